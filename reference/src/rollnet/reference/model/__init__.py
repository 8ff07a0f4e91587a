"""Models made locally for tests and the demo (nothing is downloaded)."""

from rollnet.reference.model.tiny import TinyModelSpec, init_tiny_model
from rollnet.reference.model.tokenizer import (
    BOS_TOKEN,
    EOS_TOKEN,
    PAD_TOKEN,
    UNK_TOKEN,
    build_char_tokenizer,
)

__all__ = [
    "BOS_TOKEN",
    "EOS_TOKEN",
    "PAD_TOKEN",
    "UNK_TOKEN",
    "TinyModelSpec",
    "build_char_tokenizer",
    "init_tiny_model",
]
