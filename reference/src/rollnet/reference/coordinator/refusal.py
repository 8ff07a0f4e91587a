"""Refusals raised by the coordinator's domain layer and turned into rich gRPC errors."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rollnet.ledger.leases import LeaseOutcome
from rollnet.sdk.errors import ErrorReason, FieldViolation


class Refusal(Exception):
    """The coordinator refuses a request; the servicer layer aborts the call with it.

    The gRPC status code follows from the reason (``rollnet.sdk.errors.REASON_CODES``).
    """

    def __init__(
        self,
        reason: ErrorReason,
        message: str,
        *,
        field_violations: Sequence[FieldViolation] = (),
        retry_after: float | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        self.message = message
        self.field_violations = tuple(field_violations)
        self.retry_after = retry_after
        self.metadata = dict(metadata or {})


def invalid(*violations: tuple[str, str]) -> Refusal:
    """An INVALID_FIELDS refusal listing ``(field path, description)`` pairs."""
    fields = [FieldViolation(field=path, description=why) for path, why in violations]
    summary = "; ".join(f"{path}: {why}" for path, why in violations)
    return Refusal(ErrorReason.INVALID_FIELDS, summary, field_violations=fields)


class Violations:
    """Collects field violations so a request is refused once, naming every bad field."""

    def __init__(self) -> None:
        self._items: list[tuple[str, str]] = []

    def require(self, condition: bool, path: str, why: str) -> None:
        """Record ``path: why`` unless ``condition`` holds."""
        if not condition:
            self._items.append((path, why))

    def raise_if_any(self) -> None:
        """Raise an INVALID_FIELDS refusal if anything was recorded."""
        if self._items:
            raise invalid(*self._items)


def lease_outcome_refusal(outcome: LeaseOutcome, what: str) -> Refusal:
    """The refusal that explains a failed lease-guarded write."""
    match outcome:
        case LeaseOutcome.UNKNOWN | LeaseOutcome.WRONG_HOLDER:
            return Refusal(ErrorReason.LEASE_NOT_FOUND, f"no such lease on {what} held by you")
        case LeaseOutcome.STALE_LEASE:
            return Refusal(
                ErrorReason.FENCING_TOKEN_STALE,
                f"the lease on {what} is not the current one (it expired and was re-leased)",
            )
        case LeaseOutcome.LEASE_EXPIRED:
            return Refusal(ErrorReason.LEASE_EXPIRED, f"the lease on {what} has expired")
        case _:
            return Refusal(ErrorReason.LEASE_CLOSED, f"{what} is no longer open ({outcome})")
