"""Post-commitment challenges: signed by the coordinator over the recorded commitment, checkable
by anyone with its public key, unpredictable without its private key, deterministic after."""

from __future__ import annotations

from math import comb

import pytest

from rollnet.sdk import Identity
from rollnet.sdk.proofs import (
    challenge_message,
    challenged_rollouts,
    detection_probability,
    sign_challenge,
    verify_challenge,
)
from rollnet.sdk.testing import NETWORK_ID

COORDINATOR = Identity.from_seed(bytes(range(32, 64)))
WORKER = Identity.from_seed(bytes(range(32)))
BINDING = bytes(range(100, 132))


def challenge_for(commitment_id: str, rollouts: int = 32, challenged: int = 8) -> bytes:
    return sign_challenge(
        COORDINATOR.sign, NETWORK_ID, commitment_id, BINDING, rollouts, challenged
    )


def test_challenge_verifies_with_the_coordinator_key_only() -> None:
    challenge = challenge_for("c-1")
    assert len(challenge) == 64
    key = COORDINATOR.public_key
    assert verify_challenge(key, challenge, NETWORK_ID, "c-1", BINDING, 32, 8)
    # Any other commitment, batch, count or network: not this challenge.
    assert not verify_challenge(key, challenge, NETWORK_ID, "c-2", BINDING, 32, 8)
    assert not verify_challenge(key, challenge, NETWORK_ID, "c-1", bytes(32), 32, 8)
    assert not verify_challenge(key, challenge, NETWORK_ID, "c-1", BINDING, 31, 8)
    assert not verify_challenge(key, challenge, NETWORK_ID, "c-1", BINDING, 32, 7)
    assert not verify_challenge(key, challenge, "rollnet-other", "c-1", BINDING, 32, 8)
    # A worker that knows everything it committed can sign the same message, but only with its
    # own key: what it computes is not the coordinator's challenge.
    forged = sign_challenge(WORKER.sign, NETWORK_ID, "c-1", BINDING, 32, 8)
    assert forged != challenge
    assert not verify_challenge(key, forged, NETWORK_ID, "c-1", BINDING, 32, 8)
    assert not verify_challenge(key, challenge[:63], NETWORK_ID, "c-1", BINDING, 32, 8)


def test_challenge_is_deterministic_after_the_commitment() -> None:
    # Every lease of a job, and anyone re-deriving it, gets the same challenge and rollouts.
    first, second = challenge_for("c-1"), challenge_for("c-1")
    assert first == second
    assert challenged_rollouts(first, 32, 8) == challenged_rollouts(second, 32, 8)


def test_challenged_rollouts_are_k_distinct_indexes() -> None:
    challenge = challenge_for("c-1")
    drawn = challenged_rollouts(challenge, 32, 8)
    assert len(drawn) == 8 == len(set(drawn))
    assert list(drawn) == sorted(drawn)
    assert all(0 <= i < 32 for i in drawn)
    # 0, or at least the batch: every rollout.
    assert challenged_rollouts(challenge, 32, 0) == tuple(range(32))
    assert challenged_rollouts(challenge, 4, 8) == tuple(range(4))
    assert challenged_rollouts(challenge, 4, 4) == tuple(range(4))


def test_challenge_depends_on_state_that_did_not_exist_at_commitment() -> None:
    """The commitment id is the coordinator's, drawn when it records the commitment, and the
    signature needs its private key: the same batch (same binding digest) recorded under 400
    ids draws every rollout at close to k/n, so what a worker fixes when it commits does not
    decide which rollouts are checked."""
    rollouts, challenged, trials = 16, 4, 400
    counts = [0] * rollouts
    subsets = set()
    for trial in range(trials):
        drawn = challenged_rollouts(challenge_for(f"c-{trial}", rollouts, challenged), rollouts, 4)
        subsets.add(drawn)
        for index in drawn:
            counts[index] += 1
    expected = trials * challenged / rollouts  # 100 per rollout
    spread = (trials * (challenged / rollouts) * (1 - challenged / rollouts)) ** 0.5  # 8.7
    # Deterministic (fixed key and ids): these are the figures of this seed range, not a
    # random draw at test time; the bound is 4.5 standard deviations.
    assert all(abs(count - expected) <= 4.5 * spread for count in counts), counts
    # C(16, 4) = 1820 subsets; 400 uniform draws hold 359 distinct ones on average.
    possible = comb(rollouts, challenged)
    assert len(subsets) >= 0.9 * possible * (1 - (1 - 1 / possible) ** trials)


def test_message_refuses_a_count_out_of_range() -> None:
    with pytest.raises(ValueError, match="challenged rollouts 9"):
        challenge_message(NETWORK_ID, "c-1", BINDING, 8, 9)
    assert not verify_challenge(COORDINATOR.public_key, bytes(64), NETWORK_ID, "c-1", BINDING, 8, 9)


def test_detection_probability() -> None:
    # One bad rollout of 32, 8 challenged: caught when it is drawn, 8 / 32.
    assert detection_probability(32, 1, 8) == pytest.approx(0.25)
    # Spot-checked at 10 %: a tenth of that.
    assert detection_probability(32, 1, 8, 0.1) == pytest.approx(0.025)
    # Every rollout bad, or every rollout challenged: caught whenever checked.
    assert detection_probability(32, 32, 8) == pytest.approx(1.0)
    assert detection_probability(32, 1, 0) == pytest.approx(1.0)
    assert detection_probability(32, 0, 8) == 0.0
    # The hypergeometric tail: 1 - C(n - m, k) / C(n, k).
    assert detection_probability(32, 4, 8) == pytest.approx(1 - comb(28, 8) / comb(32, 8))
    with pytest.raises(ValueError, match="cheated rollouts 33"):
        detection_probability(32, 33, 8)
