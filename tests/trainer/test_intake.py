"""Group assembly, the staleness bound under adversarial arrival orders, online filtering with
replacement demand, and the stream cursor across a restart."""

from __future__ import annotations

import random

import pytest

from rollnet.reference.trainer.intake import IntakeState, RolloutIntake
from rollnet.v1 import common_pb2, rollout_pb2

GROUP = 4


def _rollout(
    sequence: int, group: str, checkpoint: int, reward: float
) -> rollout_pb2.AcceptedRollout:
    return rollout_pb2.AcceptedRollout(
        sequence=sequence,
        group_id=group,
        checkpoint_step=checkpoint,
        validated_reward=common_pb2.Reward(task_reward=reward, total=reward),
    )


def _reward(rollout: rollout_pb2.AcceptedRollout) -> tuple[float, float]:
    return rollout.validated_reward.total, rollout.validated_reward.task_reward


def _intake(bound: int, batch: int = 2, state: IntakeState | None = None) -> RolloutIntake:
    return RolloutIntake(
        group_size=GROUP,
        batch_groups=batch,
        max_off_policy_steps=bound,
        reward_of=_reward,
        state=state,
    )


def _group(
    start: int, name: str, checkpoint: int, rewards: list[float]
) -> list[rollout_pb2.AcceptedRollout]:
    return [_rollout(start + i, name, checkpoint, r) for i, r in enumerate(rewards)]


SIGNAL = [1.0, 0.0, 0.5, 0.0]


def test_a_batch_is_made_of_complete_groups_with_advantages() -> None:
    intake = _intake(0)
    intake.record_demand(0, 2)
    for rollout in [*_group(1, "a", 0, SIGNAL), *_group(5, "b", 0, [0.0, 0.0, 0.0, 1.0])]:
        assert intake.take_batch(0) is None
        intake.offer(rollout, 0)
    batch = intake.take_batch(0)
    assert batch is not None
    assert [g.group_id for g in batch] == ["a", "b"]
    assert batch[0].advantages == pytest.approx([0.625, -0.375, 0.125, -0.375])
    assert intake.outstanding == {}
    assert intake.after_sequence == 8
    assert intake.counters.staleness == {0: 2}


def test_groups_without_signal_are_dropped_and_replaced() -> None:
    intake = _intake(0, batch=2)
    assert intake.demand_needed(0) == 2
    intake.record_demand(0, 2)
    assert intake.demand_needed(0) == 0
    for rollout in _group(1, "flat", 0, [1.0] * 4):
        intake.offer(rollout, 0)
    # The flat group resolved one prompt of demand without filling the batch: one replacement.
    assert intake.counters.dropped_no_signal == 1
    assert intake.demand_needed(0) == 1
    intake.record_demand(0, 1)
    for rollout in _group(5, "good", 0, SIGNAL):
        intake.offer(rollout, 0)
    assert intake.demand_needed(0) == 0
    assert intake.take_batch(0) is None  # one group of two: the batch waits for signal
    for rollout in _group(9, "good2", 0, SIGNAL):
        intake.offer(rollout, 0)
    batch = intake.take_batch(0)
    assert batch is not None
    assert all(len(set(g.rewards)) > 1 for g in batch)
    # What the samples scored counts the flat group too (4 x 1.0, then 2 x SIGNAL).
    assert intake.counters.scored_rollouts == 12
    assert intake.counters.scored_task_reward == pytest.approx(4.0 + 2 * sum(SIGNAL))


def test_asynchronous_demand_keeps_several_batches_in_flight() -> None:
    intake = _intake(2, batch=3)
    assert intake.demand_needed(5) == 9
    intake.record_demand(3, 3)
    intake.record_demand(1, 3)  # too old for step 5 (lag 4 > 2): written off
    assert intake.demand_needed(5) == 6
    assert intake.counters.demand_written_off == 3


@pytest.mark.parametrize("bound", [0, 1, 2])
@pytest.mark.parametrize("seed", range(12))
def test_the_staleness_bound_holds_whatever_the_arrival_order(bound: int, seed: int) -> None:
    """Groups of many checkpoints arrive interleaved in a random order while the trainer steps;
    no batch ever holds a group older than the bound, and every rollout is settled once."""
    rng = random.Random(seed)
    rollouts = []
    sequence = 0
    for index in range(40):
        checkpoint = rng.randrange(0, 12)
        rewards = [float(rng.random() < 0.5) for _ in range(GROUP)]
        for reward in rewards:
            sequence += 1
            rollouts.append((checkpoint, f"g{index}", reward))
    rng.shuffle(rollouts)
    # Sequence numbers follow arrival order, as on the real stream.
    arrivals = [_rollout(i + 1, g, c, r) for i, (c, g, r) in enumerate(rollouts)]
    intake = _intake(bound, batch=2)
    step = 0
    trained: list[int] = []
    for rollout in arrivals:
        intake.offer(rollout, step)
        if rng.random() < 0.3:
            step += 1  # the trainer moves on at arbitrary moments
        batch = intake.take_batch(step)
        if batch is not None:
            for group in batch:
                assert step - group.checkpoint_step <= bound
                trained.extend(group.sequences)
            step += 1
    assert len(trained) == len(set(trained))
    assert max(intake.counters.staleness, default=0) <= bound
    counters = intake.counters
    assert counters.trained * GROUP == len(trained)
    # Every complete group was trained on, dropped (stale or flat) or still waits: none lost.
    assert counters.groups_complete == (
        counters.trained + counters.dropped_no_signal + counters.dropped_stale + intake.buffered
    )


def test_a_restart_resumes_without_losing_or_repeating_a_rollout() -> None:
    first = _intake(1, batch=1)
    stream = [
        *_group(1, "a", 0, SIGNAL),
        *_group(5, "b", 0, SIGNAL),
        *_group(9, "c", 1, SIGNAL)[:2],  # the rest of c arrives after the crash
    ]
    for rollout in stream:
        first.offer(rollout, 0)
    batch = first.take_batch(0)
    assert batch is not None
    assert [g.group_id for g in batch] == ["a"]
    first.record_demand(1, 1)
    saved = IntakeState.from_json(first.state().to_json())
    # b (ready, untrained) and c (partial) are not settled: the cursor stays before them.
    assert saved.after_sequence == 4
    assert saved.seen_through == 10
    # The restarted trainer streams after the cursor: b and c's first half again, then the rest.
    second = _intake(1, batch=1, state=saved)
    replay = [r for r in [*stream, *_group(9, "c", 1, SIGNAL)[2:]] if r.sequence > 4]
    for rollout in replay:
        second.offer(rollout, 1)
    got: list[str] = []
    while (taken := second.take_batch(1)) is not None:
        got.extend(g.group_id for g in taken)
    assert got == ["b", "c"]
    # c's demand was still outstanding at the save and is resolved by its completion once.
    assert second.outstanding == {}
    assert second.after_sequence == 12


def test_settled_rollouts_are_ignored_when_delivered_again() -> None:
    intake = _intake(0, batch=1)
    for rollout in _group(1, "a", 0, SIGNAL):
        intake.offer(rollout, 0)
    assert intake.take_batch(0) is not None
    for rollout in _group(1, "a", 0, SIGNAL):
        intake.offer(rollout, 0)
    assert intake.counters.rollouts_ignored_settled == GROUP
    assert intake.take_batch(0) is None


def test_partial_groups_too_old_to_use_do_not_hold_the_cursor() -> None:
    intake = _intake(0, batch=1)
    for rollout in _group(1, "old", 0, SIGNAL)[:3]:
        intake.offer(rollout, 0)
    for rollout in _group(4, "new", 2, SIGNAL):
        intake.offer(rollout, 2)
    assert intake.take_batch(2) is not None
    assert intake.counters.rollouts_dropped_partial == 3
    assert intake.after_sequence == 7


def test_intake_refuses_bad_settings() -> None:
    with pytest.raises(ValueError, match="group_size"):
        RolloutIntake(group_size=1, batch_groups=1, max_off_policy_steps=0, reward_of=_reward)
    with pytest.raises(ValueError, match="max_off_policy_steps"):
        RolloutIntake(group_size=2, batch_groups=1, max_off_policy_steps=-1, reward_of=_reward)
