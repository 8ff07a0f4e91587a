"""``rollnet conformance coordinator``: one line per case, the closing count, JUnit XML, the exit
code, and one-line errors for a target that cannot be reached or a case that does not exist."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from xml.etree import ElementTree

import pytest
from conformance_testing import NETWORK, Running

from rollnet.reference.cli import main as cli_main
from rollnet.sdk.conformance import CASES


async def rollnet(*argv: str) -> int:
    """``rollnet ARGV`` in a thread (it runs its own event loop; the coordinator runs in ours)."""
    return await asyncio.to_thread(cli_main, list(argv))


def key_dir(running: Running, folder: Path) -> Path:
    folder.mkdir()
    for role, identity in running.keys.items():
        identity.save(folder / f"{role}.key")
    return folder


@pytest.mark.slow
async def test_passing_cases_exit_0_with_junit(
    running: Running, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    junit = tmp_path / "report.xml"
    code = await rollnet(
        "conformance",
        "coordinator",
        "--target",
        running.address,
        "--network-id",
        NETWORK,
        "--keys",
        str(key_dir(running, tmp_path / "keys")),
        "--case",
        "health",
        "--case",
        "auth.replay",
        "--case",
        "checkpoint",
        "--skip",
        "checkpoint.refusals",
        "--skip",
        "checkpoint.republish",
        "--junit",
        str(junit),
    )
    out = capsys.readouterr().out.splitlines()
    assert code == 0, out
    assert [line.split()[:2] for line in out[:-1]] == [
        ["PASS", "health.check"],
        ["PASS", "health.watch"],
        ["PASS", "health.reflection"],
        ["PASS", "auth.replay"],
        ["PASS", "checkpoint.publish"],
    ]
    assert out[-1] == "5 passed, 0 failed, 0 skipped"
    suite = ElementTree.parse(junit).getroot()
    assert suite.tag == "testsuite"
    assert (suite.get("tests"), suite.get("failures"), suite.get("skipped")) == ("5", "0", "0")
    assert [case.get("name") for case in suite] == [
        "check",
        "watch",
        "reflection",
        "replay",
        "publish",
    ]


async def test_a_failure_exits_1_and_a_skip_is_not_a_pass(
    running: Running, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Signed for another network, registration fails; without keys, the trainer case skips."""
    junit = tmp_path / "report.xml"
    code = await rollnet(
        "conformance",
        "coordinator",
        "--target",
        running.address,
        "--network-id",
        "another-network",
        "--case",
        "registration.new",
        "--case",
        "checkpoint.publish",
        "--junit",
        str(junit),
    )
    out = capsys.readouterr().out.splitlines()
    assert code == 1, out
    assert out[0].startswith("FAIL  registration.new")
    assert "AUDIENCE_MISMATCH" in out[0]
    assert out[1].startswith("SKIP  checkpoint.publish")
    assert "trainer" in out[1]
    assert out[-1] == "0 passed, 1 failed, 1 skipped"
    suite = ElementTree.parse(junit).getroot()
    assert (suite.get("failures"), suite.get("skipped")) == ("1", "1")
    assert suite[0].find("failure") is not None
    assert suite[1].find("skipped") is not None


async def test_list_names_every_case(capsys: pytest.CaptureFixture[str]) -> None:
    assert await rollnet("conformance", "coordinator", "--target", "h:1", "--list") == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == [case.name for case in CASES]


async def test_unreachable_target_and_unknown_case_are_one_line_errors(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # Nothing listens on the port once the probe is closed.
    code = await rollnet(
        "conformance", "coordinator", "--target", f"127.0.0.1:{port}", "--timeout", "2"
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1, err
    assert "cannot reach" in err[0]
    code = await rollnet("conformance", "coordinator", "--target", "h:1", "--case", "nonsense")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1, err
    assert "select no case" in err[0]


async def test_worker_suite_lists_its_cases(capsys: pytest.CaptureFixture[str]) -> None:
    from rollnet.reference.conformance.worker import WORKER_CASES

    assert await rollnet("conformance", "worker", "--command", "x", "--list") == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()]
    assert listed == [case.name for case in WORKER_CASES]
    code = await rollnet("conformance", "worker", "--command", "x", "--case", "nonsense")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert "select no case" in err[0]
