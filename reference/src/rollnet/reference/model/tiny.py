"""A tiny Qwen2-architecture causal LM, made locally and deterministically from a seed.

``init_tiny_model(out_dir, seed)`` writes a Hugging Face directory (``config.json``,
``generation_config.json``, ``model.safetensors`` and the character tokenizer) that
``transformers.AutoModelForCausalLM`` / ``AutoTokenizer`` (and vLLM) load from the local path.
The default size (hidden 64, 2 layers, ~0.1M parameters) decodes hundreds of short rollouts per
second on two CPU cores, which is what the test suite and the CPU demo need.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

from rollnet.reference.model.tokenizer import (
    BOS_TOKEN,
    EOS_TOKEN,
    PAD_TOKEN,
    build_char_tokenizer,
    save_char_tokenizer,
)


@dataclass(frozen=True)
class TinyModelSpec:
    """Shape of the tiny model; the vocabulary always matches the character tokenizer."""

    hidden_size: int = 64
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 512
    initializer_range: float = 0.02
    rope_theta: float = 10000.0


def tiny_config(spec: TinyModelSpec) -> Qwen2Config:
    """The ``Qwen2Config`` for a spec, with token ids from the character tokenizer."""
    tokenizer = build_char_tokenizer()
    # rope_theta and dtype go through **kwargs: their spelling differs between transformers 4/5.
    legacy: dict[str, Any] = {"rope_theta": spec.rope_theta, "torch_dtype": "float32"}
    return Qwen2Config(
        vocab_size=tokenizer.get_vocab_size(),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        max_position_embeddings=spec.max_position_embeddings,
        initializer_range=spec.initializer_range,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.token_to_id(BOS_TOKEN),
        eos_token_id=tokenizer.token_to_id(EOS_TOKEN),
        pad_token_id=tokenizer.token_to_id(PAD_TOKEN),
        **legacy,
    )


def init_tiny_model(out_dir: str | Path, seed: int = 0, spec: TinyModelSpec | None = None) -> Path:
    """Create the tiny model with weights drawn from ``seed`` and save it under ``out_dir``.

    The same seed and spec give the same weights (CPU initialisation under a fixed generator).
    Returns the directory.
    """
    spec = spec or TinyModelSpec()
    path = Path(out_dir)
    path.mkdir(parents=True, exist_ok=True)
    config = tiny_config(spec)
    # fork_rng keeps the caller's global RNG state untouched.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model: Any = Qwen2ForCausalLM(config)
    model.eval()
    generation_config: Any = GenerationConfig  # untyped constructor in transformers 5
    model.generation_config = generation_config(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        do_sample=True,
        temperature=1.0,
    )
    model.save_pretrained(path, safe_serialization=True)
    save_char_tokenizer(path, spec.max_position_embeddings)
    (path / "rollnet_tiny.json").write_text(
        json.dumps({"seed": seed, "spec": asdict(spec)}, indent=2, sort_keys=True) + "\n"
    )
    return path
