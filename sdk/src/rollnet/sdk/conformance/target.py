# gRPC deadlines are per call, so the call helpers take `timeout` on purpose.
# ruff: noqa: ASYNC109
"""The coordinator under test, as the suite sees it: over the wire, through signed calls only.

:class:`TargetConfig` is what an operator gives the suite (the address, the network id, the keys
of the allow-listed roles it may use, a restart hook, a few of the target's settings).
:class:`Target` is the run's state: the bare channel, the nodes the suite registered
(:class:`Peer`) and the steps it published. Helpers do what a worker, validator or trainer
does — register, lease, upload, commit, judge — with the generated messages and the SDK's signing
and binding code, never with the coordinator's own code.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import TypeVar

import blake3
import grpc
from google.protobuf import duration_pb2
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2

from rollnet.sdk import batches
from rollnet.sdk.checkpoints import CHECKPOINT_DOMAIN
from rollnet.sdk.client import TlsConfig
from rollnet.sdk.conformance.suite import CaseFailure, Skipped
from rollnet.sdk.conformance.wire import Tamper, Wire, describe, refusal, signing_headers
from rollnet.sdk.errors import RollnetError, from_rpc_error
from rollnet.sdk.identity import Identity
from rollnet.sdk.methods import method_path
from rollnet.sdk.node import PROTOCOL_VERSION
from rollnet.sdk.proofs.binding import LeaseBinding, derive_sampling_seed
from rollnet.sdk.version import software_version
from rollnet.v1 import (
    blob_service_pb2,
    checkpoint_pb2,
    checkpoint_service_pb2,
    commitment_service_pb2,
    common_pb2,
    node_pb2,
    node_service_pb2,
    rollout_pb2,
    rollout_service_pb2,
    task_pb2,
    task_service_pb2,
    validation_pb2,
    validation_service_pb2,
)

M = TypeVar("M", bound=Message)

ROLE_NAMES: Mapping[str, int] = {
    "worker": common_pb2.ROLE_WORKER,
    "validator": common_pb2.ROLE_VALIDATOR,
    "trainer": common_pb2.ROLE_TRAINER,
    "operator": common_pb2.ROLE_OPERATOR,
}
"""The roles a key directory may hold a key for, by file stem (``trainer.key``)."""

REGISTER = method_path("NodeService", "RegisterNode")
HEARTBEAT = method_path("NodeService", "Heartbeat")
DEREGISTER = method_path("NodeService", "DeregisterNode")
GET_NODE = method_path("NodeService", "GetNode")
LIST_NODES = method_path("NodeService", "ListNodes")
EJECT = method_path("NodeService", "EjectNode")
BAN = method_path("NodeService", "BanNode")
REINSTATE = method_path("NodeService", "ReinstateNode")
PULL_TASK = method_path("TaskService", "PullTask")
REPORT_PROGRESS = method_path("TaskService", "ReportProgress")
FAIL_TASK = method_path("TaskService", "FailTask")
UPLOAD = method_path("BlobService", "UploadBlob")
GET_BLOB = method_path("BlobService", "GetBlob")
SUBMIT = method_path("CommitmentService", "SubmitCommitment")
GET_COMMITMENT = method_path("CommitmentService", "GetCommitment")
PULL_JOB = method_path("ValidationService", "PullValidationJob")
VERDICT = method_path("ValidationService", "SubmitVerdict")
PUBLISH = method_path("CheckpointService", "PublishCheckpoint")
LATEST = method_path("CheckpointService", "GetLatestCheckpoint")
GET_CHECKPOINT = method_path("CheckpointService", "GetCheckpoint")
WATCH = method_path("CheckpointService", "WatchCheckpoints")
REQUEST_ROLLOUTS = method_path("RolloutService", "RequestRollouts")
STREAM_ROLLOUTS = method_path("RolloutService", "StreamRollouts")
LIST_ENTRIES = method_path("LedgerService", "ListEntries")
GET_BALANCE = method_path("LedgerService", "GetBalance")
CHAIN_HEAD = method_path("LedgerService", "GetChainHead")
HEALTH_CHECK = "/grpc.health.v1.Health/Check"
HEALTH_WATCH = "/grpc.health.v1.Health/Watch"

C = grpc.StatusCode
#: How long a registration may wait out the target's per-address rate limit (it is per minute).
REGISTRATION_WAIT = 65.0


@dataclass(frozen=True, slots=True)
class TargetConfig:
    """What the operator tells the suite about the coordinator under test."""

    target: str
    """``host:port``."""
    network_id: str
    """The network id (the audience of every signed call)."""
    tls: TlsConfig | None = None
    keys: Mapping[str, Identity] = field(default_factory=dict)
    """Keys on the target's allow-lists, by role name (``validator``, ``trainer``,
    ``operator``). Workers are new keys the suite makes; cases that need a role without a key
    are skipped."""
    restart: Callable[[], Awaitable[None]] | None = None
    """Restarts the target (same data, same address) and returns once it was asked to; the suite
    then waits for its health to be SERVING. Without it, the restart cases are skipped."""
    replica: str | None = None
    """``host:port`` of another replica of the same coordinator (same database and network), for
    the cases that check what replicas must share (a nonce seen by one is spent on all)."""
    invite_pool: str | None = None

    """An invite-only pool of the target, with ``invite_token``, one of its tokens."""
    invite_token: str | None = None
    upload_quota_bytes: int | None = None
    """The target's per-node upload quota, when the operator states it (the quota case needs
    it)."""
    max_message_bytes: int = 16 << 20
    """The target's message size cap (the documented default, 16 MiB)."""
    environment: str = "arithmetic"
    """An environment the target serves, for the tasks the suite asks for."""
    max_wait: float = 30.0
    """The longest the suite waits on the target's timers (lease expiry, a rate limit); cases
    that would wait longer are skipped, saying which setting is too long."""
    call_timeout: float = 15.0


@dataclass(slots=True)
class Work:
    """A leased task and a batch of rollouts for it (well-formed; not a real model's)."""

    task: task_pb2.Task
    lease: task_pb2.Lease
    batch: bytes
    rollouts: list[rollout_pb2.Rollout]


class Peer:
    """One node of the suite: a key, the role it registered with and signed calls."""

    def __init__(self, target: Target, identity: Identity, role: int) -> None:
        self.target = target
        self.identity = identity
        self.role = role
        self.registration: node_service_pb2.RegisterNodeResponse | None = None
        self.last_heartbeat = -math.inf

    @property
    def node_id(self) -> str:
        return self.identity.node_id

    def headers(
        self, method: str, body: bytes, tamper: Tamper | None = None
    ) -> list[tuple[str, str]]:
        """Honest (or ``tamper``-ed) signing headers for one call."""
        return signing_headers(self.identity, self.target.config.network_id, method, body, tamper)

    async def call(
        self,
        method: str,
        request: Message | bytes,
        response: type[M],
        *,
        tamper: Tamper | None = None,
        timeout: float | None = None,
    ) -> M:
        """A signed unary call; a refusal raises :class:`~rollnet.sdk.errors.RollnetError`."""
        body = _bytes(request)
        return await self.target.wire.unary(
            method,
            body,
            self.headers(method, body, tamper),
            response,
            timeout=timeout or self.target.config.call_timeout,
        )

    async def refused(
        self,
        method: str,
        request: Message | bytes,
        code: grpc.StatusCode,
        *reasons: str,
        field: str | None = None,
        tamper: Tamper | None = None,
        violations: bool = True,
        what: str = "",
    ) -> RollnetError:
        """Make the call and check it is refused with ``code`` and one of ``reasons``
        (``what`` names the attempt in a failure)."""
        prefix = f"{what}: " if what else ""
        try:
            body = _bytes(request)
            await self.target.wire.raw_unary(
                method,
                body,
                self.headers(method, body, tamper),
                timeout=self.target.config.call_timeout,
            )
        except RollnetError as error:
            try:
                return refusal(error, code, *reasons, field=field, violations=violations)
            except CaseFailure as failure:
                raise CaseFailure(f"{prefix}{failure}") from None
        raise CaseFailure(
            f"{prefix}{_rpc(method)} was accepted; expected {code.name}/{'|'.join(reasons)}"
        )

    async def upload(
        self, data: bytes, kind: int = blob_service_pb2.BLOB_KIND_ROLLOUT_BATCH
    ) -> blob_service_pb2.UploadBlobResponse:
        """Upload ``data`` (header, then one chunk); refusals raise."""
        return await self.upload_messages([upload_header(data, kind), upload_chunk(data)])

    async def upload_messages(
        self, messages: list[blob_service_pb2.UploadBlobRequest]
    ) -> blob_service_pb2.UploadBlobResponse:
        """An UploadBlob stream of exactly ``messages``, signed over the first."""
        raw = [m.SerializeToString(deterministic=True) for m in messages]
        return await self.target.wire.client_stream(
            UPLOAD,
            raw,
            self.headers(UPLOAD, raw[0] if raw else b""),
            blob_service_pb2.UploadBlobResponse,
            timeout=self.target.config.call_timeout,
        )

    async def get_blob(self, digest: bytes, offset: int = 0, length: int = 0) -> bytes:
        """Blob ``digest`` (from ``offset``, ``length`` bytes or to its end) from GetBlob's
        stream; the chunks' offsets must follow one another."""
        body = blob_service_pb2.GetBlobRequest(
            blake3=digest, offset=offset, length=length
        ).SerializeToString()
        call = self.target.wire.server_stream(
            GET_BLOB,
            body,
            self.headers(GET_BLOB, body),
            blob_service_pb2.GetBlobResponse,
            timeout=self.target.config.call_timeout,
        )
        parts = []
        at = offset
        try:
            async for part in call:
                if part.offset != at:
                    raise CaseFailure(f"a GetBlob chunk at offset {part.offset}, expected {at}")
                parts.append(part.chunk)
                at += len(part.chunk)
        except grpc.aio.AioRpcError as error:
            raise from_rpc_error(error) from None
        return b"".join(parts)

    async def heartbeat(self, *held: str) -> node_service_pb2.HeartbeatResponse:
        """A heartbeat listing ``held`` leases."""
        self.last_heartbeat = time.monotonic()
        return await self.call(
            HEARTBEAT,
            node_service_pb2.HeartbeatRequest(
                activity=node_service_pb2.ACTIVITY_BUSY if held else node_service_pb2.ACTIVITY_IDLE,
                held_lease_ids=list(held),
            ),
            node_service_pb2.HeartbeatResponse,
        )

    async def pull(
        self, wait: float = 5.0, request_id: str = ""
    ) -> task_service_pb2.PullTaskResponse:
        """One PullTask long-poll of at most ``wait`` seconds."""
        return await self.call(
            PULL_TASK,
            task_service_pb2.PullTaskRequest(
                request_id=request_id or new_request_id(), wait=duration(wait)
            ),
            task_service_pb2.PullTaskResponse,
            timeout=wait + self.target.config.call_timeout,
        )


def _bytes(request: Message | bytes) -> bytes:
    if isinstance(request, bytes):
        return request
    data: bytes = request.SerializeToString(deterministic=True)
    return data


def _rpc(method: str) -> str:
    return method.rsplit("/", 1)[-1]


def new_request_id() -> str:
    """A fresh request id (uuid4-like hex)."""
    return os.urandom(16).hex()


def duration(seconds: float) -> duration_pb2.Duration:
    """``seconds`` as a Duration."""
    whole = int(seconds)
    return duration_pb2.Duration(seconds=whole, nanos=round((seconds - whole) * 1e9))


def upload_header(
    data: bytes, kind: int = blob_service_pb2.BLOB_KIND_ROLLOUT_BATCH, *, size: int | None = None
) -> blob_service_pb2.UploadBlobRequest:
    """The header message declaring ``data`` (its BLAKE3 and, unless given, its size)."""
    return blob_service_pb2.UploadBlobRequest(
        header=blob_service_pb2.BlobHeader(
            blob=common_pb2.BlobRef(
                blake3=blake3.blake3(data).digest(), size=len(data) if size is None else size
            ),
            kind=kind,  # type: ignore[arg-type]
        )
    )


def upload_chunk(data: bytes) -> blob_service_pb2.UploadBlobRequest:
    """A chunk message."""
    return blob_service_pb2.UploadBlobRequest(chunk=data)


def registration(
    identity: Identity, role: int, **fields: object
) -> node_service_pb2.RegisterNodeRequest:
    """A plausible RegisterNodeRequest (``fields`` override)."""
    request = node_service_pb2.RegisterNodeRequest(
        request_id=new_request_id(),
        public_key=identity.public_key,
        role=role,  # type: ignore[arg-type]
        protocol_version=PROTOCOL_VERSION,
        software_version=software_version("conformance"),
        capabilities=node_pb2.Capabilities(environments=[]),
        hardware=node_pb2.HardwareReport(cpu_cores=2, memory_bytes=1 << 30),
    )
    for name, value in fields.items():
        if isinstance(value, Message):
            getattr(request, name).CopyFrom(value)
        else:
            setattr(request, name, value)
    return request


class Target:
    """The run's view of the coordinator under test."""

    def __init__(self, config: TargetConfig) -> None:
        self.config = config
        self.wire = Wire(config.target, tls=config.tls)
        self.coordinator_key: bytes | None = None
        self._role_peers: dict[int, Peer] = {}
        self._shared: Peer | None = None
        self._checkpoint_step: int | None = None

    async def close(self) -> None:
        await self.wire.close()

    # ---------------------------------------------------------------- nodes

    async def register(
        self, peer: Peer, request: node_service_pb2.RegisterNodeRequest | None = None
    ) -> node_service_pb2.RegisterNodeResponse:
        """Register ``peer``, waiting out a registration rate limit as its RetryInfo says (a
        per-minute limit: up to a minute, or ``max_wait`` when longer)."""
        request = request or registration(peer.identity, peer.role)
        deadline = time.monotonic() + max(self.config.max_wait, REGISTRATION_WAIT)
        while True:
            try:
                response = await peer.call(REGISTER, request, node_service_pb2.RegisterNodeResponse)
            except RollnetError as error:
                if error.reason != "RATE_LIMITED" or error.retry_after is None:
                    raise
                if time.monotonic() + error.retry_after > deadline:
                    raise Skipped(
                        f"registrations are rate-limited for {error.retry_after:.0f} s more"
                    ) from None
                await asyncio.sleep(error.retry_after)
                continue
            peer.registration = response
            if len(response.coordinator_public_key) == 32:
                self.coordinator_key = bytes(response.coordinator_public_key)
            return response

    async def worker(self, *, heartbeat: bool = True) -> Peer:
        """A new key, registered as a worker (and made ACTIVE by a heartbeat)."""
        peer = Peer(self, Identity.generate(), common_pb2.ROLE_WORKER)
        await self.register(peer)
        if heartbeat:
            await peer.heartbeat()
        return peer

    async def shared_worker(self) -> Peer:
        """A worker that cases which change nothing about it share (refusals, reads), so the
        suite registers fewer keys than the target's per-address limit allows a minute."""
        if self._shared is None:
            self._shared = await self.worker()
        elif time.monotonic() - self._shared.last_heartbeat > 1.0:
            await self._shared.heartbeat()
        return self._shared

    def key(self, role: str) -> Identity:
        """The operator-given key for ``role``, or skip the case."""
        identity = self.config.keys.get(role)
        if identity is None:
            raise Skipped(f"needs a {role} key on the target's allow-list (--keys DIR/{role}.key)")
        return identity

    async def peer(self, role: str) -> Peer:
        """The operator-given key for ``role``, registered with it (once per run)."""
        number = ROLE_NAMES[role]
        if number not in self._role_peers:
            peer = Peer(self, self.key(role), number)
            try:
                await self.register(peer)
            except RollnetError as error:
                raise CaseFailure(
                    f"the {role} key ({peer.node_id}) could not register as {role}: "
                    f"{describe(error)}"
                ) from None
            self._role_peers[number] = peer
        peer = self._role_peers[number]
        # Keep the suite's long-lived nodes ACTIVE between cases (cases do not heartbeat).
        if time.monotonic() - peer.last_heartbeat > 1.0:
            await peer.heartbeat()
        return peer

    async def coordinator_public_key(self) -> bytes:
        """The coordinator's key, as registration announced it."""
        if self.coordinator_key is None:
            await self.worker(heartbeat=False)
        if self.coordinator_key is None:
            raise CaseFailure("RegisterNodeResponse.coordinator_public_key is not 32 bytes")
        return self.coordinator_key

    # ---------------------------------------------------------------- health and restarts

    async def health(self, service: str = "") -> int:
        """Health/Check, unsigned; the status."""
        response = await self.wire.unary(
            HEALTH_CHECK,
            health_pb2.HealthCheckRequest(service=service).SerializeToString(),
            [],
            health_pb2.HealthCheckResponse,
            timeout=self.config.call_timeout,
        )
        status: int = response.status
        return status

    async def wait_serving(self) -> None:
        """Wait (up to ``max_wait``) until Health/Check answers SERVING."""
        deadline = time.monotonic() + self.config.max_wait
        last = "no answer"
        while time.monotonic() < deadline:
            try:
                if await self.health() == health_pb2.HealthCheckResponse.SERVING:
                    return
                last = "NOT_SERVING"
            except RollnetError as error:
                last = describe(error)
            await asyncio.sleep(0.1)
        raise CaseFailure(f"not SERVING within {self.config.max_wait:g} s ({last})")

    async def restart(self) -> None:
        """Restart the target through the operator's hook, then wait until it serves."""
        if self.config.restart is None:
            raise Skipped("needs a restart hook (--restart-command)")
        await self.config.restart()
        await self.wait_serving()

    # ---------------------------------------------------------------- trainer side

    async def latest_step(self, peer: Peer) -> int | None:
        """The latest published checkpoint step, ``None`` when there is none."""
        try:
            latest = await peer.call(
                LATEST,
                checkpoint_service_pb2.GetLatestCheckpointRequest(),
                checkpoint_service_pb2.GetLatestCheckpointResponse,
            )
        except RollnetError as error:
            if error.reason == "CHECKPOINT_NOT_FOUND":
                return None
            raise
        if not latest.HasField("checkpoint"):
            return None
        step: int = checkpoint_pb2.CheckpointManifest.FromString(latest.checkpoint.manifest).step
        return step

    async def manifest(
        self, trainer: Peer, step: int, *, network_id: str | None = None, path: str = "model.bin"
    ) -> tuple[bytes, bytes]:
        """Upload a one-file shard and return ``(manifest bytes, signature)`` for ``step``."""
        content = f"rollnet conformance weights, step {step}, {os.urandom(8).hex()}".encode()
        uploaded = await trainer.upload(content, blob_service_pb2.BLOB_KIND_CHECKPOINT_SHARD)
        ref = common_pb2.BlobRef(blake3=uploaded.blob.blake3, size=uploaded.blob.size)
        manifest = checkpoint_pb2.CheckpointManifest(
            step=step,
            network_id=self.config.network_id if network_id is None else network_id,
            files=[checkpoint_pb2.CheckpointFile(path=path, content=ref, shards=[ref])],
            flops_per_token=2_000_000,
        ).SerializeToString(deterministic=True)
        return manifest, trainer.identity.sign(CHECKPOINT_DOMAIN + manifest)

    async def publish(self, trainer: Peer) -> int:
        """Publish the next checkpoint step; returns it."""
        latest = await self.latest_step(trainer)
        step = 1 if latest is None else latest + 1
        manifest, signature = await self.manifest(trainer, step)
        await trainer.call(
            PUBLISH,
            checkpoint_service_pb2.PublishCheckpointRequest(
                request_id=new_request_id(), manifest=manifest, signature=signature
            ),
            checkpoint_service_pb2.PublishCheckpointResponse,
        )
        self._checkpoint_step = step
        return step

    async def checkpoint(self, trainer: Peer) -> int:
        """A published step (publishing one when the target has none)."""
        if self._checkpoint_step is None:
            latest = await self.latest_step(trainer)
            self._checkpoint_step = latest if latest is not None else await self.publish(trainer)
        return self._checkpoint_step

    def rollouts_request(
        self, count: int = 1, samples: int = 1, step: int = 0
    ) -> rollout_service_pb2.RequestRolloutsRequest:
        """A RequestRollouts for ``count`` one-prompt tasks of ``samples`` rollouts."""
        return rollout_service_pb2.RequestRolloutsRequest(
            request_id=new_request_id(),
            rollout_step=step,
            environment=self.config.environment,
            prompt_count=count,
            samples_per_prompt=samples,
            sampling=common_pb2.SamplingParams(temperature=1.0, max_new_tokens=8),
            prompts_per_task=1,
        )

    async def request_tasks(self, count: int = 1, samples: int = 1) -> list[str]:
        """Queue ``count`` tasks (a trainer's demand); their ids."""
        trainer = await self.peer("trainer")
        step = await self.checkpoint(trainer)
        created = await trainer.call(
            REQUEST_ROLLOUTS,
            self.rollouts_request(count, samples, step),
            rollout_service_pb2.RequestRolloutsResponse,
        )
        if len(created.task_ids) != count:
            raise CaseFailure(f"RequestRollouts for {count} tasks returned {created.task_ids}")
        return list(created.task_ids)

    async def lease(
        self, worker: Peer, *, queue: bool = True
    ) -> tuple[task_pb2.Task, task_pb2.Lease]:
        """Queue a task (unless ``queue`` is false) and lease one with ``worker``."""
        if queue:
            await self.request_tasks()
        pulled = await worker.pull(wait=5.0)
        if not pulled.HasField("task"):
            raise CaseFailure("a task was queued, yet PullTask (5 s) leased none")
        if not pulled.HasField("lease") or not pulled.lease.lease_id:
            raise CaseFailure("PullTask returned a task without a lease")
        return pulled.task, pulled.lease

    # ---------------------------------------------------------------- worker side

    def work(
        self,
        worker: Peer,
        task: task_pb2.Task,
        lease: task_pb2.Lease,
        *,
        rollouts: int | None = None,
        fencing_token: int | None = None,
    ) -> Work:
        """A well-formed batch for ``task`` under ``lease`` (``rollouts``: another count;
        ``fencing_token``: a batch and its commitment naming another token than the lease's)."""
        if fencing_token is not None:
            lease = task_pb2.Lease(
                lease_id=lease.lease_id,
                fencing_token=fencing_token,
                deadline=lease.deadline,
                issued_at=lease.issued_at,
            )
        binding = LeaseBinding(
            network_id=self.config.network_id,
            node_id=worker.node_id,
            task_id=task.task_id,
            lease_id=lease.lease_id,
            fencing_token=lease.fencing_token,
        )
        wanted = len(task.prompt_ids) * task.samples_per_prompt if rollouts is None else rollouts
        items = []
        for i in range(wanted):
            prompt_index, sample = divmod(i, max(task.samples_per_prompt, 1))
            prompt_index = min(prompt_index, max(len(task.prompt_ids) - 1, 0))
            items.append(
                rollout_pb2.Rollout(
                    prompt_index=prompt_index,
                    prompt_id=task.prompt_ids[prompt_index] if task.prompt_ids else 0,
                    sample_index=sample,
                    prompt_token_ids=[1, 2, 3],
                    completion_token_ids=[4, 5, 6],
                    behaviour_logprobs=[-0.5, -0.5, -0.5],
                    sampling_seed=derive_sampling_seed(binding.network_id, binding.task_id, i),
                    finish_reason=rollout_pb2.FINISH_REASON_LENGTH,
                    toploc_proof=os.urandom(258),
                )
            )
        batch = batches.encode_batch(binding, task.checkpoint_step, items)
        return Work(task=task, lease=lease, batch=batch, rollouts=items)

    def commitment(
        self,
        worker: Peer,
        work: Work,
        blob: common_pb2.BlobRef,
        *,
        fencing_token: int | None = None,
        binding_node: str | None = None,
    ) -> commitment_service_pb2.SubmitCommitmentRequest:
        """The SubmitCommitment for uploaded ``work`` (``fencing_token``, ``binding_node``:
        another token, or a binding digest computed for another node)."""
        token = work.lease.fencing_token if fencing_token is None else fencing_token
        binding = LeaseBinding(
            network_id=self.config.network_id,
            node_id=worker.node_id,
            task_id=work.task.task_id,
            lease_id=work.lease.lease_id,
            fencing_token=token,
        )
        request = batches.commitment_request(binding, blob, work.rollouts)
        request.request_id = new_request_id()
        if binding_node is not None:
            other = replace(binding, node_id=binding_node)
            request.binding_digest = batches.binding_digest(other, blob.blake3)
        return request

    async def commit(
        self, worker: Peer, work: Work
    ) -> commitment_service_pb2.SubmitCommitmentResponse:
        """Upload ``work``'s batch and commit it."""
        uploaded = await worker.upload(work.batch)
        return await worker.call(
            SUBMIT,
            self.commitment(worker, work, uploaded.blob),
            commitment_service_pb2.SubmitCommitmentResponse,
        )

    async def committed(
        self, worker: Peer
    ) -> tuple[Work, commitment_service_pb2.SubmitCommitmentResponse]:
        """Lease a new task with ``worker`` and commit work for it."""
        task, lease = await self.lease(worker)
        work = self.work(worker, task, lease)
        return work, await self.commit(worker, work)

    # ---------------------------------------------------------------- validator side

    async def job_for(
        self, validator: Peer, commitment_id: str
    ) -> validation_service_pb2.PullValidationJobResponse:
        """Pull validation jobs until the one of ``commitment_id`` (other jobs the suite left are
        judged ACCEPT on the way)."""
        for _ in range(50):
            pulled = await validator.call(
                PULL_JOB,
                validation_service_pb2.PullValidationJobRequest(
                    request_id=new_request_id(), wait=duration(5.0)
                ),
                validation_service_pb2.PullValidationJobResponse,
                timeout=5.0 + self.config.call_timeout,
            )
            if not pulled.HasField("job"):
                raise CaseFailure(
                    f"commitment {commitment_id} of an untrusted worker was not offered to the "
                    "validator within 5 s"
                )
            if pulled.job.commitment.commitment_id == commitment_id:
                return pulled
            await validator.call(
                VERDICT,
                self.verdict(pulled, accept=True),
                validation_service_pb2.SubmitVerdictResponse,
            )
        raise CaseFailure(f"no validation job for commitment {commitment_id} among 50 pulled")

    def verdict(
        self,
        pulled: validation_service_pb2.PullValidationJobResponse,
        *,
        accept: bool,
        logprobs: bool = True,
    ) -> validation_service_pb2.SubmitVerdictRequest:
        """A verdict on ``pulled``'s job: ACCEPT with rewards, work and log-probabilities shaped
        like its commitment, or REJECT."""
        job = pulled.job
        request = validation_service_pb2.SubmitVerdictRequest(
            request_id=new_request_id(),
            job_id=job.job_id,
            lease_id=pulled.lease.lease_id,
            fencing_token=pulled.lease.fencing_token,
        )
        digests = job.commitment.rollouts
        if accept:
            request.decision = validation_pb2.Verdict.DECISION_ACCEPT
            request.validated_rewards.extend(
                [common_pb2.Reward(task_reward=1.0, total=1.0)] * len(digests)
            )
            request.validated_work.CopyFrom(job.commitment.claimed_work)
            if logprobs:
                request.validated_logprobs.extend(
                    validation_pb2.ValidatedLogprobs(logprobs=[-0.5] * d.completion_tokens)
                    for d in digests
                )
        else:
            request.decision = validation_pb2.Verdict.DECISION_REJECT
            request.reject_reason = "conformance: rejected on purpose"
        return request
