"""The prompt-encoding rule: how worker and validator turn an assigned prompt into token ids.

It is protocol (``docs/protocol.md``, "Tokenization"): a validator rebuilds every assigned prompt
and compares ids with the worker's, so both must encode the same way. The rule needs only what a
checkpoint's tokenizer does (encode text, render chat messages with its template), given here as
the :class:`PromptTokenizer` protocol; the reference implementation's ``CheckpointTokenizer``
is one.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


class PromptTokenizer(Protocol):
    """What the rule needs of a checkpoint's tokenizer."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``, with special tokens added only when asked."""
        ...

    def render_chat(self, messages: Sequence[tuple[str, str]]) -> str:
        """Prompt text of chat ``messages`` through the checkpoint's chat template, with the
        generation prompt."""
        ...


class AssignedPrompt(Protocol):
    """An assigned prompt: its text, or chat messages when the model reads it through its
    template (an environment's problem)."""

    @property
    def prompt(self) -> str: ...

    @property
    def messages(self) -> Sequence[tuple[str, str]] | None: ...


def encode_prompt(tokenizer: PromptTokenizer, text: str) -> list[int]:
    """Token ids of prompt text as fed to the model: ``tokenizer.json``'s encoding, no special
    tokens added (docs/protocol.md, "Tokenization"). Validators rebuild the assigned prompt the
    same way (the assigned-data check compares ids)."""
    ids = tokenizer.encode(text, add_special_tokens=False)
    if not ids:
        raise ValueError("the prompt encodes to no tokens")
    return ids


def encode_problem(tokenizer: PromptTokenizer, problem: AssignedPrompt) -> list[int]:
    """Token ids of a problem's prompt as fed to the model, the one rule worker and validator
    share: the prompt text is ``problem.prompt``, or, when the problem is chat messages, those
    messages rendered once by the checkpoint's chat template with the generation prompt
    (:meth:`PromptTokenizer.render_chat`); the text is then encoded like any prompt
    (:func:`encode_prompt`: nothing added, the template's own special tokens matched in it).

    The completion is never re-tokenized: the sampled ids follow these ids as they are.
    """
    if problem.messages is None:
        return encode_prompt(tokenizer, problem.prompt)
    return encode_prompt(tokenizer, tokenizer.render_chat(problem.messages))


__all__ = ["AssignedPrompt", "PromptTokenizer", "encode_problem", "encode_prompt"]
