"""The worker suite: the reference worker passes every scenario; a cheating worker is caught.

Each run builds the harness network (the tiny model, a reference coordinator and validator in
process) and launches the worker under test as a real ``rollnet`` process.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rollnet.reference.conformance.worker import (
    WORKER_CASES,
    WorkerHarnessConfig,
    run_worker_suite,
)
from rollnet.sdk.conformance import Outcome, Report, format_result

pytestmark = pytest.mark.slow

WORKER = (
    "{python} -m rollnet.reference.cli worker --coordinator {target} --key {key} "
    "--data-dir {data_dir} --network-id {network_id} --pull-wait 1 --torch-threads 1"
)
CHEAT = (
    "{python} -m rollnet.reference.adversary --cheat token_altered --coordinator {target} "
    "--key {key} --data-dir {data_dir} --network-id {network_id} --pull-wait 1 "
    "--torch-threads 1"
)


def _print(report: Report) -> None:
    for result in report.results:
        print(format_result(result))
    print(report.summary())


async def test_reference_worker_passes(tmp_path: Path) -> None:
    report = await run_worker_suite(
        WorkerHarnessConfig(command=WORKER, work_dir=tmp_path, work_timeout=60.0)
    )
    _print(report)
    assert [r.name for r in report.results] == [c.name for c in WORKER_CASES]
    assert all(r.outcome is Outcome.PASSED for r in report.results), report.summary()


async def test_catches_a_worker_whose_work_does_not_verify(tmp_path: Path) -> None:
    """A worker that alters a sampled token registers fine, but its work is rejected."""
    report = await run_worker_suite(
        WorkerHarnessConfig(command=CHEAT, work_dir=tmp_path, work_timeout=60.0),
        patterns=["worker.registers", "worker.work"],
    )
    _print(report)
    registers, work = report.results
    assert registers.outcome is Outcome.PASSED
    assert work.outcome is Outcome.FAILED
    assert "rejected" in work.detail
