"""The replay cache partitioned per key: a flood of fresh keys (or busy registered keys) can
neither make it forget an honest key's nonces nor refuse that key's calls, and it stays bounded."""

from __future__ import annotations

import random

import pytest

from rollnet.sdk.nonce_cache import NonceCache, NonceCacheFull

HONEST = b"honest-key".ljust(32, b"\0")


def _key(i: int) -> bytes:
    return i.to_bytes(32, "big")


def _bounded_cache(now: list[float], **overrides: int) -> NonceCache:
    bounds = {
        "capacity": 100,
        "per_key_capacity": 50,
        "reserved_per_key": 5,
        "max_keys": 20,
        "max_unregistered_keys": 30,
        "unregistered_per_key": 2,
    } | overrides
    return NonceCache(ttl=120.0, clock=lambda: now[0], **bounds)


def test_a_flood_of_fresh_keys_cannot_flush_an_honest_nonce() -> None:
    now = [0.0]
    cache = _bounded_cache(now)
    honest = [f"{i:032x}" for i in range(5)]
    for nonce in honest:
        assert cache.record(HONEST, nonce)
    # 10,000 fresh keys registering, each twice: the unregistered pool takes 30 keys, then
    # refuses the new ones by name; nothing of the honest key is touched.
    refused: list[NonceCacheFull] = []
    for i in range(10_000):
        now[0] += 0.001
        try:
            cache.record(_key(i), "a" * 32, registered=False)
        except NonceCacheFull as full:
            refused.append(full)
            continue
        assert cache.record(_key(i), "b" * 32, registered=False)
    assert len(refused) == 10_000 - 30
    assert {full.limit for full in refused} == {"unregistered_keys"}
    assert "unregistered keys are registering" in refused[0].message
    assert cache.unregistered_keys == 30
    assert len(cache) == 5 + 30 * 2
    for nonce in honest:
        assert not cache.record(HONEST, nonce)  # every replay still refused
    assert cache.record(HONEST, "f" * 32)  # and the honest key still served
    # A fresh key's third registration attempt in one window is its share's end.
    with pytest.raises(NonceCacheFull) as share:
        cache.record(_key(0), "c" * 32, registered=False)
    assert share.value.limit == "per_key"


def test_registered_keys_filling_the_shared_pool_leave_each_key_its_reserve() -> None:
    now = [0.0]
    cache = _bounded_cache(now, per_key_capacity=100)
    assert cache.record(HONEST, "0" * 32)
    # Two busy keys take their reserve and then the shared pool (100 beyond reserves).
    taken, limits = 0, []
    for i in range(2):
        for n in range(10_000):
            try:
                cache.record(_key(i), f"{n:032x}")
            except NonceCacheFull as full:
                limits.append(full.limit)
                break
            taken += 1
    assert limits == ["per_key", "shared"]
    assert cache.shared_in_use == 100
    assert taken == 2 * 5 + 100
    # The honest key's reserve is its own: four more calls in the window...
    for n in range(1, 5):
        assert cache.record(HONEST, f"{n:032x}")
    # ... and the fifth would draw on the full shared pool.
    with pytest.raises(NonceCacheFull) as refusal:
        cache.record(HONEST, f"{5:032x}")
    assert refusal.value.limit == "shared"
    assert not cache.record(HONEST, "0" * 32)  # still a replay, full or not


def test_trusted_keys_draw_on_no_pool_the_others_can_fill() -> None:
    now = [0.0]
    cache = _bounded_cache(now, max_keys=2, per_key_capacity=100)
    # Two registered keys take every key place and the whole shared pool.
    for i in range(2):
        for n in range(100):
            try:
                cache.record(_key(i), f"{n:032x}")
            except NonceCacheFull:
                break
    assert (cache.registered_keys, cache.shared_in_use) == (2, 100)
    with pytest.raises(NonceCacheFull):
        cache.record(_key(2), "a" * 32)
    # A trusted key (a trainer, say) calls on, up to its own per-key capacity.
    trainer = b"trainer-key".ljust(32, b"\0")
    for n in range(100):
        assert cache.record(trainer, f"{n:032x}", trusted=True)
    with pytest.raises(NonceCacheFull) as refusal:
        cache.record(trainer, "f" * 32, trusted=True)
    assert refusal.value.limit == "per_key"
    assert (cache.trusted_keys, cache.registered_keys, cache.shared_in_use) == (1, 2, 100)
    assert not cache.record(trainer, f"{0:032x}", trusted=True)
    # A trusted key that registered moves out of the registering pool into its own bounds.
    validator = b"validator-key".ljust(32, b"\0")
    assert cache.record(validator, "a" * 32, registered=False, address="ipv4:192.0.2.1")
    assert cache.record(validator, "b" * 32, trusted=True)
    assert (cache.trusted_keys, cache.unregistered_keys) == (2, 0)
    now[0] = 120.0
    assert (len(cache), cache.trusted_keys, cache.registered_keys, cache.shared_in_use) == (
        0,
        0,
        0,
        0,
    )


def test_key_bounds_refuse_the_new_key_and_forget_nothing() -> None:
    now = [0.0]
    cache = _bounded_cache(now, max_keys=3)
    for i in range(3):
        assert cache.record(_key(i), "a" * 32)
    with pytest.raises(NonceCacheFull) as full:
        cache.record(_key(3), "a" * 32)
    assert full.value.limit == "keys"
    assert "keys are calling within the replay window" in full.value.message
    for i in range(3):
        assert not cache.record(_key(i), "a" * 32)
    # A key with live nonces is not a new key: it goes on calling.
    assert cache.record(_key(0), "b" * 32)
    assert cache.registered_keys == 3


def test_a_registering_key_keeps_its_nonces_when_it_becomes_registered() -> None:
    now = [0.0]
    cache = _bounded_cache(now, reserved_per_key=1, capacity=2)
    # RegisterNode from a fresh key, then its first calls as a registered key.
    assert cache.record(HONEST, "a" * 32, registered=False)
    assert cache.record(HONEST, "b" * 32, registered=False)
    assert cache.unregistered_keys == 1
    assert not cache.record(HONEST, "a" * 32)  # the registration's replay, after it registered
    assert cache.record(HONEST, "c" * 32)  # moves to the registered bounds
    assert (cache.registered_keys, cache.unregistered_keys) == (1, 0)
    # It held 2 beyond a reserve of 1: one on the shared pool, and now a second (the call).
    assert cache.shared_in_use == 2
    # The unregistered pool it left is free for another fresh key; the flood cannot reach it.
    for i in range(30):
        assert cache.record(_key(i), "a" * 32, registered=False)
    with pytest.raises(NonceCacheFull):
        cache.record(_key(99), "a" * 32, registered=False)
    for nonce in ("a", "b", "c"):
        assert not cache.record(HONEST, nonce * 32)
    # A registered key that is unknown again (deregistered, calling RegisterNode) keeps its
    # partition's bounds: its nonces were never moved.
    assert not cache.record(HONEST, "a" * 32, registered=False)


def test_promotion_beyond_the_key_bound_is_refused_and_the_nonces_kept() -> None:
    now = [0.0]
    cache = _bounded_cache(now, max_keys=1)
    assert cache.record(_key(1), "a" * 32)
    assert cache.record(HONEST, "a" * 32, registered=False)
    with pytest.raises(NonceCacheFull) as full:
        cache.record(HONEST, "b" * 32)
    assert full.value.limit == "keys"
    assert (cache.registered_keys, cache.unregistered_keys) == (1, 1)
    assert not cache.record(HONEST, "a" * 32)


def test_one_address_takes_only_its_share_of_the_registering_pool() -> None:
    now = [0.0]
    cache = _bounded_cache(now, unregistered_per_address=5)
    flooder, honest = "ipv4:203.0.113.7", "ipv4:198.51.100.1"
    for i in range(5):
        assert cache.record(_key(i), "a" * 32, registered=False, address=flooder)
    with pytest.raises(NonceCacheFull) as refusal:
        cache.record(_key(5), "a" * 32, registered=False, address=flooder)
    assert refusal.value.limit == "address"
    assert flooder in refusal.value.message
    # Its keys already in go on (a retry of a registration), another address registers.
    assert cache.record(_key(0), "b" * 32, registered=False, address=flooder)
    assert cache.record(HONEST, "a" * 32, registered=False, address=honest)
    # A key that registered leaves its address's share: the address may register one more.
    assert cache.record(_key(0), "c" * 32)
    assert cache.record(_key(5), "a" * 32, registered=False, address=flooder)
    with pytest.raises(NonceCacheFull):
        cache.record(_key(6), "a" * 32, registered=False, address=flooder)
    # So does a key whose window closed.
    now[0] = 120.0
    assert cache.record(_key(6), "a" * 32, registered=False, address=flooder)


def test_partitions_expire_with_their_window() -> None:
    now = [0.0]
    cache = _bounded_cache(now)
    assert cache.record(HONEST, "a" * 32)
    for i in range(30):
        assert cache.record(_key(i), "a" * 32, registered=False)
    now[0] = 60.0
    assert cache.record(HONEST, "b" * 32)
    now[0] = 119.99
    assert not cache.record(HONEST, "a" * 32)  # live until the window closes
    with pytest.raises(NonceCacheFull):
        cache.record(_key(1000), "a" * 32, registered=False)
    now[0] = 120.0
    # The first window closed: the fresh keys' partitions are gone, the honest key keeps "b".
    assert cache.unregistered_keys == 0
    assert (len(cache), cache.registered_keys) == (1, 1)
    assert cache.record(HONEST, "a" * 32)
    assert not cache.record(HONEST, "b" * 32)
    assert cache.record(_key(1000), "a" * 32, registered=False)
    now[0] = 240.0
    assert (len(cache), cache.registered_keys, cache.unregistered_keys) == (0, 0, 0)
    assert cache.shared_in_use == 0


def test_random_traffic_never_accepts_a_live_nonce_twice_and_stays_bounded() -> None:
    """Against a plain model of the window: a live nonce is always refused as a replay (never
    accepted, never turned into a 'full'), and every bound holds."""
    rng = random.Random(25)
    now = [0.0]
    bounds = {
        "capacity": 40,
        "per_key_capacity": 12,
        "reserved_per_key": 3,
        "max_keys": 8,
        "max_unregistered_keys": 10,
        "unregistered_per_key": 2,
        "unregistered_per_address": 4,
    }
    cache = _bounded_cache(now, **bounds)
    seen: dict[tuple[bytes, str], float] = {}
    registered_keys = [_key(i) for i in range(12)]
    for step in range(20_000):
        now[0] += rng.expovariate(1 / 0.05)
        registered = rng.random() < 0.6
        key = rng.choice(registered_keys) if registered else _key(1000 + rng.randrange(100_000))
        if seen and rng.random() < 0.3:  # replay something recorded before
            key, nonce = rng.choice(list(seen)[-200:])
        else:
            nonce = f"{step:032x}"
        trusted = registered and key in registered_keys[:2]  # two trusted keys, as a trainer
        live = seen.get((key, nonce), -1.0) > now[0]
        try:
            address = f"ipv4:192.0.2.{rng.randrange(4)}"
            fresh = cache.record(
                key, nonce, registered=registered, trusted=trusted, address=address
            )
        except NonceCacheFull:
            assert not live, "a replay must be refused as a replay"
            continue
        assert fresh is not live
        if fresh:
            seen[(key, nonce)] = now[0] + 120.0
        assert cache.registered_keys <= bounds["max_keys"]
        assert cache.unregistered_keys <= bounds["max_unregistered_keys"]
        assert cache.shared_in_use <= bounds["capacity"]
        assert cache.trusted_keys <= 2
        assert len(cache) <= (
            bounds["max_keys"] * bounds["reserved_per_key"]
            + bounds["capacity"]
            + bounds["max_unregistered_keys"] * bounds["unregistered_per_key"]
            + 2 * bounds["per_key_capacity"]
        )
    assert sum(1 for expiry in seen.values() if expiry > now[0]) == len(cache)


def test_bounds_are_checked() -> None:
    with pytest.raises(ValueError, match="reserved_per_key"):
        NonceCache(ttl=1.0, capacity=10, per_key_capacity=2, reserved_per_key=3)
    with pytest.raises(ValueError, match="key bounds >= 1"):
        NonceCache(ttl=1.0, capacity=10, max_unregistered_keys=0)
    with pytest.raises(ValueError, match="ttl > 0"):
        NonceCache(ttl=0.0, capacity=10)


def test_a_key_allow_listed_while_it_calls_on_takes_the_trusted_bounds() -> None:
    """Trust follows the key from call to call: a validator allow-listed while it calls at least
    once a window (so its partition never expires) is not held to the registered bounds, and
    one whose role is revoked goes back to them, its nonces kept."""
    now = [0.0]
    cache = _bounded_cache(now, capacity=10, reserved_per_key=2, max_keys=2)
    validator = _key(1)
    assert cache.record(validator, "a" * 32)  # a registered worker still
    for i in range(12):  # another key fills the shared pool
        assert cache.record(_key(2), f"{i:032x}")
    assert cache.shared_in_use == 10
    for step in range(1, 6):  # allow-listed now: calls on, beyond its reserve
        now[0] = step * 10.0
        assert cache.record(validator, f"{step:032x}", trusted=True)
    assert (cache.trusted_keys, cache.registered_keys, cache.shared_in_use) == (1, 1, 10)
    assert not cache.record(validator, f"{5:032x}", trusted=True)  # its nonces stay
    # Its role revoked: back to the registered bounds, with what it holds beyond its reserve.
    with pytest.raises(NonceCacheFull) as refused:
        cache.record(validator, "b" * 32)
    assert refused.value.limit == "shared"
    assert (cache.trusted_keys, cache.registered_keys, cache.shared_in_use) == (0, 2, 14)
    assert not cache.record(validator, "a" * 32)
    with pytest.raises(NonceCacheFull) as refused:
        cache.record(_key(3), "a" * 32)
    assert refused.value.limit == "keys"
    now[0] = 200.0  # every window closed: nothing left, counts back to zero
    assert (len(cache), cache.trusted_keys, cache.registered_keys, cache.shared_in_use) == (
        0,
        0,
        0,
        0,
    )


def test_a_refusal_says_when_the_bound_frees_up() -> None:
    """A key at its own bound is told to come back when its oldest nonce expires (not in a
    second, to be refused again for the rest of the window); other bounds name the cache's
    oldest nonce's expiry, the earliest anything frees up."""
    now = [0.0]
    cache = _bounded_cache(now, per_key_capacity=3, reserved_per_key=3, max_keys=1)
    for step in range(3):
        now[0] = 10.0 * step
        assert cache.record(HONEST, f"{step:032x}")
    now[0] = 25.0
    with pytest.raises(NonceCacheFull) as refused:
        cache.record(HONEST, "f" * 32)
    assert (refused.value.limit, refused.value.retry_after) == ("per_key", 95.0)
    with pytest.raises(NonceCacheFull) as refused:
        cache.record(_key(1), "f" * 32)
    assert (refused.value.limit, refused.value.retry_after) == ("keys", 95.0)
    now[0] = 120.0  # the oldest expired: one call more, then the next oldest
    assert cache.record(HONEST, "f" * 32)
    with pytest.raises(NonceCacheFull) as refused:
        cache.record(HONEST, "e" * 32)
    assert refused.value.retry_after == 10.0


def test_random_trust_changes_keep_the_counts_exact() -> None:
    """Keys allow-listed and revoked at random while they call: replays are still refused, the
    bounds hold less what demoted keys brought back, and once every window closed every count
    is back to zero (no drift in the shared pool or the key counts)."""
    rng = random.Random(2026)
    now = [0.0]
    cache = _bounded_cache(now, capacity=30, per_key_capacity=10, reserved_per_key=3, max_keys=6)
    keys = [_key(i) for i in range(10)]
    trust = dict.fromkeys(keys, False)
    seen: dict[tuple[bytes, str], float] = {}
    for step in range(20_000):
        now[0] += rng.expovariate(1 / 0.05)
        key = rng.choice(keys)
        if rng.random() < 0.01:
            trust[key] = not trust[key]
        if seen and rng.random() < 0.3:
            key, nonce = rng.choice(list(seen)[-200:])
        else:
            nonce = f"{step:032x}"
        live = seen.get((key, nonce), -1.0) > now[0]
        try:
            fresh = cache.record(key, nonce, trusted=trust[key])
        except NonceCacheFull:
            assert not live, "a replay must be refused as a replay"
            continue
        assert fresh is not live
        if fresh:
            seen[(key, nonce)] = now[0] + 120.0
        assert len(cache) <= 6 * 3 + 30 + 10 * 10
    assert sum(1 for expiry in seen.values() if expiry > now[0]) == len(cache)
    now[0] += 121.0
    counts = (len(cache), cache.registered_keys, cache.trusted_keys, cache.shared_in_use)
    assert counts == (0, 0, 0, 0)
