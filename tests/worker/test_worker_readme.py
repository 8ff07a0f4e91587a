"""The README's worker example runs as written: saved to a file and started with python, it
registers, leases a task, builds its rollouts with the SDK's helpers and gets a receipt from a
real coordinator; SIGTERM drains it and it exits 0."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from worker_testing import request_tasks, start_trainer

from rollnet.reference.cli import main as cli_main
from rollnet.reference.coordinator.config import CoordinatorConfig
from rollnet.reference.coordinator.server import start_coordinator
from rollnet.sdk.identity import Identity
from rollnet.sdk.testing import NETWORK_ID, wait_until

README = Path(__file__).resolve().parents[2] / "README.md"


def readme_example() -> str:
    text = README.read_text()
    section = text[text.index("## Using the SDK") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None
    return match.group(1)


def _receipts(outbox: Path) -> int:
    if not outbox.exists():
        return 0
    with sqlite3.connect(outbox) as connection:
        try:
            return int(connection.execute("SELECT count(*) FROM receipts").fetchone()[0])
        except sqlite3.OperationalError:  # the worker has not made its tables yet
            return 0


@pytest.mark.slow
@pytest.mark.timeout(240)
async def test_readme_worker_example_runs_as_written(
    coordinator_config: CoordinatorConfig,
    trainer_identity: Identity,
    tiny_model: Path,
    tmp_path: Path,
) -> None:
    (tmp_path / "example.py").write_text(readme_example())
    # The README's first step: a key made with the CLI.
    assert (
        await asyncio.to_thread(
            cli_main, ["keys", "generate", "--out", str(tmp_path / "worker.key")]
        )
        == 0
    )
    coordinator = await start_coordinator(coordinator_config)
    trainer = await start_trainer(coordinator.address, trainer_identity, tiny_model)
    env = {
        **os.environ,
        "ROLLNET_COORDINATOR": coordinator.address,
        "ROLLNET_NETWORK_ID": NETWORK_ID,
    }
    worker = await asyncio.create_subprocess_exec(
        sys.executable,
        "example.py",
        cwd=tmp_path,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        await request_tasks(trainer, 1)
        outbox = tmp_path / "worker-data" / "outbox.sqlite3"

        def receipt() -> bool:
            assert worker.returncode is None, "the example exited"
            return _receipts(outbox) == 1

        await wait_until(receipt, within=120, what="the example's first receipt")
        worker.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(worker.wait(), 60) == 0
    finally:
        if worker.returncode is None:
            worker.kill()
            await worker.wait()
        await trainer.close()
        await coordinator.stop(grace=0.5)
