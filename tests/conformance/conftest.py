"""A reference coordinator for the conformance suite to run against, with short timers (a 3 s
lease, so the lease-expiry cases run), a small upload quota and message cap (so the quota and
size cases are quick), an invite-only pool and a restart hook that stops it and starts it again
on the same port and database."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from conformance_testing import MESSAGE_CAP, NETWORK, QUOTA, Running

from rollnet.reference.coordinator.config import (
    PoolConfig,
    with_overrides,
)
from rollnet.reference.coordinator.server import start_coordinator
from rollnet.reference.testing import coordinator_config
from rollnet.sdk import Identity


def conformance_config(tmp_path: Path, database_url: str, keys: dict[str, Identity]) -> Any:
    config = coordinator_config(
        tmp_path / "coordinator",
        database_url,
        network_id=NETWORK,
        validators=[keys["validator"]],
        trainers=[keys["trainer"]],
        operators=[keys["operator"]],
        heartbeat_interval=timedelta(seconds=2),
        lease_duration=timedelta(seconds=3),
        upload_quota_bytes=QUOTA,
        max_message_bytes=MESSAGE_CAP,
        registrations_per_ip_per_minute=200,
    )
    return replace(
        config, pools={"": PoolConfig(), "invited": PoolConfig(frozenset({"conformance-token"}))}
    )


@pytest.fixture
async def running(tmp_path: Path, sqlite_url: str) -> AsyncIterator[Running]:
    keys = {role: Identity.generate() for role in ("validator", "trainer", "operator")}
    config = conformance_config(tmp_path, sqlite_url, keys)
    state = Running(await start_coordinator(config), config, keys)
    try:
        yield state
    finally:
        await state.coordinator.stop(grace=0.5)


@pytest.fixture
async def second_replica(tmp_path: Path, fresh_postgres_url: str) -> AsyncIterator[Running]:
    """Replica B of two coordinators on one PostgreSQL database, sharing their key and blob
    store (replica A runs beside it: its sweeper, its caches)."""
    keys = {role: Identity.generate() for role in ("validator", "trainer", "operator")}
    base = conformance_config(tmp_path, fresh_postgres_url, keys)
    shared_key = tmp_path / "coordinator.key"
    first = with_overrides(base, data_dir=tmp_path / "replica-a", key_file=shared_key)
    second = with_overrides(base, data_dir=tmp_path / "replica-b", key_file=shared_key)
    first.blob_dir.mkdir(parents=True)
    second.data_dir.mkdir(parents=True)
    second.blob_dir.symlink_to(first.blob_dir, target_is_directory=True)
    replica_a = await start_coordinator(first)
    state = Running(await start_coordinator(second), second, keys, replica=replica_a.address)
    try:
        yield state
    finally:
        await state.coordinator.stop(grace=0.5)
        await replica_a.stop(grace=0.5)
