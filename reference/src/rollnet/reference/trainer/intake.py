"""From the stream of accepted rollouts to full training batches: group assembly, the staleness
bound, online filtering, replacement demand and the stream cursor.

:class:`RolloutIntake` is pure bookkeeping (no I/O), so its rules are tested under any arrival
order. The trainer feeds it every accepted rollout (:meth:`RolloutIntake.offer`), asks how many
prompts to request (:meth:`RolloutIntake.demand_needed`), records what it requested
(:meth:`RolloutIntake.record_demand`) and takes a batch when one is ready
(:meth:`RolloutIntake.take_batch`).

**Staleness.** The trainer's step counter ``step`` is the newest checkpoint it published; its next
update is applied to those weights. A rollout generated with checkpoint ``c`` has lag
``step − c`` and is trained on only if the lag is at most ``max_off_policy_steps`` (0 is
synchronous: only rollouts of the current weights). The bound is checked when a batch is taken,
not when a rollout arrives, so a group that waited in the buffer while the trainer moved on is
dropped too: no order of arrival can get a stale group into a batch.

**Online filtering.** A group whose rewards are all equal has zero advantages: it is dropped
(counted) and its demand counts as resolved, so :meth:`demand_needed` asks for a replacement;
batches hold only groups with signal.

**Cursor.** ``after_sequence`` is the newest sequence below which every rollout is *settled*
(trained on or dropped); settled sequences above it are listed in ``settled_above``. A trainer
restarted from its saved state resumes the stream after ``after_sequence``, ignores what was
settled and re-buffers the rest: no rollout is lost and none is trained on twice.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from rollnet.reference.trainer.advantages import group_advantages, has_signal
from rollnet.v1 import rollout_pb2

__all__ = ["Group", "IntakeCounters", "IntakeState", "RolloutIntake"]


@dataclass(slots=True)
class Group:
    """The rollouts of one prompt (GRPO group), complete, with their rewards and advantages."""

    group_id: str
    checkpoint_step: int
    rollouts: list[rollout_pb2.AcceptedRollout]
    rewards: list[float]
    task_rewards: list[float]
    advantages: list[float] = field(default_factory=list)

    @property
    def sequences(self) -> list[int]:
        """Stream sequence numbers of its rollouts."""
        return [r.sequence for r in self.rollouts]


@dataclass(slots=True)
class IntakeCounters:
    """What happened to groups so far (cumulative; the trainer reports them per step)."""

    groups_complete: int = 0
    dropped_stale: int = 0
    dropped_no_signal: int = 0
    trained: int = 0
    rollouts_ignored_settled: int = 0
    demand_written_off: int = 0
    rollouts_dropped_partial: int = 0
    scored_rollouts: int = 0
    """Rollouts of every fresh complete group that was scored (kept or dropped for no signal)."""
    scored_task_reward: float = 0.0
    """Their task rewards, summed: what the workers' samples score, before filtering."""
    staleness: dict[int, int] = field(default_factory=dict)
    """Lag (steps) -> groups trained on with it."""


@dataclass(slots=True)
class IntakeState:
    """What a restart needs (persisted with the trainer's state, as JSON data)."""

    after_sequence: int = 0
    settled_above: list[int] = field(default_factory=list)
    seen_through: int = 0
    """The newest sequence delivered so far."""
    outstanding: dict[int, int] = field(default_factory=dict)
    """Checkpoint step -> groups requested with it and not yet resolved."""

    def to_json(self) -> dict[str, Any]:
        """JSON data."""
        return {
            "after_sequence": self.after_sequence,
            "settled_above": sorted(self.settled_above),
            "seen_through": self.seen_through,
            "outstanding": {str(k): v for k, v in sorted(self.outstanding.items())},
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> IntakeState:
        """Read what :meth:`to_json` wrote."""
        return cls(
            after_sequence=int(data["after_sequence"]),
            settled_above=[int(s) for s in data["settled_above"]],
            seen_through=int(data["seen_through"]),
            outstanding={int(k): int(v) for k, v in data["outstanding"].items()},
        )


RewardOf = Callable[[rollout_pb2.AcceptedRollout], tuple[float, float]]
"""A rollout's ``(total, task)`` reward: the validator's, or recomputed by the trainer."""


class RolloutIntake:
    """Group assembly, staleness, filtering and demand (see the module docs)."""

    def __init__(
        self,
        *,
        group_size: int,
        batch_groups: int,
        max_off_policy_steps: int,
        reward_of: RewardOf,
        normalize_std: bool = False,
        state: IntakeState | None = None,
    ) -> None:
        if group_size < 2:
            raise ValueError("group_size must be at least 2 (advantages compare completions)")
        if batch_groups < 1:
            raise ValueError("batch_groups must be at least 1")
        if max_off_policy_steps < 0:
            raise ValueError("max_off_policy_steps must be at least 0")
        self.group_size = group_size
        self.batch_groups = batch_groups
        self.max_off_policy_steps = max_off_policy_steps
        self.normalize_std = normalize_std
        self._reward_of = reward_of
        state = state or IntakeState()
        self._after = state.after_sequence
        self._settled_above = set(state.settled_above)
        self._seen_through = state.seen_through
        self.outstanding = dict(state.outstanding)
        self._partial: dict[str, list[rollout_pb2.AcceptedRollout]] = {}
        self._ready: list[Group] = []
        self.counters = IntakeCounters()

    # -- the stream -------------------------------------------------------------------------

    @property
    def after_sequence(self) -> int:
        """Where a restarted stream resumes."""
        return self._after

    def settled(self, sequence: int) -> bool:
        """Whether the rollout of ``sequence`` was trained on or dropped already."""
        return sequence <= self._after or sequence in self._settled_above

    def offer(self, rollout: rollout_pb2.AcceptedRollout, step: int) -> None:
        """Take one accepted rollout; ``step`` is the trainer's current step."""
        if self.settled(rollout.sequence):
            self.counters.rollouts_ignored_settled += 1
            return
        members = self._partial.setdefault(rollout.group_id, [])
        if any(m.sequence == rollout.sequence for m in members):
            return  # a reconnected stream delivered it again
        members.append(rollout)
        # After a restart the stream re-delivers what was buffered; demand it resolved before
        # the save is already off the books.
        fresh = rollout.sequence > self._seen_through
        self._seen_through = max(self._seen_through, rollout.sequence)
        if len(members) < self.group_size:
            return
        del self._partial[rollout.group_id]
        members.sort(key=lambda r: r.sequence)
        checkpoint = members[0].checkpoint_step
        if fresh:
            self._resolve(checkpoint)
        self.counters.groups_complete += 1
        if step - checkpoint > self.max_off_policy_steps:
            self.counters.dropped_stale += 1
            self._settle(m.sequence for m in members)
            return
        rewards = [self._reward_of(m) for m in members]
        totals = [total for total, _ in rewards]
        self.counters.scored_rollouts += len(rewards)
        self.counters.scored_task_reward += sum(task for _, task in rewards)
        if not has_signal(totals):
            self.counters.dropped_no_signal += 1
            self._settle(m.sequence for m in members)
            return
        self._ready.append(
            Group(
                group_id=members[0].group_id,
                checkpoint_step=checkpoint,
                rollouts=members,
                rewards=totals,
                task_rewards=[task for _, task in rewards],
                advantages=group_advantages(totals, normalize_std=self.normalize_std),
            )
        )

    # -- batches ----------------------------------------------------------------------------

    @property
    def buffered(self) -> int:
        """Complete groups with signal waiting for a batch (usable or not)."""
        return len(self._ready)

    def ready_groups(self, step: int) -> int:
        """Groups with signal that the update after ``step`` may use."""
        return sum(1 for g in self._ready if step - g.checkpoint_step <= self.max_off_policy_steps)

    def take_batch(self, step: int) -> list[Group] | None:
        """``batch_groups`` groups for the update applied to checkpoint ``step`` (oldest usable
        first), or ``None`` when not enough are ready. Groups too stale for ``step`` are
        dropped here; the taken groups are settled."""
        bound = self.max_off_policy_steps
        stale = [g for g in self._ready if step - g.checkpoint_step > bound]
        self._ready = [g for g in self._ready if step - g.checkpoint_step <= bound]
        # A part of a group too old to use holds the cursor back for nothing: let it go (the
        # rest of it, should it come, is dropped the same way).
        for group_id in [
            k for k, ms in self._partial.items() if step - ms[0].checkpoint_step > bound
        ]:
            self.counters.rollouts_dropped_partial += len(self._partial[group_id])
            self._settle(m.sequence for m in self._partial.pop(group_id))
        for group in stale:
            self.counters.dropped_stale += 1
            self._settle(group.sequences)
        if len(self._ready) < self.batch_groups:
            return None
        self._ready.sort(key=lambda g: (g.checkpoint_step, g.rollouts[0].sequence))
        batch, self._ready = self._ready[: self.batch_groups], self._ready[self.batch_groups :]
        for group in batch:
            lag = step - group.checkpoint_step
            self.counters.staleness[lag] = self.counters.staleness.get(lag, 0) + 1
            self.counters.trained += 1
            self._settle(group.sequences)
        return batch

    # -- demand -----------------------------------------------------------------------------

    def demand_needed(self, step: int) -> int:
        """Prompts to request now so that the next ``max_off_policy_steps + 1`` updates have
        their groups in flight: in synchronous mode one batch, asynchronous more. Demand made
        with checkpoints too old for ``step`` is written off first (its groups would be
        dropped)."""
        oldest = step - self.max_off_policy_steps
        for checkpoint in [c for c in self.outstanding if c < oldest]:
            self.counters.demand_written_off += self.outstanding.pop(checkpoint)
        in_flight = sum(self.outstanding.values())
        target = self.batch_groups * (self.max_off_policy_steps + 1)
        return max(0, target - in_flight - self.ready_groups(step))

    def record_demand(self, checkpoint_step: int, groups: int) -> None:
        """``groups`` prompts were requested; their tasks generate with ``checkpoint_step``."""
        self.outstanding[checkpoint_step] = self.outstanding.get(checkpoint_step, 0) + groups

    def write_off_demand(self) -> int:
        """Forget all outstanding demand (it is taking too long: tasks failed or were lost);
        returns how many groups that was. Late groups are still used if they arrive."""
        total = sum(self.outstanding.values())
        self.counters.demand_written_off += total
        self.outstanding.clear()
        return total

    def _resolve(self, checkpoint: int) -> None:
        left = self.outstanding.get(checkpoint, 0)
        if left > 1:
            self.outstanding[checkpoint] = left - 1
        elif left == 1:
            del self.outstanding[checkpoint]

    # -- state ------------------------------------------------------------------------------

    def _settle(self, sequences: Iterable[int]) -> None:
        self._settled_above.update(s for s in sequences if s > self._after)
        self._advance()

    def _advance(self) -> None:
        # The stream comes in sequence order: everything seen below the oldest rollout still
        # waiting (in a partial group or a ready one) is settled.
        pending = [m.sequence for ms in self._partial.values() for m in ms]
        pending += [s for g in self._ready for s in g.sequences]
        horizon = min(pending) - 1 if pending else self._seen_through
        self._after = max(self._after, horizon)
        self._settled_above = {s for s in self._settled_above if s > self._after}

    def state(self) -> IntakeState:
        """What a restart resumes from."""
        return IntakeState(
            after_sequence=self._after,
            settled_above=sorted(self._settled_above),
            seen_through=self._seen_through,
            outstanding=dict(self.outstanding),
        )
