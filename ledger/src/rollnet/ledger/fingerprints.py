"""The copy index: each committed rollout's token digests, to find a completion committed twice.

A commitment's rollouts are fingerprinted when it is recorded: the tokens digest (prompt and
completion ids) and the completion digest (completion ids alone). Looking each new rollout up
finds the same tokens in any commitment whose task was not rejected or failed — live or
accepted work. Rejected and failed work is excluded: its prompts are queued again as a fresh
task, whose honest rollouts must not be refused as copies of work that was never credited.

Whether a match is a copy is the caller's rule (the coordinator's :mod:`copies`); this module
stores and finds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import insert, or_, select
from sqlalchemy.orm import Session

from rollnet.ledger.enums import TaskState
from rollnet.ledger.models import Commitment, RolloutFingerprint, Task

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
    """Index the rollouts of a commitment just recorded."""
    if not prints:
        return
    session.execute(
        insert(RolloutFingerprint),
        [
            {
                "commitment_id": commitment_id,
                "rollout_index": p.rollout_index,
                "node_id": node_id,
                "tokens_blake3": p.tokens_blake3,
                "completion_blake3": p.completion_blake3,
                "logprob_sum": p.logprob_sum,
            }
            for p in prints
        ],
    )


def find_originals(session: Session, prints: Sequence[Fingerprint]) -> list[Original]:
    """Fingerprinted rollouts of live or accepted commitments sharing a tokens or completion
    digest with ``prints`` (two index probes per rollout)."""
    if not prints:
        return []
    tokens = sorted({p.tokens_blake3 for p in prints})
    completions = sorted({p.completion_blake3 for p in prints})
    fp = RolloutFingerprint
    rows = session.execute(
        select(
            fp.commitment_id,
            fp.node_id,
            fp.rollout_index,
            fp.tokens_blake3,
            fp.completion_blake3,
            fp.logprob_sum,
        )
        .join(Commitment, Commitment.id == fp.commitment_id)
        .join(Task, Task.id == Commitment.task_id)
        .where(
            or_(fp.tokens_blake3.in_(tokens), fp.completion_blake3.in_(completions)),
            Task.state.in_(_LIVE_STATES),
        )
        .order_by(fp.commitment_id, fp.rollout_index)
    ).all()
    return [
        Original(
            commitment_id=row.commitment_id,
            node_id=row.node_id,
            rollout_index=int(row.rollout_index),
            tokens_blake3=bytes(row.tokens_blake3),
            completion_blake3=bytes(row.completion_blake3),
            logprob_sum=float(row.logprob_sum),
        )
        for row in rows
    ]
