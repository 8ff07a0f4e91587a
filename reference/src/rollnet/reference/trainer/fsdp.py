"""Scale-out with FSDP2 (``fully_shard``): the same training code in one process or many.

Under ``torchrun`` (``WORLD_SIZE > 1``) :func:`setup` joins the process group (``nccl`` on CUDA,
``gloo`` on CPU) and :func:`shard` applies ``fully_shard`` to every decoder layer and then to
the whole :class:`~rollnet.reference.trainer.policy.PolicyForward` (its embedding, final norm and
LM head are gathered by the root's own forward). In one process both are no-ops.

Data parallelism: :func:`distributed_step` gives each process its slice of the batch's sequences,
sums the loss tokens over all of them (the loss is normalised by the *global* count) and scales
what each back-propagates by the world size, since FSDP2's gradient reduction averages over
processes — so the update is the one a single process makes on the whole batch.
:func:`full_state_dict` gathers the full weights for export (on every rank that asks).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from rollnet.reference.trainer.loss import LossConfig
from rollnet.reference.trainer.policy import StepStats, TrainingSequence, pack, train_step

__all__ = ["distributed_step", "full_state_dict", "rank", "setup", "shard", "world_size"]


def world_size() -> int:
    """Processes training together (1 without a process group)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def rank() -> int:
    """This process's rank (0 without a process group)."""
    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


def setup(device: str) -> None:
    """Join the process group ``torchrun`` describes (no-op when ``WORLD_SIZE`` is unset or 1)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1 or dist.is_initialized():
        return
    backend = "nccl" if device.startswith("cuda") else "gloo"
    dist.init_process_group(backend=backend)
    if device.startswith("cuda"):
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))


def shard(policy: nn.Module, model: Any) -> nn.Module:
    """``fully_shard`` each decoder layer, then the policy; a no-op in one process."""
    if world_size() <= 1:
        return policy
    from torch.distributed.fsdp import fully_shard

    for layer in model.get_decoder().layers:
        fully_shard(layer)
    fully_shard(policy)
    return policy


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The model's full weights (gathered from the shards under FSDP2), on the CPU."""
    if world_size() <= 1:
        return {name: tensor.detach().cpu() for name, tensor in model.state_dict().items()}
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    return {
        name: tensor.detach().cpu()
        for name, tensor in state.items()
        if isinstance(tensor, torch.Tensor)
    }


def distributed_step(
    policy: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    sequences: Sequence[TrainingSequence],
    loss_config: LossConfig,
    *,
    pad_id: int,
    device: torch.device,
    micro_batch_size: int,
    grad_clip: float,
    reference: nn.Module | None = None,
) -> StepStats:
    """One optimizer step over the whole batch ``sequences`` (every process passes the same
    list); each process trains on its own slice. Returns the step's figures, summed over all
    processes."""
    size, me = world_size(), rank()
    mine = list(sequences[me::size])
    # Every process must run the same number of forward passes (each gathers shards with the
    # others): the slices, at most one sequence apart, are cut into equally many micro-batches.
    widest = -(-len(sequences) // size)
    count = -(-widest // micro_batch_size)
    if len(sequences) < size * count:
        raise ValueError(
            f"{len(sequences)} sequences cannot give {size} processes {count} micro-batches each"
        )
    bounds = [round(i * len(mine) / count) for i in range(count + 1)]
    micro = [pack(mine[a:b], pad_id, device) for a, b in itertools.pairwise(bounds)]
    total = sum(len(s.completion_ids) for s in sequences)
    stats = train_step(
        policy,
        optimizer,
        scheduler,
        micro,
        loss_config,
        total_loss_tokens=total,
        grad_clip=grad_clip,
        loss_scale=float(size),
        reference=reference,
    )
    if size > 1:
        names = sorted(stats.branch_counts)
        figures = torch.tensor(
            [
                stats.loss,
                float(stats.loss_tokens),
                stats.mismatch_kl,
                stats.entropy,
                stats.kl_reference,
                *[stats.branch_counts[n] for n in names],
            ],
            dtype=torch.float64,
            device=device,
        )
        dist.all_reduce(figures)
        values = figures.tolist()
        stats.loss, stats.mismatch_kl, stats.entropy, stats.kl_reference = (
            values[0],
            values[2],
            values[3],
            values[4],
        )
        stats.loss_tokens = int(values[1])
        stats.branch_counts = dict(zip(names, values[5:], strict=True))
    return stats
