"""The shared batching loop: batches form behind a running commit, and a failed batch is tried
again in parts so that only the failing item's caller hears of it."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from rollnet.ledger.batching import AGAIN, Batcher, OnFailure
from rollnet.sdk.testing import wait_until


@dataclass
class Item:
    value: str
    future: asyncio.Future[str] | None = None
    tries: int = 0


class Doubler(Batcher[Item]):
    """Commits a batch by doubling each value; a batch holding ``bad`` fails as a whole."""

    def __init__(
        self,
        on_failure: OnFailure = OnFailure.SPLIT_IN_HALVES,
        *,
        skip: bool = False,
        max_batch: int = 16,
    ) -> None:
        super().__init__(max_batch=max_batch, on_failure=on_failure, skip_abandoned=skip)
        #: Commit number -> the event it waits for before answering.
        self.gates: dict[int, asyncio.Event] = {}
        self.commits: list[list[str]] = []
        self.requeued: list[str] = []

    async def submit(self, value: str) -> str:
        item = Item(value, asyncio.get_running_loop().create_future())
        self._enqueue(item)
        assert item.future is not None
        return await item.future

    def _requeued(self, item: Item) -> None:
        self.requeued.append(item.value)

    async def _commit(self, batch: list[Item]) -> Sequence[Any]:
        number = len(self.commits)
        self.commits.append([item.value for item in batch])
        gate = self.gates.get(number)
        if gate is not None:
            await gate.wait()
        if any(item.value == "bad" for item in batch):
            raise ValueError("bad item in the batch")
        outcomes: list[Any] = []
        for item in batch:
            item.tries += 1
            if item.value == "stop":  # an item's own failure, as an outcome
                outcomes.append(StopIteration("an exhausted iterator"))
                continue
            outcomes.append(AGAIN if item.value == "again" and item.tries == 1 else item.value * 2)
        return outcomes


async def _queue_behind_first(batcher: Doubler, values: list[str]) -> list[asyncio.Task[str]]:
    """Submit ``first`` (held in its commit by gate 0), then ``values`` queued behind it."""
    batcher.gates[0] = asyncio.Event()
    tasks = [asyncio.ensure_future(batcher.submit("first"))]
    await wait_until(lambda: batcher.commits == [["first"]], what="the first batch committing")
    tasks += [asyncio.ensure_future(batcher.submit(value)) for value in values]
    await wait_until(lambda: batcher.backlog == len(values), what="the others queued")
    return tasks


def test_parts_of_a_failed_batch() -> None:
    assert OnFailure.SPLIT_IN_HALVES.parts([1, 2, 3, 4, 5]) == [[1, 2], [3, 4, 5]]
    assert OnFailure.EACH_ALONE.parts([1, 2, 3]) == [[1], [2], [3]]


def test_max_batch_must_be_positive() -> None:
    with pytest.raises(ValueError, match="max_batch"):
        Doubler(max_batch=0)


async def test_halves_isolate_the_failing_item() -> None:
    batcher = Doubler()
    try:
        tasks = await _queue_behind_first(batcher, ["b", "bad", "c", "d"])
        batcher.gates[0].set()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await batcher.close()
    assert outcomes[:2] == ["firstfirst", "bb"]
    assert isinstance(outcomes[2], ValueError)
    assert outcomes[3:] == ["cc", "dd"]
    assert batcher.commits == [
        ["first"],
        ["b", "bad", "c", "d"],
        ["b", "bad"],
        ["b"],
        ["bad"],
        ["c", "d"],
    ]
    assert (batcher.batches, batcher.items, batcher.retried) == (6, 11, 0)


async def test_each_alone_skips_callers_who_left() -> None:
    batcher = Doubler(OnFailure.EACH_ALONE)
    try:
        tasks = await _queue_behind_first(batcher, ["b", "bad", "gone", "d"])
        batcher.gates[1] = asyncio.Event()  # the batch of four, held while one caller leaves
        batcher.gates[0].set()
        await wait_until(lambda: len(batcher.commits) == 2, what="the batch of four committing")
        tasks[3].cancel()
        batcher.gates[1].set()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await batcher.close()
    assert outcomes[:2] == ["firstfirst", "bb"]
    assert isinstance(outcomes[2], ValueError)
    assert isinstance(outcomes[3], asyncio.CancelledError)
    assert outcomes[4] == "dd"
    assert sorted(map(tuple, batcher.commits[2:])) == [("b",), ("bad",), ("d",)]
    assert (batcher.batches, batcher.items, batcher.retried) == (5, 8, 3)


async def test_abandoned_items_are_left_out_when_asked() -> None:
    batcher = Doubler(skip=True)
    try:
        tasks = await _queue_behind_first(batcher, ["left", "stays"])
        tasks[1].cancel()
        await wait_until(lambda: tasks[1].done(), what="the caller gone")
        batcher.gates[0].set()
        assert await tasks[2] == "staysstays"
    finally:
        await batcher.close()
    assert batcher.commits == [["first"], ["stays"]]


async def test_again_goes_back_in_the_queue() -> None:
    batcher = Doubler()
    try:
        assert await batcher.submit("again") == "againagain"
    finally:
        await batcher.close()
    assert batcher.requeued == ["again"]
    assert batcher.commits == [["again"], ["again"]]


async def test_close_cancels_queued_callers() -> None:
    batcher = Doubler()
    tasks = await _queue_behind_first(batcher, ["queued"])
    await batcher.close()
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(outcome, asyncio.CancelledError) for outcome in outcomes)
    assert batcher.commits == [["first"]]


async def test_drain_waits_until_every_queued_item_is_settled() -> None:
    batcher = Doubler()
    await batcher.drain()  # nothing queued: returns at once
    tasks = await _queue_behind_first(batcher, ["b", "again"])
    draining = asyncio.ensure_future(batcher.drain())
    await asyncio.sleep(0)
    assert not draining.done()
    batcher.gates[0].set()
    await draining
    assert all(task.done() for task in tasks)  # settled before drain returned
    await batcher.close()  # nothing left to cancel
    assert [task.result() for task in tasks] == ["firstfirst", "bb", "againagain"]
    assert batcher.commits == [["first"], ["b", "again"], ["again"]]


async def test_a_stop_iteration_outcome_reaches_its_caller() -> None:
    """An asyncio future refuses StopIteration as an outcome; its caller hears a RuntimeError
    instead of waiting for good, and the batcher goes on."""
    batcher = Doubler()
    try:
        with pytest.raises(RuntimeError) as raised:
            await asyncio.wait_for(batcher.submit("stop"), 10)
        assert isinstance(raised.value.__cause__, StopIteration)
        assert await asyncio.wait_for(batcher.submit("ok"), 10) == "okok"
    finally:
        await batcher.close()
