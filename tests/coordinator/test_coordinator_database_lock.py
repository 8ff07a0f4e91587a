"""One coordinator per SQLite database: a second one on the same data dir (or the same
database file through --db) is refused with a one-line ConfigError naming the first one's
process; once the first stops, the database is free again."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from coordinator_testing import sqlite_only

from rollnet.reference.coordinator.config import ConfigError, CoordinatorConfig, with_overrides
from rollnet.reference.coordinator.server import start_coordinator


@sqlite_only
@pytest.mark.slow
async def test_a_second_coordinator_on_one_sqlite_database_is_refused(
    coordinator_config: CoordinatorConfig, tmp_path: Path
) -> None:
    own_dir = with_overrides(coordinator_config, database_url=None, data_dir=tmp_path / "data")
    first = await start_coordinator(own_dir)
    try:
        for second in (
            own_dir,  # the same data dir
            with_overrides(  # another data dir, the same database file
                own_dir,
                data_dir=tmp_path / "elsewhere",
                database_url=f"sqlite:///{tmp_path / 'data' / 'rollnet.db'}",
            ),
        ):
            with pytest.raises(ConfigError) as refused:
                await start_coordinator(second)
            message = str(refused.value)
            assert "another coordinator" in message
            assert f"process {os.getpid()}" in message
            assert "\n" not in message
        assert first.readiness.serving  # the first one is untouched
    finally:
        await first.stop(grace=0.1)
    again = await start_coordinator(own_dir)
    await again.stop(grace=0.1)
