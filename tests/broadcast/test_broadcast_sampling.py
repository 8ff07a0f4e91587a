"""How a client picks relays: in proportion to success rate x measured bandwidth, unmeasured
relays as the best measured one, a floor for every relay, and healing as failures age."""

from __future__ import annotations

import random
import time
from collections import Counter

import pytest

from rollnet.sdk.broadcast import RelayShards, sample_weights

A, B, C = "http://a:1", "http://b:1", "http://c:1"


def shares(shards: RelayShards, picks: int = 10_000) -> dict[str, float]:
    counts = Counter(shards.pick(set()).url for _ in range(picks))
    return {url: counts[url] / picks for url in shards.health}


def test_picks_follow_success_rate_times_bandwidth() -> None:
    shards = RelayShards([A, B, C], rng=random.Random(7))
    a, b, c = (shards.health[url] for url in (A, B, C))
    a.successes, a.bandwidth = 8.0, 100e6
    b.successes, b.bandwidth = 8.0, 25e6
    c.successes, c.failures, c.bandwidth = 4.0, 4.0, 100e6  # half its transfers failed
    # Success rates (Laplace): 0.9, 0.9, 0.5; weights 90, 22.5, 50 (of 162.5).
    expected = [90 / 162.5, 22.5 / 162.5, 50 / 162.5]
    assert sample_weights([a, b, c]) == pytest.approx(expected)
    got = shares(shards)
    for url, share in zip((A, B, C), expected, strict=True):
        assert got[url] == pytest.approx(share, abs=0.02)


def test_an_unmeasured_relay_counts_as_the_best_and_a_bad_one_keeps_a_floor() -> None:
    shards = RelayShards([A, B, C], rng=random.Random(3))
    a, b, c = (shards.health[url] for url in (A, B, C))
    a.successes, a.bandwidth = 20.0, 50e6
    b.failures = 1e6  # failed over and over: only the floor (2% of the best weight) is left
    # c: never tried, so it weighs as much as the best measured relay (at its own rate).
    weights = sample_weights([a, b, c])
    assert weights[2] == pytest.approx(weights[0] * (1 / 2) / (21 / 22))
    assert weights[1] == pytest.approx(0.02 * weights[0])
    got = shares(shards)
    assert got[B] == pytest.approx(weights[1], abs=0.005)
    assert got[B] > 0
    # Excluded relays are picked only when nothing else is left.
    assert {shards.pick({A, C}).url for _ in range(50)} == {B}
    assert {shards.pick({A, B, C}).url for _ in range(200)} == {A, B, C}


def test_a_relay_that_recovers_is_trusted_again_as_its_failures_age() -> None:
    shards = RelayShards([A, B], rng=random.Random(5))
    a, b = shards.health[A], shards.health[B]
    a.successes = b.successes = 10.0
    a.bandwidth = b.bandwidth = 50e6
    a.failures = 200.0  # it was down a while ago
    assert shards_of(shards)[A] < 0.06
    # Five minutes later (ten half-lives) its record counts a thousandth as much: it is
    # picked about as often as the other again, with no one resetting anything.
    now = time.monotonic()
    for health in (a, b):
        health._seen = now - 300.0
    got = shares(shards)
    assert got[A] == pytest.approx(0.48, abs=0.03)
    assert a.failures < 0.2


def shards_of(shards: RelayShards) -> dict[str, float]:
    return dict(zip(shards.health, sample_weights(list(shards.health.values())), strict=True))
