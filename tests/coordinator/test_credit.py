"""The credit rule on its own: work units, spot checks, slashes, rewards and ejection."""

from __future__ import annotations

import pytest

from rollnet.ledger.enums import NodeState
from rollnet.reference.coordinator.credit import (
    Judgement,
    Settlement,
    judged_units,
    settle,
    slash_amount,
    spot_check_draw,
    spot_check_probability,
    work_units,
)

FLOPS = 2_000_000  # two work units per token


def _judged(**changes: object) -> Judgement:
    facts: dict[str, object] = {
        "accepted": True,
        "units": 600,
        "check_probability": 1.0,
        "worker_state": NodeState.ACTIVE,
    }
    facts.update(changes)
    return Judgement(**facts)  # type: ignore[arg-type]


def test_work_units_are_mflops_rounded_down() -> None:
    assert work_units(100, 200, FLOPS) == 600
    assert work_units(1, 0, 999_999) == 0  # under one MFLOP: nothing
    assert work_units(3, 0, 500_000) == 1  # 1.5 MFLOPs, rounded down
    assert work_units(0, 0, FLOPS) == 0
    assert work_units(10, 10, 0) == 0  # the checkpoint's FLOPs are not known


def test_judged_units_count_validated_tokens_on_accept_and_the_batch_on_reject() -> None:
    assert judged_units(True, 100, 300, FLOPS) == 200
    assert judged_units(False, 100, 300, FLOPS) == 600  # the validator's count is ignored
    assert judged_units(False, 0, 0, FLOPS) == 0


def test_accept_credits_the_judged_work_and_rewards_the_validator() -> None:
    settled = settle(_judged(units=600), eject_after_rejects=3)
    assert settled == Settlement(worker_amount=600, validator_reward=6, eject=False)


def test_validator_reward_is_a_hundredth_and_at_least_one_unit() -> None:
    assert settle(_judged(units=0), eject_after_rejects=3).validator_reward == 1
    assert settle(_judged(units=199), eject_after_rejects=3).validator_reward == 1
    assert settle(_judged(units=250), eject_after_rejects=3).validator_reward == 2
    rejected = _judged(accepted=False, units=50_000, rejects=1)
    assert settle(rejected, eject_after_rejects=3).validator_reward == 500


def test_reject_under_a_full_check_slashes_the_work() -> None:
    settled = settle(_judged(accepted=False, units=600, rejects=1), eject_after_rejects=3)
    assert settled == Settlement(worker_amount=-600, validator_reward=6, eject=False)


def test_reject_of_a_spot_check_slashes_the_work_over_its_probability() -> None:
    # Chosen one time in four: (1 - 1/4) x W credited unchecked, 4 x W slashed when caught.
    quarter = _judged(accepted=False, units=600, check_probability=0.25, rejects=1)
    assert settle(quarter, eject_after_rejects=3).worker_amount == -2400
    # Rounded up: 100 / 0.3 = 333.3...
    third = _judged(accepted=False, units=100, check_probability=0.3, rejects=1)
    assert settle(third, eject_after_rejects=3).worker_amount == -334


def test_slash_amount_is_exact_for_tiny_probabilities() -> None:
    assert slash_amount(7, 1.0) == 7
    assert slash_amount(0, 0.5) == 0
    assert slash_amount(10, 0.1) == 100  # 0.1 as a float is a hair above 1/10
    assert slash_amount(3, 2**-40) == 3 * 2**40  # a tiny p neither overflows nor rounds
    assert slash_amount(1, 1e-300) > 10**299


@pytest.mark.parametrize("probability", [0.0, -0.5, 1.5, float("nan")])
def test_slash_amount_refuses_a_probability_outside_zero_one(probability: float) -> None:
    with pytest.raises(ValueError, match="check probability"):
        slash_amount(10, probability)


def test_a_reject_with_an_impossible_probability_is_refused() -> None:
    with pytest.raises(ValueError, match="not in \\(0, 1\\]"):
        settle(_judged(accepted=False, check_probability=0.0), eject_after_rejects=3)


def test_accept_ignores_the_check_probability() -> None:
    # Nothing is slashed on an accept, so even a recorded probability of 0 settles.
    settled = settle(_judged(check_probability=0.0), eject_after_rejects=3)
    assert settled.worker_amount == 600


def test_rejects_eject_at_the_threshold_not_before() -> None:
    below = _judged(accepted=False, rejects=2)
    at = _judged(accepted=False, rejects=3)
    assert not settle(below, eject_after_rejects=3).eject
    assert settle(at, eject_after_rejects=3).eject
    assert settle(_judged(accepted=False, rejects=1), eject_after_rejects=1).eject


def test_forgiven_rejects_do_not_count_again() -> None:
    forgiven = _judged(accepted=False, rejects=4, rejects_forgiven=2)
    assert not settle(forgiven, eject_after_rejects=3).eject
    assert settle(
        _judged(accepted=False, rejects=5, rejects_forgiven=2), eject_after_rejects=3
    ).eject


def test_an_accept_ejects_only_when_flagged_and_stays_credited() -> None:
    many_rejects = _judged(rejects=10)  # rejects weigh on rejects only
    assert not settle(many_rejects, eject_after_rejects=3).eject
    flagged = settle(_judged(flagged=True), eject_after_rejects=3)
    assert flagged == Settlement(worker_amount=600, validator_reward=6, eject=True)


@pytest.mark.parametrize("state", [NodeState.EJECTED, NodeState.BANNED])
def test_a_removed_node_is_not_ejected_again(state: NodeState) -> None:
    assert not settle(_judged(flagged=True, worker_state=state), eject_after_rejects=3).eject
    rejected = _judged(accepted=False, rejects=9, worker_state=state)
    settled = settle(rejected, eject_after_rejects=3)
    assert not settled.eject
    assert settled.worker_amount == -600  # its work is still slashed


@pytest.mark.parametrize("state", [NodeState.OFFLINE, NodeState.SUSPECT, NodeState.PENDING])
def test_a_node_in_any_other_state_is_ejected(state: NodeState) -> None:
    assert settle(_judged(flagged=True, worker_state=state), eject_after_rejects=3).eject


def test_every_commitment_is_checked_until_the_node_is_trusted() -> None:
    assert spot_check_probability(0, 10, 0.1) == 1.0
    assert spot_check_probability(9, 10, 0.1) == 1.0
    # Then thinned out with the streak, never below the floor.
    assert spot_check_probability(10, 10, 0.1) == 1.0
    assert spot_check_probability(20, 10, 0.1) == 0.5
    assert spot_check_probability(1000, 10, 0.1) == 0.1
    assert spot_check_probability(1000, 10, 0.0) == 0.01
    assert spot_check_probability(0, 0, 0.0) == 0.0  # no trust needed, no floor: never checked


def test_spot_check_draw_is_reproducible_and_uniform_enough() -> None:
    assert spot_check_draw(7, "abc") == spot_check_draw(7, "abc")
    assert spot_check_draw(7, "abc") != spot_check_draw(8, "abc")
    draws = [spot_check_draw(1, f"c{i}") for i in range(2000)]
    assert all(0.0 <= d < 1.0 for d in draws)
    below_quarter = sum(d < 0.25 for d in draws) / len(draws)
    assert 0.2 < below_quarter < 0.3
