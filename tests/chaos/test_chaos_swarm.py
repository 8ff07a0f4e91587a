"""The local swarm under faults of every kind (the short version of ``bench/chaos.py``).

Real processes on SQLite — coordinator, trainer, two relays, two workers, a validator — with one
or more faults of every kind that applies to SQLite (process kills and restarts of each role,
proxy delay, resets and a partition); afterwards every invariant must hold: no rollout trained on
twice, no commitment credited twice, no task stuck under a dead lease, the ledger verifies,
training progressed and every process serves. Recovery times are printed, not asserted.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rollnet.reference.chaos import FAULT_KINDS, ChaosConfig, SwarmConfig, run_chaos


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_the_swarm_survives_a_fault_of_every_kind_on_sqlite(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    config = ChaosConfig(
        swarm=SwarmConfig(
            data_dir=tmp_path / "swarm",
            workers=2,
            validators=1,
            warm_start_steps=50,
            model_root=tmp_path_factory.mktemp("chaos-models"),
        ),
        budget=1.0,  # one round: every kind once, however long each recovery takes
        seed=7,
        fault_seconds=4.0,
    )
    report = await run_chaos(config)
    print(report.table())
    assert {f.kind for f in report.faults} == set(FAULT_KINDS) - {
        "drop_db_connections",
        "restart_database",
    }
    assert all(f.survived for f in report.faults), report.table()
    broken = [i for i in report.invariants if not i.holds]
    assert not broken, report.table()
    assert len(report.invariants) == 6
