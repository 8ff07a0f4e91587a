"""The reference environment and tokenizer against the golden vectors
(``protos/rollnet/v1/vectors.json``: ``arithmetic_prompts`` and ``tokenization``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from rollnet.reference.envs import load_environment
from rollnet.reference.inference.tokenization import CheckpointTokenizer
from rollnet.reference.model import init_tiny_model

VECTORS_PATH = Path(__file__).resolve().parents[2] / "protos" / "rollnet" / "v1" / "vectors.json"


@pytest.fixture(scope="module")
def vectors() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(VECTORS_PATH.read_text(encoding="utf-8"))
    return loaded


def test_arithmetic_prompt_mapping(vectors: dict[str, Any]) -> None:
    for case in vectors["arithmetic_prompts"]["cases"]:
        environment = load_environment("arithmetic", case["config"])
        assert environment.config == case["normalized_config"]
        assert environment.digest == case["config_digest"]
        for expected in case["problems"]:
            problem = environment.prompt(int(expected["prompt_id"]))
            assert problem.prompt == expected["prompt"]
            assert problem.answer == expected["answer"]
            assert (problem.target_length or 0) == expected["target_length"]


def test_tokenization_of_the_tiny_checkpoint(vectors: dict[str, Any], tmp_path: Path) -> None:
    """What ``rollnet model init-tiny`` writes to tokenizer.json gives the vectors' ids, read as
    the protocol says (no special tokens added; special tokens skipped on decode), and the same
    through the ``tokenizers`` library directly."""
    section = vectors["tokenization"]
    directory = init_tiny_model(tmp_path / "tiny", seed=0)
    tokenizer = CheckpointTokenizer.load(directory)
    raw = Tokenizer.from_file(str(directory / "tokenizer.json"))
    for case in section["encode"]:
        assert tokenizer.encode(case["text"]) == case["ids"]
        assert raw.encode(case["text"], add_special_tokens=False).ids == case["ids"]
    decode = section["decode"]
    assert tokenizer.decode(decode["ids"]) == decode["text"]
    assert raw.decode(decode["ids"], skip_special_tokens=True) == decode["text"]
