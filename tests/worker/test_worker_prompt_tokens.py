"""The one rule for a prompt's tokens, shared by worker and validator (``encode_problem``):
plain text encoded by the checkpoint's ``tokenizer.json``; chat messages rendered once by the
checkpoint's chat template into text that is then encoded the same way."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Tokenizer

from rollnet.reference.envs import Problem
from rollnet.reference.inference.tokenization import CheckpointTokenizer
from rollnet.sdk.prompts import encode_problem

# Exercises what transformers' renderer adds to plain Jinja2: trim_blocks and lstrip_blocks
# (the indented block tags leave nothing), loop controls, raise_exception, a tojson that does
# not escape HTML, the special tokens' strings, and tools passed as none.
TEMPLATE = """{{ bos_token }}
{%- if tools is not none %}{{ raise_exception('tools are not supported') }}{% endif %}
{% for message in messages %}
    {% if message['role'] not in ['system', 'user', 'assistant'] %}
        {{ raise_exception('unknown role ' + message['role']) }}
    {% endif %}
    {% if loop.first and message['role'] == 'system' %}
System: {{ message['content'] | trim }} {{ {'turns': messages | length, 'q': 'a<b'} | tojson }}
        {% continue %}
    {% endif %}
<{{ message['role'] }}>
{{ message['content'] }}{{ eos_token }}
{% endfor %}
{% if add_generation_prompt %}<assistant>
{% endif %}"""

MESSAGES = (("system", "  Be terse. "), ("user", "Reverse 'a<b'."))
RENDERED = (
    '<|bos|>System: Be terse. {"turns": 2, "q": "a<b"}\n'
    "<user>\nReverse 'a<b'.<|endoftext|>\n<assistant>\n"
)


@pytest.fixture
def checkpoint(tiny_model: Path, tmp_path: Path) -> Path:
    """The tiny checkpoint's tokenizer files (and config.json, for transformers), in a
    directory of this test's own: the shared checkpoint stays without a chat template."""
    directory = tmp_path / "checkpoint"
    directory.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_model / name, directory / name)
    return directory


def set_config(directory: Path, **entries: Any) -> None:
    path = directory / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    config.update(entries)
    path.write_text(json.dumps(config), encoding="utf-8")


def problem(messages: tuple[tuple[str, str], ...] | None) -> Problem:
    return Problem(0, "Be terse.\n\nReverse abc.", "", None, "key", messages)


def raw_ids(directory: Path, text: str) -> list[int]:
    tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
    return list(tokenizer.encode(text, add_special_tokens=False).ids)


def test_plain_text_is_encoded_by_tokenizer_json(checkpoint: Path) -> None:
    set_config(checkpoint, chat_template=TEMPLATE)  # not used: the problem is plain text
    ids = encode_problem(CheckpointTokenizer.load(checkpoint), problem(None))
    assert ids == raw_ids(checkpoint, "Be terse.\n\nReverse abc.")


def test_messages_go_through_the_chat_template_once(checkpoint: Path) -> None:
    set_config(checkpoint, chat_template=TEMPLATE)
    tokenizer = CheckpointTokenizer.load(checkpoint)
    assert tokenizer.render_chat(MESSAGES) == RENDERED
    ids = encode_problem(tokenizer, problem(MESSAGES))
    # The template's special tokens are matched in the rendered text: one id each.
    assert ids == raw_ids(checkpoint, RENDERED)
    assert ids[0] == 2  # <|bos|>
    assert tokenizer.decode(ids, skip_special_tokens=False) == RENDERED
    # The validator rebuilds them from a fresh load of the same files.
    assert encode_problem(CheckpointTokenizer.load(checkpoint), problem(MESSAGES)) == ids


def test_the_same_ids_as_transformers_apply_chat_template(checkpoint: Path) -> None:
    """What workers built on transformers feed the model (apply_chat_template, generation
    prompt, tokenized) is what the rule gives."""
    from transformers import AutoTokenizer

    set_config(checkpoint, chat_template=TEMPLATE)
    library: Any = AutoTokenizer.from_pretrained(str(checkpoint), local_files_only=True)
    conversation = [{"role": role, "content": content} for role, content in MESSAGES]
    text = library.apply_chat_template(conversation, add_generation_prompt=True, tokenize=False)
    ids = library.apply_chat_template(
        conversation, add_generation_prompt=True, tokenize=True, return_dict=False
    )
    assert text == RENDERED
    assert encode_problem(CheckpointTokenizer.load(checkpoint), problem(MESSAGES)) == list(ids)


def test_chat_template_jinja_wins_over_tokenizer_config(checkpoint: Path) -> None:
    set_config(checkpoint, chat_template="from tokenizer_config")
    (checkpoint / "chat_template.jinja").write_text(
        "{% for m in messages %}[{{ m['content'] }}]{% endfor %}\n", encoding="utf-8"
    )
    # Jinja drops the file's single trailing newline, as transformers renders it.
    assert (
        CheckpointTokenizer.load(checkpoint).render_chat(MESSAGES)
        == "[  Be terse. ][Reverse 'a<b'.]"
    )


def test_a_list_of_named_templates_uses_default(checkpoint: Path) -> None:
    set_config(
        checkpoint,
        chat_template=[
            {"name": "tool_use", "template": "tools"},
            {"name": "default", "template": "{{ messages | length }} messages"},
        ],
    )
    assert CheckpointTokenizer.load(checkpoint).render_chat(MESSAGES) == "2 messages"


def test_the_clock_is_not_available(checkpoint: Path) -> None:
    """A template that reads the date (Llama 3.1's) gets its fixed fallback: a worker and its
    validator render the same prompt on any day."""
    set_config(
        checkpoint,
        chat_template=(
            "{% if strftime_now is defined %}{{ strftime_now('%d %b %Y') }}"
            "{% else %}26 Jul 2024{% endif %}"
        ),
    )
    assert CheckpointTokenizer.load(checkpoint).render_chat(MESSAGES) == "26 Jul 2024"


def test_messages_without_a_chat_template_are_refused(checkpoint: Path) -> None:
    tokenizer = CheckpointTokenizer.load(checkpoint)
    with pytest.raises(ValueError, match="no chat template"):
        encode_problem(tokenizer, problem((("user", "Reverse abc."),)))


@pytest.mark.parametrize(
    ("template", "message"),
    [
        (TEMPLATE, "unknown role tool"),
        ("{% for m in messages %}", "does not compile"),
        ("{{ messages[0]['content'].__class__.__subclasses__() }}", "refused the messages"),
    ],
)
def test_a_failing_template_is_a_value_error_naming_it(
    checkpoint: Path, template: str, message: str
) -> None:
    set_config(checkpoint, chat_template=template)
    tokenizer = CheckpointTokenizer.load(checkpoint)
    with pytest.raises(ValueError, match=message) as raised:
        encode_problem(tokenizer, problem((("tool", "42"),)))
    assert "tokenizer_config.json" in str(raised.value)


def test_a_malformed_tokenizer_config_matters_only_to_chat_prompts(checkpoint: Path) -> None:
    (checkpoint / "tokenizer_config.json").write_text("{not json", encoding="utf-8")
    tokenizer = CheckpointTokenizer.load(checkpoint)
    assert encode_problem(tokenizer, problem(None)) == raw_ids(
        checkpoint, "Be terse.\n\nReverse abc."
    )
    with pytest.raises(ValueError, match=r"tokenizer_config\.json: not JSON"):
        encode_problem(tokenizer, problem(MESSAGES))
