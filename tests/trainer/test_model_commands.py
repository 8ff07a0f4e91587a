"""``rollnet model warm-start`` and ``rollnet model difficulty`` on the tiny model."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from rollnet.reference.cli import main
from rollnet.reference.trainer.difficulty import ScoredProblem, write_band


@pytest.fixture
def one_thread() -> Iterator[None]:
    """``--torch-threads 1`` sets the process's torch threads; put them back after."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.mark.usefixtures("one_thread")
def test_warm_start_then_difficulty(tmp_path: Path, tiny_model: Path) -> None:
    out = tmp_path / "warm"
    assert main(["model", "warm-start", "--model", str(tiny_model), "--out", str(out),
                 "--steps", "20", "--seed", "3", "--torch-threads", "1"]) == 0  # fmt: skip
    assert torch.get_num_threads() == 1
    record = json.loads((out / "rollnet_warm_start.json").read_text())
    assert record["final_loss"] < record["first_loss"]
    assert (out / "tokenizer.json").exists()
    band = tmp_path / "band.jsonl"
    assert main(["model", "difficulty", "--model", str(out), "--out", str(band),
                 "--problems", "6", "--samples", "2", "--keep", "0:1",
                 "--torch-threads", "1"]) == 0  # fmt: skip
    lines = [json.loads(line) for line in band.read_text().splitlines()]
    assert len(lines) == 6
    assert all(0.0 <= line["mean_reward"] <= 1.0 for line in lines)
    assert all(line["problem"].startswith("reverse ") for line in lines)


def test_write_band_keeps_the_band_only(tmp_path: Path) -> None:
    scored = [ScoredProblem(i, f"s{i}", f"p{i}", f"a{i}", r) for i, r in enumerate([0, 0.5, 1])]
    assert write_band(scored, 0.1, 0.9, tmp_path / "b.jsonl") == 1
    assert json.loads((tmp_path / "b.jsonl").read_text())["id"] == "s1"
    with pytest.raises(ValueError, match="band"):
        write_band(scored, 0.9, 0.1, tmp_path / "c.jsonl")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--environment", "chess"], "unknown environment 'chess'"),
        (["--environment-config", "[1]"], "must be a JSON object"),
        (["--answer-share", "2"], "must be within [0, 1]"),
    ],
)
def test_warm_start_refuses_bad_input(
    tmp_path: Path, tiny_model: Path, capsys: pytest.CaptureFixture[str], args: list[str],
    message: str,
) -> None:  # fmt: skip
    code = main(["model", "warm-start", "--model", str(tiny_model), "--out", str(tmp_path / "o"),
                 *args])  # fmt: skip
    assert code == 2
    assert message in capsys.readouterr().err
