"""Stopping ``rollnet coordinator`` (a real process): Ctrl-C with nodes connected ends long
polls and streams at once instead of waiting out the grace period, a second Ctrl-C forces the
stop, the chain head is signed at shutdown (so ``ledger verify`` covers every entry), and
Ctrl-C during the start-up migrations exits cleanly, leaving a database the next start
finishes migrating."""

from __future__ import annotations

import asyncio
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from coordinator_testing import pull
from dashboard_testing import make_history

from rollnet.ledger import chain
from rollnet.ledger.engine import create_engine, session_factory
from rollnet.reference.cli import main as cli_main
from rollnet.sdk import Identity, RollnetError
from rollnet.sdk.testing import NETWORK_ID, wait_until_blocking

pytestmark = pytest.mark.slow

STARTUP = 120.0


@dataclass
class CoordinatorProcess:
    """``rollnet coordinator`` in a child process, its stderr read line by line."""

    process: subprocess.Popen[str]
    lines: queue.Queue[str] = field(default_factory=queue.Queue)
    seen: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        def read() -> None:
            assert self.process.stderr is not None
            for line in self.process.stderr:
                self.lines.put(line.rstrip("\n"))

        threading.Thread(target=read, daemon=True).start()

    def wait_for_line(self, fragment: str, within: float) -> str:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.1)
            except queue.Empty:
                if self.process.poll() is not None and self.lines.empty():
                    break
                continue
            self.seen.append(line)
            if fragment in line:
                return line
        raise AssertionError(f"no line with {fragment!r} within {within} s: {self.seen}")

    def finish(self, within: float) -> tuple[int, list[str]]:
        """Exit code and every stderr line that is not a JSON log record."""
        code = self.process.wait(timeout=within)
        while True:  # the reader thread drains the pipe to its end
            try:
                self.seen.append(self.lines.get(timeout=2.0))
            except queue.Empty:
                break
        return code, [line for line in self.seen if not line.startswith("{")]


def start(data_dir: Path, *extra: str) -> CoordinatorProcess:
    argv = [sys.executable, "-m", "rollnet.reference.cli", "coordinator", "--data-dir"]
    argv += [str(data_dir), "--listen", "127.0.0.1:0", "--network-id", NETWORK_ID, *extra]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=env)
    return CoordinatorProcess(process)


@pytest.fixture
def allow_lists(tmp_path: Path) -> tuple[Path, Identity, Identity]:
    trainer, validator = Identity.generate(), Identity.generate()
    config = tmp_path / "coordinator.toml"
    config.write_text(
        f'trainers = ["{trainer.node_id}"]\nvalidators = ["{validator.node_id}"]\n'
        "head_sign_interval = 3600\n"  # only the shutdown signs the last entries
    )
    return config, trainer, validator


async def test_ctrl_c_with_nodes_connected_stops_at_once_and_signs_the_head(
    tmp_path: Path, allow_lists: tuple[Path, Identity, Identity]
) -> None:
    config, trainer, validator = allow_lists
    data = tmp_path / "data"
    coordinator = start(data, "--config", str(config), "--pull-wait-max", "30")
    try:
        line = await asyncio.to_thread(coordinator.wait_for_line, "listening on", STARTUP)
        address = line.split("listening on ")[1].split()[0]
        swarm = await make_history(address, trainer, validator)
    except BaseException:
        coordinator.process.kill()
        raise
    try:
        # A worker waits in a long poll (nothing is queued), a validator watches checkpoints.
        waiting = asyncio.ensure_future(pull(swarm.worker_client, wait=30.0))
        watch = swarm.validator_client.checkpoints.watch(0).__aiter__()
        await anext(watch)  # checkpoint 1, then the stream waits
        await asyncio.sleep(0.5)  # both calls are in the server's hands
        stopped_at = time.monotonic()
        coordinator.process.send_signal(signal.SIGINT)
        code, lines = await asyncio.to_thread(coordinator.finish, 30.0)
        took = time.monotonic() - stopped_at
        # Before: the 30 s long poll held the stop for the whole 10 s grace.
        assert took < 8.0, f"the coordinator took {took:.1f} s to stop"
        assert code == 0, lines
        assert not any("Traceback" in line for line in lines)
        assert any("stopping (Ctrl-C again to stop at once)" in line for line in lines)
        try:
            answer = await asyncio.wait_for(waiting, 10)
            assert not answer.HasField("task")  # told to come back later
        except RollnetError:
            pass  # or the connection closed first: the worker retries elsewhere, either way
    finally:
        await swarm.close()
    # The last signed head covers the whole chain: nothing after it is left unsigned.
    engine = create_engine(f"sqlite:///{data / 'rollnet.db'}")
    try:
        with session_factory(engine)() as session:
            tip = chain.chain_tip(session)
            head = chain.latest_signed_head(session, NETWORK_ID)
        assert tip.sequence == 8  # the history's three credits, a slash, four validator rewards
        assert head is not None
        assert (head.sequence, head.head_hash) == (tip.sequence, tip.head_hash)
    finally:
        engine.dispose()
    verify = ["ledger", "verify", "--db", f"sqlite:///{data}/rollnet.db"]
    assert await asyncio.to_thread(cli_main, verify) == 0


def test_a_second_ctrl_c_forces_the_stop(tmp_path: Path) -> None:
    coordinator = start(tmp_path / "data")
    coordinator.wait_for_line("listening on", STARTUP)
    coordinator.process.send_signal(signal.SIGINT)
    coordinator.process.send_signal(signal.SIGINT)
    code, lines = coordinator.finish(30.0)
    assert code == 0, lines
    assert not any("Traceback" in line for line in lines)


def test_ctrl_c_during_start_up_migrations_exits_cleanly(tmp_path: Path) -> None:
    data = tmp_path / "data"
    coordinator = start(data)

    def migrating() -> bool:
        return (data / "rollnet.db").exists() or coordinator.process.poll() is not None

    wait_until_blocking(
        migrating, within=STARTUP, what="the coordinator to open its database", poll=0.01
    )
    coordinator.process.send_signal(signal.SIGINT)
    code, lines = coordinator.finish(60.0)
    assert not any("Traceback" in line for line in lines), lines
    if code == 130:  # interrupted while migrating (the usual case)
        assert lines == ["rollnet coordinator: interrupted"]
    else:  # the migrations had finished: an ordinary stop
        assert code == 0, lines
    # The next start finds a database it can use (migrated the rest of the way) and serves.
    again = start(data)
    again.wait_for_line("listening on", STARTUP)
    again.process.send_signal(signal.SIGINT)
    assert again.finish(30.0)[0] == 0
