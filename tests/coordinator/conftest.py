"""Fixtures for coordinator tests: a real coordinator on port 0 and signed SDK clients."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from rollnet.reference.coordinator.config import CoordinatorConfig, load_config, with_overrides
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
    base = load_config(tmp_path / "coordinator")
    return with_overrides(
        base,
        database_url=db_url,
        listen="127.0.0.1:0",
        network_id="rollnet-test",
        trainers=frozenset({trainer_identity.node_id}),
        validators=frozenset({validator_identity.node_id}),
        operators=frozenset({operator_identity.node_id}),
    )


@pytest.fixture
async def coordinator(coordinator_config: CoordinatorConfig) -> AsyncIterator[Coordinator]:
    running = await start_coordinator(coordinator_config)
    try:
        yield running
    finally:
        await running.stop(grace=0.5)
