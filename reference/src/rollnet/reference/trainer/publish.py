"""Checkpoints out of the trainer: fp32 master weights exported as bf16 in Hugging Face layout,
published with a signed manifest, and only the last ``max_off_policy_steps + 1`` kept.

bf16 halves what every worker downloads and, since an RL step changes few weights by more than
a bf16 rounding step, consecutive checkpoints share most of their bytes (docs/trainer.md).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import torch

__all__ = ["TOKENIZER_FILES", "checkpoint_dir", "export_checkpoint", "prune_checkpoints"]

#: Files copied from the starting model directory into every published checkpoint.
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.jinja",
)


def checkpoint_dir(data_dir: Path, step: int) -> Path:
    """Where checkpoint ``step`` is written."""
    return data_dir / "checkpoints" / f"step-{step}"


def export_checkpoint(
    model: Any, state: dict[str, torch.Tensor], base_dir: Path, out: Path
) -> Path:
    """Write ``state`` (the full fp32 state dict of ``model``) as a bf16 Hugging Face directory
    at ``out`` (replaced atomically: a reader never sees half of one)."""
    staging = out.with_name(f".{out.name}.partial")
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    half = {
        name: tensor.detach().to(device="cpu", dtype=torch.bfloat16)
        if tensor.is_floating_point()
        else tensor.detach().cpu()
        for name, tensor in state.items()
    }
    if getattr(model.config, "tie_word_embeddings", False):
        # The copies above no longer share storage, so save_pretrained would write the tied head
        # as a second copy of the embedding table; loading ties it again.
        half.pop("lm_head.weight", None)
    model.save_pretrained(staging, state_dict=half, safe_serialization=True)
    for name in TOKENIZER_FILES:
        source = base_dir / name
        if source.exists():
            shutil.copyfile(source, staging / name)
    if out.exists():
        shutil.rmtree(out)
    staging.rename(out)
    return out


def prune_checkpoints(data_dir: Path, newest: int, keep: int) -> list[int]:
    """Remove checkpoint directories older than the ``keep`` newest up to ``newest``; returns
    the removed steps."""
    removed = []
    for path in (data_dir / "checkpoints").glob("step-*"):
        try:
            step = int(path.name.removeprefix("step-"))
        except ValueError:
            continue
        if step <= newest - keep:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(step)
    return sorted(removed)
