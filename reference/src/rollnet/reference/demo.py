"""The local demo swarm: one machine, every role, real processes on loopback.

``rollnet demo`` starts a coordinator, publishes the tiny model as checkpoint 0 (trainer key),
starts honest workers, validators and optionally cheating workers as separate processes, then
plays the trainer's part: each round it asks for rollouts of the ``arithmetic`` environment and
follows the stream of accepted ones, printing what the swarm did (accepted rollouts, validated
reward, rejects, ejections, balances). At the end it stops every process gracefully and checks
the ledger's hash chain with ``rollnet ledger verify``.

The trainer itself (GRPO updates, new checkpoints) is a later component; until it lands the
demo keeps serving checkpoint 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from rollnet.sdk import PROTOCOL_VERSION, ConnectionConfig, Identity, RollnetClient
from rollnet.v1 import (
    common_pb2,
    ledger_pb2,
    ledger_service_pb2,
    node_pb2,
    node_service_pb2,
    rollout_service_pb2,
)

NETWORK_ID = "rollnet-demo"


@dataclass
class DemoConfig:
    """What the demo runs."""

    data_dir: Path
    workers: int = 2
    validators: int = 1
    cheats: tuple[str, ...] = ("token_altered",)
    rounds: int = 3
    prompts_per_round: int = 8
    samples_per_prompt: int = 4
    max_new_tokens: int = 16
    round_timeout: float = 300.0
    port: int = 0
    eject_after_rejects: int = 2


@dataclass
class _Swarm:
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    def start(self, name: str, args: list[str], log_dir: Path) -> None:
        log = open(log_dir / f"{name}.log", "ab")  # noqa: SIM115 - owned by the process
        self.processes[name] = subprocess.Popen(
            args, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )

    def stop(self, timeout: float = 60.0) -> None:
        # Workers and validators first (they drain), the coordinator last.
        ordered = sorted(self.processes.items(), key=lambda item: item[0] == "coordinator")
        nodes = [p for name, p in ordered if name != "coordinator"]
        coordinator = [p for name, p in ordered if name == "coordinator"]
        for group in (nodes, coordinator):
            for process in group:
                if process.poll() is None:
                    process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + timeout
            for process in group:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=max(0.1, deadline - time.monotonic()))
                if process.poll() is None:
                    process.kill()
                    process.wait()


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


#: Every model process of the demo shares this machine's cores: one PyTorch thread each, or their
#: threads wait on each other at every operation (see docs/worker.md).
ONE_THREAD = ("--torch-threads", "1")


def _rollnet() -> list[str]:
    return [sys.executable, "-m", "rollnet.reference.cli"]


#: What a demo run leaves that the next one must not start from (keys and the model stay).
_RUN_STATE = ("coordinator", "logs", "worker-*", "validator-*", "cheat-*")


def clear_previous_run(root: Path) -> bool:
    """Remove an earlier run's coordinator database, blobs, node state and logs under ``root``.

    The trainer streams accepted rollouts from the ledger's start, so a run on top of an earlier
    one would count the earlier rollouts as its own (rounds "done" in no time). The tiny model
    and the keys are kept: they are the same every run. Returns whether anything was removed.
    """
    removed = False
    for pattern in _RUN_STATE:
        for path in root.glob(pattern):
            if path.is_dir():
                shutil.rmtree(path)
                removed = True
    return removed


def _key(path: Path) -> Identity:
    if path.exists():
        return Identity.load(path)
    identity = Identity.generate()
    identity.save(path)
    return identity


async def _wait_for_coordinator(address: str, process: subprocess.Popen[bytes]) -> None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + 120
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError("the coordinator exited; see coordinator.log")
            with contextlib.suppress(grpc.aio.AioRpcError):
                reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=2)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            await asyncio.sleep(0.2)
    raise RuntimeError("the coordinator did not become ready within 120 s")


async def run_demo(config: DemoConfig) -> int:
    """Run the demo swarm; returns a process exit code."""
    from rollnet.reference.checkpoints import publish_model_dir
    from rollnet.reference.model.tiny import init_tiny_model

    root = config.data_dir.resolve()
    if clear_previous_run(root):
        print(f"starting afresh: the previous run's ledger and node state under {root} removed")
    for sub in ("keys", "logs", "model"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    model_dir = root / "model"
    if not (model_dir / "config.json").exists():
        print("creating the tiny model ...", flush=True)
        init_tiny_model(model_dir)
    trainer = _key(root / "keys" / "trainer.key")
    validators = [_key(root / "keys" / f"validator-{i}.key") for i in range(config.validators)]
    port = config.port or _free_port()
    address = f"127.0.0.1:{port}"
    allow = ", ".join(f'"{v.node_id}"' for v in validators)
    (root / "coordinator.toml").write_text(
        f'network_id = "{NETWORK_ID}"\n'
        f'trainers = ["{trainer.node_id}"]\n'
        f"validators = [{allow}]\n"
        f"eject_after_rejects = {config.eject_after_rejects}\n"
        "heartbeat_interval = 2\n"
        "lease_duration = 120\n"
    )
    swarm = _Swarm()
    logs = root / "logs"
    common = ["--coordinator", address, "--network-id", NETWORK_ID]
    try:
        swarm.start(
            "coordinator",
            [
                *_rollnet(),
                "coordinator",
                "--data-dir",
                str(root / "coordinator"),
                "--config",
                str(root / "coordinator.toml"),
                "--listen",
                address,
            ],
            logs,
        )
        await _wait_for_coordinator(address, swarm.processes["coordinator"])
        print(f"coordinator on {address} (network {NETWORK_ID}); logs in {logs}", flush=True)
        client = RollnetClient.connect(ConnectionConfig(address, NETWORK_ID), trainer)
        async with client:
            await client.nodes.register_node(
                node_service_pb2.RegisterNodeRequest(
                    public_key=trainer.public_key,
                    role=common_pb2.ROLE_TRAINER,
                    protocol_version=PROTOCOL_VERSION,
                    software_version="rollnet-demo/0.1",
                    capabilities=node_pb2.Capabilities(),
                )
            )
            published = await publish_model_dir(client, trainer, model_dir, 0, NETWORK_ID)
            print(
                f"published checkpoint 0: {published.shards_uploaded} shards, "
                f"{published.bytes_uploaded:,} bytes",
                flush=True,
            )
            for i in range(config.workers):
                swarm.start(
                    f"worker-{i}",
                    [
                        *_rollnet(),
                        "worker",
                        *common,
                        "--key",
                        str(root / "keys" / f"worker-{i}.key"),
                        *ONE_THREAD,
                        "--data-dir",
                        str(root / f"worker-{i}"),
                    ],
                    logs,
                )
            for i in range(config.validators):
                swarm.start(
                    f"validator-{i}",
                    [
                        *_rollnet(),
                        "validator",
                        *common,
                        "--key",
                        str(root / "keys" / f"validator-{i}.key"),
                        *ONE_THREAD,
                        "--data-dir",
                        str(root / f"validator-{i}"),
                    ],
                    logs,
                )
            for cheat in config.cheats:
                swarm.start(
                    f"cheat-{cheat}",
                    [
                        sys.executable,
                        "-m",
                        "rollnet.reference.adversary",
                        "--cheat",
                        cheat,
                        *common,
                        "--key",
                        str(root / "keys" / f"cheat-{cheat}.key"),
                        *ONE_THREAD,
                        "--data-dir",
                        str(root / f"cheat-{cheat}"),
                    ],
                    logs,
                )
            print(
                f"started {config.workers} worker(s), {config.validators} validator(s), "
                f"cheats: {', '.join(config.cheats) or 'none'}",
                flush=True,
            )
            ok = await _play_trainer(client, config)
            names = {
                Identity.load(path).node_id: path.stem for path in (root / "keys").glob("*.key")
            }
            await _report_ledger(client, names)
    finally:
        print("stopping the swarm ...", flush=True)
        swarm.stop()
    db = f"sqlite:///{root / 'coordinator' / 'rollnet.db'}"
    verify = await asyncio.create_subprocess_exec(*_rollnet(), "ledger", "verify", "--db", db)
    verified = await verify.wait()
    return 0 if ok and verified == 0 else 1


async def _play_trainer(client: RollnetClient, config: DemoConfig) -> bool:
    stream = client.rollouts.stream(0)
    for step in range(1, config.rounds + 1):
        started = time.monotonic()
        response = await client.rollouts.request_rollouts(
            rollout_service_pb2.RequestRolloutsRequest(
                rollout_step=step,
                environment="arithmetic",
                prompt_count=config.prompts_per_round,
                samples_per_prompt=config.samples_per_prompt,
                sampling=common_pb2.SamplingParams(
                    temperature=1.0, max_new_tokens=config.max_new_tokens
                ),
                prompts_per_task=1,
            )
        )
        wanted = config.prompts_per_round * config.samples_per_prompt
        tasks = set(response.task_ids)
        received = 0
        rewards: list[float] = []
        tokens = 0
        try:
            async with asyncio.timeout(config.round_timeout):
                while received < wanted:
                    rollout = await anext(stream)
                    if rollout.rollout_step != step:
                        continue
                    received += 1
                    tokens += len(rollout.rollout.completion_token_ids)
                    if rollout.HasField("validated_reward"):
                        rewards.append(rollout.validated_reward.total)
                    tasks.discard(rollout.task_id)
        except TimeoutError:
            print(f"round {step}: timed out with {received}/{wanted} rollouts", flush=True)
            return False
        elapsed = time.monotonic() - started
        mean = sum(rewards) / len(rewards) if rewards else float("nan")
        print(
            f"round {step}: {received} accepted rollouts in {elapsed:.1f} s "
            f"({tokens / elapsed:.0f} completion tokens/s), mean validated reward {mean:.3f}",
            flush=True,
        )
    return True


async def _report_ledger(client: RollnetClient, names: dict[str, str]) -> None:
    entries = await client.ledger.list_entries(
        ledger_service_pb2.ListEntriesRequest(page_size=1000)
    )
    kinds: Counter[str] = Counter()
    balances: Counter[str] = Counter()
    slashes: Counter[str] = Counter()
    for entry in entries.entries:
        kinds[ledger_pb2.LedgerEntry.Kind.Name(entry.kind)] += 1
        balances[entry.node_id] += entry.amount
        if entry.kind == ledger_pb2.LedgerEntry.KIND_SLASH:
            slashes[entry.memo or "?"] += 1
    print(f"ledger: {entries.head_sequence} entries ({dict(kinds)})", flush=True)
    for reason, count in slashes.most_common():
        print(f"  rejected: {count} x {reason}", flush=True)
    for node_id, amount in balances.most_common():
        name = names.get(node_id, "?")
        print(f"  balance {name:<24} {node_id}: {amount:>8,} work units", flush=True)
