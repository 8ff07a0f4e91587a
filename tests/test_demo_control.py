"""`rollnet demo` in hand (issue 21): options refused before anything starts, one demo per data
directory, and the swarm view's plain lines. The SIGTERM test runs the small demo of
tests/test_demo.py for real and stops it after its first step."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rollnet.reference.cli import main
from rollnet.reference.demo_control import DataDirLock, known_cheats, processes_using
from rollnet.reference.demo_view import SwarmWatch, plain_line, sparkline, summary_fields, trend
from rollnet.sdk.testing import wait_until_blocking

SMALL = [
    "--workers",
    "1",
    "--prompts",
    "4",
    "--samples",
    "4",
    "--prompts-per-task",
    "1",
    "--warm-start-steps",
    "50",
]


def refused(capsys: pytest.CaptureFixture[str], data_dir: Path, *argv: str) -> str:
    """stderr's one line of a demo that must refuse: exit 2, nothing created or started."""
    capsys.readouterr()
    code = main(["demo", "--data-dir", str(data_dir), *argv])
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    lines = captured.err.splitlines()
    assert code == 2, captured
    assert len(lines) == 1, captured.err
    assert captured.out == ""
    assert not data_dir.exists() or not any(p.name != "demo.lock" for p in data_dir.iterdir()), (
        list(data_dir.iterdir())
    )
    return lines[0]


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--workers", "0"], "--workers 0: give at least 1 (honest workers"),
        (["--workers", "-1"], "--workers -1: give at least 1"),
        (["--validators", "0"], "--validators 0: give at least 1 (validators"),
        (["--prompts", "0"], "--prompts 0: give at least 1"),
        (["--samples", "0"], "--samples 0: give at least 1"),
        (["--samples", "1"], "--samples 1: give at least 2"),
        (["--samples", "257"], "--samples 257: the coordinator admits at most 256"),
        (["--steps", "0"], "--steps 0: give at least 1"),
        (["--prompts-per-task", "0"], "--prompts-per-task 0: give at least 1"),
        (["--prompts-per-task", "1024", "--samples", "8"], "admits at most 4,096"),
        (["--max-new-tokens", "100000"], "--max-new-tokens 100000: give 1 to 511"),
        (["--max-new-tokens", "0"], "--max-new-tokens 0: give 1 to"),
        (["--max-off-policy-steps", "-1"], "--max-off-policy-steps -1: give 0 or more"),
        (["--cheat", "bogus"], "--cheat bogus: no such cheat; choose from "),
        (["--cheat", "token_altered", "--cheat", "token_altered"], "each cheat once"),
        (["--port", "99999"], "--port 99999: give 1 to 65535"),
    ],
)
def test_options_the_demo_cannot_run_with_are_refused_before_anything_starts(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, argv: list[str], says: str
) -> None:
    line = refused(capsys, tmp_path / "demo", *argv)
    assert line.startswith("rollnet demo: "), line
    assert says in line, line
    assert not (tmp_path / "demo").exists()


def test_an_unknown_cheat_lists_every_known_one(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    line = refused(capsys, tmp_path / "demo", "--cheat", "nope")
    assert all(name in line for name in known_cheats()), line
    assert "token_altered" in known_cheats()


def test_a_coordinator_port_in_use_is_refused(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, taken_port: int
) -> None:
    line = refused(capsys, tmp_path / "demo", "--port", str(taken_port))
    assert f"--port {taken_port}: another process listens there" in line


def test_a_running_demo_keeps_its_data_dir(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    root = tmp_path / "demo"
    lock = DataDirLock(root)
    lock.acquire()  # this test process plays the running demo
    (root / "coordinator").mkdir()
    (root / "coordinator" / "rollnet.db").write_text("theirs")
    try:
        capsys.readouterr()
        code = main(["demo", "--data-dir", str(root), *SMALL])
        err = capsys.readouterr().err
    finally:
        lock.release()
    assert code == 2, err
    assert f"another demo (pid {os.getpid()}) is running on {root.resolve()}" in err, err
    assert (root / "coordinator" / "rollnet.db").read_text() == "theirs"


def test_children_left_by_a_killed_demo_keep_its_data_dir(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The demo died (its pid is gone) but a process it started still holds the lock."""
    root = (tmp_path / "demo").resolve()
    root.mkdir()
    (root / "demo.lock").write_text("999999999\n")  # no such process
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR);"
            "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)",
            str(root / "demo.lock"),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline() == "held\n"
        capsys.readouterr()
        code = main(["demo", "--data-dir", str(root), *SMALL])
        err = capsys.readouterr().err
        assert code == 2, err
        assert f"processes of an earlier demo still run on {root} (pids {holder.pid})" in err
        assert sorted(os.listdir(root)) == ["demo.lock"]
    finally:
        holder.kill()
        holder.wait()


SNAPSHOT: dict[str, Any] = {
    "nodes": {"by_state": {"active": 4, "ejected": 1}, "total": 5},
    "tasks": {"pending": 2, "leased": 1, "accepted": 9, "rejected": 1, "failed": 0},
    "validation": {"accepted": 7, "rejected": 2, "rejects_by_reason": {"sampling": 2}},
    "checkpoints": {"latest": 3, "live_nodes": 4, "at_latest": 3},
    "ledger": {"entries": 12, "amounts": {"credit": 900, "slash": -50}},
    "rewards": [
        {"step": 1, "mean_task_reward": 0.2},
        {"step": 0, "mean_task_reward": 0.1},
        {"step": 2, "mean_task_reward": 0.5},
    ],
}


def test_the_view_shows_what_the_dashboard_reads() -> None:
    fields = summary_fields(SNAPSHOT)
    assert fields["step"] == "3"
    assert fields["task reward"].startswith("0.500 ↗")
    assert fields["nodes"] == "5: active 4, ejected 1"
    assert fields["tasks"] == "pending 2, leased 1"
    assert fields["rollouts"] == "7 validated, 2 rejected (sampling 2)"
    assert fields["broadcast"] == "3 of 4 nodes on checkpoint 3"
    assert fields["ledger"] == "12 entries; credit +900, slash -50"
    steps = [{"step": 1, "task_reward": 0.3}, {"step": 2, "task_reward": 0.1}]
    from_trainer = summary_fields(SNAPSHOT, steps)
    assert from_trainer["step"] == "2"
    assert from_trainer["task reward"].startswith("0.100 ↘")
    assert sparkline([0.0, 0.5, 1.0]) == "▁▅█"
    assert trend([0.5, 0.5]) == "→"
    assert trend([0.6, 0.2]) == "↘"
    assert trend([0.1]) == "·"


def test_off_a_terminal_the_view_prints_one_plain_line_per_step() -> None:
    out = io.StringIO()
    watch = SwarmWatch("http://127.0.0.1:1", out=out)
    assert not watch.live
    watch.update(SNAPSHOT)
    watch.update(SNAPSHOT)  # the same step: nothing new
    watch.update({**SNAPSHOT, "checkpoints": {**SNAPSHOT["checkpoints"], "latest": 4}})
    lines = out.getvalue().splitlines()
    assert lines == [plain_line(SNAPSHOT), lines[1]], lines
    assert lines[0].startswith("swarm: step 3; nodes 5: active 4, ejected 1; ")
    assert lines[1].startswith("swarm: step 4; ")


def test_on_a_terminal_the_view_is_a_live_panel() -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Terminal()
    watch = SwarmWatch("http://127.0.0.1:8", out=out)
    with watch.shown():
        watch.update(SNAPSHOT)
    text = out.getvalue()
    for label in ("task reward", "broadcast", "3 of 4 nodes on checkpoint 3", "127.0.0.1:8"):
        assert label in text, text


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_sigterm_stops_every_process_and_still_prints_the_summary(tmp_path: Path) -> None:
    root = (tmp_path / "demo").resolve()
    demo = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "rollnet.reference.cli",
            "demo",
            "--data-dir",
            str(root),
            "--steps",
            "50",
            *SMALL,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert demo.stdout is not None
    seen: list[str] = []
    try:
        for line in demo.stdout:
            seen.append(line)
            if line.startswith("step   1: task reward"):
                break
        else:
            pytest.fail("".join(seen))
        children = processes_using(root)
        assert len(children) >= 5, children  # coordinator, trainer, worker, validator, cheat
        demo.send_signal(signal.SIGTERM)
        seen.extend(demo.stdout)
        code = demo.wait(timeout=120)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    output = "".join(seen)
    assert code == 130, output
    assert "Traceback" not in output, output
    assert "SIGTERM: stopping the demo" in output, output
    assert "swarm: step " in output, output  # the plain lines off a terminal
    assert "reward: " in output, output
    assert "ledger: " in output, output
    assert (root / "reward.png").read_bytes().startswith(b"\x89PNG")
    assert "ledger export: " in output, output
    assert (root / "ledger.jsonl").stat().st_size > 0, output
    assert "stopped by SIGTERM" in output, output
    # Zombies of the killed ones are reaped by init.
    wait_until_blocking(
        lambda: not [pid for pid in children if _alive(pid)],
        within=10,
        what=f"the demo's children {children} to exit; its output: {output}",
        poll=0.1,
    )
    assert processes_using(root) == []


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


FORCED = """
import asyncio, subprocess, sys
from rollnet.reference.demo_control import StopSignals

async def main() -> int:
    stop = StopSignals()
    child = subprocess.Popen([sys.executable, "-c", "import signal, time;"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN); print('up', flush=True); time.sleep(60)"],
        start_new_session=True, stdout=subprocess.PIPE)
    assert child.stdout.readline() == b"up\\n"
    stop.watch({"stubborn": child})
    stop.following = True  # as while the demo follows the trainer: the first signal only asks
    stop.install(asyncio.current_task())
    print(child.pid, flush=True)
    await stop.stopping.wait()
    print("stopping", flush=True)
    await asyncio.sleep(60)  # a child that does not drain; the second signal must not wait
    return 0

sys.exit(asyncio.run(main()))
"""


def test_a_second_signal_kills_every_child_at_once() -> None:
    demo = subprocess.Popen(
        [sys.executable, "-c", FORCED], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    assert demo.stdout is not None
    child = int(demo.stdout.readline())
    demo.send_signal(signal.SIGINT)
    assert demo.stdout.readline() == "stopping\n"
    assert _alive(child)  # it ignores SIGTERM, and nothing has killed it yet
    demo.send_signal(signal.SIGINT)
    assert demo.wait(timeout=30) == 130
    err = demo.stderr.read() if demo.stderr else ""
    assert "SIGINT: stopping the demo (Ctrl-C again to force)" in err, err
    assert "SIGINT again: killing every process of the demo" in err, err
    assert "Traceback" not in err, err
    # Killed; init reaps it.
    wait_until_blocking(lambda: not _alive(child), within=10, what="the killed child to go")


async def test_the_ledger_summary_reads_every_page(capsys: pytest.CaptureFixture[str]) -> None:
    from types import SimpleNamespace

    from rollnet.reference.demo import _report_ledger
    from rollnet.v1 import ledger_pb2, ledger_service_pb2

    total = 2500
    entries = [
        ledger_pb2.LedgerEntry(
            sequence=n,
            kind=ledger_pb2.LedgerEntry.KIND_CREDIT,
            node_id="a" * 32 if n % 2 else "b" * 32,
            amount=1,
        )
        for n in range(1, total + 1)
    ]

    async def list_entries(
        request: ledger_service_pb2.ListEntriesRequest,
    ) -> ledger_service_pb2.ListEntriesResponse:
        page = entries[request.after_sequence : request.after_sequence + 1000]
        return ledger_service_pb2.ListEntriesResponse(entries=page, head_sequence=total)

    client: Any = SimpleNamespace(ledger=SimpleNamespace(list_entries=list_entries))
    await _report_ledger(client, {"a" * 32: "worker-0"})
    output = capsys.readouterr().out
    assert "ledger: 2500 entries" in output
    assert "credit                      2,500 entries" in output
    assert f"worker-0                 {'a' * 32}:    1,250 work units" in output
    assert "{" not in output  # a table, not a Python dict
