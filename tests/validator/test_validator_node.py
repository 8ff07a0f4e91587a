"""The validator process's refusals: a key that is not on the coordinator's validators
allow-list, or a coordinator serving another network, stops it with a clear error; an allowed
one registers and deregisters when stopped."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest
from swarm_testing import Ledger
from validator_testing import coordinator_config_for

from rollnet.ledger.enums import NodeState
from rollnet.reference.coordinator.server import start_coordinator
from rollnet.reference.validator import Validator, ValidatorConfig, ValidatorFatalError
from rollnet.sdk.identity import Identity
from rollnet.sdk.testing import NETWORK_ID, wait_until
from rollnet.sdk.worker import Backoff


@pytest.mark.timeout(60)
async def test_a_key_off_the_allow_list_is_refused(tmp_path: Path, sqlite_url: str) -> None:
    allowed, stranger = Identity.generate(), Identity.generate()
    coordinator = await start_coordinator(
        coordinator_config_for(tmp_path, sqlite_url, Identity.generate(), allowed)
    )
    ledger = Ledger(sqlite_url)
    config = ValidatorConfig(
        target=coordinator.address,
        data_dir=tmp_path / "validator",
        network_id=NETWORK_ID,
        backoff=Backoff(initial=0.1, maximum=0.5),
    )
    try:
        with pytest.raises(ValidatorFatalError, match="ROLE_NOT_PERMITTED"):
            await asyncio.wait_for(Validator(config, stranger).run(), 20)
        wrong_network = replace(config, network_id="another-network")
        with pytest.raises(ValidatorFatalError):
            await asyncio.wait_for(Validator(wrong_network, allowed).run(), 20)
        # The allowed key registers, idles, and deregisters when asked to stop.
        validator = Validator(config, allowed)
        running = asyncio.create_task(validator.run())
        await wait_until(
            lambda: ledger.node_state(allowed.node_id) is not None, within=20, what="registration"
        )
        validator.request_stop()
        await asyncio.wait_for(running, 20)
        assert ledger.node_state(allowed.node_id) is NodeState.DEREGISTERED
        assert validator.verdicts_submitted == 0
    finally:
        await coordinator.stop(grace=0.5)
        ledger.close()
