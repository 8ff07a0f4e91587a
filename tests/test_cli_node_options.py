"""The options every model-running node shares (`--torch-threads`, `--reward-time-limit`, the
checked numbers, the key and data directory): validated before anything runs, and applied."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rollnet.reference.cli import build_parser, node_options

BASE = {
    "worker": ["worker", "--coordinator", "127.0.0.1:1", "--key", "k", "--data-dir", "d"],
    "validator": ["validator", "--coordinator", "127.0.0.1:1", "--key", "k", "--data-dir", "d"],
}


@pytest.mark.parametrize("command", sorted(BASE))
def test_threads_must_be_a_positive_whole_number(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for bad in ("0", "-2", "two"):
        with pytest.raises(SystemExit) as exited:
            build_parser().parse_args([*BASE[command], "--torch-threads", bad])
        assert exited.value.code == 2
        assert "--torch-threads" in capsys.readouterr().err


@pytest.mark.parametrize("command", sorted(BASE))
def test_threads_are_applied(command: str) -> None:
    before = torch.get_num_threads()
    try:
        args = build_parser().parse_args([*BASE[command], "--torch-threads", "1"])
        node_options.apply(args)
        assert torch.get_num_threads() == 1
        unset = build_parser().parse_args(BASE[command])
        torch.set_num_threads(before)
        node_options.apply(unset)  # not given: PyTorch keeps its own choice
        assert torch.get_num_threads() == before
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("command", sorted(BASE))
@pytest.mark.parametrize(
    ("flag", "bad"),
    [
        ("--reward-time-limit", "0.5"),
        ("--reward-time-limit", "0"),
        ("--reward-time-limit", "-1"),
        ("--reward-time-limit", "abc"),
        ("--reward-time-limit", "inf"),
        ("--reward-time-limit", "nan"),
        ("--keep-checkpoints", "0"),
        ("--keep-checkpoints", "-1"),
        ("--pull-wait", "-5"),
        ("--pull-wait", "nan"),
        ("--pull-wait", "1e12"),
    ],
)
def test_numbers_are_checked_before_anything_runs(
    command: str, flag: str, bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # A usage error (exit 2, the flag named), never a traceback after the node registered.
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args([*BASE[command], flag, bad])
    assert exited.value.code == 2
    assert flag in capsys.readouterr().err


@pytest.mark.parametrize("command", sorted(BASE))
def test_sensible_numbers_are_accepted(command: str) -> None:
    numbers = ["--reward-time-limit", "2.5", "--keep-checkpoints", "1", "--pull-wait", "0"]
    args = build_parser().parse_args([*BASE[command], *numbers])
    assert (args.reward_time_limit, args.keep_checkpoints, args.pull_wait) == (2.5, 1, 0.0)


@pytest.mark.parametrize("command", sorted(BASE))
def test_a_bad_key_or_data_dir_is_a_usage_error(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Exit 2 with the path named, before anything connects: not a traceback at the first job.
    from rollnet.reference.cli import main

    coordinator = ["--coordinator", "127.0.0.1:1"]
    a_file = tmp_path / "a-file"
    a_file.write_text("not a directory")
    key = ["--key", str(tmp_path / "node.key")]
    assert main([command, *coordinator, *key, "--data-dir", str(a_file)]) == 2
    assert f"--data-dir: {a_file} cannot be a directory: it is a file" in capsys.readouterr().err
    assert main([command, *coordinator, "--key", str(tmp_path), "--data-dir", "d"]) == 2
    assert f"key file {tmp_path}" in capsys.readouterr().err


@pytest.mark.parametrize("command", sorted(BASE))
@pytest.mark.parametrize("bad", ["localhost", "localhost:", ":7070", "host:0", "host:70000"])
def test_the_coordinator_address_needs_a_port(
    command: str, bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [a if a != "127.0.0.1:1" else bad for a in BASE[command]]
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(argv)
    assert exited.value.code == 2
    assert "HOST:PORT" in capsys.readouterr().err
    assert build_parser().parse_args(BASE[command]).coordinator == "127.0.0.1:1"
    ipv6 = [a if a != "127.0.0.1:1" else "[::1]:7070" for a in BASE[command]]
    assert build_parser().parse_args(ipv6).coordinator == "[::1]:7070"


def test_a_worker_for_an_environment_not_installed_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rollnet.reference.cli import main

    argv = [*BASE["worker"][:-1], str(tmp_path), "--key", str(tmp_path / "k")]
    assert main([*argv, "--environment", "arithmetic", "--environment", "nosuchenv"]) == 2
    err = capsys.readouterr().err
    assert "--environment nosuchenv: not installed here" in err
    assert "arithmetic" in err
