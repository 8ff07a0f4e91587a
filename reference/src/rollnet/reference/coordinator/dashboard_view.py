"""What the operator dashboard shows, read from the database through ``rollnet.ledger``.

A :class:`SwarmView` answers every browser from one snapshot taken at most once per
:data:`REFRESH_SECONDS`, so the database cost does not grow with the number of viewers. Each
snapshot reads what is live (node counts, work in flight, the chain tip and its newest signed
head, the reward sums per step, the checkpoint each live node reports) and the ledger entries
appended since the previous snapshot; totals that grow with history (balances, credits, slashes,
rejects by reason) are taken once with grouped reads when the view starts and then kept up to
date from those new entries. Throughput is bucketed from the entries' timestamps, so it is the
whole network's (every replica appends to the one ledger), not only this process's.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from rollnet.ledger import artifacts, chain, overview
from rollnet.ledger.enums import EntryKind, NodeRole, NodeState
from rollnet.reference.coordinator.context import CoordinatorContext

#: A snapshot is reused by every request for this long.
REFRESH_SECONDS = 1.0
#: Figures that scan the nodes table (counts by role and state, checkpoint steps) and the reward
#: curve change slowly: they are read anew at most this often (each scan of 10,000 nodes is tens
#: of milliseconds on SQLite).
SLOW_REFRESH_SECONDS = 5.0
#: Throughput buckets: their width and how many are kept (10 minutes).
BUCKET_SECONDS = 5
BUCKETS = 120
#: Ledger entries read per snapshot at most (a backlog is caught up over several snapshots).
ENTRIES_PER_SNAPSHOT = 20_000
#: Entries before the tip read when the view starts, to fill the throughput charts.
BACKFILL_ENTRIES = 20_000
#: Nodes listed per page.
NODE_PAGE = 50


@dataclass
class _Bucket:
    start: int
    rollouts: int = 0
    tokens: int = 0
    verdicts: int = 0


@dataclass
class _Totals:
    """Totals kept up to date from new ledger entries."""

    sequence: int = 0
    balances: dict[str, int] = field(default_factory=dict)
    credited: dict[str, int] = field(default_factory=dict)
    kind_amounts: dict[str, int] = field(default_factory=dict)
    kind_counts: dict[str, int] = field(default_factory=dict)
    rejects_by_reason: dict[str, int] = field(default_factory=dict)
    credits_validated: int = 0

    def add(self, entry: overview.EntrySummary) -> None:
        kind = entry.kind.value
        self.sequence = entry.sequence
        self.balances[entry.node_id] = self.balances.get(entry.node_id, 0) + entry.amount
        if entry.kind in (EntryKind.CREDIT, EntryKind.VALIDATOR_REWARD):
            self.credited[entry.node_id] = self.credited.get(entry.node_id, 0) + entry.amount
        self.kind_amounts[kind] = self.kind_amounts.get(kind, 0) + entry.amount
        self.kind_counts[kind] = self.kind_counts.get(kind, 0) + 1
        if entry.kind is EntryKind.SLASH:
            reason = entry.memo or "unspecified"
            self.rejects_by_reason[reason] = self.rejects_by_reason.get(reason, 0) + 1
        if entry.kind is EntryKind.CREDIT and entry.validated:
            self.credits_validated += 1


@dataclass(frozen=True)
class _Slow:
    """The slowly refreshed figures, all read in one snapshot."""

    taken_at: float
    node_counts: dict[Any, int]
    latest: int | None
    """The latest checkpoint step, read with ``steps``."""
    steps: dict[int | None, int]
    rewards: list[Any]


class SwarmView:
    """Snapshots of the swarm for the dashboard (see the module docstring)."""

    def __init__(self, ctx: CoordinatorContext) -> None:
        self.ctx = ctx
        self._totals: _Totals | None = None
        self._buckets: deque[_Bucket] = deque(maxlen=BUCKETS)
        self._snapshot: dict[str, Any] | None = None
        self._taken_at = 0.0
        self._slow: _Slow | None = None
        self._lock = asyncio.Lock()

    async def snapshot(self) -> dict[str, Any]:
        """The current snapshot (JSON-ready), taken anew when the last is older than
        :data:`REFRESH_SECONDS`."""
        async with self._lock:
            if self._snapshot is None or time.monotonic() - self._taken_at >= REFRESH_SECONDS:
                snapshot = await self.ctx.run_read(self._take)
                # Kept in this process's memory and changed on the event loop: read here.
                snapshot["relay_reports"] = self.ctx.relay_reports.overview()
                self._snapshot = snapshot
                self._taken_at = time.monotonic()
            return self._snapshot

    async def nodes(
        self, *, after: str, state: NodeState | None, role: NodeRole | None
    ) -> dict[str, Any]:
        """A page of nodes with their credits and checkpoint step (JSON-ready)."""
        await self.snapshot()  # balances up to date
        rows = await self.ctx.run_read(
            lambda session: overview.node_page(
                session, after_id=after, limit=NODE_PAGE + 1, state=state, role=role
            )
        )
        page = rows[:NODE_PAGE]
        totals = self._totals or _Totals()
        return {
            "nodes": [
                {
                    "node_id": row.node_id,
                    "role": row.role.value,
                    "state": row.state.value,
                    "state_reason": row.state_reason,
                    "last_heartbeat_at": _iso(row.last_heartbeat_at),
                    "checkpoint_step": row.checkpoint_step,
                    "balance": totals.balances.get(row.node_id, 0),
                    "credited": totals.credited.get(row.node_id, 0),
                    "software_version": row.software_version,
                }
                for row in page
            ],
            "next_after": page[-1].node_id if len(rows) > NODE_PAGE else None,
        }

    # ------------------------------------------------------------------ one snapshot (a thread)
    def _take(self, session: Session) -> dict[str, Any]:
        tip = chain.chain_tip(session)
        if self._totals is None:
            self._start(session, tip.sequence)
        totals = self._totals
        assert totals is not None
        self._follow(session, totals, ENTRIES_PER_SNAPSHOT)
        work = overview.open_work(session, with_nodes=False)
        head = chain.latest_signed_head(session, self.ctx.config.network_id)
        latest = artifacts.latest_checkpoint_step(session)
        if self._slow is None or time.monotonic() - self._slow.taken_at >= SLOW_REFRESH_SECONDS:
            self._slow = _Slow(
                time.monotonic(),
                overview.node_counts(session),
                # The nodes' steps are compared with the latest step read with them, not with
                # one read up to SLOW_REFRESH_SECONDS later (which no node could hold yet).
                latest,
                overview.checkpoint_steps(session),
                overview.step_rewards(session),
            )
        node_counts, steps, rewards = self._slow.node_counts, self._slow.steps, self._slow.rewards
        counted_at = self._slow.latest
        return {
            "generated_at": _iso(self.ctx.clock()),
            "network_id": self.ctx.config.network_id,
            "coordinator_public_key": self.ctx.identity.public_key.hex(),
            "nodes": _nodes(node_counts),
            "tasks": {
                **{state.value: count for state, count in work.tasks.items()},
                "accepted": totals.kind_counts.get(EntryKind.CREDIT.value, 0),
                "rejected": totals.kind_counts.get(EntryKind.SLASH.value, 0),
                "failed": work.failed_tasks,
                "expired": work.expired_tasks,
            },
            "validation": {
                **{state.value: count for state, count in work.jobs.items()},
                "accepted": totals.credits_validated,
                "rejected": totals.kind_counts.get(EntryKind.SLASH.value, 0),
                "given_up": work.failed_jobs,
                "spot_check_skipped": totals.kind_counts.get(EntryKind.CREDIT.value, 0)
                - totals.credits_validated,
                "rejects_by_reason": dict(
                    sorted(totals.rejects_by_reason.items(), key=lambda item: -item[1])
                ),
            },
            "ledger": {
                "entries": totals.sequence,
                "tip_sequence": tip.sequence,
                "tip_hash": tip.head_hash.hex(),
                "amounts": dict(totals.kind_amounts),
                "counts": dict(totals.kind_counts),
                "nodes_credited": sum(1 for v in totals.credited.values() if v > 0),
                "signed_head": None
                if head is None
                else {
                    "sequence": head.sequence,
                    "hash": head.head_hash.hex(),
                    "signed_at": _iso(head.signed_at),
                    "public_key": head.signer_public_key.hex(),
                    "signature": head.signature.hex(),
                },
            },
            "checkpoints": {
                "latest": latest,
                "nodes_by_step": [
                    {"step": step, "nodes": count}
                    for step, count in sorted(
                        steps.items(), key=lambda item: -1 if item[0] is None else item[0]
                    )
                ],
                "live_nodes": sum(steps.values()),
                # Nodes holding the step that was latest when their steps were read, and those
                # at most one step behind it (nodes report their step by heartbeat, so with a
                # trainer stepping faster than the heartbeat interval most are one behind).
                "counted_at": counted_at,
                "at_latest": _at_least(steps, counted_at),
                "within_one_step": _at_least(steps, None if counted_at is None else counted_at - 1),
            },
            "rewards": [
                {
                    "step": r.rollout_step,
                    "rollouts": r.rollouts,
                    "mean_task_reward": r.mean_task_reward,
                    "mean_reward": r.mean_total_reward,
                }
                for r in rewards
            ],
            "throughput": self._throughput(),
        }

    def _start(self, session: Session, tip: int) -> None:
        grouped = overview.ledger_totals(session, tip)
        self._totals = _Totals(
            sequence=tip,
            balances=grouped.node_balances,
            credited=grouped.node_credited,
            kind_amounts={k.value: v for k, v in grouped.kind_amounts.items()},
            kind_counts={k.value: v for k, v in grouped.kind_counts.items()},
            rejects_by_reason={
                (reason or "unspecified"): count
                for reason, count in grouped.rejects_by_reason.items()
            },
            credits_validated=grouped.credits_validated,
        )
        # The charts start with the last minutes the ledger holds (totals are complete already).
        horizon = time.time() - BUCKET_SECONDS * BUCKETS
        for entry in overview.entries_after(
            session, max(0, tip - BACKFILL_ENTRIES), limit=BACKFILL_ENTRIES
        ):
            if entry.recorded_at.timestamp() >= horizon:
                self._count(entry)

    def _follow(self, session: Session, totals: _Totals, budget: int) -> None:
        while budget > 0:
            entries = overview.entries_after(session, totals.sequence, limit=min(budget, 5000))
            for entry in entries:
                totals.add(entry)
                self._count(entry)
            budget -= len(entries)
            if len(entries) < 5000:
                return

    def _count(self, entry: overview.EntrySummary) -> None:
        start = int(entry.recorded_at.timestamp()) // BUCKET_SECONDS * BUCKET_SECONDS
        bucket = self._bucket(start)
        if bucket is None:
            return
        if entry.kind is EntryKind.CREDIT:
            bucket.rollouts += entry.rollouts
            bucket.tokens += entry.tokens
        elif entry.kind is EntryKind.VALIDATOR_REWARD:
            bucket.verdicts += 1  # one per verdict, accepted or rejected

    def _bucket(self, start: int) -> _Bucket | None:
        if self._buckets and start < self._buckets[0].start:
            return None  # older than the window
        if not self._buckets or start > self._buckets[-1].start:
            self._buckets.append(_Bucket(start))
            return self._buckets[-1]
        for bucket in reversed(self._buckets):  # entries arrive nearly in time order
            if bucket.start == start:
                return bucket
            if bucket.start < start:
                break
        # A gap inside the window (entries from another replica's clock): keep order.
        buckets = sorted([*self._buckets, _Bucket(start)], key=lambda b: b.start)[-BUCKETS:]
        self._buckets = deque(buckets, maxlen=BUCKETS)
        return next((b for b in self._buckets if b.start == start), None)

    def _throughput(self) -> dict[str, Any]:
        """Per-second rates in every bucket of the window, empty buckets included."""
        now = int(time.time()) // BUCKET_SECONDS * BUCKET_SECONDS
        first = now - BUCKET_SECONDS * (BUCKETS - 1)
        by_start = {b.start: b for b in self._buckets}
        starts = list(range(first, now + 1, BUCKET_SECONDS))
        empty = _Bucket(0)
        rows = [by_start.get(start, empty) for start in starts]
        return {
            "bucket_seconds": BUCKET_SECONDS,
            "t": starts,
            "rollouts_per_s": [b.rollouts / BUCKET_SECONDS for b in rows],
            "tokens_per_s": [b.tokens / BUCKET_SECONDS for b in rows],
            "verdicts_per_s": [b.verdicts / BUCKET_SECONDS for b in rows],
        }


def _at_least(steps: dict[int | None, int], step: int | None) -> int:
    """Live nodes reporting ``step`` or a later one (0 when there is no step yet)."""
    if step is None:
        return 0
    return sum(count for held, count in steps.items() if held is not None and held >= step)


def _nodes(counts: dict[Any, int]) -> dict[str, Any]:
    by_role: dict[str, dict[str, int]] = {}
    for (role, state), count in counts.items():
        by_role.setdefault(role.value, {})[state.value] = count
    by_state: dict[str, int] = {}
    for (_role, state), count in counts.items():
        by_state[state.value] = by_state.get(state.value, 0) + count
    return {"by_role": by_role, "by_state": by_state, "total": sum(by_state.values())}


def _iso(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")
