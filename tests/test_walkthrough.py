"""docs/walkthrough.md, followed step by step: every ``bash`` block runs in order in an empty
directory, with ``rollnet`` on the PATH. A block marked ``(keeps running)`` is a terminal of its
own (a background process), and the next block waits until it is ready (the coordinator says
it listens, a node that it registered); ``# every terminal: Ctrl-C`` stops them, last started
first, and each must exit 0. The only changes: free ports for the page's fixed ones, and
127.0.0.1 for 0.0.0.0 (nothing here listens beyond this machine)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from rollnet.sdk.testing import free_port, wait_until_blocking

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "walkthrough.md"
BIN = Path(sys.executable).parent

pytestmark = pytest.mark.slow


def blocks() -> list[str]:
    return re.findall(r"```bash\n(.*?)```", PAGE.read_text(), re.S)


class Terminal:
    """A ``(keeps running)`` block: its process and what it printed."""

    def __init__(self, script: str, cwd: Path, env: dict[str, str]) -> None:
        self.script = script
        self.output: list[str] = []
        self.process = subprocess.Popen(
            ["bash", "-c", "exec " + script],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.output.append(line.rstrip("\n"))

    def wait_for(self, fragment: str, within: float) -> None:
        def seen() -> bool:
            if any(fragment in line for line in self.output):
                return True
            assert self.process.poll() is None, f"{self.script!r} exited: {self.output[-20:]}"
            return False

        wait_until_blocking(
            seen, within=within, what=f"{fragment!r} from {self.script!r}", poll=0.1
        )

    def stop(self) -> int:
        self.process.send_signal(signal.SIGINT)
        return self.process.wait(timeout=90)


def run(script: str, cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=420,
    )
    assert done.returncode == 0, f"{script!r} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.mark.timeout(900)
def test_the_walkthrough_works_as_printed(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
    ports = {port: str(free_port()) for port in ("7070", "7080", "7443", "7444")}
    terminals: list[Terminal] = []
    outputs: list[str] = []
    try:
        for block in blocks():
            if block.startswith("source .venv"):
                continue  # the test's PATH has rollnet already
            script = block.replace("0.0.0.0:", "127.0.0.1:")
            for fixed, free in ports.items():
                script = script.replace(f":{fixed}", f":{free}")
            first = script.splitlines()[0]
            if first.startswith("# every terminal: Ctrl-C"):
                while terminals:
                    terminal = terminals.pop()
                    assert terminal.stop() == 0, terminal.output[-20:]
            elif "(keeps running)" in first:
                terminal = Terminal("\n".join(script.splitlines()[1:]), tmp_path, env)
                terminals.append(terminal)
                if "rollnet coordinator" in script:
                    terminal.wait_for("listening on", within=120)
                else:  # as a person would, wait until the node says it registered
                    terminal.wait_for("_registered", within=300)
            else:
                outputs.append(run(script, tmp_path, env))
            if "rollnet worker" in script and "--tls-ca" in script:
                _until_the_worker_joins_over_tls(tmp_path, env, ports["7443"])
    finally:
        for terminal in terminals:
            terminal.process.kill()
    streamed = next(out for out in outputs if '"sequence"' in out)
    rollouts = [json.loads(line) for line in streamed.splitlines() if line.startswith("{")]
    assert len(rollouts) == 8
    assert all(r["validated_reward"] is not None for r in rollouts)
    # The trainer's two steps: the last line of its metrics is step 2.
    trained = [
        json.loads(line)
        for out in outputs
        for line in out.splitlines()
        if line.startswith("{") and '"task_reward"' in line
    ]
    assert [line["step"] for line in trained] == [2]
    listed = next(out for out in outputs if out.startswith("NODE"))
    assert listed.count(" worker ") == 2
    assert " validator " in listed
    verified = [line for out in outputs for line in out.splitlines() if line.startswith("OK: ")]
    assert len(verified) == 1  # ledger verify


def _until_the_worker_joins_over_tls(cwd: Path, env: dict[str, str], port: str) -> None:
    """The page's worker registers with the TLS coordinator (seen in the operator's list)."""
    worker = run("rollnet keys show keys/worker1.key | awk '/^node_id/ {print $2}'", cwd, env)

    def joined() -> bool:
        listed = run(
            f"rollnet nodes list --coordinator localhost:{port} --tls-ca tls/cert.pem "
            "--key keys/operator.key --json",
            cwd,
            env,
        )
        return any(node["node_id"] == worker.strip() for node in json.loads(listed))

    wait_until_blocking(joined, within=120, what="the worker registered over TLS", poll=1)
