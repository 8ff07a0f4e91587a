"""A coordinator to fuzz and the judge of its answers.

:func:`start_swarm` starts a real coordinator (port 0) in a :class:`~conftest.LoopThread`, then
does what a swarm does through the conformance suite's over-the-wire helpers (register every
role, publish a checkpoint, queue tasks, lease, upload, commit, lease the validation job), so the
fuzz requests can name objects that exist. :class:`Swarm` makes raw calls with a blocking gRPC
channel: any bytes, signed with the SDK's signing code (or deliberately not), and
:func:`judge` checks the answer against the error rules of docs/protocol.md.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import grpc
from fuzz_testing import NETWORK, LoopThread
from google.protobuf import descriptor_pool, message_factory
from google.protobuf.descriptor import MethodDescriptor
from google.protobuf.message import DecodeError, Message
from grpc_health.v1 import health_pb2
from wire_strategies import Pools

from rollnet.reference.coordinator.config import load_config, with_overrides
from rollnet.reference.coordinator.server import Coordinator, start_coordinator
from rollnet.sdk.conformance.suite import CaseFailure
from rollnet.sdk.conformance.target import (
    HEALTH_CHECK,
    Peer,
    Target,
    TargetConfig,
    new_request_id,
    registration,
    upload_chunk,
    upload_header,
)
from rollnet.sdk.conformance.wire import Tamper, check_details, signing_headers
from rollnet.sdk.errors import RollnetError, from_rpc_error
from rollnet.sdk.identity import Identity
from rollnet.sdk.methods import ALL_METHODS, ROLE_TABLE
from rollnet.v1 import (
    blob_service_pb2,
    checkpoint_service_pb2,
    commitment_service_pb2,
    common_pb2,
    ledger_service_pb2,
    node_service_pb2,
    rollout_service_pb2,
    task_service_pb2,
    validation_service_pb2,
)

#: The coordinator's message cap here: small, so an oversized message is cheap to send.
MESSAGE_CAP = 256 * 1024
#: Calls that may rightly wait for something to happen (long polls, watches): a client
#: deadline on them is the client's choice, not a hang.
WAITING = frozenset(
    {
        "/rollnet.v1.TaskService/PullTask",
        "/rollnet.v1.ValidationService/PullValidationJob",
        "/rollnet.v1.CheckpointService/WatchCheckpoints",
        "/rollnet.v1.RolloutService/StreamRollouts",
    }
)
WAITING_TIMEOUT = 0.3
#: Long enough for any honest answer on a loaded two-core machine; past it, a call hangs.
CALL_TIMEOUT = 20.0
_C = grpc.StatusCode


def methods() -> dict[str, MethodDescriptor]:
    """Every RPC of protocol v1 by full path (``ALL_METHODS``, which the SDK takes from the
    generated service descriptors), with its descriptor."""
    pool = descriptor_pool.Default()
    found = {}
    for path in ALL_METHODS:
        service, name = path.strip("/").split("/")
        found[path] = pool.FindServiceByName(service).methods_by_name[name]
    return found


@dataclass
class Swarm:
    """A running coordinator, the nodes registered with it and what they made."""

    loop: LoopThread
    coordinator: Coordinator
    target: Target
    peers: dict[int, Peer]
    """A registered node per role (a worker holding a live lease among them)."""
    bases: Mapping[str, Callable[[Identity], Sequence[Message]]]
    """Per RPC: honest request messages (a stream's whole list) for a caller's key."""
    pools: Pools
    channel: grpc.Channel = field(init=False)

    def __post_init__(self) -> None:
        options = [
            ("grpc.max_send_message_length", 64 << 20),
            ("grpc.max_receive_message_length", 64 << 20),
            ("grpc.enable_retries", 0),
        ]
        self.channel = grpc.insecure_channel(self.coordinator.address, options=options)

    def close(self) -> None:
        self.channel.close()
        self.loop.run(self.target.close())
        self.loop.run(self.coordinator.stop(grace=0.5))

    def call(
        self,
        method: MethodDescriptor,
        path: str,
        bodies: Sequence[bytes],
        headers: Sequence[tuple[str, str]],
    ) -> RollnetError | None:
        """One raw call of ``path``; the refusal (``None`` when answered)."""
        timeout = WAITING_TIMEOUT if path in WAITING else CALL_TIMEOUT
        metadata = tuple(headers)
        try:
            if method.client_streaming:
                upload: grpc.StreamUnaryMultiCallable[bytes, bytes] = self.channel.stream_unary(
                    path
                )
                upload(iter(bodies), metadata=metadata, timeout=timeout)
            elif method.server_streaming:
                streams: grpc.UnaryStreamMultiCallable[bytes, bytes] = self.channel.unary_stream(
                    path
                )
                stream = streams(bodies[0], metadata=metadata, timeout=timeout)
                for count, _ in enumerate(stream):
                    if count >= 2:
                        stream.cancel()
                        break
            else:
                unary: grpc.UnaryUnaryMultiCallable[bytes, bytes] = self.channel.unary_unary(path)
                unary(bodies[0], metadata=metadata, timeout=timeout)
        except grpc.RpcError as error:
            return from_rpc_error(error)
        return None

    def serving(self) -> None:
        """The coordinator still answers: Health/Check says SERVING."""
        check = self.channel.unary_unary(
            HEALTH_CHECK,
            request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
            response_deserializer=health_pb2.HealthCheckResponse.FromString,
        )
        answer = check(health_pb2.HealthCheckRequest(), timeout=CALL_TIMEOUT)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING

    def headers(
        self, identity: Identity, path: str, body: bytes, tamper: Tamper | None = None
    ) -> list[tuple[str, str]]:
        """The SDK's signing headers of one call."""
        return signing_headers(identity, NETWORK, path, body, tamper)


def parses(method: MethodDescriptor, bodies: Sequence[bytes]) -> bool:
    """Whether every request message parses (then a refusal must name the field it blames)."""
    request_type: type[Message] = _message_class(method)
    try:
        for body in bodies:
            request_type.FromString(body)
    except DecodeError:
        return False
    return True


def _message_class(method: MethodDescriptor) -> type[Message]:
    return message_factory.GetMessageClass(method.input_type)


def judge(path: str, error: RollnetError | None, *, parsed: bool, oversized: bool) -> None:
    """The protocol's rules for one answer: never INTERNAL or UNKNOWN; a refusal carries a
    ``google.rpc.Status`` with one ``ErrorInfo`` (and a field violation with INVALID_FIELDS when
    the message parsed); DEADLINE_EXCEEDED only on calls that wait; gRPC's own size cut-off
    (no details) only for a message above the cap."""
    if error is None:
        return
    if error.code is _C.DEADLINE_EXCEEDED and path in WAITING:
        return
    if error.code is _C.CANCELLED and error.status is None:
        return  # a stream we cancelled after its first answers
    if (
        error.code is _C.RESOURCE_EXHAUSTED
        and error.status is None
        and oversized
        and "larger than max" in error.message
    ):
        return
    try:
        check_details(error, violations=parsed)
    except CaseFailure as failure:
        raise AssertionError(
            f"{path}: {failure} ({error.code.name}: {error.message[:300]})"
        ) from None
    if error.code is _C.DEADLINE_EXCEEDED:
        raise AssertionError(f"{path} did not answer within {CALL_TIMEOUT} s")


def allowed_roles(path: str) -> list[int]:
    return sorted(ROLE_TABLE[path])


async def start_swarm(loop: LoopThread, database_url: str, data_dir: Path) -> Swarm:
    """Start the coordinator and bring a small swarm's objects into being (runs on ``loop``)."""
    keys = {role: Identity.generate() for role in ("validator", "trainer", "operator")}
    config = with_overrides(
        load_config(data_dir / "coordinator"),
        database_url=database_url,
        listen="127.0.0.1:0",
        network_id=NETWORK,
        validators=frozenset({keys["validator"].node_id}),
        trainers=frozenset({keys["trainer"].node_id}),
        operators=frozenset({keys["operator"].node_id}),
        max_message_bytes=MESSAGE_CAP,
        lease_duration=timedelta(seconds=600),
        # Limits hold elsewhere (tests/coordinator); here they would only hide the handlers.
        registrations_per_ip_per_minute=1_000_000,
        rate_limit_per_key=1_000_000.0,
        rate_burst_per_key=1_000_000,
        max_leases_per_node=256,
    )
    coordinator = await start_coordinator(config)
    target = Target(
        TargetConfig(
            target=coordinator.address,
            network_id=NETWORK,
            keys=keys,
            max_message_bytes=MESSAGE_CAP,
            call_timeout=CALL_TIMEOUT,
        )
    )
    worker = await target.worker()
    trainer = await target.peer("trainer")
    validator = await target.peer("validator")
    operator = await target.peer("operator")
    relay = Peer(target, Identity.generate(), common_pb2.ROLE_RELAY)
    await target.register(relay)
    work, committed = await target.committed(worker)
    job = await target.job_for(validator, committed.commitment.commitment_id)
    task, lease = await target.lease(worker)
    bystander = await target.worker()
    step = work.task.checkpoint_step
    manifest, signature = await target.manifest(trainer, step + 1)
    batch_ref = committed.commitment.rollout_batch
    live_work = target.work(worker, task, lease)
    live_blob = (await worker.upload(live_work.batch)).blob
    submit = target.commitment(worker, live_work, live_blob)
    verdict = target.verdict(job, accept=True)

    peers: dict[int, Peer] = {
        common_pb2.ROLE_WORKER: worker,
        common_pb2.ROLE_VALIDATOR: validator,
        common_pb2.ROLE_TRAINER: trainer,
        common_pb2.ROLE_OPERATOR: operator,
        common_pb2.ROLE_RELAY: relay,
    }
    # Not the swarm's own nodes: an operator call drawing one would ban or eject it.
    node_ids = [bystander.node_id, Identity.generate().node_id]
    pools = Pools(
        strings=[
            *node_ids,
            work.task.task_id,
            task.task_id,
            work.lease.lease_id,
            lease.lease_id,
            committed.commitment.commitment_id,
            job.job.job_id,
            job.lease.lease_id,
            "arithmetic",
            NETWORK,
            new_request_id(),
        ],
        blobs=[
            batch_ref.blake3,
            live_blob.blake3,
            submit.binding_digest,
            worker.identity.public_key,
            manifest,
            signature,
        ],
        numbers=[lease.fencing_token, job.lease.fencing_token, step, batch_ref.size, 0, 1],
    )
    sample = b"fuzz blob " + os.urandom(16)

    def one(message: Message) -> Callable[[Identity], Sequence[Message]]:
        return lambda _caller: [message]

    bases: dict[str, Callable[[Identity], Sequence[Message]]] = {
        "/rollnet.v1.NodeService/RegisterNode": lambda caller: [
            registration(caller, common_pb2.ROLE_WORKER)
        ],
        "/rollnet.v1.NodeService/Heartbeat": one(
            node_service_pb2.HeartbeatRequest(
                activity=node_service_pb2.ACTIVITY_BUSY, held_lease_ids=[lease.lease_id]
            )
        ),
        "/rollnet.v1.NodeService/DeregisterNode": one(
            node_service_pb2.DeregisterNodeRequest(request_id=new_request_id(), reason="fuzz")
        ),
        "/rollnet.v1.NodeService/GetNode": one(
            node_service_pb2.GetNodeRequest(node_id=worker.node_id)
        ),
        "/rollnet.v1.NodeService/ListNodes": one(node_service_pb2.ListNodesRequest(page_size=5)),
        "/rollnet.v1.NodeService/EjectNode": one(
            node_service_pb2.EjectNodeRequest(
                request_id=new_request_id(), node_id=bystander.node_id, reason="fuzz"
            )
        ),
        "/rollnet.v1.NodeService/BanNode": one(
            node_service_pb2.BanNodeRequest(
                request_id=new_request_id(), node_id=bystander.node_id, reason="fuzz"
            )
        ),
        "/rollnet.v1.NodeService/ReinstateNode": one(
            node_service_pb2.ReinstateNodeRequest(
                request_id=new_request_id(), node_id=bystander.node_id, reason="fuzz"
            )
        ),
        "/rollnet.v1.TaskService/PullTask": one(
            task_service_pb2.PullTaskRequest(request_id=new_request_id())
        ),
        "/rollnet.v1.TaskService/ReportProgress": one(
            task_service_pb2.ReportProgressRequest(
                lease_id=lease.lease_id,
                fencing_token=lease.fencing_token,
                completed_rollouts=1,
                total_rollouts=2,
            )
        ),
        "/rollnet.v1.TaskService/FailTask": one(
            task_service_pb2.FailTaskRequest(
                request_id=new_request_id(),
                lease_id=lease.lease_id,
                fencing_token=lease.fencing_token,
                reason=task_service_pb2.FAIL_REASON_DEADLINE,
                message="fuzz",
            )
        ),
        "/rollnet.v1.BlobService/UploadBlob": lambda _caller: [
            upload_header(sample),
            upload_chunk(sample),
        ],
        "/rollnet.v1.BlobService/GetBlob": one(
            blob_service_pb2.GetBlobRequest(blake3=batch_ref.blake3, offset=1, length=10)
        ),
        "/rollnet.v1.CommitmentService/SubmitCommitment": one(submit),
        "/rollnet.v1.CommitmentService/GetCommitment": one(
            commitment_service_pb2.GetCommitmentRequest(
                commitment_id=committed.commitment.commitment_id
            )
        ),
        "/rollnet.v1.ValidationService/PullValidationJob": one(
            validation_service_pb2.PullValidationJobRequest(request_id=new_request_id())
        ),
        "/rollnet.v1.ValidationService/SubmitVerdict": one(verdict),
        "/rollnet.v1.CheckpointService/PublishCheckpoint": one(
            checkpoint_service_pb2.PublishCheckpointRequest(
                request_id=new_request_id(), manifest=manifest, signature=signature
            )
        ),
        "/rollnet.v1.CheckpointService/GetLatestCheckpoint": one(
            checkpoint_service_pb2.GetLatestCheckpointRequest()
        ),
        "/rollnet.v1.CheckpointService/GetCheckpoint": one(
            checkpoint_service_pb2.GetCheckpointRequest(step=step)
        ),
        "/rollnet.v1.CheckpointService/WatchCheckpoints": one(
            checkpoint_service_pb2.WatchCheckpointsRequest(after_step=0)
        ),
        "/rollnet.v1.RolloutService/RequestRollouts": one(target.rollouts_request(1, 1, step)),
        "/rollnet.v1.RolloutService/StreamRollouts": one(
            rollout_service_pb2.StreamRolloutsRequest()
        ),
        "/rollnet.v1.LedgerService/ListEntries": one(
            ledger_service_pb2.ListEntriesRequest(page_size=3)
        ),
        "/rollnet.v1.LedgerService/GetBalance": one(
            ledger_service_pb2.GetBalanceRequest(node_id=worker.node_id)
        ),
        "/rollnet.v1.LedgerService/GetChainHead": one(ledger_service_pb2.GetChainHeadRequest()),
    }
    return Swarm(loop, coordinator, target, peers, bases, pools)
