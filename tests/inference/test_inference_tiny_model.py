"""The tiny Qwen2 model and its character tokenizer, made locally and loaded by transformers."""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer

from rollnet.reference.cli import model as model_cli
from rollnet.reference.model import build_char_tokenizer, init_tiny_model

TEXTS = ["12+34=", "What's 3*7? Think.\n\tAnswer: 21", "a  b \n\n c<|endoftext|>"]


def _digest(path: Path) -> str:
    return hashlib.sha256((path / "model.safetensors").read_bytes()).hexdigest()


def test_weights_are_deterministic_in_the_seed(tiny_model: Path, tmp_path: Path) -> None:
    again = init_tiny_model(tmp_path / "again", seed=0)
    other = init_tiny_model(tmp_path / "other", seed=1)
    assert _digest(again) == _digest(tiny_model)
    assert _digest(other) != _digest(tiny_model)


def test_transformers_loads_model_and_tokenizer(tiny_model: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    raw = build_char_tokenizer()
    assert len(tokenizer) == raw.get_vocab_size() == model.config.vocab_size == 101
    assert tokenizer.eos_token_id == model.config.eos_token_id == raw.token_to_id("<|endoftext|>")
    assert tokenizer.pad_token_id == model.config.pad_token_id
    for text in TEXTS:
        ids = tokenizer(text).input_ids
        assert ids == raw.encode(text).ids
        assert tokenizer.decode(ids) == text
    # One token per ASCII character.
    assert len(tokenizer("12+34=").input_ids) == 6
    assert sum(p.numel() for p in model.parameters()) < 200_000


def test_cli_init_tiny(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    model_cli.register(parser.add_subparsers())
    args = parser.parse_args(["model", "init-tiny", "--out", str(tmp_path / "m"), "--seed", "0"])
    assert args.handler(args) == 0
    assert (tmp_path / "m" / "config.json").exists()
    assert "wrote tiny model" in capsys.readouterr().out
