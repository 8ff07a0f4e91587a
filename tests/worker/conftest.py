"""Fixtures for worker tests: the tiny model (made once), a fast-ticking coordinator config."""

from __future__ import annotations

from pathlib import Path

import pytest
from worker_testing import coordinator_config_for

from rollnet.reference.coordinator.config import CoordinatorConfig
from rollnet.sdk.identity import Identity


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from rollnet.reference.model.tiny import init_tiny_model

    return init_tiny_model(tmp_path_factory.mktemp("tiny-model"), seed=0)


@pytest.fixture
def trainer_identity() -> Identity:
    return Identity.generate()


@pytest.fixture
def coordinator_config(
    tmp_path: Path, sqlite_url: str, trainer_identity: Identity
) -> CoordinatorConfig:
    return coordinator_config_for(tmp_path, sqlite_url, trainer_identity)
