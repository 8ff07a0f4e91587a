"""Checkpoints out of the trainer: fp32 master weights exported as bf16 in Hugging Face layout,
published with a signed manifest, and only the last ``max_off_policy_steps + 1`` kept.

bf16 halves what every worker downloads and, since an RL step changes few weights by more than
a bf16 rounding step, consecutive checkpoints share most of their bytes (docs/trainer.md): each
step is also published as a lossless delta against the step the coordinator held before
(docs/broadcast.md), and with an origin directory its blobs are written there for
``rollnet relay --origin DIR``.
"""

from __future__ import annotations

import asyncio
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from rollnet.reference.checkpoint_publishing import PublishedCheckpoint
    from rollnet.sdk import Identity, RollnetClient

__all__ = [
    "TOKENIZER_FILES",
    "checkpoint_dir",
    "export_checkpoint",
    "prune_checkpoints",
    "publish_step",
]

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


async def publish_step(
    client: RollnetClient,
    identity: Identity,
    data_dir: Path,
    step: int,
    network_id: str,
    *,
    published: int | None,
    deltas: bool = True,
    origin_dir: Path | None = None,
    origin_keep: int = 2,
) -> PublishedCheckpoint:
    """Publish ``checkpoint_dir(data_dir, step)`` as checkpoint ``step``.

    ``published``: the newest step the coordinator holds. With ``deltas``, each file is also
    described as a delta against that step's file when its directory is still here and the
    delta is less than half the file: the nodes that hold that step (every node that kept up)
    then fetch only what changed, and late joiners the full files. ``origin_dir``: every blob
    and the signed checkpoint are written there too, and only the newest ``origin_keep``
    checkpoints' blobs are kept (:func:`~rollnet.reference.checkpoint_publishing.prune_origin`).
    """
    from rollnet.reference.checkpoint_publishing import DeltaBase, prune_origin, publish_model_dir

    base = None
    if deltas and published is not None and published < step:
        previous = checkpoint_dir(data_dir, published)
        if (previous / "config.json").is_file():
            base = DeltaBase(published, previous)
    result = await publish_model_dir(
        client,
        identity,
        checkpoint_dir(data_dir, step),
        step,
        network_id,
        delta_base=base,
        origin_dir=origin_dir,
    )
    if origin_dir is not None:
        await asyncio.to_thread(prune_origin, origin_dir, origin_keep)
    return result
