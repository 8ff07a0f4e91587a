"""Group commit of heartbeats: many nodes' heartbeats, one transaction.

Flower's SuperLink spends one database transaction per heartbeat and tops out near 230/s on this
class of machine. Here concurrent heartbeats are queued and flushed together every few
milliseconds (or when the batch is full): one conditional UPDATE revives the batch's nodes, one
SELECT reads their states, one UPDATE per lease kind extends every listed lease. Each caller still
gets its own answer, and a heartbeat is acknowledged only after its batch committed. A batch whose
transaction fails is split in halves, each committed alone, down to the heartbeat that fails by
itself: one node's bad heartbeat never fails the others' (nor turns them SUSPECT). The queue,
gathering and splitting are :class:`rollnet.ledger.batching.Batcher`'s; this module holds what a
batch of heartbeats writes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import statistics
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from rollnet.ledger import artifacts, leases, nodes
from rollnet.ledger.batching import Batcher, OnFailure
from rollnet.ledger.enums import NodeRole, NodeState
from rollnet.ledger.nonces import NonceKey, replayed_calls
from rollnet.reference.coordinator.context import CoordinatorContext

_NOT_WORKING = frozenset({NodeState.EJECTED, NodeState.BANNED, NodeState.DEREGISTERED})

log = logging.getLogger("rollnet.coordinator")


@dataclass(frozen=True, slots=True)
class HeartbeatResult:
    """What one node's heartbeat found, after its batch committed."""

    known: bool
    state: NodeState | None
    role: NodeRole | None
    reason: str
    extended: frozenset[str]
    deadline: datetime
    latest_step: int
    #: The heartbeat's nonce was recorded before: a replay, which changed nothing.
    replayed: bool = False


@dataclass
class _Pending:
    node_id: str
    lease_ids: tuple[str, ...]
    interval: timedelta
    future: asyncio.Future[HeartbeatResult]
    checkpoint_step: int = 0
    #: The call's nonce, recorded in the batch's transaction (see reference.coordinator.nonces).
    nonce: NonceKey | None = None


def _replayed(deadline: datetime) -> HeartbeatResult:
    return HeartbeatResult(False, None, None, "", frozenset(), deadline, 0, replayed=True)


#: Heartbeats queued for the next group commit beyond which the coordinator is behind.
BACKLOG_LIMIT = 2048
#: Event-loop lag (smoothed) beyond which the coordinator is behind: calls wait this long for the
#: loop before any of their code runs, and more of them queue inside gRPC meanwhile.
LAG_LIMIT = 0.100
_LAG_PERIOD = 0.050


class LoopLag:
    """How late the event loop runs what is due: the coordinator's own overload signal.

    A probe sleeps ``_LAG_PERIOD`` again and again and records how much later than asked it
    wakes; :attr:`seconds` is the median of the last ``window`` records, so a single stall (a
    collection, a large reply) does not count, a saturated loop does. It measures every cost of
    the loop at once (signature checks, gRPC, handlers), which a queue inside one component
    cannot.
    """

    def __init__(self, window: int = 20) -> None:
        self.samples: deque[float] = deque(maxlen=window)
        self._task: asyncio.Task[None] | None = None
        #: The median lateness of the recent probes, updated with each probe (read per call).
        self.seconds = 0.0

    def record(self, late: float) -> None:
        """Add one probe's lateness."""
        self.samples.append(late)
        self.seconds = statistics.median(self.samples)

    @property
    def lagging(self) -> bool:
        """Whether the loop lags: a full window of probes, most of them over :data:`LAG_LIMIT`.

        A window not yet full (the first second after start, when start-up work may hold the
        loop once or twice) never counts as lagging.
        """
        return len(self.samples) == self.samples.maxlen and self.seconds > LAG_LIMIT

    def start(self) -> None:
        """Start probing on the running loop (idempotent)."""
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._probe())

    async def stop(self) -> None:
        """Stop probing."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _probe(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            await asyncio.sleep(_LAG_PERIOD)
            self.record(max(0.0, loop.time() - started - _LAG_PERIOD))


class HeartbeatBatcher(Batcher[_Pending]):
    """Collects heartbeats and commits them in groups (a :class:`~rollnet.ledger.batching.Batcher`
    that gathers for ``max_delay`` and splits a failed batch in halves)."""

    noun = "heartbeats"
    log = log

    def __init__(
        self, ctx: CoordinatorContext, *, max_batch: int = 1024, max_delay: float = 0.010
    ) -> None:
        super().__init__(
            max_batch=max_batch, max_delay=max_delay, on_failure=OnFailure.SPLIT_IN_HALVES
        )
        self.ctx = ctx
        self.lag = LoopLag()

    async def submit(
        self,
        node_id: str,
        lease_ids: tuple[str, ...],
        interval: timedelta,
        checkpoint_step: int = 0,
        nonce: NonceKey | None = None,
    ) -> HeartbeatResult:
        """Queue one heartbeat and wait until its batch is committed.

        ``interval`` is the heartbeat interval granted to the node in this reply: its SUSPECT and
        OFFLINE deadlines are counted from it. ``checkpoint_step`` is the step the node reported
        (recorded for the operator's view of checkpoint broadcast). ``nonce`` is the call's,
        recorded in the batch's transaction: a heartbeat whose nonce was recorded before is a
        replay, changes nothing and comes back ``replayed``.
        """
        future: asyncio.Future[HeartbeatResult] = asyncio.get_running_loop().create_future()
        self._enqueue(_Pending(node_id, lease_ids, interval, future, checkpoint_step, nonce))
        return await future

    @property
    def behind(self) -> bool:
        """Whether the coordinator is behind: its event loop lags, or heartbeats queue up.

        The signal behind the interval back-off: granting longer intervals while behind sheds
        load before calls start timing out, and since each node's deadlines follow the interval
        it was granted, no node is judged by an interval it was not told.
        """
        return self.lag.lagging or self.backlog > BACKLOG_LIMIT

    async def close(self) -> None:
        """Stop the flushing task (pending heartbeats fail with CancelledError)."""
        await self.lag.stop()
        await super().close()

    async def _commit(self, batch: list[_Pending]) -> list[HeartbeatResult]:
        config = self.ctx.config
        now = self.ctx.clock()
        deadline = now + config.lease_duration

        def work(session: Session) -> list[HeartbeatResult]:
            replays = replayed_calls(session, [item.nonce for item in batch])
            live = [p for index, p in enumerate(batch) if index not in replays]
            states = nodes.record_heartbeats(
                session,
                [p.node_id for p in live],
                now=now,
                deadlines={
                    p.node_id: (
                        now + p.interval * config.suspect_after_missed,
                        now + p.interval * config.offline_after_missed,
                    )
                    for p in live
                },
                checkpoint_steps={p.node_id: p.checkpoint_step for p in live},
            )
            # An ejected, banned or deregistered node's leases were taken back; should it hold
            # one again somehow, its heartbeats do not keep it.
            holders = [
                (lease_id, p.node_id)
                for p in live
                if p.node_id in states and states[p.node_id][0] not in _NOT_WORKING
                for lease_id in p.lease_ids
            ]
            extended = leases.extend_leases(
                session, holders, now=now, lease_duration=config.lease_duration
            )
            step = artifacts.latest_checkpoint_step(session) or 0
            results = []
            for index, item in enumerate(batch):
                if index in replays:
                    results.append(_replayed(deadline))
                    continue
                state_role = states.get(item.node_id)
                results.append(
                    HeartbeatResult(
                        known=state_role is not None,
                        state=state_role[0] if state_role else None,
                        role=state_role[1] if state_role else None,
                        reason=state_role[2] if state_role else "",
                        extended=frozenset(i for i in item.lease_ids if i in extended),
                        deadline=deadline,
                        latest_step=step,
                    )
                )
            return results

        return await self.ctx.run_in_transaction(work)
