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


def test_chat_prompt_of_the_tiny_checkpoint(vectors: dict[str, Any], tmp_path: Path) -> None:
    """The vectors' chat template, put into the tiny checkpoint's tokenizer_config.json, renders
    the messages to the vectors' text, whose ids are the vectors' (the template's special
    tokens matched as tokens); transformers' apply_chat_template gives the same."""
    from transformers import AutoTokenizer

    chat = vectors["tokenization"]["chat"]
    directory = init_tiny_model(tmp_path / "tiny", seed=0)
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config.update(chat["tokenizer_config"])
    config_path.write_text(json.dumps(config), encoding="utf-8")
    tokenizer = CheckpointTokenizer.load(directory)
    messages = [(m["role"], m["content"]) for m in chat["messages"]]
    assert tokenizer.render_chat(messages) == chat["text"]
    assert tokenizer.encode(chat["text"]) == chat["ids"]
    library: Any = AutoTokenizer.from_pretrained(str(directory), local_files_only=True)
    ids = library.apply_chat_template(
        chat["messages"], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert list(ids) == chat["ids"]
