"""Appending to the hash chain, signing heads, balances and group commit, on both engines."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from rollnet.ledger import (
    AppendedEntry,
    EntryKind,
    GroupCommitWriter,
    NewEntry,
    append_entries,
    balance,
    balances,
    chain_tip,
    latest_signed_head,
    list_entries,
    sign_chain_head,
    verify_database,
)
from rollnet.ledger.canonical import GENESIS_HASH, canonical_entry_bytes, chain_hash, datetime_to_us
from rollnet.ledger.chain import public_key_bytes
from rollnet.sdk.testing import NETWORK_ID

T0 = datetime(2026, 1, 1, tzinfo=UTC)
AddNodes = Callable[..., list[str]]


def test_appends_chain_hashes_from_genesis(
    sessions: sessionmaker[Session], add_nodes: AddNodes, migrated_engine: Engine
) -> None:
    alice, bob = add_nodes(2)
    with sessions.begin() as session:
        assert chain_tip(session).sequence == 0
        first = append_entries(
            session,
            [
                NewEntry(alice, EntryKind.CREDIT, 1500, memo="accepted"),
                NewEntry(bob, EntryKind.SLASH, -300),
            ],
            now=T0,
        )
    with sessions.begin() as session:
        second = append_entries(
            session, [NewEntry(alice, EntryKind.ADJUSTMENT, -100, memo="correction")], now=T0
        )
    entries = first + second
    assert [entry.sequence for entry in entries] == [1, 2, 3]
    prev = GENESIS_HASH
    for entry in entries:
        assert entry.prev_hash == prev
        canonical = canonical_entry_bytes(
            sequence=entry.sequence,
            time_us=datetime_to_us(entry.recorded_at),
            node_id=entry.node_id,
            kind=entry.kind.value,
            amount=entry.amount,
            commitment_id=entry.commitment_id,
            verdict_id=entry.verdict_id,
            memo=entry.memo,
        )
        assert entry.entry_hash == chain_hash(prev, canonical)
        prev = entry.entry_hash
    with sessions.begin() as session:
        assert list_entries(session) == entries
        assert list_entries(session, after_sequence=2) == entries[2:]
        tip = chain_tip(session)
        assert (tip.sequence, tip.head_hash) == (3, entries[-1].entry_hash)
        assert balances(session) == dict(sorted({alice: 1400, bob: -300}.items()))
        assert balance(session, alice) == 1400
        assert balance(session, "f" * 32) == 0
    report = verify_database(migrated_engine)
    assert report.ok, report.summary()
    assert report.entries_verified == 3


def test_rolled_back_append_leaves_no_trace(
    sessions: sessionmaker[Session], add_nodes: AddNodes
) -> None:
    (alice,) = add_nodes(1)

    def append_good_then_bad() -> None:
        with sessions.begin() as session:
            append_entries(session, [NewEntry(alice, EntryKind.CREDIT, 10)], now=T0)
            # A bad reference fails the whole transaction: the good entry goes too.
            append_entries(
                session, [NewEntry(alice, EntryKind.CREDIT, 10, commitment_id="nope")], now=T0
            )

    with pytest.raises(IntegrityError):
        append_good_then_bad()
    with sessions.begin() as session:
        assert chain_tip(session).sequence == 0
        assert list_entries(session) == []


def test_entry_validation_refuses_wrong_signs_and_overflow() -> None:
    node = "0" * 32
    with pytest.raises(ValueError, match="cannot be negative"):
        NewEntry(node, EntryKind.CREDIT, -1)
    with pytest.raises(ValueError, match="cannot be positive"):
        NewEntry(node, EntryKind.SLASH, 1)
    with pytest.raises(ValueError, match="64-bit"):
        NewEntry(node, EntryKind.ADJUSTMENT, 2**63)
    with pytest.raises(ValueError, match="is not a valid EntryKind"):
        NewEntry(node, "bonus", 1)  # type: ignore[arg-type]


def test_signed_heads_are_idempotent_per_sequence_and_verify(
    sessions: sessionmaker[Session], add_nodes: AddNodes, migrated_engine: Engine
) -> None:
    (alice,) = add_nodes(1)
    key = Ed25519PrivateKey.generate()
    with sessions.begin() as session:
        empty_head = sign_chain_head(session, key, NETWORK_ID, now=T0)
        assert (empty_head.sequence, empty_head.head_hash) == (0, GENESIS_HASH)
        append_entries(session, [NewEntry(alice, EntryKind.CREDIT, 5)], now=T0)
        head = sign_chain_head(session, key, NETWORK_ID, now=T0)
        again = sign_chain_head(session, key, NETWORK_ID, now=T0 + timedelta(seconds=1))
    assert head == again
    assert head.sequence == 1
    assert head.signer_public_key == public_key_bytes(key)
    with sessions.begin() as session:
        assert latest_signed_head(session, NETWORK_ID) == head
        assert latest_signed_head(session, "other-network") is None
    pinned = verify_database(migrated_engine, pinned_key=public_key_bytes(key))
    assert pinned.ok, pinned.summary()
    assert pinned.heads_verified == 2
    assert "pinned coordinator key" in pinned.key_source
    unpinned = verify_database(migrated_engine)
    assert unpinned.ok
    assert "stored with the heads" in unpinned.key_source
    other = verify_database(
        migrated_engine, pinned_key=public_key_bytes(Ed25519PrivateKey.generate())
    )
    assert not other.ok
    assert other.first_bad_sequence == 0


def test_concurrent_appenders_never_fork_the_chain(
    migrated_engine: Engine, sessions: sessionmaker[Session], add_nodes: AddNodes
) -> None:
    """Four threads (stand-ins for coordinator replicas) append batches at the same time."""
    nodes = add_nodes(4)
    batches_per_thread = 15
    barrier = threading.Barrier(len(nodes))
    errors: list[BaseException] = []

    def replica(node_id: str) -> None:
        try:
            barrier.wait(timeout=30)
            for batch in range(batches_per_thread):
                with sessions.begin() as session:
                    append_entries(
                        session,
                        [
                            NewEntry(node_id, EntryKind.CREDIT, 1, memo=f"{node_id}:{batch}:{i}")
                            for i in range(10)
                        ],
                    )
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=replica, args=(node,)) for node in nodes]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not errors, errors
    report = verify_database(migrated_engine)
    assert report.ok, report.summary()
    total = len(nodes) * batches_per_thread * 10
    assert report.last_sequence == total
    with sessions.begin() as session:
        entries = list_entries(session, limit=total + 1)
    # Each batch is contiguous: group commit never interleaves two transactions' entries.
    for start in range(0, total, 10):
        memos = [entry.memo.rsplit(":", 1)[0] for entry in entries[start : start + 10]]
        assert len(set(memos)) == 1


def appending(entry: NewEntry) -> Callable[[Session], AppendedEntry]:
    """The unit of work that appends ``entry`` alone."""
    return lambda session: append_entries(session, [entry])[0]


def test_group_commit_writer_batches_concurrent_appends(
    migrated_engine: Engine, sessions: sessionmaker[Session], add_nodes: AddNodes
) -> None:
    nodes = add_nodes(8)
    per_thread = 50
    with GroupCommitWriter(sessions, max_batch=64) as appender:
        barrier = threading.Barrier(len(nodes))
        results: dict[str, list[int]] = {}

        def caller(node_id: str) -> None:
            barrier.wait(timeout=30)
            futures = [
                appender.submit_threadsafe(appending(NewEntry(node_id, EntryKind.CREDIT, i)))
                for i in range(per_thread)
            ]
            results[node_id] = [future.result(timeout=60).sequence for future in futures]

        threads = [threading.Thread(target=caller, args=(node,)) for node in nodes]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        batches = appender.batches
    sequences = sorted(sequence for values in results.values() for sequence in values)
    assert sequences == list(range(1, len(nodes) * per_thread + 1))
    for values in results.values():
        assert values == sorted(values)  # one caller's entries keep their order
    assert batches < len(nodes) * per_thread
    report = verify_database(migrated_engine)
    assert report.ok, report.summary()
    with sessions.begin() as session:
        assert balances(session) == {node: sum(range(per_thread)) for node in sorted(nodes)}


def test_group_commit_refuses_a_bad_entry_and_then_closes(
    sessions: sessionmaker[Session], add_nodes: AddNodes
) -> None:
    (alice,) = add_nodes(1)
    with GroupCommitWriter(sessions) as appender:
        # unknown node: FK fails
        bad = appender.submit_threadsafe(appending(NewEntry("f" * 32, EntryKind.CREDIT, 1)))
        with pytest.raises(IntegrityError):
            bad.result(timeout=60)
        good = appender.run(appending(NewEntry(alice, EntryKind.CREDIT, 2)), timeout=60)
    assert good.sequence == 1
    with pytest.raises(RuntimeError, match="shut down"):
        appender.submit_threadsafe(appending(NewEntry(alice, EntryKind.CREDIT, 3)))


def test_group_commit_failure_fails_only_the_entry_that_broke_the_batch(
    sessions: sessionmaker[Session], add_nodes: AddNodes
) -> None:
    """Entries queued behind a held chain tip share one transaction; one of them breaks it (its
    node does not exist). That entry fails alone: the batch is appended again in halves."""
    alice, bob = add_nodes(2)
    with GroupCommitWriter(sessions) as appender:
        submit = appender.submit_threadsafe
        with sessions.begin() as holder:
            chain_tip(holder, for_update=True)  # the appender waits for this lock
            first = submit(appending(NewEntry(alice, EntryKind.CREDIT, 1)))
            queued = [
                submit(appending(NewEntry(bob, EntryKind.CREDIT, 2))),
                submit(appending(NewEntry("f" * 32, EntryKind.CREDIT, 3))),  # unknown node
                submit(appending(NewEntry(alice, EntryKind.CREDIT, 4))),
                submit(appending(NewEntry(bob, EntryKind.CREDIT, 5, memo="after"))),
            ]
        with pytest.raises(IntegrityError):
            queued[1].result(timeout=60)
        written = [future.result(timeout=60) for future in (first, queued[0], *queued[2:])]
    assert [entry.sequence for entry in written] == [1, 2, 3, 4]  # in order, no gap
    assert [entry.amount for entry in written] == [1, 2, 4, 5]
    with sessions.begin() as session:
        assert balances(session) == {alice: 5, bob: 7}


def test_verification_reads_a_snapshot_without_waiting_for_writers(
    migrated_engine: Engine, sessions: sessionmaker[Session], add_nodes: AddNodes
) -> None:
    """A writer holding its transaction open neither blocks verification nor leaks into it."""
    (alice,) = add_nodes(1)
    with sessions.begin() as session:
        append_entries(session, [NewEntry(alice, EntryKind.CREDIT, 1)], now=T0)
    with sessions.begin() as writer:
        append_entries(writer, [NewEntry(alice, EntryKind.CREDIT, 2)], now=T0)
        writer.flush()
        report = verify_database(migrated_engine)  # another connection, same thread
        assert report.ok, report.summary()
        assert report.last_sequence == 1
    assert verify_database(migrated_engine).last_sequence == 2
