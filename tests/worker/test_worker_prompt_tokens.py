"""The one rule for a prompt's tokens, shared by worker and validator (``encode_problem``):
plain text as is, chat messages through the checkpoint's chat template once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rollnet.reference.envs import Problem
from rollnet.reference.worker import encode_problem, encode_prompt

# A minimal template: each message as "<role>content\n", then the assistant's opening tag.
TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


@pytest.fixture
def tokenizer(tiny_model: Path) -> Any:
    from transformers import AutoTokenizer

    loaded: Any = AutoTokenizer.from_pretrained(str(tiny_model), local_files_only=True)
    return loaded


def problem(messages: tuple[tuple[str, str], ...] | None) -> Problem:
    return Problem(0, "Be terse.\n\nReverse abc.", "", None, "key", messages)


def test_plain_text_is_fed_as_is(tokenizer: Any) -> None:
    assert encode_problem(tokenizer, problem(None)) == encode_prompt(
        tokenizer, "Be terse.\n\nReverse abc."
    )


def test_messages_go_through_the_chat_template_once(tokenizer: Any) -> None:
    tokenizer.chat_template = TEMPLATE
    messages = (("system", "Be terse."), ("user", "Reverse abc."))
    ids = encode_problem(tokenizer, problem(messages))
    rendered = "<system>Be terse.\n<user>Reverse abc.\n<assistant>"
    assert ids == encode_prompt(tokenizer, rendered)
    assert tokenizer.decode(ids) == rendered
    # The same messages give the same ids every time (the validator rebuilds them).
    assert encode_problem(tokenizer, problem(messages)) == ids


def test_messages_without_a_chat_template_are_refused(tokenizer: Any) -> None:
    tokenizer.chat_template = None
    with pytest.raises(ValueError, match="no chat template"):
        encode_problem(tokenizer, problem((("user", "Reverse abc."),)))
