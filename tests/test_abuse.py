"""Abuse: every attack of ``bench/abuse.py``, briefly, against a real coordinator process.

The invariants, not the latencies: each limit holds (token buckets, the per-address
registration window, a node's uploads and long polls held at once), memory and open files stay
bounded, no garbage signature is accepted, and honest nodes' calls all succeed meanwhile. The
limits are set low so that a slow machine still runs into every one of them (the set-up
registers 9 keys: the flood finds 3 registrations left in the window).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest

from rollnet.reference.coordinator.dispatch import HeldPolls
from rollnet.reference.coordinator.registry import RegistrationLimiter
from rollnet.reference.coordinator.uploads import PendingUploads, QuotaExceeded
from rollnet.sdk import Identity

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import abuse  # bench/abuse.py, found through sys.path
from coordinator_load import Node

HONEST_NODES = 4
ATTACKER_KEYS = 4
LIMITS = abuse.Limits(
    # Below what the attacks' first volley sends at once (16 calls), however slow the machine.
    rate_per_key=2.0,
    burst_per_key=3,
    registrations_per_minute=12,
    # One lease per node: two uploads and one long poll held at once.
    max_leases_per_node=1,
    max_message_bytes=1 << 20,
    max_blob_bytes=8 << 20,
    upload_quota_bytes=16 << 20,
    # Long polls that wait return after 10 s (the phase lasts until they have); the others
    # must have been answered before 7.5 s.
    pull_wait_max=10.0,
)


@pytest.mark.slow
async def test_attacks_hold_their_limits(tmp_path: Path) -> None:
    trainer = Node(Identity.generate())
    with abuse.coordinator(tmp_path, LIMITS, trainer) as running:
        phases = await abuse.run_attacks(
            running,
            LIMITS,
            trainer,
            attacks=list(abuse.ATTACKS),
            seconds=1.0,
            honest_nodes=HONEST_NODES,
            attacker_keys=ATTACKER_KEYS,
            storm_keys=1,
            # 1 call/s per honest node: within its bucket.
            honest_rate=1.0 * HONEST_NODES,
            concurrency=16,
            long_polls=40,
            slow_streams=40,
            slow_size=2 << 20,  # above the in-memory limit: each stream has a temporary file
        )
        abuse.print_phases(phases)
        assert running.alive()
    by_name = {phase.name: phase for phase in phases}
    assert list(by_name) == ["baseline", *abuse.ATTACKS, "after all attacks"]

    for phase in phases:
        # Honest nodes are served all along.
        assert not phase.honest.failures, (phase.name, phase.honest.failures)
        assert phase.honest.calls() > 0, phase.name
        if phase.attack is not None:
            assert phase.attack.limit_held(), (phase.name, phase.attack)

    def answers(name: str) -> dict[str, int]:
        attack = by_name[name].attack
        assert attack is not None
        return dict(attack.answers)

    # Fresh keys from one address: the window's registrations (some taken by the set-up), no
    # more; the rest refused as rate-limited.
    flood = answers("register-flood")
    set_up = HONEST_NODES + ATTACKER_KEYS + 1  # and the trainer
    assert flood.get("OK", 0) <= LIMITS.registrations_per_minute - set_up
    assert flood["RESOURCE_EXHAUSTED/RATE_LIMITED"] > 0
    # One key's storms run into its bucket.
    for storm in ("heartbeat-storm", "pull-storm", "bogus-leases"):
        assert answers(storm)["RESOURCE_EXHAUSTED/RATE_LIMITED"] > 0, storm
    # One long poll per node waits; the others are answered at once (no task, or rate-limited).
    polls = answers("long-polls")
    assert polls["held open"] <= ATTACKER_KEYS * LIMITS.max_leases_per_node
    assert polls.get("OK", 0) > 0
    # Slowloris: two streams per node held, the rest refused.
    slow = answers("slowloris")
    assert slow["held open"] <= ATTACKER_KEYS * LIMITS.upload_streams()
    assert slow["RESOURCE_EXHAUSTED/UPLOAD_QUOTA_EXCEEDED"] > 0
    # Every oversized upload refused, each kind with its reason.
    oversized = answers("oversized")
    assert not [kind for kind in oversized if kind.endswith(": OK")], oversized
    for expected in (
        "over the blob cap: RESOURCE_EXHAUSTED/BLOB_TOO_LARGE",
        "more than declared: INVALID_ARGUMENT/BLOB_SIZE_MISMATCH",
        "message over the cap: RESOURCE_EXHAUSTED/MESSAGE_TOO_LARGE",
        "over the quota: RESOURCE_EXHAUSTED/UPLOAD_QUOTA_EXCEEDED",
    ):
        assert oversized.get(expected, 0) > 0, (expected, oversized)
    # No garbage signature gets in.
    garbage = answers("garbage-signatures")
    assert set(garbage) == {"UNAUTHENTICATED/SIGNATURE_INVALID"}, garbage
    # Bogus leases: the bound's worth served, one more refused at the edge.
    assert answers("bogus-leases")["INVALID_ARGUMENT/INVALID_FIELDS"] > 0

    # Bounded: memory within a generous factor of the start, open files back down.
    first, last = phases[0], phases[-1]
    peak = max(phase.rss_during for phase in phases)
    assert peak < max(3 * first.rss_before, first.rss_before + 512), (first.rss_before, peak)
    assert last.files_after <= first.files_before + 16
    assert max(phase.files_during for phase in phases) <= first.files_before + 64


@pytest.mark.slow
async def test_fresh_key_flood_cannot_unprotect_or_refuse_honest_nodes(tmp_path: Path) -> None:
    """A flood of fresh keys from one address fills that address's share of the replay cache's
    pool of registering keys and has its new keys refused by name; honest nodes are served
    meanwhile and their captured call, replayed all along, is refused NONCE_REPLAYED."""
    limits = dataclasses.replace(LIMITS, max_registering_keys=1_000)
    # The share: the registrations an address is admitted within one replay window (120 s).
    share = 2 * limits.registrations_per_minute
    trainer = Node(Identity.generate())
    with abuse.coordinator(tmp_path, limits, trainer) as running:
        phases = await abuse.run_attacks(
            running,
            limits,
            trainer,
            attacks=["fresh-key-flood"],
            seconds=2.0,
            honest_nodes=HONEST_NODES,
            attacker_keys=ATTACKER_KEYS,
            honest_rate=1.0 * HONEST_NODES,
            concurrency=16,
        )
        abuse.print_phases(phases)
        assert running.alive()
    baseline, flood, after = phases
    for phase in phases:
        assert not phase.honest.failures, (phase.name, phase.honest.failures)
        assert phase.honest.calls() > 0, phase.name
    attack = flood.attack
    assert attack is not None
    assert attack.limit_held(), attack
    assert attack.replays[abuse.REPLAY_REFUSED] > 0
    assert set(attack.replays) == {abuse.REPLAY_REFUSED}
    # The set-up's keys that have not called since they registered still hold a place in the
    # address's share: the flood gets the rest, then its new keys are refused by that bound.
    by_share = attack.answers["RESOURCE_EXHAUSTED/RATE_LIMITED (address)"]
    assert by_share > 0
    assert attack.answers.total() - by_share <= share
    assert after.rss_after < max(3 * baseline.rss_before, baseline.rss_before + 512)


def test_the_bench_measures_the_replay_cache_cost() -> None:
    line = abuse.nonce_cache_cost(100, capacity=2_000, calls=640)
    assert "100 registering keys and 2,000 shared nonces live" in line


def test_the_bench_side_by_side_shows_the_flood_served_only_by_the_partitions() -> None:
    """Below the shared pool's capacity both serve the honest keys; what differs is where the
    fresh keys go (a flood the size of the pool is the bench's, too slow for a test)."""
    shared, partitioned = abuse.flood_side_by_side(20_000, honest_keys=10)
    assert "fresh keys refused         0" in shared
    assert "honest new calls served 10/10, replays refused 10/10" in shared
    assert "fresh keys refused    10,000" in partitioned
    assert "honest new calls served 10/10, replays refused 10/10" in partitioned


def test_uploads_streaming_at_once_are_capped_per_node() -> None:
    uploads = PendingUploads(1 << 20, max_streams=2)
    first = uploads.begin("node", b"a" * 32, 10)
    uploads.begin("node", b"b" * 32, 10)
    with pytest.raises(QuotaExceeded, match="streaming 2 uploads"):
        uploads.begin("node", b"c" * 32, 10)
    # Another node, and a trusted uploader, are not held back by this one.
    uploads.begin("other", b"c" * 32, 10)
    for _ in range(5):
        uploads.begin(None, b"d" * 32, 10)
    # A stream that ends frees its place.
    uploads.finish(first, stored=False)
    assert uploads.streams("node") == 1
    third = uploads.begin("node", b"c" * 32, 10)
    # A stream refused over the quota takes no place.
    uploads.finish(third, stored=False)
    with pytest.raises(QuotaExceeded, match="quota"):
        uploads.begin("node", b"e" * 32, 2 << 20)
    assert uploads.streams("node") == 1


def test_long_polls_beyond_the_cap_do_not_wait() -> None:
    polls = HeldPolls(1)
    with polls.hold("node") as first:
        assert first
        with polls.hold("node") as second, polls.hold("other") as elsewhere:
            assert not second
            assert elsewhere
            assert polls.held("node") == 2
    assert polls.held("node") == 0
    with polls.hold("node") as again:
        assert again


def test_registration_windows_of_quiet_addresses_are_forgotten() -> None:
    now = [0.0]
    limiter = RegistrationLimiter(2, max_addresses=100, clock=lambda: now[0])
    for i in range(100):
        assert limiter.admit(f"2001:db8:{i:x}::1") is None
    assert len(limiter) == 100
    now[0] = 30.0
    assert limiter.admit("2001:db8:1::1") is None
    assert limiter.admit("2001:db8:1::1") is not None
    # A minute on, a new address drops the quiet windows, not the one still open.
    now[0] = 61.0
    assert limiter.admit("2001:db8:ffff::1") is None
    assert len(limiter) == 2
    assert limiter.admit("2001:db8:1::1") is None
    assert limiter.admit("2001:db8:1::1") is not None
    # Many addresses active within one minute are all kept: the limit holds for each.
    for i in range(1_000):
        now[0] += 0.001
        assert limiter.admit(f"10.{i // 256}.{i % 256}.1") is None
    assert len(limiter) == 1_002
    assert limiter.admit("10.0.0.1") is None
    assert limiter.admit("10.0.0.1") is not None


def test_registrations_from_one_ipv6_network_share_one_window() -> None:
    """An IPv6 subscriber holds a /64: every address of it counts as one (as the servicer passes
    it, a gRPC peer less its port); an IPv4-mapped address counts as its IPv4 address."""
    limiter = RegistrationLimiter(2, clock=lambda: 0.0)
    assert limiter.admit("ipv6:[2001:db8:7:7::1]") is None
    assert limiter.admit("ipv6:[2001:db8:7:7::2]") is None
    assert limiter.admit("ipv6:%5B2001:db8:7:7:ffff::3%5D") is not None
    assert limiter.admit("ipv6:[2001:db8:7:8::1]") is None
    assert limiter.admit("ipv4:192.0.2.9") is None
    assert limiter.admit("ipv4:192.0.2.9") is None
    assert limiter.admit("ipv6:[::ffff:192.0.2.9]") is not None
    assert len(limiter) == 3
