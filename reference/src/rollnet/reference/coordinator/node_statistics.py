"""Per-node statistics on verdicts: what the coordinator accepts, accumulates and acts on.

An ACCEPT verdict may carry, per rollout in batch order, the validator's ``RolloutStatistics``
(``SubmitVerdictRequest.rollout_statistics``): counts and sums over the rollout's completion tokens
that only the validator's own prefill can compute. Validators are trusted; the coordinator checks
only the shape (one entry per rollout, ``tokens`` equal to the rollout's completion length, the four
near-tie counts together at most tokens, the dispersion at most its token count, which is 0 or
tokens) and refuses anything else as INVALID_FIELDS. It adds them
to the worker's row (``node_statistics``, one CUSUM update per verdict) and runs the sequential
tests of :mod:`rollnet.sdk.proofs.statistics` with the policy of the network's compute dtype. A
flagged worker is ejected in the same transaction, the test and its figures recorded as the state
reason (docs/verification.md, "Per-node statistics").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy.orm import Session

from rollnet.ledger import statistics as stored
from rollnet.reference.coordinator.refusal import Violations, invalid
from rollnet.sdk.proofs.statistics import (
    NodeEvidence,
    NodeJudgement,
    RolloutStatistics,
    StatisticsPolicy,
    judge,
)
from rollnet.v1 import validation_pb2

FIELD = "rollout_statistics"


@dataclass(frozen=True)
class NodeFlag:
    """A per-node test flagged a worker: which test, and the state reason to eject it with."""

    test: str
    reason: str


def check_decision(
    entries: Sequence[validation_pb2.RolloutStatistics], accepted: bool, v: Violations
) -> None:
    """Only an ACCEPT carries statistics (a rejected batch's say nothing about honest work)."""
    v.require(accepted or not entries, FIELD, "only an ACCEPT carries rollout statistics")


def check_shape(
    entries: Sequence[validation_pb2.RolloutStatistics], completion_tokens: Sequence[int]
) -> None:
    """One entry per rollout of the batch, each summarizing exactly that rollout's completion
    tokens, or none of them (tokens 0: a rollout the job's challenge did not draw); raises
    INVALID_FIELDS naming every entry that is off."""
    if not entries:
        return
    if len(entries) != len(completion_tokens):
        raise invalid(
            (
                FIELD,
                f"length {len(entries)}, but the batch has {len(completion_tokens)} rollouts: "
                "one entry per rollout, in batch order",
            )
        )
    v = Violations()
    for index, (entry, tokens) in enumerate(zip(entries, completion_tokens, strict=True)):
        v.require(
            entry.tokens in (0, tokens),
            f"{FIELD}[{index}].tokens",
            f"{entry.tokens}, but rollout {index} has {tokens} completion tokens (0 for a "
            "rollout the challenge did not draw)",
        )
        v.require(
            entry.dispersion_tokens in (0, entry.tokens),
            f"{FIELD}[{index}].dispersion_tokens",
            f"{entry.dispersion_tokens}, but the entry summarizes {entry.tokens} tokens: the "
            "dispersion is over all of them, or none (0: the log-probabilities not compared)",
        )
        v.require(
            entry.logprob_dispersion <= entry.dispersion_tokens,
            f"{FIELD}[{index}].logprob_dispersion",
            f"{entry.logprob_dispersion}, but each of its {entry.dispersion_tokens} tokens adds "
            "at most 1",
        )
        v.require(
            entry.tokens > 0 or (entry.logprob_excess == 0.0 and entry.logprob_variance == 0.0),
            f"{FIELD}[{index}]",
            "an entry of 0 tokens (a rollout the challenge did not draw) summarizes nothing: "
            "its sums must be 0",
        )
        counted = (
            entry.near_tie_losses
            + entry.near_tie_wins
            + entry.eos_near_tie_losses
            + entry.eos_near_tie_passes
        )
        v.require(
            counted <= entry.tokens,
            f"{FIELD}[{index}]",
            f"near_tie_losses + near_tie_wins + eos_near_tie_losses + eos_near_tie_passes = "
            f"{counted} exceed tokens = {entry.tokens}",
        )
    v.raise_if_any()


def _evidence(row: stored.StatisticsRow) -> NodeEvidence:
    return NodeEvidence(
        tokens=row.tokens,
        near_tie_losses=row.near_tie_losses,
        near_tie_wins=row.near_tie_wins,
        logprob_excess=row.logprob_excess,
        logprob_variance=row.logprob_variance,
        near_tie_cusum=row.near_tie_cusum,
        logprob_high_cusum=row.logprob_high_cusum,
        logprob_low_cusum=row.logprob_low_cusum,
        eos_near_tie_losses=row.eos_near_tie_losses,
        eos_near_tie_passes=row.eos_near_tie_passes,
        eos_cusum=row.eos_cusum,
        logprob_dispersion=row.logprob_dispersion,
        dispersion_tokens=row.dispersion_tokens,
        dispersion_cusum=row.dispersion_cusum,
    )


def record(
    session: Session,
    node_id: str,
    entries: Sequence[validation_pb2.RolloutStatistics],
    policy: StatisticsPolicy,
    *,
    now: datetime,
) -> NodeFlag | None:
    """Add one verdict's statistics to the node's evidence, whatever the task's temperature
    (the statistics are in units of each token's own tolerance); the flag when this update
    flags the node for the first time, else None."""
    if not entries:
        return None
    row = stored.get_node_statistics(session, node_id, for_update=True) or stored.StatisticsRow()
    evidence = _evidence(row).add(
        [
            RolloutStatistics(
                tokens=e.tokens,
                near_tie_losses=e.near_tie_losses,
                near_tie_wins=e.near_tie_wins,
                logprob_excess=e.logprob_excess,
                logprob_variance=e.logprob_variance,
                eos_near_tie_losses=e.eos_near_tie_losses,
                eos_near_tie_passes=e.eos_near_tie_passes,
                logprob_dispersion=e.logprob_dispersion,
                dispersion_tokens=e.dispersion_tokens,
            )
            for e in entries
        ],
        policy,
    )
    judgement = judge(evidence, policy)
    newly = judgement.flagged and row.flagged_at is None
    stored.save_node_statistics(
        session,
        node_id,
        stored.StatisticsRow(
            tokens=evidence.tokens,
            near_tie_losses=evidence.near_tie_losses,
            near_tie_wins=evidence.near_tie_wins,
            logprob_excess=evidence.logprob_excess,
            logprob_variance=evidence.logprob_variance,
            near_tie_cusum=evidence.near_tie_cusum,
            logprob_high_cusum=evidence.logprob_high_cusum,
            logprob_low_cusum=evidence.logprob_low_cusum,
            eos_near_tie_losses=evidence.eos_near_tie_losses,
            eos_near_tie_passes=evidence.eos_near_tie_passes,
            eos_cusum=evidence.eos_cusum,
            logprob_dispersion=evidence.logprob_dispersion,
            dispersion_tokens=evidence.dispersion_tokens,
            dispersion_cusum=evidence.dispersion_cusum,
            flagged_at=now if newly else row.flagged_at,
            flagged_test=judgement.test if newly else row.flagged_test,
        ),
        now=now,
    )
    if not newly:
        return None
    return NodeFlag(judgement.test, flag_reason(judgement, policy, evidence.tokens))


def flag_reason(judgement: NodeJudgement, policy: StatisticsPolicy, tokens: int) -> str:
    """The state reason an ejection by a per-node test records."""
    return (
        f"per-node statistics: {judgement.test} test {judgement.statistic:.1f} >= "
        f"{policy.flag_threshold:.1f} after {tokens} tokens (honest false-flag probability "
        f"<= {policy.false_flag_probability:g} per {policy.horizon_tokens} tokens)"
    )


__all__ = ["FIELD", "NodeFlag", "check_decision", "check_shape", "flag_reason", "record"]
