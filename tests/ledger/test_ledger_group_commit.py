"""Group commit (the coordinator's SQLite writer): calls queued behind a running commit share
the next one.

Each call's work runs in its own savepoint, so one call's failure loses nothing of the others,
and nobody hears success unless the shared COMMIT went through.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from rollnet.ledger.batching import OnFailure
from rollnet.ledger.engine import create_engine, session_factory
from rollnet.ledger.group_commit import GroupCommitWriter


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    engine = create_engine(data_dir=tmp_path)
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE parent (id INTEGER PRIMARY KEY)"))
        connection.execute(
            text(
                "CREATE TABLE item (x INTEGER UNIQUE, parent INTEGER REFERENCES parent(id) "
                "DEFERRABLE INITIALLY DEFERRED)"
            )
        )
    yield engine
    engine.dispose()


def stored(engine: Engine) -> list[int]:
    with engine.connect() as connection:
        return sorted(x for (x,) in connection.execute(text("SELECT x FROM item")))


def insert(
    x: int, *, parent: int | None = None, then_fail: bool = False
) -> Callable[[Session], int]:
    def work(session: Session) -> int:
        session.execute(text("INSERT INTO item (x, parent) VALUES (:x, :p)"), {"x": x, "p": parent})
        if then_fail:
            raise ValueError(f"refused after writing {x}")
        return x

    return work


class Hold:
    """A unit of work that holds the writer thread until :attr:`release` is set."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self, session: Session) -> None:
        self.started.set()
        self.release.wait(timeout=30)


async def held_batch(writer: GroupCommitWriter, *works: Callable[[Session], int]) -> list[Any]:
    """Run ``works`` as one batch: they queue while a first call holds the writer."""
    hold = Hold()
    first = writer.submit(hold)
    await asyncio.to_thread(hold.started.wait, 30)
    futures = [writer.submit(work) for work in works]
    hold.release.set()
    await first
    return await asyncio.gather(*futures, return_exceptions=True)


async def test_one_failing_call_rolls_back_only_its_own_writes(engine: Engine) -> None:
    writer = GroupCommitWriter(session_factory(engine))
    try:
        results = await held_batch(
            writer,
            insert(1),
            insert(2, then_fail=True),
            insert(1),  # unique violation: this call alone fails
            insert(3),
        )
    finally:
        writer.shutdown()
    assert results[0] == 1
    assert results[3] == 3
    assert isinstance(results[1], ValueError)
    assert isinstance(results[2], IntegrityError)
    assert stored(engine) == [1, 3]
    # The blocker committed alone; the four queued calls shared the next commit.
    assert (writer.batches, writer.jobs) == (2, 5)


async def test_a_failed_commit_fails_only_the_call_that_broke_it(engine: Engine) -> None:
    writer = GroupCommitWriter(session_factory(engine))
    try:
        # The deferred foreign key is checked at COMMIT: the shared transaction is refused
        # there, so its halves are committed alone, down to the call that breaks the key.
        results = await held_batch(
            writer, insert(1), insert(2), insert(3, parent=99), insert(4), insert(5)
        )
    finally:
        writer.shutdown()
    assert [results[i] for i in (0, 1, 3, 4)] == [1, 2, 4, 5], results
    assert isinstance(results[2], IntegrityError), results
    assert stored(engine) == [1, 2, 4, 5]


async def test_a_lone_call_commits_or_rolls_back_whole(engine: Engine) -> None:
    writer = GroupCommitWriter(session_factory(engine))
    try:
        assert await writer.submit(insert(7)) == 7
        with pytest.raises(ValueError, match="refused after writing 8"):
            await writer.submit(insert(8, then_fail=True))
    finally:
        writer.shutdown()
    assert stored(engine) == [7]
    with pytest.raises(RuntimeError, match="shut down"):
        writer.submit(insert(9))


async def test_shutdown_finishes_queued_work(engine: Engine) -> None:
    writer = GroupCommitWriter(session_factory(engine))
    futures = [writer.submit(insert(x)) for x in range(20)]
    await asyncio.to_thread(writer.shutdown)
    assert await asyncio.gather(*futures) == list(range(20))
    assert stored(engine) == list(range(20))


def test_a_caller_whose_loop_closed_does_not_stop_the_writer(engine: Engine) -> None:
    writer = GroupCommitWriter(session_factory(engine))
    release = threading.Event()

    def slow(session: Session) -> int:
        release.wait(timeout=30)
        return 0

    async def queue_slow() -> None:
        writer.submit(slow)  # its caller will be gone when it finishes

    gone = asyncio.new_event_loop()
    gone.run_until_complete(queue_slow())
    gone.close()
    release.set()

    async def next_call() -> int:
        return await asyncio.wait_for(writer.submit(insert(7)), timeout=30)

    try:
        assert asyncio.run(next_call()) == 7
    finally:
        writer.shutdown()
    assert stored(engine) == [7]


async def test_a_threads_call_cancelled_before_its_batch_does_not_run(engine: Engine) -> None:
    """A thread may cancel its call until a batch takes it; an event loop's caller that goes
    away does not take back its write."""
    writer = GroupCommitWriter(session_factory(engine))
    hold = Hold()
    try:
        first = writer.submit(hold)
        await asyncio.to_thread(hold.started.wait, 30)
        cancelled = writer.submit_threadsafe(insert(1))
        kept = writer.submit_threadsafe(insert(2))
        left = writer.submit(insert(3))
        assert writer.backlog == 3
        assert cancelled.cancel()
        left.cancel()
        hold.release.set()
        await first
        assert await asyncio.wrap_future(kept) == 2
        assert await writer.submit(insert(4)) == 4
    finally:
        writer.shutdown()
    assert stored(engine) == [2, 3, 4]
    assert writer.backlog == 0


def test_calls_from_threads_and_loops_share_a_batch(engine: Engine) -> None:
    writer = GroupCommitWriter(session_factory(engine))
    hold = Hold()

    async def on_a_loop(first: int) -> list[int]:
        futures = [writer.submit(insert(x)) for x in range(first, first + 3)]
        hold.release.set()
        return list(await asyncio.gather(*futures))

    try:
        held = writer.submit_threadsafe(hold)
        assert hold.started.wait(30)
        threaded = [writer.submit_threadsafe(insert(x)) for x in range(10, 13)]
        assert asyncio.run(on_a_loop(20)) == [20, 21, 22]
        assert [future.result(timeout=30) for future in threaded] == [10, 11, 12]
        held.result(timeout=30)
    finally:
        writer.shutdown()
    # The blocker committed alone; the six calls queued behind it shared the next commit.
    assert (writer.batches, writer.jobs) == (2, 7)
    assert stored(engine) == [10, 11, 12, 20, 21, 22]


class Halt(BaseException):
    """A BaseException of a unit of work's own."""


def stop(writer: GroupCommitWriter) -> None:
    """Shut ``writer`` down, failing (rather than hanging) should that never return."""
    stopping = threading.Thread(target=writer.shutdown, daemon=True)
    stopping.start()
    stopping.join(30)
    assert not stopping.is_alive(), "shutdown() hung"


@pytest.mark.parametrize("error", [KeyboardInterrupt, SystemExit, asyncio.CancelledError, Halt])
def test_a_unit_raising_a_base_exception_fails_its_own_caller_only(
    engine: Engine, error: type[BaseException]
) -> None:
    """Not the writer's to stop on: the unit's caller hears it (as from a thread pool), its
    writes are rolled back, and the writer goes on; before, the callers hung for good."""

    def fail(x: int) -> Callable[[Session], int]:
        def work(session: Session) -> int:
            insert(x)(session)
            raise error(f"raised after writing {x}")

        return work

    writer = GroupCommitWriter(session_factory(engine))
    hold = Hold()
    try:
        with pytest.raises(error):
            writer.submit_threadsafe(fail(1)).result(timeout=10)  # alone in its transaction
        held = writer.submit_threadsafe(hold)
        assert hold.started.wait(30)
        futures = [writer.submit_threadsafe(work) for work in (insert(2), fail(3), insert(4))]
        hold.release.set()
        held.result(timeout=10)
        assert futures[0].result(timeout=10) == 2
        with pytest.raises(error):
            futures[1].result(timeout=10)
        assert futures[2].result(timeout=10) == 4
        assert writer.run(insert(5), timeout=10) == 5
    finally:
        hold.release.set()
        stop(writer)
    assert stored(engine) == [2, 4, 5]


def test_shutdown_returns_after_a_unit_raised_a_base_exception(engine: Engine) -> None:
    writer = GroupCommitWriter(session_factory(engine))

    def halt(session: Session) -> None:
        raise Halt

    future = writer.submit_threadsafe(halt)
    try:
        with pytest.raises(Halt):
            future.result(timeout=10)
    finally:
        stop(writer)


@pytest.mark.parametrize("on_failure", list(OnFailure))
async def test_a_caller_who_left_has_its_work_committed_after_a_failed_commit(
    engine: Engine, on_failure: OnFailure
) -> None:
    """An event loop's caller that went away while its batch ran still has its write, also
    when that batch's COMMIT failed and its units are committed again in parts."""
    writer = GroupCommitWriter(session_factory(engine), on_failure=on_failure)
    inside = Hold()  # the batch's first unit: holds the batch while a caller leaves

    def first(session: Session) -> int:
        inside(session)
        return insert(1)(session)

    hold = Hold()
    try:
        held = writer.submit(hold)
        await asyncio.to_thread(hold.started.wait, 30)
        works = (first, insert(2), insert(3, parent=99))  # the third breaks the batch's COMMIT
        futures = [writer.submit(work) for work in works]
        hold.release.set()
        await held
        await asyncio.to_thread(inside.started.wait, 30)
        futures[1].cancel()
        inside.release.set()
        results = await asyncio.gather(*futures, return_exceptions=True)
    finally:
        hold.release.set()
        inside.release.set()
        await asyncio.to_thread(stop, writer)
    assert results[0] == 1
    assert isinstance(results[1], asyncio.CancelledError)
    assert isinstance(results[2], IntegrityError)
    assert stored(engine) == [1, 2]


async def test_a_unit_may_return_an_exception(engine: Engine) -> None:
    """A unit's value is its caller's result whatever it is, an exception object included."""
    error = ValueError("a value, not a failure")

    def give(session: Session) -> ValueError:
        return error

    writer = GroupCommitWriter(session_factory(engine))
    hold = Hold()
    try:
        assert await writer.submit(give) is error  # alone in its transaction
        held = writer.submit(hold)
        await asyncio.to_thread(hold.started.wait, 30)
        looped, threaded = writer.submit(give), writer.submit_threadsafe(give)
        hold.release.set()
        await held
        assert await looped is error
        assert await asyncio.wrap_future(threaded) is error
    finally:
        hold.release.set()
        await asyncio.to_thread(stop, writer)


def test_run_from_a_unit_of_work_refuses_rather_than_wait_forever(engine: Engine) -> None:
    """The writer thread waiting on its own queue would never get to the call it waits for."""
    writer = GroupCommitWriter(session_factory(engine))

    def nested(session: Session) -> int:
        return writer.run(insert(1))

    try:
        with pytest.raises(RuntimeError, match="unit of work"):
            writer.run(nested, timeout=10)
        assert writer.run(insert(2), timeout=10) == 2
    finally:
        stop(writer)
    assert stored(engine) == [2]


async def test_a_unit_raising_stop_iteration_fails_its_own_caller_only(engine: Engine) -> None:
    """An asyncio future refuses StopIteration: the unit's caller hears a RuntimeError, and the
    calls settled after it on the same loop are settled all the same."""

    def exhausted(session: Session) -> int:
        return next(iter([]))

    writer = GroupCommitWriter(session_factory(engine))
    try:
        alone = await asyncio.wait_for(
            asyncio.gather(writer.submit(exhausted), return_exceptions=True), 10
        )
        batched = await asyncio.wait_for(held_batch(writer, exhausted, insert(1)), 10)
    finally:
        await asyncio.to_thread(stop, writer)
    assert isinstance(alone[0], RuntimeError)
    assert isinstance(batched[0], RuntimeError)
    assert isinstance(batched[0].__cause__, StopIteration)
    assert batched[1] == 1
    assert stored(engine) == [1]


def test_backlog_never_counts_below_zero(engine: Engine) -> None:
    """A call is counted submitted before the writer can take it, and read so."""
    writer = GroupCommitWriter(session_factory(engine))
    lowest = 0
    done = threading.Event()

    def watch() -> None:
        nonlocal lowest
        while not done.is_set():
            lowest = min(lowest, writer.backlog)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        futures = [writer.submit_threadsafe(lambda session: None) for _ in range(5000)]
        for future in futures:
            future.result(timeout=30)
    finally:
        done.set()
        watcher.join()
        stop(writer)
    assert lowest == 0
    assert writer.backlog == 0
