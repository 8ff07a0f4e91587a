"""``--torch-threads`` on the commands that run a model: validated, and applied to PyTorch."""

from __future__ import annotations

import pytest
import torch

from rollnet.reference.cli import build_parser, torch_threads

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
        torch_threads.apply(args)
        assert torch.get_num_threads() == 1
        unset = build_parser().parse_args(BASE[command])
        torch.set_num_threads(before)
        torch_threads.apply(unset)  # not given: PyTorch keeps its own choice
        assert torch.get_num_threads() == before
    finally:
        torch.set_num_threads(before)
