"""The worker suite: a harness network around a worker program, driven through scenarios.

The harness is a reference coordinator (SQLite, seconds-scale timers), a reference validator
that re-checks every commitment with one prefill, a trainer that publishes the tiny model and
asks for rollouts, and an operator — all in this process. The worker under test is a separate
program (``--command``), pointed at a recording proxy (:mod:`rollnet.sdk.conformance.proxy`) in
front of the coordinator: the proxy sees every call the worker makes, and answers some in the
coordinator's place (a rate limit, a revoked lease) to see what the worker does next.

A worker passes when its commitments verify and are accepted (the trainer streams its rollouts
and the ledger credits it), it backs off as ``RetryInfo`` says, drops a revoked lease, survives a
coordinator restart, follows a new checkpoint, obeys a drain command and drains on SIGTERM, and
no call it ever made was refused for being malformed or badly signed.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import shlex
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import grpc
from google.protobuf.message import Message

from rollnet.sdk import ConnectionConfig, Identity, RetryPolicy, RollnetClient
from rollnet.sdk.conformance.proxy import Call, Fault, Proxy
from rollnet.sdk.conformance.suite import Case, CaseFailure, Report, Result, run_cases, select
from rollnet.sdk.errors import ErrorReason
from rollnet.sdk.identity import b64url_encode
from rollnet.sdk.methods import method_path
from rollnet.sdk.node import PROTOCOL_VERSION
from rollnet.sdk.version import PROTOCOL_MAJOR
from rollnet.v1 import (
    checkpoint_pb2,
    checkpoint_service_pb2,
    commitment_service_pb2,
    common_pb2,
    node_pb2,
    node_service_pb2,
    rollout_service_pb2,
    task_service_pb2,
)

NETWORK = "rollnet-conformance"
SUITE = "worker"
REGISTER = method_path("NodeService", "RegisterNode")
HEARTBEAT = method_path("NodeService", "Heartbeat")
DEREGISTER = method_path("NodeService", "DeregisterNode")
PULL_TASK = method_path("TaskService", "PullTask")
FAIL_TASK = method_path("TaskService", "FailTask")
SUBMIT = method_path("CommitmentService", "SubmitCommitment")
GET_CHECKPOINT = method_path("CheckpointService", "GetCheckpoint")
MUTATING: dict[str, type[Message]] = {
    PULL_TASK: task_service_pb2.PullTaskRequest,
    FAIL_TASK: task_service_pb2.FailTaskRequest,
    SUBMIT: commitment_service_pb2.SubmitCommitmentRequest,
    DEREGISTER: node_service_pb2.DeregisterNodeRequest,
}
#: A worker's call refused with one of these broke the protocol (not the harness's doing).
_MALFORMED = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.INVALID_ARGUMENT}


@dataclass(frozen=True, slots=True)
class WorkerHarnessConfig:
    """What the suite runs and where."""

    command: str
    """The worker's command line, split as a shell would (no shell runs it, so the process the
    harness signals is the worker); in each word ``{target}``, ``{network_id}``, ``{key}``,
    ``{data_dir}`` and ``{python}`` (this interpreter) are replaced."""
    work_dir: Path | None = None
    """Where the harness keeps its database, model and logs (default: a temporary folder)."""
    startup_timeout: float = 120.0
    """How long the worker may take from launch to registration."""
    work_timeout: float = 120.0
    """How long a scenario waits for the worker's work to be accepted."""


@dataclass
class WorkerProcess:
    """One launched worker program."""

    identity: Identity
    process: asyncio.subprocess.Process
    log: Path

    @property
    def key(self) -> str:
        return b64url_encode(self.identity.public_key)

    def log_tail(self, lines: int = 5) -> str:
        try:
            text = self.log.read_text(errors="replace").strip().splitlines()
        except OSError:
            return ""
        return " | ".join(text[-lines:])


@dataclass
class Harness:
    """The network around the worker under test."""

    config: WorkerHarnessConfig
    root: Path
    coordinator: Any = None
    coordinator_config: Any = None
    proxy: Proxy | None = None
    validator: Any = None
    validator_task: asyncio.Task[None] | None = None
    trainer: RollnetClient | None = None
    operator: RollnetClient | None = None
    keys: dict[str, Identity] = field(default_factory=dict)
    model_dir: Path | None = None
    step: int = 1
    main: WorkerProcess | None = None
    processes: list[WorkerProcess] = field(default_factory=list)
    stream_after: int = 0
    accepted: dict[str, str] = field(default_factory=dict)
    """task id -> node id of every rollout the trainer has streamed."""

    # ------------------------------------------------------------------ setup and teardown

    async def open(self) -> None:
        from rollnet.reference.checkpoint_publishing import publish_model_dir
        from rollnet.reference.coordinator.config import load_config, with_overrides
        from rollnet.reference.coordinator.server import start_coordinator
        from rollnet.reference.model.tiny import init_tiny_model
        from rollnet.reference.validator import Validator, ValidatorConfig
        from rollnet.sdk.worker import Backoff

        self.keys = {role: Identity.generate() for role in ("trainer", "validator", "operator")}
        self.model_dir = await asyncio.to_thread(init_tiny_model, self.root / "model")
        self.coordinator_config = with_overrides(
            load_config(self.root / "coordinator"),
            listen="127.0.0.1:0",
            network_id=NETWORK,
            trainers=frozenset({self.keys["trainer"].node_id}),
            validators=frozenset({self.keys["validator"].node_id}),
            operators=frozenset({self.keys["operator"].node_id}),
            heartbeat_interval=timedelta(seconds=1),
            lease_duration=timedelta(seconds=4),
            sweep_interval=timedelta(seconds=0.2),
            retry_after=timedelta(seconds=0.2),
            pull_wait_max=timedelta(seconds=2),
            suspect_after_missed=5.0,
            offline_after_missed=10.0,
        )
        self.coordinator = await start_coordinator(self.coordinator_config)
        self.proxy = Proxy(upstream=self.coordinator.address)
        await self.proxy.start()
        self.trainer = self._client("trainer")
        self.operator = self._client("operator")
        for role, client in (("trainer", self.trainer), ("operator", self.operator)):
            await client.nodes.register_node(
                node_service_pb2.RegisterNodeRequest(
                    public_key=self.keys[role].public_key,
                    role=common_pb2.ROLE_TRAINER if role == "trainer" else common_pb2.ROLE_OPERATOR,
                    protocol_version=PROTOCOL_VERSION,
                    hardware=node_pb2.HardwareReport(cpu_cores=2, memory_bytes=1 << 30),
                )
            )
        await publish_model_dir(self.trainer, self.keys["trainer"], self.model_dir, 1, NETWORK)
        self.validator = Validator(
            ValidatorConfig(
                target=self.coordinator.address,
                data_dir=self.root / "validator",
                network_id=NETWORK,
                pull_wait=1.0,
                backoff=Backoff(initial=0.1, maximum=1.0),
            ),
            self.keys["validator"],
        )
        self.validator_task = asyncio.create_task(self.validator.run())

    def _client(self, role: str) -> RollnetClient:
        return RollnetClient.connect(
            ConnectionConfig(
                target=self.coordinator.address,
                network_id=NETWORK,
                timeout=15.0,
                retry=RetryPolicy(max_attempts=20, initial_backoff=0.2, max_backoff=1.0),
            ),
            self.keys[role],
        )

    async def close(self) -> None:
        for worker in self.processes:
            if worker.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    worker.process.kill()
                await worker.process.wait()
        if self.validator is not None and self.validator_task is not None:
            self.validator.request_stop()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.validator_task, timeout=15)
        for client in (self.trainer, self.operator):
            if client is not None:
                await client.close()
        if self.proxy is not None:
            await self.proxy.stop()
        if self.coordinator is not None:
            await self.coordinator.stop(grace=0.5)

    async def restart_coordinator(self) -> None:
        """Stop the coordinator and start it again on the same port and database."""
        from rollnet.reference.coordinator.server import start_coordinator

        address = self.coordinator.address
        await self.coordinator.stop(grace=0.5)
        self.coordinator = await start_coordinator(replace(self.coordinator_config, listen=address))

    # ------------------------------------------------------------------ the worker under test

    async def launch(self, name: str) -> WorkerProcess:
        """Start the worker command with a new key; returns once it registered."""
        assert self.proxy is not None
        folder = self.root / name
        folder.mkdir(parents=True)
        identity = Identity.generate()
        key = folder / "worker.key"
        identity.save(key)
        values = {
            "target": self.proxy.address,
            "network_id": NETWORK,
            "key": str(key),
            "data_dir": str(folder / "data"),
            "python": sys.executable,
        }
        argv = [part.format(**values) for part in shlex.split(self.config.command)]
        log = folder / "worker.log"
        with log.open("wb") as output:
            process = await asyncio.create_subprocess_exec(
                *argv, stdout=output, stderr=output, start_new_session=True
            )
        worker = WorkerProcess(identity, process, log)
        self.processes.append(worker)
        deadline = time.monotonic() + self.config.startup_timeout
        while True:
            try:
                await self.proxy.wait_for(
                    lambda c: (
                        c.method == REGISTER
                        and c.key == worker.key
                        and c.code == grpc.StatusCode.OK
                    ),
                    within=1.0,
                    what="RegisterNode",
                )
            except CaseFailure:
                exited = process.returncode
                if exited is None and time.monotonic() < deadline:
                    continue
                raise CaseFailure(
                    f"the worker did not register within {self.config.startup_timeout:g} s"
                    + (f" (it exited {exited})" if exited is not None else "")
                    + f"; its log ends: {worker.log_tail()}"
                ) from None
            return worker

    async def main_worker(self) -> WorkerProcess:
        """The long-lived worker most scenarios use (launched by the first one)."""
        if self.main is None:
            self.main = await self.launch("worker")
        if self.main.process.returncode is not None:
            raise CaseFailure(
                f"the worker exited ({self.main.process.returncode}); its log ends: "
                f"{self.main.log_tail()}"
            )
        return self.main

    def calls(self, worker: WorkerProcess, method: str | None = None) -> list[Call]:
        assert self.proxy is not None
        return [
            c
            for c in self.proxy.calls
            if c.key == worker.key and (method is None or c.method == method)
        ]

    # ------------------------------------------------------------------ trainer side

    async def request(self, tasks: int = 1) -> list[str]:
        """Ask for ``tasks`` arithmetic tasks (one prompt, two samples, 8 tokens) at the
        current step; their ids."""
        assert self.trainer is not None
        response = await self.trainer.rollouts.request_rollouts(
            rollout_service_pb2.RequestRolloutsRequest(
                rollout_step=self.step,
                environment="arithmetic",
                prompt_count=tasks,
                samples_per_prompt=2,
                sampling=common_pb2.SamplingParams(temperature=1.0, max_new_tokens=8),
                prompts_per_task=1,
            )
        )
        return list(response.task_ids)

    async def wait_accepted(self, task_ids: Sequence[str], node_id: str) -> None:
        """Wait until the trainer streams accepted rollouts of every task in ``task_ids``, made
        by ``node_id``."""
        assert self.trainer is not None
        deadline = time.monotonic() + self.config.work_timeout
        wanted = set(task_ids)
        while not wanted <= set(self.accepted):
            await self._check_not_slashed(node_id)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                missing = sorted(wanted - set(self.accepted))
                raise CaseFailure(
                    f"tasks {missing} were not accepted within {self.config.work_timeout:g} s"
                )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._read_stream(), timeout=min(remaining, 2.0))
        others = {t: self.accepted[t] for t in wanted if self.accepted[t] != node_id}
        if others:
            raise CaseFailure(f"tasks done by other nodes, not the worker: {others}")

    async def _check_not_slashed(self, node_id: str) -> None:
        """Fail at once when a validator rejected the worker's work (the ledger slashed it)."""
        from rollnet.v1 import ledger_pb2, ledger_service_pb2

        assert self.operator is not None
        page = await self.operator.ledger.list_entries(
            ledger_service_pb2.ListEntriesRequest(node_id=node_id, page_size=1000)
        )
        slashes = [e for e in page.entries if e.kind == ledger_pb2.LedgerEntry.KIND_SLASH]
        if slashes:
            raise CaseFailure(
                f"the validator rejected {len(slashes)} of the worker's commitments "
                f"(slashed: {', '.join(e.memo or e.commitment_id for e in slashes[:3])})"
            )

    async def _read_stream(self) -> None:
        assert self.trainer is not None
        async for rollout in self.trainer.rollouts.stream(self.stream_after):
            self.stream_after = max(self.stream_after, rollout.sequence)
            self.accepted[rollout.task_id] = rollout.node_id

    async def publish_next(self, *, delta_seed: int | None = None) -> int:
        """Publish the next step: the current weights again, or (``delta_seed``) the tiny model
        drawn from that seed, shipped with deltas against the current step's files."""
        from rollnet.reference.checkpoint_publishing import DeltaBase, publish_model_dir
        from rollnet.reference.model.tiny import init_tiny_model

        assert self.trainer is not None
        assert self.model_dir is not None
        base = DeltaBase(self.step, self.model_dir)
        self.step += 1
        if delta_seed is not None:
            self.model_dir = await asyncio.to_thread(
                init_tiny_model, self.root / f"model-{self.step}", delta_seed
            )
        await publish_model_dir(
            self.trainer,
            self.keys["trainer"],
            self.model_dir,
            self.step,
            NETWORK,
            delta_base=base if delta_seed is not None else None,
        )
        return self.step


# ============================================================================ cases

WORKER_CASES: list[Case[Harness]] = []


def case(
    name: str, summary: str, *, timeout: float = 300.0
) -> Callable[[Callable[[Harness], Any]], Callable[[Harness], Any]]:
    def add(body: Callable[[Harness], Any]) -> Callable[[Harness], Any]:
        WORKER_CASES.append(Case(name, summary, body, timeout))
        return body

    return add


def expect(condition: bool, message: str) -> None:
    if not condition:
        raise CaseFailure(message)


@case("worker.registers", "registers as a worker, protocol 1.x, its own key; then heartbeats")
async def registers(harness: Harness) -> None:
    worker = await harness.main_worker()
    [first, *_] = [c for c in harness.calls(worker, REGISTER) if c.code == grpc.StatusCode.OK]
    request = node_service_pb2.RegisterNodeRequest.FromString(first.body)
    expect(request.role == common_pb2.ROLE_WORKER, f"registered with role {request.role}")
    expect(
        request.protocol_version.major == PROTOCOL_MAJOR,
        f"protocol_version.major is not {PROTOCOL_MAJOR}",
    )
    expect(request.public_key == worker.identity.public_key, "public_key is not its key")
    assert harness.proxy is not None
    try:
        await harness.proxy.wait_for(
            lambda c: c.method == HEARTBEAT and c.key == worker.key,
            within=10.0,
            what="Heartbeat",
            since=first.started,
        )
    except CaseFailure as error:
        raise CaseFailure(f"{error} after registering") from None


@case("worker.work", "its commitments verify and are accepted: streamed to the trainer, credited")
async def work(harness: Harness) -> None:
    worker = await harness.main_worker()
    tasks = await harness.request(2)
    await harness.wait_accepted(tasks, worker.identity.node_id)
    assert harness.operator is not None
    from rollnet.v1 import ledger_service_pb2

    balance = await harness.operator.ledger.get_balance(
        ledger_service_pb2.GetBalanceRequest(node_id=worker.identity.node_id)
    )
    expect(balance.credited > 0, "the worker's accepted work earned no credit")


@case(
    "worker.rate_limit", "a RATE_LIMITED PullTask with RetryInfo 1.5 s: the next pull waits 1.5 s"
)
async def rate_limit(harness: Harness) -> None:
    worker = await harness.main_worker()
    assert harness.proxy is not None
    delay = 1.5
    harness.proxy.faults.append(
        Fault(
            PULL_TASK,
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            ErrorReason.RATE_LIMITED,
            retry_after=delay,
            key=worker.key,
        )
    )
    refused = await harness.proxy.wait_for(
        lambda c: c.method == PULL_TASK and c.key == worker.key and c.injected,
        within=30.0,
        what="PullTask to refuse",
    )
    following = await harness.proxy.wait_for(
        lambda c: c.method == PULL_TASK and c.key == worker.key and c.started > refused.started,
        within=30.0,
        what="PullTask after the refusal",
    )
    waited = following.started - refused.started
    expect(waited >= delay - 0.05, f"the worker pulled again after {waited:.2f} s, not {delay} s")
    tasks = await harness.request(1)
    await harness.wait_accepted(tasks, worker.identity.node_id)


@case("worker.revoked_lease", "a commitment refused FENCING_TOKEN_STALE is dropped; work goes on")
async def revoked_lease(harness: Harness) -> None:
    worker = await harness.main_worker()
    assert harness.proxy is not None
    harness.proxy.faults.append(
        Fault(
            SUBMIT,
            grpc.StatusCode.FAILED_PRECONDITION,
            ErrorReason.FENCING_TOKEN_STALE,
            message="the lease on the task is not the current one (injected)",
            key=worker.key,
        )
    )
    await harness.request(1)
    refused = await harness.proxy.wait_for(
        lambda c: c.method == SUBMIT and c.key == worker.key and c.injected,
        within=harness.config.work_timeout,
        what="SubmitCommitment to refuse",
    )
    lease_id = commitment_service_pb2.SubmitCommitmentRequest.FromString(refused.body).lease_id
    tasks = await harness.request(1)
    await harness.wait_accepted(tasks, worker.identity.node_id)
    again = [
        c
        for c in harness.calls(worker, SUBMIT)
        if c.started > refused.started
        and commitment_service_pb2.SubmitCommitmentRequest.FromString(c.body).lease_id == lease_id
    ]
    expect(not again, f"the worker submitted the revoked lease {lease_id} {len(again)} more times")


@case("worker.restart", "the coordinator restarts: the worker carries on and its work is accepted")
async def restart(harness: Harness) -> None:
    worker = await harness.main_worker()
    await harness.restart_coordinator()
    tasks = await harness.request(1)
    await harness.wait_accepted(tasks, worker.identity.node_id)


@case("worker.new_checkpoint", "a new checkpoint: tasks of the new step are done with its weights")
async def new_checkpoint(harness: Harness) -> None:
    worker = await harness.main_worker()
    step = await harness.publish_next()
    tasks = await harness.request(1)
    await harness.wait_accepted(tasks, worker.identity.node_id)
    fetched = [
        c
        for c in harness.calls(worker, GET_CHECKPOINT)
        if checkpoint_service_pb2.GetCheckpointRequest.FromString(c.body).step == step
    ]
    expect(bool(fetched), f"the worker never asked for checkpoint {step}")


@case(
    "worker.delta_checkpoint",
    "new weights shipped with deltas: the worker generates with them (delta or shards)",
)
async def delta_checkpoint(harness: Harness) -> None:
    worker = await harness.main_worker()
    step = await harness.publish_next(delta_seed=1)
    assert harness.trainer is not None
    published = await harness.trainer.checkpoints.get_checkpoint(
        checkpoint_service_pb2.GetCheckpointRequest(step=step)
    )
    manifest = checkpoint_pb2.CheckpointManifest.FromString(published.checkpoint.manifest)
    expect(
        any(file.HasField("delta") for file in manifest.files),
        "the harness published no delta (the trainer's build_manifest changed?)",
    )
    tasks = await harness.request(1)
    await harness.wait_accepted(tasks, worker.identity.node_id)


def _interval(seconds: float) -> Callable[[bytes, bytes], bytes]:
    def rewrite(request: bytes, response: bytes) -> bytes:
        answer = node_service_pb2.HeartbeatResponse.FromString(response)
        answer.heartbeat_interval.FromTimedelta(timedelta(seconds=seconds))
        return answer.SerializeToString()

    return rewrite


@case("worker.heartbeat_interval", "heartbeats follow the interval the last reply granted (2.5 s)")
async def heartbeat_interval(harness: Harness) -> None:
    worker = await harness.main_worker()
    assert harness.proxy is not None
    granted = 2.5
    harness.proxy.faults.append(
        Fault(HEARTBEAT, key=worker.key, count=3, rewrite=_interval(granted))
    )
    first = await harness.proxy.wait_for(
        lambda c: c.method == HEARTBEAT and c.key == worker.key and c.rewritten,
        within=10.0,
        what="Heartbeat",
    )
    last = await harness.proxy.wait_for(
        lambda c: c.method == HEARTBEAT and c.key == worker.key and not c.rewritten,
        within=4 * granted + 5.0,
        what="the heartbeat after three granting 2.5 s",
        since=first.started + 0.001,
    )
    beats = [c.started for c in harness.calls(worker, HEARTBEAT) if first.started <= c.started]
    beats = beats[: beats.index(last.started) + 1]
    gaps = [later - earlier for earlier, later in itertools.pairwise(beats)]
    # The SDK jitters by 10 %; the protocol asks for the granted interval, so allow 20 %.
    short = [round(gap, 2) for gap in gaps if gap < granted * 0.8]
    expect(len(gaps) >= 3, f"{len(gaps)} heartbeat gaps seen, expected 3")
    expect(not short, f"heartbeats {short} s apart, under the granted {granted} s")
    expect(
        max(gaps) < 2 * granted + 1.0,
        f"a heartbeat gap of {max(gaps):.1f} s, far over the granted {granted} s",
    )


@case(
    "worker.requests", "every call it made was well-formed: none refused as malformed or unsigned"
)
async def requests(harness: Harness) -> None:
    worker = await harness.main_worker()
    bad = [
        f"{c.rpc} {c.code.name}/{c.reason}"
        for c in harness.calls(worker)
        if not c.injected and c.code in _MALFORMED
    ]
    expect(not bad, f"refused as malformed: {bad[:5]}")
    reused = [c.rpc for c in harness.calls(worker) if c.reason == "REQUEST_ID_REUSED"]
    expect(not reused, f"request ids reused with another body: {reused[:5]}")
    for method, message in MUTATING.items():
        for c in harness.calls(worker, method):
            expect(
                bool(getattr(message.FromString(c.body), "request_id", "")),
                f"a {c.rpc} without a request_id",
            )


def _with_drain(request: bytes, response: bytes) -> bytes:
    """A heartbeat answer with a DrainCommand added."""
    answer = node_service_pb2.HeartbeatResponse.FromString(response)
    answer.commands.add().drain.reason = "conformance: drain"
    return answer.SerializeToString()


@case("worker.drain", "a DrainCommand: the worker stops pulling and deregisters")
async def drain(harness: Harness) -> None:
    assert harness.proxy is not None
    worker = await harness.launch("drained")
    await harness.proxy.wait_for(
        lambda c: c.method == PULL_TASK and c.key == worker.key,
        within=30.0,
        what="PullTask",
    )
    harness.proxy.faults.append(Fault(HEARTBEAT, key=worker.key, rewrite=_with_drain))
    told = await harness.proxy.wait_for(
        lambda c: c.method == HEARTBEAT and c.key == worker.key and c.rewritten,
        within=10.0,
        what="Heartbeat to carry the DrainCommand",
    )
    deregistered = await harness.proxy.wait_for(
        lambda c: c.method == DEREGISTER and c.key == worker.key,
        within=30.0,
        what="DeregisterNode after the DrainCommand",
        since=told.started,
    )
    expect(
        deregistered.code == grpc.StatusCode.OK,
        f"DeregisterNode was refused {deregistered.code.name}/{deregistered.reason}",
    )
    # A pull already waiting then may finish; none may start a second after the command.
    late = [c for c in harness.calls(worker, PULL_TASK) if c.started > told.started + 1.0]
    expect(not late, f"{len(late)} PullTask after the DrainCommand")


@case("worker.sigterm", "SIGTERM: leases given back or finished, DeregisterNode, exit 0")
async def sigterm(harness: Harness) -> None:
    worker = await harness.main_worker()
    assert harness.proxy is not None
    await harness.request(1)
    await harness.proxy.wait_for(
        lambda c: c.method == PULL_TASK and c.key == worker.key,
        within=30.0,
        what="PullTask",
        since=time.monotonic(),
    )
    sent = time.monotonic()
    worker.process.send_signal(signal.SIGTERM)
    try:
        code = await asyncio.wait_for(worker.process.wait(), timeout=60.0)
    except TimeoutError:
        raise CaseFailure("the worker did not exit within 60 s of SIGTERM") from None
    expect(code == 0, f"the worker exited {code} on SIGTERM; its log ends: {worker.log_tail()}")
    deregistered = [c for c in harness.calls(worker, DEREGISTER) if c.started >= sent]
    expect(bool(deregistered), "the worker exited without DeregisterNode")


async def run_worker_suite(
    config: WorkerHarnessConfig,
    *,
    patterns: Sequence[str] = (),
    skip: Sequence[str] = (),
    on_result: Callable[[Result], None] | None = None,
) -> Report:
    """Build the harness network, run the worker suite (or the cases ``patterns`` select, less
    those ``skip`` names) and tear everything down."""
    with contextlib.ExitStack() as stack:
        root = config.work_dir
        if root is None:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rollnet-conf-")))
        root.mkdir(parents=True, exist_ok=True)
        harness = Harness(config, root)
        try:
            await harness.open()
            return await run_cases(
                SUITE, select(WORKER_CASES, patterns), harness, on_result=on_result
            )
        finally:
            await harness.close()
    raise AssertionError("unreachable")  # pragma: no cover


__all__ = ["WORKER_CASES", "WorkerHarnessConfig", "run_worker_suite"]
