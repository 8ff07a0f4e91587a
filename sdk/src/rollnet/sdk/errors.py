"""Rich errors on the wire and typed exceptions in the client.

Every error a rollnet server returns carries a ``google.rpc.Status`` in the trailing metadata key
``grpc-status-details-bin``. Its details hold one ``google.rpc.ErrorInfo`` (domain ``rollnet``,
``reason`` = an :class:`ErrorReason` value, free-form string metadata), a ``google.rpc.BadRequest``
with field violations when the input was invalid, and a ``google.rpc.RetryInfo`` when the client
should come back later. Servers raise such errors with :func:`abort`; clients turn a failed call
into a :class:`RollnetError` subclass with :func:`from_rpc_error`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2

ERROR_DOMAIN = "rollnet"
"""The ``ErrorInfo.domain`` of every error a rollnet server raises."""

STATUS_DETAILS_KEY = "grpc-status-details-bin"
"""Trailing metadata key holding the serialized ``google.rpc.Status``."""


class ErrorReason(enum.StrEnum):
    """Why a server refused a call: ``rollnet.v1.ErrorReason`` without its ``ERROR_REASON_`` prefix.

    The value is what travels in ``google.rpc.ErrorInfo.reason``.
    """

    SIGNATURE_MISSING = "SIGNATURE_MISSING"
    SIGNATURE_MALFORMED = "SIGNATURE_MALFORMED"
    SIGNATURE_INVALID = "SIGNATURE_INVALID"
    BODY_HASH_MISMATCH = "BODY_HASH_MISMATCH"
    TIMESTAMP_SKEW = "TIMESTAMP_SKEW"
    NONCE_REPLAYED = "NONCE_REPLAYED"
    AUDIENCE_MISMATCH = "AUDIENCE_MISMATCH"
    UNKNOWN_KEY = "UNKNOWN_KEY"
    ROLE_NOT_ALLOWED = "ROLE_NOT_ALLOWED"
    NODE_BANNED = "NODE_BANNED"
    NODE_EJECTED = "NODE_EJECTED"
    NODE_DEREGISTERED = "NODE_DEREGISTERED"
    PROTOCOL_VERSION_UNSUPPORTED = "PROTOCOL_VERSION_UNSUPPORTED"
    INVITE_TOKEN_INVALID = "INVITE_TOKEN_INVALID"
    ROLE_NOT_PERMITTED = "ROLE_NOT_PERMITTED"
    HARDWARE_CLAIM_IMPLAUSIBLE = "HARDWARE_CLAIM_IMPLAUSIBLE"
    KEY_MISMATCH = "KEY_MISMATCH"
    ROLE_CONFLICT = "ROLE_CONFLICT"
    COMPUTE_DTYPE_UNSUPPORTED = "COMPUTE_DTYPE_UNSUPPORTED"
    INVALID_FIELDS = "INVALID_FIELDS"
    RATE_LIMITED = "RATE_LIMITED"
    MESSAGE_TOO_LARGE = "MESSAGE_TOO_LARGE"
    REQUEST_ID_REUSED = "REQUEST_ID_REUSED"
    NODE_NOT_FOUND = "NODE_NOT_FOUND"
    NOT_SERVING = "NOT_SERVING"
    LEASE_NOT_FOUND = "LEASE_NOT_FOUND"
    LEASE_EXPIRED = "LEASE_EXPIRED"
    FENCING_TOKEN_STALE = "FENCING_TOKEN_STALE"
    CONCURRENCY_LIMIT = "CONCURRENCY_LIMIT"
    LEASE_CLOSED = "LEASE_CLOSED"
    BLOB_TOO_LARGE = "BLOB_TOO_LARGE"
    BLOB_HASH_MISMATCH = "BLOB_HASH_MISMATCH"
    BLOB_SIZE_MISMATCH = "BLOB_SIZE_MISMATCH"
    BLOB_NOT_FOUND = "BLOB_NOT_FOUND"
    BLOB_HEADER_INVALID = "BLOB_HEADER_INVALID"
    UPLOAD_QUOTA_EXCEEDED = "UPLOAD_QUOTA_EXCEEDED"
    STORAGE_FULL = "STORAGE_FULL"
    COMMITMENT_BINDING_INVALID = "COMMITMENT_BINDING_INVALID"
    ROLLOUT_BATCH_INVALID = "ROLLOUT_BATCH_INVALID"
    COMMITMENT_NOT_FOUND = "COMMITMENT_NOT_FOUND"
    ROLLOUT_DUPLICATE = "ROLLOUT_DUPLICATE"
    JOB_NOT_FOUND = "JOB_NOT_FOUND"
    VERDICT_ALREADY_RECORDED = "VERDICT_ALREADY_RECORDED"
    CHECKPOINT_SIGNATURE_INVALID = "CHECKPOINT_SIGNATURE_INVALID"
    CHECKPOINT_STEP_NOT_MONOTONIC = "CHECKPOINT_STEP_NOT_MONOTONIC"
    CHECKPOINT_NOT_FOUND = "CHECKPOINT_NOT_FOUND"
    CHECKPOINT_SHARD_MISSING = "CHECKPOINT_SHARD_MISSING"


_C = grpc.StatusCode
_R = ErrorReason

REASON_CODES: Mapping[ErrorReason, grpc.StatusCode] = {
    _R.SIGNATURE_MISSING: _C.UNAUTHENTICATED,
    _R.SIGNATURE_MALFORMED: _C.UNAUTHENTICATED,
    _R.SIGNATURE_INVALID: _C.UNAUTHENTICATED,
    _R.BODY_HASH_MISMATCH: _C.UNAUTHENTICATED,
    _R.TIMESTAMP_SKEW: _C.UNAUTHENTICATED,
    _R.NONCE_REPLAYED: _C.UNAUTHENTICATED,
    _R.AUDIENCE_MISMATCH: _C.UNAUTHENTICATED,
    _R.UNKNOWN_KEY: _C.UNAUTHENTICATED,
    _R.ROLE_NOT_ALLOWED: _C.PERMISSION_DENIED,
    _R.NODE_BANNED: _C.PERMISSION_DENIED,
    _R.NODE_EJECTED: _C.PERMISSION_DENIED,
    _R.NODE_DEREGISTERED: _C.FAILED_PRECONDITION,
    _R.PROTOCOL_VERSION_UNSUPPORTED: _C.FAILED_PRECONDITION,
    _R.INVITE_TOKEN_INVALID: _C.PERMISSION_DENIED,
    _R.ROLE_NOT_PERMITTED: _C.PERMISSION_DENIED,
    _R.HARDWARE_CLAIM_IMPLAUSIBLE: _C.INVALID_ARGUMENT,
    _R.KEY_MISMATCH: _C.INVALID_ARGUMENT,
    _R.ROLE_CONFLICT: _C.FAILED_PRECONDITION,
    _R.COMPUTE_DTYPE_UNSUPPORTED: _C.FAILED_PRECONDITION,
    _R.INVALID_FIELDS: _C.INVALID_ARGUMENT,
    _R.RATE_LIMITED: _C.RESOURCE_EXHAUSTED,
    _R.MESSAGE_TOO_LARGE: _C.RESOURCE_EXHAUSTED,
    _R.REQUEST_ID_REUSED: _C.FAILED_PRECONDITION,
    _R.NODE_NOT_FOUND: _C.NOT_FOUND,
    _R.NOT_SERVING: _C.UNAVAILABLE,
    _R.LEASE_NOT_FOUND: _C.NOT_FOUND,
    _R.LEASE_EXPIRED: _C.FAILED_PRECONDITION,
    _R.FENCING_TOKEN_STALE: _C.FAILED_PRECONDITION,
    _R.CONCURRENCY_LIMIT: _C.RESOURCE_EXHAUSTED,
    _R.LEASE_CLOSED: _C.FAILED_PRECONDITION,
    _R.BLOB_TOO_LARGE: _C.RESOURCE_EXHAUSTED,
    _R.BLOB_HASH_MISMATCH: _C.INVALID_ARGUMENT,
    _R.BLOB_SIZE_MISMATCH: _C.INVALID_ARGUMENT,
    _R.BLOB_NOT_FOUND: _C.NOT_FOUND,
    _R.BLOB_HEADER_INVALID: _C.INVALID_ARGUMENT,
    _R.UPLOAD_QUOTA_EXCEEDED: _C.RESOURCE_EXHAUSTED,
    _R.STORAGE_FULL: _C.RESOURCE_EXHAUSTED,
    _R.COMMITMENT_BINDING_INVALID: _C.INVALID_ARGUMENT,
    _R.ROLLOUT_BATCH_INVALID: _C.INVALID_ARGUMENT,
    _R.COMMITMENT_NOT_FOUND: _C.NOT_FOUND,
    _R.ROLLOUT_DUPLICATE: _C.ALREADY_EXISTS,
    _R.JOB_NOT_FOUND: _C.NOT_FOUND,
    _R.VERDICT_ALREADY_RECORDED: _C.FAILED_PRECONDITION,
    _R.CHECKPOINT_SIGNATURE_INVALID: _C.INVALID_ARGUMENT,
    _R.CHECKPOINT_STEP_NOT_MONOTONIC: _C.FAILED_PRECONDITION,
    _R.CHECKPOINT_NOT_FOUND: _C.NOT_FOUND,
    _R.CHECKPOINT_SHARD_MISSING: _C.FAILED_PRECONDITION,
}
"""The gRPC status code that goes with each reason (as documented in ``errors.proto``)."""


@dataclass(frozen=True, slots=True)
class FieldViolation:
    """One invalid field of a request (``google.rpc.BadRequest.FieldViolation``).

    ``field`` is a path such as ``"hardware.gpus[0].memory_bytes"``.
    """

    field: str
    description: str
    reason: str = ""


# --------------------------------------------------------------------------------------------
# Server side


def build_status(
    code: grpc.StatusCode,
    reason: ErrorReason | str,
    message: str,
    *,
    field_violations: Iterable[FieldViolation] = (),
    retry_after: float | None = None,
    metadata: Mapping[str, str] | None = None,
) -> status_pb2.Status:
    """Build the ``google.rpc.Status`` a rollnet server sends for one refusal.

    ``retry_after`` (seconds) adds a ``RetryInfo``; ``field_violations`` add a ``BadRequest``.
    """
    status = status_pb2.Status(code=code.value[0], message=message)
    info = error_details_pb2.ErrorInfo(
        reason=str(reason), domain=ERROR_DOMAIN, metadata=dict(metadata or {})
    )
    _pack(status, info)
    violations = [
        error_details_pb2.BadRequest.FieldViolation(
            field=v.field, description=v.description, reason=v.reason
        )
        for v in field_violations
    ]
    if violations:
        _pack(status, error_details_pb2.BadRequest(field_violations=violations))
    if retry_after is not None:
        delay = duration_pb2.Duration()
        delay.FromNanoseconds(max(0, math.ceil(retry_after * 1e9)))
        _pack(status, error_details_pb2.RetryInfo(retry_delay=delay))
    return status


def status_trailing_metadata(status: status_pb2.Status) -> tuple[tuple[str, bytes], ...]:
    """The trailing metadata that carries ``status`` (for servers that set it by hand)."""
    return ((STATUS_DETAILS_KEY, status.SerializeToString()),)


async def abort(
    context: grpc.aio.ServicerContext[Any, Any],
    code: grpc.StatusCode,
    reason: ErrorReason | str,
    message: str,
    *,
    field_violations: Iterable[FieldViolation] = (),
    retry_after: float | None = None,
    metadata: Mapping[str, str] | None = None,
) -> NoReturn:
    """End the current call of a ``grpc.aio`` servicer with a rich rollnet error.

    ``context`` is the handler's ``grpc.aio.ServicerContext``. Never returns: gRPC raises inside
    ``abort`` to unwind the handler.
    """
    status = build_status(
        code,
        reason,
        message,
        field_violations=field_violations,
        retry_after=retry_after,
        metadata=metadata,
    )
    await context.abort(code, message, trailing_metadata=status_trailing_metadata(status))
    # grpc.aio's abort always raises; this guards against a context that does not.
    raise AssertionError("ServicerContext.abort returned")  # pragma: no cover


def _pack(status: status_pb2.Status, detail: Any) -> None:
    packed = any_pb2.Any()
    packed.Pack(detail)
    status.details.append(packed)


# --------------------------------------------------------------------------------------------
# Client side


class RollnetError(Exception):
    """A call to a rollnet server failed.

    Attributes:
        code: the gRPC status code.
        reason: the ``ErrorInfo`` reason: an :class:`ErrorReason` member when this SDK knows it,
            the raw string when a newer server sent one it does not, ``""`` when absent.
        message: the server's human-readable message.
        metadata: the ``ErrorInfo`` metadata (string to string).
        retry_after: the server's ``RetryInfo`` delay in seconds, or ``None``.
        field_violations: the ``BadRequest`` field violations (empty unless input was invalid).
        status: the raw ``google.rpc.Status``, or ``None`` when the server sent none.

    ``__cause__`` is the original ``grpc.aio.AioRpcError`` when the error came off the wire.
    """

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        reason: str = "",
        metadata: Mapping[str, str] | None = None,
        retry_after: float | None = None,
        field_violations: tuple[FieldViolation, ...] = (),
        status: status_pb2.Status | None = None,
    ) -> None:
        super().__init__(f"{code.name}: {reason + ': ' if reason else ''}{message}")
        self.code = code
        self.message = message
        self.reason = _known_reason(reason)
        self.metadata: Mapping[str, str] = dict(metadata or {})
        self.retry_after = retry_after
        self.field_violations = field_violations
        self.status = status


class Cancelled(RollnetError):
    """CANCELLED: the call was cancelled (usually by the caller)."""


class Unknown(RollnetError):
    """UNKNOWN: the server failed without saying why."""


class InvalidArgument(RollnetError):
    """INVALID_ARGUMENT: the request is invalid; see :attr:`field_violations`."""


class DeadlineExceeded(RollnetError):
    """DEADLINE_EXCEEDED: the call ran out of time."""


class NotFound(RollnetError):
    """NOT_FOUND: the addressed resource does not exist."""


class AlreadyExists(RollnetError):
    """ALREADY_EXISTS: the resource to create exists."""


class PermissionDenied(RollnetError):
    """PERMISSION_DENIED: the caller is known but may not do this."""


class ResourceExhausted(RollnetError):
    """RESOURCE_EXHAUSTED: a quota, rate limit or size cap was hit."""


class FailedPrecondition(RollnetError):
    """FAILED_PRECONDITION: the system is not in a state that allows the call."""


class Aborted(RollnetError):
    """ABORTED: a concurrency conflict; the call may be retried."""


class OutOfRange(RollnetError):
    """OUT_OF_RANGE: an offset or position is past the end."""


class Unimplemented(RollnetError):
    """UNIMPLEMENTED: the server does not implement the method."""


class Internal(RollnetError):
    """INTERNAL: the server broke an invariant."""


class Unavailable(RollnetError):
    """UNAVAILABLE: the server cannot be reached or is not serving; retry later."""


class DataLoss(RollnetError):
    """DATA_LOSS: unrecoverable data loss or corruption."""


class Unauthenticated(RollnetError):
    """UNAUTHENTICATED: the call's signature was refused; :attr:`reason` says why."""


_ERROR_TYPES: Mapping[grpc.StatusCode, type[RollnetError]] = {
    _C.CANCELLED: Cancelled,
    _C.UNKNOWN: Unknown,
    _C.INVALID_ARGUMENT: InvalidArgument,
    _C.DEADLINE_EXCEEDED: DeadlineExceeded,
    _C.NOT_FOUND: NotFound,
    _C.ALREADY_EXISTS: AlreadyExists,
    _C.PERMISSION_DENIED: PermissionDenied,
    _C.RESOURCE_EXHAUSTED: ResourceExhausted,
    _C.FAILED_PRECONDITION: FailedPrecondition,
    _C.ABORTED: Aborted,
    _C.OUT_OF_RANGE: OutOfRange,
    _C.UNIMPLEMENTED: Unimplemented,
    _C.INTERNAL: Internal,
    _C.UNAVAILABLE: Unavailable,
    _C.DATA_LOSS: DataLoss,
    _C.UNAUTHENTICATED: Unauthenticated,
}


def error_type(code: grpc.StatusCode) -> type[RollnetError]:
    """The :class:`RollnetError` subclass raised for ``code``."""
    return _ERROR_TYPES.get(code, RollnetError)


def from_rpc_error(error: grpc.RpcError) -> RollnetError:
    """Convert a failed gRPC call into the matching :class:`RollnetError` subclass.

    Parses the ``google.rpc.Status`` from the trailing metadata; a status whose code disagrees
    with the call's code is ignored (as ``grpc_status.rpc_status.from_call`` would refuse it).
    Sets ``__cause__`` to ``error``. The caller raises the result (``raise from_rpc_error(e)``
    inside ``except``, or ``raise ... from e``).
    """
    code: grpc.StatusCode = error.code()
    message: str = error.details() or ""
    status = _status_from_trailers(error.trailing_metadata(), code)
    reason = ""
    metadata: dict[str, str] = {}
    retry_after: float | None = None
    violations: list[FieldViolation] = []
    if status is not None:
        for detail in status.details:
            if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                detail.Unpack(info)
                if not reason:
                    reason = info.reason
                    metadata = dict(info.metadata)
            elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad = error_details_pb2.BadRequest()
                detail.Unpack(bad)
                violations.extend(
                    FieldViolation(v.field, v.description, v.reason) for v in bad.field_violations
                )
            elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                retry = error_details_pb2.RetryInfo()
                detail.Unpack(retry)
                retry_after = retry.retry_delay.ToNanoseconds() / 1e9
    result = error_type(code)(
        code,
        message,
        reason=reason,
        metadata=metadata,
        retry_after=retry_after,
        field_violations=tuple(violations),
        status=status,
    )
    result.__cause__ = error
    return result


def _status_from_trailers(trailers: Any, code: grpc.StatusCode) -> status_pb2.Status | None:
    for key, value in trailers or ():
        if key != STATUS_DETAILS_KEY:
            continue
        status = status_pb2.Status()
        try:
            status.ParseFromString(value)
        except Exception:  # a malformed details blob must not hide the real error
            return None
        if status.code != code.value[0]:
            return None
        return status
    return None


def _known_reason(reason: str) -> str:
    try:
        return ErrorReason(reason)
    except ValueError:
        return reason
