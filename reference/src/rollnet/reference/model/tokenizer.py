"""A character-level tokenizer over printable ASCII, built offline with the ``tokenizers`` package.

Ids 0-3 are the special tokens (``<|endoftext|>`` is EOS, then pad, bos, unk); then tab, newline
and the 95 printable ASCII characters in code-point order: 101 tokens in all.

It is laid out exactly like a Qwen2 byte-level BPE tokenizer with no merges (NFC normalizer,
Qwen2's split regex, ``ByteLevel`` pre-tokenizer and decoder; characters spelled in the GPT-2
byte-to-unicode alphabet, e.g. space as ``\u0120``). transformers 5 always rebuilds a ``qwen2``
model's tokenizer in that layout from the vocabulary, so only this shape gives the same ids through
``tokenizers``, ``AutoTokenizer`` and vLLM: one token per ASCII character. Bytes outside the
vocabulary become ``<|unk|>`` here and are dropped by transformers' rebuild; the arithmetic and
math prompts are plain ASCII.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

EOS_TOKEN = "<|endoftext|>"
PAD_TOKEN = "<|pad|>"
BOS_TOKEN = "<|bos|>"
UNK_TOKEN = "<|unk|>"
SPECIAL_TOKENS = (EOS_TOKEN, PAD_TOKEN, BOS_TOKEN, UNK_TOKEN)
CHARACTER_BYTES = (9, 10, *range(32, 127))
"""The bytes with a token: tab, newline and printable ASCII."""

# Qwen2's pre-tokenization regex (split contractions, letters, single digits, punctuation, spaces).
_SPLIT_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def _byte_to_unicode(byte: int) -> str:
    """GPT-2's reversible byte -> printable character map, as used by byte-level BPE."""
    printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
    if byte in printable:
        return chr(byte)
    others = [b for b in range(256) if b not in printable]
    return chr(256 + others.index(byte))


def build_char_tokenizer() -> Tokenizer:
    """The character-level tokenizer (deterministic: same ids on every call)."""
    symbols = [_byte_to_unicode(byte) for byte in CHARACTER_BYTES]
    vocab = {token: index for index, token in enumerate((*SPECIAL_TOKENS, *symbols))}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token=UNK_TOKEN))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(
        [AddedToken(token, special=True, normalized=False) for token in SPECIAL_TOKENS]
    )
    return tokenizer


def save_char_tokenizer(out_dir: Path, model_max_length: int) -> Tokenizer:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` (Hugging Face layout)."""
    tokenizer = build_char_tokenizer()
    tokenizer.save(str(out_dir / "tokenizer.json"))
    config = {
        # What transformers 5 uses for qwen2 anyway; 4.x and vLLM resolve it to the fast class.
        "tokenizer_class": "Qwen2Tokenizer",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "unk_token": UNK_TOKEN,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    special = {"bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN, "pad_token": PAD_TOKEN}
    special["unk_token"] = UNK_TOKEN
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
    return tokenizer
