"""Fixtures for coordinator tests: a real coordinator on port 0 and signed SDK clients."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rollnet.reference import testing as reference_testing
from rollnet.reference.coordinator.config import CoordinatorConfig
from rollnet.reference.coordinator.server import Coordinator, start_coordinator
from rollnet.sdk.identity import Identity


@pytest.fixture
def trainer_identity() -> Identity:
    return Identity.generate()


@pytest.fixture
def validator_identity() -> Identity:
    return Identity.generate()


@pytest.fixture
def operator_identity() -> Identity:
    return Identity.generate()


@pytest.fixture
def coordinator_config(
    tmp_path: Path,
    db_url: str,
    trainer_identity: Identity,
    validator_identity: Identity,
    operator_identity: Identity,
) -> CoordinatorConfig:
    return reference_testing.coordinator_config(
        tmp_path / "coordinator",
        db_url,
        trainers=[trainer_identity],
        validators=[validator_identity],
        operators=[operator_identity],
    )


@pytest.fixture
async def coordinator(coordinator_config: CoordinatorConfig) -> AsyncIterator[Coordinator]:
    running = await start_coordinator(coordinator_config)
    try:
        yield running
    finally:
        await running.stop(grace=0.5)
