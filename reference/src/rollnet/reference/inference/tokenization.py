"""A checkpoint's ``tokenizer.json``, applied as the protocol says (docs/protocol.md,
"Tokenization").

Prompt token ids and reward text are protocol data: a worker's prompt ids must equal the ones
its validator rebuilds, and a validator scores the text it decodes from the completion ids. Both
are defined by the checkpoint's ``tokenizer.json`` (the Hugging Face ``tokenizers`` format) and
nothing else: encode the prompt text with no special tokens added; decode the completion with
the special tokens skipped. Libraries that wrap the file add behaviour of their own (transformers
rebuilds some models' tokenizers from the vocabulary, and ``clean_up_tokenization_spaces``
rewrites decoded text), so the reference worker and validator read the file with ``tokenizers``
directly, as an implementation in another language would.

Chat prompts (an environment's problem given as messages) become text through the checkpoint's
chat template first (:class:`ChatTemplate`: Jinja2, as ``transformers``' ``apply_chat_template``
renders it, without the clock), and that text is encoded like any other prompt: one way from a
problem to its ids.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

TOKENIZER_FILE = "tokenizer.json"
"""The file every checkpoint carries for tokenization."""

CHAT_TEMPLATE_FILE = "chat_template.jinja"
"""A checkpoint's chat template as a file of its own (what transformers 4.47+ writes)."""

TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
"""Holds the chat template of older checkpoints (``chat_template``) and the special tokens'
strings a template may print."""

SPECIAL_TOKEN_NAMES = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)
"""The template variables taken from ``tokenizer_config.json`` (transformers' named special
tokens)."""


class _GenerationBlock(jinja2.ext.Extension):
    """``{% generation %}...{% endgeneration %}``: marks the assistant's tokens for
    transformers' assistant mask and renders its body unchanged; templates that use it must
    compile here too."""

    tags = {"generation"}  # noqa: RUF012 (a set, as jinja2.ext.Extension declares it)

    def parse(self, parser: Any) -> jinja2.nodes.Node:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    @staticmethod
    def _body(caller: Any) -> str:
        return str(caller())


def _raise_exception(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's own tojson escapes <, >, & and ' for HTML and sorts keys; chat templates are
    # written against transformers' filter, which is plain json.dumps.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _environment() -> ImmutableSandboxedEnvironment:
    environment = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols, _GenerationBlock],
    )
    environment.filters["tojson"] = _tojson
    environment.globals["raise_exception"] = _raise_exception
    # No strftime_now: a prompt that depended on the clock would differ between a worker and
    # its validator. Templates that test ``strftime_now is defined`` use their fixed date.
    return environment


class ChatTemplate:
    """A checkpoint's chat template, rendering chat messages to prompt text (docs/protocol.md,
    "Tokenization"): Jinja2 in a sandbox with ``trim_blocks`` and ``lstrip_blocks``, the
    ``loopcontrols`` extension, ``raise_exception``, transformers' ``tojson`` and
    ``{% generation %}``; the variables ``messages`` (``[{"role", "content"}]``),
    ``add_generation_prompt`` (true), ``tools`` and ``documents`` (none) and the special
    tokens' strings of ``tokenizer_config.json``.

    Raises ``ValueError`` naming the template's file when it does not compile.
    """

    def __init__(
        self, source: str, special_tokens: Mapping[str, str] | None = None, origin: str = ""
    ) -> None:
        self.source = source
        self.special_tokens = dict(special_tokens or {})
        self.origin = origin or "the chat template"
        try:
            self._template = _environment().from_string(source)
        except jinja2.TemplateError as error:
            raise ValueError(f"{self.origin}: does not compile: {error}") from None

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> ChatTemplate | None:
        """The chat template of the checkpoint in ``directory``, ``None`` when it has none:
        ``chat_template.jinja`` when present, otherwise ``tokenizer_config.json``'s
        ``chat_template`` (a string, or the entry named ``default`` of a list of ``{name,
        template}``). ``ValueError`` naming the file when either is malformed."""
        root = Path(directory)
        config_path = root / TOKENIZER_CONFIG_FILE
        config: Mapping[str, Any] = {}
        if config_path.is_file():
            try:
                loaded = json.loads(config_path.read_text(encoding="utf-8"))
            except (UnicodeDecodeError, json.JSONDecodeError) as error:
                raise ValueError(f"{config_path}: not JSON: {error}") from None
            if not isinstance(loaded, dict):
                raise ValueError(f"{config_path}: not a JSON object")
            config = loaded
        template_path = root / CHAT_TEMPLATE_FILE
        if template_path.is_file():
            try:
                source = template_path.read_text(encoding="utf-8")
            except UnicodeDecodeError as error:
                raise ValueError(f"{template_path}: not UTF-8: {error}") from None
            return cls(source, _special_tokens(config, config_path), str(template_path))
        return cls.from_tokenizer_config(config, str(config_path))

    @classmethod
    def from_tokenizer_config(
        cls, config: Mapping[str, Any], origin: str = TOKENIZER_CONFIG_FILE
    ) -> ChatTemplate | None:
        """The template in a ``tokenizer_config.json``'s ``chat_template`` (a string, or the
        entry named ``default`` of a list of ``{name, template}``), with its special tokens;
        ``None`` without one."""
        template = config.get("chat_template")
        if template is None:
            return None
        if isinstance(template, list):
            named = {
                entry.get("name"): entry.get("template")
                for entry in template
                if isinstance(entry, dict)
            }
            template = named.get("default")
        if not isinstance(template, str):
            raise ValueError(
                f"{origin}: chat_template must be a string or a list of "
                "{name, template} with one named default"
            )
        return cls(template, _special_tokens(config, origin), f"{origin} (chat_template)")

    def render(self, messages: Sequence[tuple[str, str]]) -> str:
        """The prompt text of ``messages`` (``(role, content)`` pairs) with the generation
        prompt; ``ValueError`` when the template refuses them (``raise_exception``) or fails."""
        if not messages:
            raise ValueError("a chat prompt needs at least one message")
        conversation = [{"role": role, "content": content} for role, content in messages]
        try:
            return self._template.render(
                **self.special_tokens,
                messages=conversation,
                add_generation_prompt=True,
                tools=None,
                documents=None,
            )
        except jinja2.TemplateError as error:
            raise ValueError(f"{self.origin} refused the messages: {error}") from None


def _special_tokens(config: Mapping[str, Any], origin: object) -> dict[str, str]:
    tokens: dict[str, str] = {}
    for name in SPECIAL_TOKEN_NAMES:
        value = config.get(name)
        if isinstance(value, dict):  # an AddedToken's fields
            value = value.get("content")
        if value is None:
            continue
        if not isinstance(value, str):
            raise ValueError(
                f"{origin}: {name} must be a string or an object with a content string"
            )
        tokens[name] = value
    return tokens


class CheckpointTokenizer:
    """Encode prompts and decode completions with one checkpoint's ``tokenizer.json``; chat
    messages become prompt text through its :class:`ChatTemplate`."""

    def __init__(
        self, tokenizer: Tokenizer, chat_template: ChatTemplate | None = None, directory: str = ""
    ) -> None:
        self.tokenizer = tokenizer
        self._given_template = chat_template
        self._directory = directory

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> CheckpointTokenizer:
        """The tokenizer of the checkpoint in ``directory``; ``FileNotFoundError`` without one."""
        path = Path(directory) / TOKENIZER_FILE
        if not path.is_file():
            raise FileNotFoundError(
                f"{path}: the checkpoint has no {TOKENIZER_FILE}, which the protocol tokenizes "
                "with (docs/protocol.md, Tokenization)"
            )
        return cls(Tokenizer.from_file(str(path)), directory=os.fspath(directory))

    @cached_property
    def chat_template(self) -> ChatTemplate | None:
        """The checkpoint's chat template, read on first use (a checkpoint whose prompts are
        plain text needs none, and its ``tokenizer_config.json`` is then never parsed)."""
        if self._given_template is not None or not self._directory:
            return self._given_template
        return ChatTemplate.load(self._directory)

    def render_chat(self, messages: Sequence[tuple[str, str]]) -> str:
        """Prompt text of chat ``messages`` (:meth:`ChatTemplate.render`); ``ValueError`` when
        the checkpoint has no chat template."""
        template = self.chat_template
        if template is None:
            raise ValueError(
                "the prompt is chat messages, but the checkpoint has no chat template "
                f"({CHAT_TEMPLATE_FILE}, or chat_template in {TOKENIZER_CONFIG_FILE}); use the "
                "environment's plain-text prompt format"
            )
        return template.render(messages)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``: normalizer, pre-tokenizer and model of the file; special
        tokens (a BOS, a template's) are added only when asked, and the protocol never asks."""
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids`` through the file's decoder (byte-level: bytes back, then UTF-8 with
        invalid sequences replaced by U+FFFD), tokens marked special skipped by default."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))


__all__ = [
    "CHAT_TEMPLATE_FILE",
    "SPECIAL_TOKEN_NAMES",
    "TOKENIZER_CONFIG_FILE",
    "TOKENIZER_FILE",
    "ChatTemplate",
    "CheckpointTokenizer",
]
