"""Per-node statistics repository: the running sums and CUSUMs of ``node_statistics``.

Functions take a session and run inside the caller's transaction. The tests themselves (what the
sums mean, when a node is flagged) are ``rollnet.sdk.proofs.statistics``; this module only
stores them.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from rollnet.ledger.models import NodeStatistics


@dataclass(frozen=True)
class StatisticsRow:
    """The stored values of one node's row (plain values, detached from the session)."""

    tokens: int = 0
    near_tie_losses: int = 0
    near_tie_wins: int = 0
    logprob_excess: float = 0.0
    logprob_variance: float = 0.0
    near_tie_cusum: float = 0.0
    logprob_high_cusum: float = 0.0
    logprob_low_cusum: float = 0.0
    eos_near_tie_losses: int = 0
    eos_near_tie_passes: int = 0
    eos_cusum: float = 0.0
    logprob_dispersion: float = 0.0
    dispersion_tokens: int = 0
    dispersion_cusum: float = 0.0
    flagged_at: datetime | None = None
    flagged_test: str = ""


def _row(model: NodeStatistics) -> StatisticsRow:
    return StatisticsRow(
        tokens=model.tokens,
        near_tie_losses=model.near_tie_losses,
        near_tie_wins=model.near_tie_wins,
        logprob_excess=model.logprob_excess,
        logprob_variance=model.logprob_variance,
        near_tie_cusum=model.near_tie_cusum,
        logprob_high_cusum=model.logprob_high_cusum,
        logprob_low_cusum=model.logprob_low_cusum,
        eos_near_tie_losses=model.eos_near_tie_losses,
        eos_near_tie_passes=model.eos_near_tie_passes,
        eos_cusum=model.eos_cusum,
        logprob_dispersion=model.logprob_dispersion,
        dispersion_tokens=model.dispersion_tokens,
        dispersion_cusum=model.dispersion_cusum,
        flagged_at=model.flagged_at,
        flagged_test=model.flagged_test,
    )


def get_node_statistics(
    session: Session, node_id: str, *, for_update: bool = False
) -> StatisticsRow | None:
    """The node's row (None: no statistics yet). ``for_update`` locks it until the caller's
    transaction ends (PostgreSQL; SQLite serializes writers anyway), so two verdicts on the same
    node add up rather than overwrite each other."""
    query = select(NodeStatistics).where(NodeStatistics.node_id == node_id)
    if for_update:
        query = query.with_for_update()
    model = session.execute(query).scalar_one_or_none()
    return None if model is None else _row(model)


def save_node_statistics(
    session: Session, node_id: str, row: StatisticsRow, *, now: datetime
) -> None:
    """Insert or replace the node's row with ``row`` (read with ``for_update`` first)."""
    model = session.get(NodeStatistics, node_id)
    if model is None:
        model = NodeStatistics(node_id=node_id)
        session.add(model)
    model.tokens = row.tokens
    model.near_tie_losses = row.near_tie_losses
    model.near_tie_wins = row.near_tie_wins
    model.logprob_excess = row.logprob_excess
    model.logprob_variance = row.logprob_variance
    model.near_tie_cusum = row.near_tie_cusum
    model.logprob_high_cusum = row.logprob_high_cusum
    model.logprob_low_cusum = row.logprob_low_cusum
    model.eos_near_tie_losses = row.eos_near_tie_losses
    model.eos_near_tie_passes = row.eos_near_tie_passes
    model.eos_cusum = row.eos_cusum
    model.logprob_dispersion = row.logprob_dispersion
    model.dispersion_tokens = row.dispersion_tokens
    model.dispersion_cusum = row.dispersion_cusum
    model.flagged_at = row.flagged_at
    model.flagged_test = row.flagged_test
    model.updated_at = now
    session.flush()


def flagged_nodes(session: Session) -> dict[str, str]:
    """Every node a per-node test has flagged → the test that did."""
    rows = session.execute(
        select(NodeStatistics.node_id, NodeStatistics.flagged_test).where(
            NodeStatistics.flagged_at.is_not(None)
        )
    )
    return dict(rows)


__all__ = ["StatisticsRow", "flagged_nodes", "get_node_statistics", "save_node_statistics"]
