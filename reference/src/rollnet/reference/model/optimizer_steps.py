"""Consecutive real optimizer steps of the tiny model, published the way a trainer does.

Deltas between checkpoints (:mod:`rollnet.sdk.broadcast.delta`) are only as small as the
updates are sparse in bf16, so tests and ``bench/broadcast.py`` measure them on real steps:
AdamW on the causal-LM loss of seeded token batches, master weights in float32, each step
written as a Hugging Face directory with bf16 ``model.safetensors`` (what a trainer publishes).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file
from transformers import Qwen2ForCausalLM

from rollnet.reference.model.tiny import TinyModelSpec, init_tiny_model

DEFAULT_LR = 1e-6
"""The learning rate of the steps (RL trainers run 1e-6 to 1e-5)."""


def write_optimizer_steps(
    out_root: Path,
    steps: int,
    *,
    spec: TinyModelSpec | None = None,
    lr: float = DEFAULT_LR,
    seed: int = 0,
    batch: int = 4,
    sequence: int = 64,
) -> list[Path]:
    """Write the initial model and ``steps`` AdamW steps after it: ``out_root/step-0`` ...
    ``out_root/step-<steps>``; returns the directories in order."""
    spec = spec or TinyModelSpec()
    first = init_tiny_model(out_root / "step-0-f32", seed=seed, spec=spec)
    model: Any = Qwen2ForCausalLM.from_pretrained(first, torch_dtype=torch.float32)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    generator = torch.Generator().manual_seed(seed + 1)
    vocab = model.config.vocab_size
    directories = [_publish(model, first, out_root / "step-0")]
    for step in range(1, steps + 1):
        tokens = torch.randint(0, vocab, (batch, sequence), generator=generator)
        loss = model(input_ids=tokens, labels=tokens).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        directories.append(_publish(model, first, out_root / f"step-{step}"))
    shutil.rmtree(first)
    return directories


def _publish(model: Any, template: Path, directory: Path) -> Path:
    """Copy the configuration and tokenizer of ``template``; weights in bf16."""
    directory.mkdir(parents=True, exist_ok=True)
    for path in template.iterdir():
        if path.is_file() and path.suffix != ".safetensors":
            shutil.copy2(path, directory / path.name)
    state = {
        name: tensor.detach().to(torch.bfloat16).contiguous()
        for name, tensor in model.state_dict().items()
    }
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    save_file(state, str(directory / "model.safetensors"), metadata={"format": "pt"})
    return directory
