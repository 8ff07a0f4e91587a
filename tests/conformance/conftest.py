"""A reference coordinator for the conformance suite to run against, with short timers (a 3 s
lease, so the lease-expiry cases run), a small upload quota and message cap (so the quota and
size cases are quick), an invite-only pool and a restart hook that stops it and starts it again
on the same port and database."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from conformance_testing import MESSAGE_CAP, NETWORK, QUOTA, Running

from rollnet.reference.coordinator.config import (
    PoolConfig,
    load_config,
    with_overrides,
)
from rollnet.reference.coordinator.server import start_coordinator
from rollnet.sdk import Identity


@pytest.fixture
async def running(tmp_path: Path, sqlite_url: str) -> AsyncIterator[Running]:
    keys = {role: Identity.generate() for role in ("validator", "trainer", "operator")}
    config = with_overrides(
        load_config(tmp_path / "coordinator"),
        database_url=sqlite_url,
        listen="127.0.0.1:0",
        network_id=NETWORK,
        validators=frozenset({keys["validator"].node_id}),
        trainers=frozenset({keys["trainer"].node_id}),
        operators=frozenset({keys["operator"].node_id}),
        heartbeat_interval=timedelta(seconds=2),
        lease_duration=timedelta(seconds=3),
        upload_quota_bytes=QUOTA,
        max_message_bytes=MESSAGE_CAP,
        registrations_per_ip_per_minute=200,
    )
    config = replace(
        config, pools={"": PoolConfig(), "invited": PoolConfig(frozenset({"conformance-token"}))}
    )
    state = Running(await start_coordinator(config), config, keys)
    try:
        yield state
    finally:
        await state.coordinator.stop(grace=0.5)
