"""sdk/README.md's worked example runs against a real coordinator (only its address differs)."""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

import pytest
import structlog

from rollnet.reference.coordinator.config import load_config, with_overrides
from rollnet.reference.coordinator.server import start_coordinator

README = Path(__file__).resolve().parents[2] / "sdk" / "README.md"


@pytest.mark.slow
async def test_the_sdk_readme_example_runs(tmp_path: Path) -> None:
    code = re.search(r"```python\n(.*?)```", README.read_text(), re.S)
    assert code is not None
    config = with_overrides(load_config(tmp_path / "coordinator"), listen="127.0.0.1:0")
    with structlog.testing.capture_logs():
        coordinator = await start_coordinator(config)
    try:
        script = tmp_path / "example.py"
        script.write_text(code.group(1).replace("127.0.0.1:7070", coordinator.address))
        process = await asyncio.create_subprocess_exec(
            sys.executable, str(script), stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        out, err = await asyncio.wait_for(process.communicate(), 120)
        assert process.returncode == 0, err.decode()
        lines = out.decode().splitlines()
        assert lines[0].startswith("registered as ")
        assert lines[1].startswith("no work now; come back in")
        assert lines[2] == "balance: 0 work units"
    finally:
        await coordinator.stop(grace=0.5)
