"""The copy index: each committed rollout's token digests, to find a completion committed twice.

A commitment's rollouts are fingerprinted when it is recorded: the tokens digest (prompt and
completion ids) and the completion digest (completion ids alone). Looking each new rollout up
finds the same tokens in any commitment whose task was not rejected or failed — live or
accepted work. Rejected and failed work is excluded: its prompts are queued again as a fresh
task, whose honest rollouts must not be refused as copies of work that was never credited.

Whether a match is a copy is the caller's rule (the coordinator's :mod:`copies`); this module
stores, and finds only the matches that rule can use: those where the repeat is improbable at
the caller's threshold.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Float, Integer, bindparam, or_, select, type_coerce
from sqlalchemy.orm import Session
from sqlalchemy.sql.elements import ColumnElement
from sqlalchemy.types import NullType

from rollnet.ledger.enums import TaskState
from rollnet.ledger.models import Commitment, RolloutFingerprint, Task, table_of
from rollnet.ledger.prepared import Prepared, prepared_insert

#: Task states whose commitments count as originals: not rejected, not failed.
_LIVE_STATES = (TaskState.SUBMITTED, TaskState.VALIDATING, TaskState.ACCEPTED)


@dataclass(frozen=True, slots=True)
class Fingerprint:
    """One rollout's digests and its claimed log-probability."""

    rollout_index: int
    tokens_blake3: bytes
    completion_blake3: bytes
    logprob_sum: float


@dataclass(frozen=True, slots=True)
class Original:
    """A fingerprinted rollout of a live or accepted commitment that a new one matches."""

    commitment_id: str
    node_id: str
    rollout_index: int
    tokens_blake3: bytes
    completion_blake3: bytes
    logprob_sum: float


def record_fingerprints(
    session: Session, commitment_id: str, node_id: str, prints: Sequence[Fingerprint]
) -> None:
    """Index the rollouts of a commitment just recorded (one prepared INSERT a rollout: on the
    commitment's hot path, ~10 times cheaper than an ORM executemany)."""
    for p in prints:
        _INSERT.run(
            session,
            {
                "commitment_id": commitment_id,
                "rollout_index": p.rollout_index,
                "node_id": node_id,
                "tokens_blake3": p.tokens_blake3,
                "completion_blake3": p.completion_blake3,
                "logprob_sum": p.logprob_sum,
            },
        )


def find_originals(
    session: Session, prints: Sequence[Fingerprint], *, improbable: float, limit: int
) -> list[Original]:
    """Fingerprinted rollouts of live or accepted commitments that ``prints`` repeat where the
    repeat is improbable: the same tokens where either claimed log-probability is at most
    ``improbable``, or the same completion where the print's own claim is. Ordered by
    commitment and rollout; at most ``limit`` of them.

    Every row found is such a repeat, so the bound loses no verdict: it keeps a completion
    committed a million times from costing a million rows to the commitment that repeats it.
    An honest likely completion ("42", a lone EOS) recurs without end and is read only where
    an improbable claim of the same tokens exists (one range probe of the tokens index).
    """
    likely = [p for p in prints if p.logprob_sum > improbable]
    unlikely = [p for p in prints if p.logprob_sum <= improbable]
    live = list(_LIVE_STATES)
    rows: list[tuple[Any, ...]] = []
    if likely:
        rows += _FIND_IMPROBABLE_SAME_TOKENS.rows(
            session,
            {
                "tokens": sorted({p.tokens_blake3 for p in likely}),
                "improbable": improbable,
                "live": live,
                "limit": limit,
            },
        )
    if unlikely and len(rows) < limit:
        rows += _FIND_SAME_TOKENS_OR_COMPLETION.rows(
            session,
            {
                "tokens": sorted({p.tokens_blake3 for p in unlikely}),
                "completions": sorted({p.completion_blake3 for p in unlikely}),
                "live": live,
                "limit": limit - len(rows),
            },
        )
    found = {
        (str(commitment_id), int(rollout_index)): Original(
            commitment_id=str(commitment_id),
            node_id=str(node_id),
            rollout_index=int(rollout_index),
            tokens_blake3=bytes(tokens),
            completion_blake3=bytes(completion),
            logprob_sum=float(logprob_sum),
        )
        for commitment_id, node_id, rollout_index, tokens, completion, logprob_sum in rows
    }
    return [found[key] for key in sorted(found)]


def _originals(*where: ColumnElement[bool]) -> Prepared:
    """Fingerprints of live or accepted commitments matching ``where`` (at most ``limit``)."""
    return Prepared(
        select(
            _FINGERPRINTS.c.commitment_id,
            _FINGERPRINTS.c.node_id,
            _FINGERPRINTS.c.rollout_index,
            _FINGERPRINTS.c.tokens_blake3,
            _FINGERPRINTS.c.completion_blake3,
            # Untyped: the driver returns a float on both engines, and psycopg's Float result
            # processor cannot be built without a cursor (Prepared builds them ahead).
            type_coerce(_FINGERPRINTS.c.logprob_sum, NullType()),
        )
        .join(Commitment, Commitment.id == _FINGERPRINTS.c.commitment_id)
        .join(Task, Task.id == Commitment.task_id)
        .where(*where, Task.state.in_(bindparam("live", expanding=True)))
        .limit(bindparam("limit", type_=Integer))
    )


_FINGERPRINTS = table_of(RolloutFingerprint)
_INSERT = prepared_insert(_FINGERPRINTS)
_FIND_IMPROBABLE_SAME_TOKENS = _originals(
    _FINGERPRINTS.c.tokens_blake3.in_(bindparam("tokens", expanding=True)),
    _FINGERPRINTS.c.logprob_sum <= bindparam("improbable", type_=Float),
)
_FIND_SAME_TOKENS_OR_COMPLETION = _originals(
    or_(
        _FINGERPRINTS.c.tokens_blake3.in_(bindparam("tokens", expanding=True)),
        _FINGERPRINTS.c.completion_blake3.in_(bindparam("completions", expanding=True)),
    )
)
