"""Fixtures for worker tests: a fast-ticking coordinator config (the tiny model is the root's)."""

from __future__ import annotations

from pathlib import Path

import pytest
from worker_testing import coordinator_config_for

from rollnet.reference.coordinator.config import CoordinatorConfig
from rollnet.sdk.identity import Identity


@pytest.fixture
def trainer_identity() -> Identity:
    return Identity.generate()


@pytest.fixture
def coordinator_config(
    tmp_path: Path, sqlite_url: str, trainer_identity: Identity
) -> CoordinatorConfig:
    return coordinator_config_for(tmp_path, sqlite_url, trainer_identity)
