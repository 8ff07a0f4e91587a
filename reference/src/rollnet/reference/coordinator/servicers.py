"""gRPC servicers of the coordinator: convert, check idempotency, delegate, map refusals.

Rules live in the domain modules (nodes, dispatch, blob_intake, commitments, verdicts,
checkpoints, ledger_reads); this module only reads the verified caller, replays stored
responses of repeated request ids, and turns a :class:`Refusal` into a rich gRPC error.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import blake3
from google.protobuf.message import Message
from grpc.aio import ServicerContext
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from rollnet.ledger import idempotency
from rollnet.ledger.enums import NodeState
from rollnet.reference.coordinator.blob_intake import BlobDesk
from rollnet.reference.coordinator.checkpoint_desk import CheckpointDesk
from rollnet.reference.coordinator.commitments import CommitmentDesk
from rollnet.reference.coordinator.context import (
    IDEMPOTENCY_SCOPE,
    CoordinatorContext,
    IdempotencyScope,
    StoredResponse,
)
from rollnet.reference.coordinator.dispatch import Dispatcher
from rollnet.reference.coordinator.ledger_reads import LedgerDesk
from rollnet.reference.coordinator.refusal import Refusal
from rollnet.reference.coordinator.registry import NodeRegistry
from rollnet.reference.coordinator.serde import ROLE_TO_DB, timestamp
from rollnet.reference.coordinator.standing import Caller
from rollnet.reference.coordinator.verdicts import VerdictDesk
from rollnet.sdk.errors import REASON_CODES, ErrorReason, abort
from rollnet.sdk.verifier import current_caller
from rollnet.v1 import (
    blob_service_pb2,
    blob_service_pb2_grpc,
    checkpoint_service_pb2,
    checkpoint_service_pb2_grpc,
    commitment_service_pb2,
    commitment_service_pb2_grpc,
    ledger_service_pb2,
    ledger_service_pb2_grpc,
    node_service_pb2,
    node_service_pb2_grpc,
    rollout_service_pb2,
    rollout_service_pb2_grpc,
    task_service_pb2,
    task_service_pb2_grpc,
    validation_service_pb2,
    validation_service_pb2_grpc,
)

Req = TypeVar("Req", bound=Message)
Resp = TypeVar("Resp", bound=Message)


def caller() -> Caller:
    """The verified caller of the current call, in domain terms."""
    verified = current_caller()
    return Caller(
        node_id=verified.node_id,
        public_key=verified.public_key,
        role=ROLE_TO_DB.get(verified.role) if verified.registered else None,  # type: ignore[call-overload]
    )


async def refuse(context: ServicerContext[Any, Any], refusal: Refusal) -> None:
    """Abort the call with ``refusal`` as a rich error."""
    await abort(
        context,
        REASON_CODES[refusal.reason],
        refusal.reason,
        refusal.message,
        field_violations=refusal.field_violations,
        retry_after=refusal.retry_after,
        metadata=refusal.metadata,
    )


def handled(
    method: Callable[[Any, Req, ServicerContext[Req, Resp]], Awaitable[Resp]],
) -> Callable[[Any, Req, ServicerContext[Req, Resp]], Awaitable[Resp]]:
    """Turn :class:`Refusal` raised by a unary handler into the matching gRPC error."""

    @functools.wraps(method)
    async def wrapper(self: Any, request: Req, context: ServicerContext[Req, Resp]) -> Resp:
        try:
            return await method(self, request, context)
        except Refusal as refusal:
            await refuse(context, refusal)
            raise  # unreachable: abort raises

    return wrapper


class Idempotency:
    """Replays the stored response of a repeated ``(caller, method, request_id)``.

    The stored value is BLAKE3(request bytes) followed by the response bytes, so a request id
    reused with a different body is told apart and refused (REQUEST_ID_REUSED).
    """

    def __init__(self, ctx: CoordinatorContext) -> None:
        self.ctx = ctx

    async def run(
        self,
        method: str,
        request: Message,
        response_type: type[Resp],
        produce: Callable[[], Awaitable[Resp]],
        *,
        changed: Callable[[Resp], bool] = lambda _response: True,
    ) -> Resp:
        """Return the stored response for a seen request id, else produce and store one.

        ``changed`` says whether a response reflects a mutation; one that does not (a pull that
        found no work) is not recorded, so the same id may be used to poll again.
        """
        request_id: str = getattr(request, "request_id", "")
        if not request_id:
            return await produce()
        who = current_caller().node_id
        digest = blake3.blake3(request.SerializeToString(deterministic=True)).digest()
        # The stored response, if any, is looked up by the call's first transaction (saving a
        # read per call). Checks made before it depend only on the request's bytes or on
        # content-addressed blobs, so a repeat passes them exactly as the original did.
        scope = IdempotencyScope(who, method, request_id, digest, response_type)
        token = IDEMPOTENCY_SCOPE.set(scope)
        try:
            response = await produce()
        except StoredResponse as replay:
            return self._replayed(replay.payload, method, request_id, digest, response_type)
        except (IntegrityError, Refusal):
            # A concurrent call with the same request id won the race: it rolled us back (its
            # record came first), or it changed what we checked (on PostgreSQL a retry waits
            # on the first call's row locks, then finds the job done or the lease closed).
            # Either way its stored answer, if it has one, is this call's answer too.
            raced = await self._lookup(who, method, request_id, digest, response_type)
            if raced is None:
                raise
            return raced
        finally:
            IDEMPOTENCY_SCOPE.reset(token)
        if not scope.stored and changed(response):
            # The response was assembled after the mutation committed: record it now. A crash
            # in between is covered by the RPC's own idempotency (see docs/protocol.md).
            payload = digest + response.SerializeToString(deterministic=True)
            now = self.ctx.clock()

            def store(session: Session) -> None:
                if idempotency.lookup(session, who, method, request_id) is None:
                    idempotency.store(session, who, method, request_id, payload, now=now)

            await self.ctx.run_in_transaction(store)
        return response

    async def _lookup(
        self, who: str, method: str, request_id: str, digest: bytes, response_type: type[Resp]
    ) -> Resp | None:
        def lookup(session: Session) -> bytes | None:
            return idempotency.lookup(session, who, method, request_id)

        stored = await self.ctx.run_read(lookup)
        if stored is None:
            return None
        return self._replayed(stored, method, request_id, digest, response_type)

    @staticmethod
    def _replayed(
        stored: bytes, method: str, request_id: str, digest: bytes, response_type: type[Resp]
    ) -> Resp:
        if stored[:32] != digest:
            raise Refusal(
                ErrorReason.REQUEST_ID_REUSED,
                f"request_id {request_id!r} was used for a different {method} request",
            )
        return response_type.FromString(stored[32:])


class _Base:
    def __init__(self, ctx: CoordinatorContext, idem: Idempotency) -> None:
        self.ctx = ctx
        self.idem = idem


class NodeServicer(_Base, node_service_pb2_grpc.NodeServiceServicer):
    """NodeService."""

    def __init__(self, ctx: CoordinatorContext, idem: Idempotency, registry: NodeRegistry) -> None:
        super().__init__(ctx, idem)
        self.registry = registry

    @handled
    async def RegisterNode(
        self,
        request: node_service_pb2.RegisterNodeRequest,
        context: ServicerContext[
            node_service_pb2.RegisterNodeRequest, node_service_pb2.RegisterNodeResponse
        ],
    ) -> node_service_pb2.RegisterNodeResponse:
        peer = context.peer() or ""
        ip = peer.rsplit(":", 1)[0] if ":" in peer else peer
        signer = current_caller().public_key
        response = await self.idem.run(
            "RegisterNode",
            request,
            node_service_pb2.RegisterNodeResponse,
            lambda: self.registry.register(signer, ip, request),
        )
        # A clock reading, not part of the answer: a retry measures its offset afresh.
        response.server_time.CopyFrom(timestamp(self.ctx.clock()))
        return response

    @handled
    async def Heartbeat(
        self,
        request: node_service_pb2.HeartbeatRequest,
        context: ServicerContext[
            node_service_pb2.HeartbeatRequest, node_service_pb2.HeartbeatResponse
        ],
    ) -> node_service_pb2.HeartbeatResponse:
        return await self.registry.heartbeat(caller(), request)

    @handled
    async def DeregisterNode(
        self,
        request: node_service_pb2.DeregisterNodeRequest,
        context: ServicerContext[
            node_service_pb2.DeregisterNodeRequest, node_service_pb2.DeregisterNodeResponse
        ],
    ) -> node_service_pb2.DeregisterNodeResponse:
        return await self.idem.run(
            "DeregisterNode",
            request,
            node_service_pb2.DeregisterNodeResponse,
            lambda: self.registry.deregister(caller(), request),
        )

    @handled
    async def GetNode(
        self,
        request: node_service_pb2.GetNodeRequest,
        context: ServicerContext[node_service_pb2.GetNodeRequest, node_service_pb2.GetNodeResponse],
    ) -> node_service_pb2.GetNodeResponse:
        return node_service_pb2.GetNodeResponse(
            node=await self.registry.get(caller(), request.node_id)
        )

    @handled
    async def ListNodes(
        self,
        request: node_service_pb2.ListNodesRequest,
        context: ServicerContext[
            node_service_pb2.ListNodesRequest, node_service_pb2.ListNodesResponse
        ],
    ) -> node_service_pb2.ListNodesResponse:
        return await self.registry.list(request)

    @handled
    async def EjectNode(
        self,
        request: node_service_pb2.EjectNodeRequest,
        context: ServicerContext[
            node_service_pb2.EjectNodeRequest, node_service_pb2.EjectNodeResponse
        ],
    ) -> node_service_pb2.EjectNodeResponse:
        async def produce() -> node_service_pb2.EjectNodeResponse:
            node = await self.registry.remove(
                caller(), request.node_id, request.reason, NodeState.EJECTED
            )
            return node_service_pb2.EjectNodeResponse(node=node)

        return await self.idem.run(
            "EjectNode", request, node_service_pb2.EjectNodeResponse, produce
        )

    @handled
    async def BanNode(
        self,
        request: node_service_pb2.BanNodeRequest,
        context: ServicerContext[node_service_pb2.BanNodeRequest, node_service_pb2.BanNodeResponse],
    ) -> node_service_pb2.BanNodeResponse:
        async def produce() -> node_service_pb2.BanNodeResponse:
            node = await self.registry.remove(
                caller(), request.node_id, request.reason, NodeState.BANNED
            )
            return node_service_pb2.BanNodeResponse(node=node)

        return await self.idem.run("BanNode", request, node_service_pb2.BanNodeResponse, produce)

    @handled
    async def ReinstateNode(
        self,
        request: node_service_pb2.ReinstateNodeRequest,
        context: ServicerContext[
            node_service_pb2.ReinstateNodeRequest, node_service_pb2.ReinstateNodeResponse
        ],
    ) -> node_service_pb2.ReinstateNodeResponse:
        async def produce() -> node_service_pb2.ReinstateNodeResponse:
            node = await self.registry.reinstate(request.node_id, request.reason)
            return node_service_pb2.ReinstateNodeResponse(node=node)

        return await self.idem.run(
            "ReinstateNode", request, node_service_pb2.ReinstateNodeResponse, produce
        )


class TaskServicer(_Base, task_service_pb2_grpc.TaskServiceServicer):
    """TaskService."""

    def __init__(self, ctx: CoordinatorContext, idem: Idempotency, dispatcher: Dispatcher) -> None:
        super().__init__(ctx, idem)
        self.dispatcher = dispatcher

    @handled
    async def PullTask(
        self,
        request: task_service_pb2.PullTaskRequest,
        context: ServicerContext[
            task_service_pb2.PullTaskRequest, task_service_pb2.PullTaskResponse
        ],
    ) -> task_service_pb2.PullTaskResponse:
        async def produce() -> task_service_pb2.PullTaskResponse:
            return await self.dispatcher.pull(caller(), request)

        return await self.idem.run(
            "PullTask",
            request,
            task_service_pb2.PullTaskResponse,
            produce,
            changed=lambda response: response.HasField("lease"),
        )

    @handled
    async def ReportProgress(
        self,
        request: task_service_pb2.ReportProgressRequest,
        context: ServicerContext[
            task_service_pb2.ReportProgressRequest, task_service_pb2.ReportProgressResponse
        ],
    ) -> task_service_pb2.ReportProgressResponse:
        return await self.dispatcher.report_progress(caller(), request)

    @handled
    async def FailTask(
        self,
        request: task_service_pb2.FailTaskRequest,
        context: ServicerContext[
            task_service_pb2.FailTaskRequest, task_service_pb2.FailTaskResponse
        ],
    ) -> task_service_pb2.FailTaskResponse:
        return await self.idem.run(
            "FailTask",
            request,
            task_service_pb2.FailTaskResponse,
            lambda: self.dispatcher.fail(caller(), request),
        )


class BlobServicer(_Base, blob_service_pb2_grpc.BlobServiceServicer):
    """BlobService."""

    def __init__(self, ctx: CoordinatorContext, idem: Idempotency, desk: BlobDesk) -> None:
        super().__init__(ctx, idem)
        self.desk = desk

    async def UploadBlob(
        self,
        request_iterator: AsyncIterator[blob_service_pb2.UploadBlobRequest],
        context: ServicerContext[
            blob_service_pb2.UploadBlobRequest, blob_service_pb2.UploadBlobResponse
        ],
    ) -> blob_service_pb2.UploadBlobResponse:
        try:
            first = await anext(aiter(request_iterator), None)
            if first is None or first.WhichOneof("part") != "header":
                raise Refusal(ErrorReason.BLOB_HEADER_INVALID, "the first message must be a header")

            async def chunks() -> AsyncIterator[bytes]:
                async for message in request_iterator:
                    if message.WhichOneof("part") != "chunk":
                        raise Refusal(
                            ErrorReason.BLOB_HEADER_INVALID, "only the first message is a header"
                        )
                    yield message.chunk

            return await self.desk.upload(caller(), first.header, chunks())
        except Refusal as refusal:
            await refuse(context, refusal)
            raise

    async def GetBlob(
        self,
        request: blob_service_pb2.GetBlobRequest,
        context: ServicerContext[blob_service_pb2.GetBlobRequest, blob_service_pb2.GetBlobResponse],
    ) -> AsyncIterator[blob_service_pb2.GetBlobResponse]:
        try:
            async for chunk in self.desk.download(request):
                yield chunk
        except Refusal as refusal:
            await refuse(context, refusal)


class CommitmentServicer(_Base, commitment_service_pb2_grpc.CommitmentServiceServicer):
    """CommitmentService."""

    def __init__(self, ctx: CoordinatorContext, idem: Idempotency, desk: CommitmentDesk) -> None:
        super().__init__(ctx, idem)
        self.desk = desk

    @handled
    async def SubmitCommitment(
        self,
        request: commitment_service_pb2.SubmitCommitmentRequest,
        context: ServicerContext[
            commitment_service_pb2.SubmitCommitmentRequest,
            commitment_service_pb2.SubmitCommitmentResponse,
        ],
    ) -> commitment_service_pb2.SubmitCommitmentResponse:
        return await self.idem.run(
            "SubmitCommitment",
            request,
            commitment_service_pb2.SubmitCommitmentResponse,
            lambda: self.desk.submit(caller(), request),
        )

    @handled
    async def GetCommitment(
        self,
        request: commitment_service_pb2.GetCommitmentRequest,
        context: ServicerContext[
            commitment_service_pb2.GetCommitmentRequest,
            commitment_service_pb2.GetCommitmentResponse,
        ],
    ) -> commitment_service_pb2.GetCommitmentResponse:
        return await self.desk.get_commitment(caller(), request.commitment_id)


class ValidationServicer(_Base, validation_service_pb2_grpc.ValidationServiceServicer):
    """ValidationService."""

    def __init__(self, ctx: CoordinatorContext, idem: Idempotency, desk: VerdictDesk) -> None:
        super().__init__(ctx, idem)
        self.desk = desk

    @handled
    async def PullValidationJob(
        self,
        request: validation_service_pb2.PullValidationJobRequest,
        context: ServicerContext[
            validation_service_pb2.PullValidationJobRequest,
            validation_service_pb2.PullValidationJobResponse,
        ],
    ) -> validation_service_pb2.PullValidationJobResponse:
        return await self.idem.run(
            "PullValidationJob",
            request,
            validation_service_pb2.PullValidationJobResponse,
            lambda: self.desk.pull_job(caller(), request),
            changed=lambda response: response.HasField("lease"),
        )

    @handled
    async def SubmitVerdict(
        self,
        request: validation_service_pb2.SubmitVerdictRequest,
        context: ServicerContext[
            validation_service_pb2.SubmitVerdictRequest,
            validation_service_pb2.SubmitVerdictResponse,
        ],
    ) -> validation_service_pb2.SubmitVerdictResponse:
        return await self.idem.run(
            "SubmitVerdict",
            request,
            validation_service_pb2.SubmitVerdictResponse,
            lambda: self.desk.submit_verdict(caller(), request),
        )


class CheckpointServicer(_Base, checkpoint_service_pb2_grpc.CheckpointServiceServicer):
    """CheckpointService."""

    def __init__(self, ctx: CoordinatorContext, idem: Idempotency, desk: CheckpointDesk) -> None:
        super().__init__(ctx, idem)
        self.desk = desk

    @handled
    async def PublishCheckpoint(
        self,
        request: checkpoint_service_pb2.PublishCheckpointRequest,
        context: ServicerContext[
            checkpoint_service_pb2.PublishCheckpointRequest,
            checkpoint_service_pb2.PublishCheckpointResponse,
        ],
    ) -> checkpoint_service_pb2.PublishCheckpointResponse:
        return await self.idem.run(
            "PublishCheckpoint",
            request,
            checkpoint_service_pb2.PublishCheckpointResponse,
            lambda: self.desk.publish(caller(), request),
        )

    @handled
    async def GetLatestCheckpoint(
        self,
        request: checkpoint_service_pb2.GetLatestCheckpointRequest,
        context: ServicerContext[
            checkpoint_service_pb2.GetLatestCheckpointRequest,
            checkpoint_service_pb2.GetLatestCheckpointResponse,
        ],
    ) -> checkpoint_service_pb2.GetLatestCheckpointResponse:
        latest = await self.desk.latest()
        response = checkpoint_service_pb2.GetLatestCheckpointResponse()
        if latest is not None:
            response.checkpoint.CopyFrom(latest)
        return response

    @handled
    async def GetCheckpoint(
        self,
        request: checkpoint_service_pb2.GetCheckpointRequest,
        context: ServicerContext[
            checkpoint_service_pb2.GetCheckpointRequest,
            checkpoint_service_pb2.GetCheckpointResponse,
        ],
    ) -> checkpoint_service_pb2.GetCheckpointResponse:
        return checkpoint_service_pb2.GetCheckpointResponse(
            checkpoint=await self.desk.get(request.step)
        )

    async def WatchCheckpoints(
        self,
        request: checkpoint_service_pb2.WatchCheckpointsRequest,
        context: ServicerContext[
            checkpoint_service_pb2.WatchCheckpointsRequest,
            checkpoint_service_pb2.WatchCheckpointsResponse,
        ],
    ) -> AsyncIterator[checkpoint_service_pb2.WatchCheckpointsResponse]:
        async for checkpoint in self.desk.watch(request.after_step):
            yield checkpoint_service_pb2.WatchCheckpointsResponse(checkpoint=checkpoint)


class RolloutServicer(_Base, rollout_service_pb2_grpc.RolloutServiceServicer):
    """RolloutService."""

    def __init__(
        self, ctx: CoordinatorContext, idem: Idempotency, dispatcher: Dispatcher, ledger: LedgerDesk
    ) -> None:
        super().__init__(ctx, idem)
        self.dispatcher = dispatcher
        self.ledger = ledger

    @handled
    async def RequestRollouts(
        self,
        request: rollout_service_pb2.RequestRolloutsRequest,
        context: ServicerContext[
            rollout_service_pb2.RequestRolloutsRequest, rollout_service_pb2.RequestRolloutsResponse
        ],
    ) -> rollout_service_pb2.RequestRolloutsResponse:
        return await self.idem.run(
            "RequestRollouts",
            request,
            rollout_service_pb2.RequestRolloutsResponse,
            lambda: self.dispatcher.request_rollouts(caller(), request),
        )

    async def StreamRollouts(
        self,
        request: rollout_service_pb2.StreamRolloutsRequest,
        context: ServicerContext[
            rollout_service_pb2.StreamRolloutsRequest, rollout_service_pb2.StreamRolloutsResponse
        ],
    ) -> AsyncIterator[rollout_service_pb2.StreamRolloutsResponse]:
        async for rollout in self.ledger.accepted_rollouts(
            request.after_sequence, request.min_checkpoint_step
        ):
            yield rollout_service_pb2.StreamRolloutsResponse(rollout=rollout)


class LedgerServicer(_Base, ledger_service_pb2_grpc.LedgerServiceServicer):
    """LedgerService."""

    def __init__(self, ctx: CoordinatorContext, idem: Idempotency, desk: LedgerDesk) -> None:
        super().__init__(ctx, idem)
        self.desk = desk

    @handled
    async def ListEntries(
        self,
        request: ledger_service_pb2.ListEntriesRequest,
        context: ServicerContext[
            ledger_service_pb2.ListEntriesRequest, ledger_service_pb2.ListEntriesResponse
        ],
    ) -> ledger_service_pb2.ListEntriesResponse:
        return await self.desk.list_entries(request)

    @handled
    async def GetBalance(
        self,
        request: ledger_service_pb2.GetBalanceRequest,
        context: ServicerContext[
            ledger_service_pb2.GetBalanceRequest, ledger_service_pb2.GetBalanceResponse
        ],
    ) -> ledger_service_pb2.GetBalanceResponse:
        return await self.desk.balance(request.node_id or caller().node_id)

    @handled
    async def GetChainHead(
        self,
        request: ledger_service_pb2.GetChainHeadRequest,
        context: ServicerContext[
            ledger_service_pb2.GetChainHeadRequest, ledger_service_pb2.GetChainHeadResponse
        ],
    ) -> ledger_service_pb2.GetChainHeadResponse:
        return await self.desk.chain_head(fresh=request.fresh)
