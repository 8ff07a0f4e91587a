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
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Tokenizer

TOKENIZER_FILE = "tokenizer.json"
"""The file every checkpoint carries for tokenization."""


class CheckpointTokenizer:
    """Encode prompts and decode completions with one checkpoint's ``tokenizer.json``."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer

    @classmethod
    def load(cls, directory: str | os.PathLike[str]) -> CheckpointTokenizer:
        """The tokenizer of the checkpoint in ``directory``; ``FileNotFoundError`` without one."""
        path = Path(directory) / TOKENIZER_FILE
        if not path.is_file():
            raise FileNotFoundError(
                f"{path}: the checkpoint has no {TOKENIZER_FILE}, which the protocol tokenizes "
                "with (docs/protocol.md, Tokenization)"
            )
        return cls(Tokenizer.from_file(str(path)))

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of ``text``: normalizer, pre-tokenizer and model of the file; special
        tokens (a BOS, a template's) are added only when asked, and the protocol never asks."""
        return list(self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Text of ``ids`` through the file's decoder (byte-level: bytes back, then UTF-8 with
        invalid sequences replaced by U+FFFD), tokens marked special skipped by default."""
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens))


__all__ = ["TOKENIZER_FILE", "CheckpointTokenizer"]
