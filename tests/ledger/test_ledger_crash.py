"""A writer SIGKILLed mid-batch leaves a valid chain and no partial batch."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import func, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from rollnet.ledger import EntryKind, NewEntry, append_entries, verify_database
from rollnet.ledger.models import LedgerEntry
from rollnet.sdk.testing import wait_until_blocking

CHILD = Path(__file__).with_name("crash_appender.py")
BATCH = 2000
AddNodes = Callable[..., list[str]]


def _batch_sizes(sessions: sessionmaker[Session]) -> Counter[str]:
    with sessions.begin() as session:
        memos = session.scalars(select(LedgerEntry.memo).where(LedgerEntry.memo.like("batch-%")))
        return Counter(memo.split(":", 1)[0] for memo in memos)


def _start(db_url: str, node_id: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(CHILD), db_url, node_id, str(BATCH), *extra],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


def _read_until(child: subprocess.Popen[str], wanted: str) -> None:
    assert child.stdout is not None
    for line in child.stdout:
        if line.strip() == wanted:
            return
    pytest.fail(f"child exited with {child.wait()} before printing {wanted!r}")


def _kill(child: subprocess.Popen[str]) -> None:
    os.kill(child.pid, signal.SIGKILL)
    assert child.wait(timeout=30) == -signal.SIGKILL


def _assert_whole_batches_and_valid_chain(
    engine: Engine, sessions: sessionmaker[Session], expected_entries: int | None = None
) -> Counter[str]:
    sizes = _batch_sizes(sessions)
    assert all(size == BATCH for size in sizes.values()), sizes
    report = verify_database(engine)
    assert report.ok, report.summary()
    if expected_entries is not None:
        assert report.last_sequence == expected_entries
    return sizes


def test_sigkill_mid_transaction_leaves_no_partial_batch(
    db_url: str, migrated_engine: Engine, sessions: sessionmaker[Session], add_nodes: AddNodes
) -> None:
    (node_id,) = add_nodes(1)
    child = _start(db_url, node_id, "3")
    try:
        _read_until(child, "committed 2")
        _read_until(child, "inserted 3")  # batch 3's rows are written, not committed
        _kill(child)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    sizes = _assert_whole_batches_and_valid_chain(migrated_engine, sessions, 2 * BATCH)
    assert sorted(sizes) == ["batch-1", "batch-2"]
    # The chain continues cleanly after the crash.
    with sessions.begin() as session:
        appended = append_entries(session, [NewEntry(node_id, EntryKind.CREDIT, 1)])
    assert appended[0].sequence == 2 * BATCH + 1
    assert verify_database(migrated_engine).ok


def test_sigkill_at_an_arbitrary_point_leaves_no_partial_batch(
    db_url: str, migrated_engine: Engine, sessions: sessionmaker[Session], add_nodes: AddNodes
) -> None:
    """Kill as soon as rows are visible in the database, wherever the writer happens to be."""
    (node_id,) = add_nodes(1)
    child = _start(db_url, node_id)

    def rows_visible() -> bool:
        with sessions.begin() as session:
            count = session.scalar(select(func.count()).select_from(LedgerEntry)) or 0
        if count >= 2 * BATCH:
            return True
        assert child.poll() is None, "the writer died on its own"
        return False

    try:
        wait_until_blocking(rows_visible, within=60, what="rows in the database", poll=0.01)
        _kill(child)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    sizes = _assert_whole_batches_and_valid_chain(migrated_engine, sessions)
    assert len(sizes) >= 2
