"""Key look-ups for the request verifier: batched, cached, bounded, and cleared by a ban."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

import pytest
from coordinator_testing import register
from sqlalchemy.orm import Session

from rollnet.reference.coordinator import keys as keys_module
from rollnet.reference.coordinator.keys import KeyDirectory
from rollnet.reference.coordinator.server import Coordinator
from rollnet.sdk import Identity
from rollnet.sdk.testing import connect
from rollnet.v1 import common_pb2

T = TypeVar("T")


async def _registered(coordinator: Coordinator, count: int) -> list[Identity]:
    identities = [Identity.generate() for _ in range(count)]
    for identity in identities:
        client = connect(coordinator.address, identity)
        try:
            await register(client, identity, common_pb2.ROLE_WORKER)
        finally:
            await client.close()
    return identities


async def test_concurrent_misses_are_read_together(coordinator: Coordinator) -> None:
    identities = await _registered(coordinator, 40)
    strangers = [Identity.generate() for _ in range(5)]
    coordinator.ctx.forget_keys()
    keys = KeyDirectory(coordinator.ctx)
    wanted = [i.public_key for i in identities + strangers]
    # Each key asked for twice at once: one answer serves both.
    answers = await asyncio.gather(*(keys.resolve(key) for key in wanted + wanted))
    for identity, known in zip(identities + identities, answers[:40] + answers[45:85], strict=True):
        assert known is not None
        assert known.node_id == identity.node_id
        assert known.role == common_pb2.ROLE_WORKER
        assert not known.banned
    assert answers[40:45] == [None] * 5
    assert answers[85:] == [None] * 5
    assert keys.keys_read == 45, "each missing key is read once"
    assert keys.reads <= 2, "the misses of one burst share a read"
    # Known keys are now cached; unknown ones are asked again (they may register meanwhile).
    await asyncio.gather(*(keys.resolve(key) for key in wanted))
    assert keys.keys_read == 50


async def test_the_cache_is_bounded_and_a_ban_clears_it(coordinator: Coordinator) -> None:
    identities = await _registered(coordinator, 6)
    coordinator.ctx.forget_keys()
    keys = KeyDirectory(coordinator.ctx, max_entries=4)
    for identity in identities:
        await keys.resolve(identity.public_key)
    cache = coordinator.ctx.key_cache
    assert list(cache) == [i.public_key for i in identities[2:]], "the oldest go first"
    await coordinator.ctx.run_in_transaction(lambda session: None)
    coordinator.ctx.forget_keys()
    assert not cache


async def test_a_read_in_flight_during_a_ban_does_not_refill_the_cache(
    coordinator: Coordinator, monkeypatch: pytest.MonkeyPatch
) -> None:
    (identity,) = await _registered(coordinator, 1)
    coordinator.ctx.forget_keys()
    keys = KeyDirectory(coordinator.ctx)
    started, release = asyncio.Event(), asyncio.Event()
    real_read = coordinator.ctx.run_read

    async def held_read(work: Callable[[Session], T]) -> T:
        started.set()
        await release.wait()
        return await real_read(work)

    monkeypatch.setattr(coordinator.ctx, "run_read", held_read)
    pending = asyncio.ensure_future(keys.resolve(identity.public_key))
    await started.wait()  # the read has begun
    coordinator.ctx.forget_keys()  # what a ban does
    release.set()
    assert await pending is not None
    assert identity.public_key not in coordinator.ctx.key_cache


async def test_a_flood_of_unknown_keys_is_read_in_bounded_batches(
    coordinator: Coordinator, monkeypatch: pytest.MonkeyPatch
) -> None:
    (identity,) = await _registered(coordinator, 1)
    coordinator.ctx.forget_keys()
    monkeypatch.setattr(keys_module, "KEYS_PER_READ", 50)
    keys = KeyDirectory(coordinator.ctx)
    strangers = [Identity.generate().public_key for _ in range(120)]
    answers = await asyncio.gather(
        *(keys.resolve(key) for key in [*strangers, identity.public_key])
    )
    assert answers[:120] == [None] * 120
    assert answers[120] is not None
    assert keys.keys_read == 121
    assert keys.largest_read == 50
    assert keys.reads == 3


async def test_callers_are_not_stranded_when_the_reader_is_cancelled(
    coordinator: Coordinator, monkeypatch: pytest.MonkeyPatch
) -> None:
    keys = KeyDirectory(coordinator.ctx)
    started = asyncio.Event()

    async def stuck_read(work: Callable[[Session], T]) -> T:
        started.set()
        await asyncio.Event().wait()  # never answers
        raise AssertionError("unreachable")

    monkeypatch.setattr(coordinator.ctx, "run_read", stuck_read)
    first = asyncio.ensure_future(keys.resolve(Identity.generate().public_key))
    await started.wait()
    second = asyncio.ensure_future(keys.resolve(Identity.generate().public_key))
    await asyncio.sleep(0)
    assert keys._reading is not None
    keys._reading.cancel()
    for caller in (first, second):
        with pytest.raises(asyncio.CancelledError):
            await caller
    assert keys._reading is None
