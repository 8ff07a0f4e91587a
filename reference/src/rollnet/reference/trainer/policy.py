"""The policy as the trainer sees it: sequences in, per-token log-probabilities out, and one
optimizer step over a batch.

A batch is a list of :class:`TrainingSequence` (prompt, completion, the log-probabilities the
loss needs, the group advantage). :func:`pack` pads a micro-batch into tensors; the forward pass
(:class:`PolicyForward`) runs the model's body, then the LM head **in fp32** on the completion
positions only, divides the logits by the sampling temperature (behaviour log-probs are defined
on ``logits / T``) and returns each completion token's log-probability and the entropy.
:func:`train_step` accumulates the loss over micro-batches (normalised by the whole batch's loss
tokens, across every process), clips the gradient norm and steps the optimizer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from rollnet.reference.trainer.loss import LossConfig, LossResult, policy_loss

__all__ = [
    "PackedBatch",
    "PolicyForward",
    "StepStats",
    "TrainingSequence",
    "behaviour_logprobs",
    "pack",
    "train_step",
    "warmup_lambda",
]


@dataclass(frozen=True, slots=True)
class TrainingSequence:
    """One rollout ready for the loss."""

    prompt_ids: Sequence[int]
    completion_ids: Sequence[int]
    behaviour_logprobs: Sequence[float]
    """What the worker reported (metrics only)."""
    validated_logprobs: Sequence[float] | None
    """The validator's recomputation, or ``None`` when the rollout was not spot-checked."""
    advantage: float
    temperature: float


@dataclass(frozen=True, slots=True)
class PackedBatch:
    """Right-padded tensors of a micro-batch plus flat per-completion-token tensors."""

    input_ids: Tensor
    attention_mask: Tensor
    positions: Tensor
    """Flat indices into ``[batch * length]`` of the positions that predict a completion token."""
    targets: Tensor
    temperatures: Tensor
    advantages: Tensor
    behaviour_logprobs: Tensor
    validated_logprobs: Tensor
    validated_mask: Tensor
    loss_mask: Tensor

    @property
    def loss_tokens(self) -> int:
        """Completion tokens in the micro-batch."""
        return int(self.loss_mask.sum())


def pack(sequences: Sequence[TrainingSequence], pad_id: int, device: torch.device) -> PackedBatch:
    """Pad ``sequences`` (prompt + completion each) into one micro-batch."""
    if not sequences:
        raise ValueError("a micro-batch needs at least one sequence")
    rows = [list(s.prompt_ids) + list(s.completion_ids) for s in sequences]
    length = max(len(row) for row in rows)
    input_ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    attention = torch.zeros((len(rows), length), dtype=torch.long)
    positions: list[int] = []
    targets: list[int] = []
    temperatures: list[float] = []
    advantages: list[float] = []
    behaviour: list[float] = []
    validated: list[float] = []
    validated_mask: list[bool] = []
    for index, (sequence, row) in enumerate(zip(sequences, rows, strict=True)):
        completion = list(sequence.completion_ids)
        if not sequence.prompt_ids or not completion:
            raise ValueError("a training sequence needs a prompt and a completion")
        if len(sequence.behaviour_logprobs) != len(completion):
            raise ValueError("behaviour_logprobs must have one entry per completion token")
        checked = sequence.validated_logprobs
        if checked is not None and len(checked) != len(completion):
            raise ValueError("validated_logprobs must have one entry per completion token")
        input_ids[index, : len(row)] = torch.tensor(row, dtype=torch.long)
        attention[index, : len(row)] = 1
        start = len(sequence.prompt_ids) - 1  # the position whose logits predict token 0
        positions.extend(index * length + start + t for t in range(len(completion)))
        targets.extend(completion)
        temperatures.extend([sequence.temperature] * len(completion))
        advantages.extend([sequence.advantage] * len(completion))
        behaviour.extend(sequence.behaviour_logprobs)
        validated.extend(checked if checked is not None else [0.0] * len(completion))
        validated_mask.extend([checked is not None] * len(completion))

    def floats(values: list[float]) -> Tensor:
        return torch.tensor(values, dtype=torch.float32, device=device)

    return PackedBatch(
        input_ids=input_ids.to(device),
        attention_mask=attention.to(device),
        positions=torch.tensor(positions, dtype=torch.long, device=device),
        targets=torch.tensor(targets, dtype=torch.long, device=device),
        temperatures=floats(temperatures),
        advantages=floats(advantages),
        behaviour_logprobs=floats(behaviour),
        validated_logprobs=floats(validated),
        validated_mask=torch.tensor(validated_mask, dtype=torch.bool, device=device),
        loss_mask=torch.ones(len(targets), dtype=torch.bool, device=device),
    )


class PolicyForward(nn.Module):
    """A Hugging Face causal LM as the loss needs it: token log-probs and entropies with the LM
    head in fp32 (a bf16 head rounds away the small probability differences the ratio is made
    of). One module, so that FSDP2 can shard it as a whole (the root's parameters — embedding,
    final norm, head — are gathered by its own forward)."""

    def __init__(self, model: Any) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: Tensor,
        attention_mask: Tensor,
        positions: Tensor,
        targets: Tensor,
        temperatures: Tensor,
    ) -> tuple[Tensor, Tensor]:
        body = self.model.get_decoder()
        hidden = body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        picked = hidden.reshape(-1, hidden.shape[-1]).index_select(0, positions)
        head = self.model.get_output_embeddings()
        weight = head.weight
        if hasattr(weight, "full_tensor"):  # a DTensor: FSDP2 left the head sharded
            weight = weight.full_tensor()
        logits = F.linear(picked.float(), weight.float())
        bias = getattr(head, "bias", None)
        if bias is not None:
            logits = logits + bias.float()
        log_probs = torch.log_softmax(logits / temperatures.unsqueeze(1), dim=-1)
        chosen = log_probs.gather(1, targets.unsqueeze(1)).squeeze(1)
        entropy = -(log_probs.exp() * log_probs).sum(-1)
        return chosen, entropy


@dataclass(slots=True)
class StepStats:
    """What one optimizer step did (sums over this process's slice unless said otherwise)."""

    loss: float = 0.0
    """The normalised loss of the whole batch (summed over micro-batches and processes)."""
    loss_tokens: int = 0
    branch_counts: dict[str, float] = field(default_factory=dict)
    mismatch_kl: float = 0.0
    entropy: float = 0.0
    kl_reference: float = 0.0
    grad_norm: float = 0.0
    """Before clipping."""
    learning_rate: float = 0.0


def warmup_lambda(warmup_steps: int) -> Any:
    """Learning-rate multiplier: linear from ``1/(warmup+1)`` to 1 over ``warmup_steps``."""

    def factor(step: int) -> float:
        if warmup_steps <= 0:
            return 1.0
        return min(1.0, (step + 1) / (warmup_steps + 1))

    return factor


def train_step(
    policy: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    micro_batches: Sequence[PackedBatch],
    loss_config: LossConfig,
    *,
    total_loss_tokens: int,
    grad_clip: float,
    loss_scale: float = 1.0,
    reference: nn.Module | None = None,
) -> StepStats:
    """One optimizer step over ``micro_batches`` (gradients accumulated).

    ``total_loss_tokens`` is the whole batch's count across processes; ``loss_scale`` multiplies
    what is back-propagated (``world_size`` under FSDP2, whose gradient reduction averages over
    processes while the loss is already a global sum).
    """
    stats = StepStats()
    optimizer.zero_grad(set_to_none=True)
    for batch in micro_batches:
        args = (
            batch.input_ids,
            batch.attention_mask,
            batch.positions,
            batch.targets,
            batch.temperatures,
        )
        logprobs, entropy = policy(*args)
        reference_logprobs = None
        if reference is not None:
            with torch.no_grad():
                reference_logprobs, _ = reference(*args)
        result: LossResult = policy_loss(
            loss_config,
            logprobs=logprobs,
            behaviour_logprobs=batch.behaviour_logprobs,
            validated_logprobs=batch.validated_logprobs,
            validated_mask=batch.validated_mask,
            advantages=batch.advantages,
            loss_mask=batch.loss_mask,
            total_loss_tokens=total_loss_tokens,
            entropy=entropy,
            reference_logprobs=reference_logprobs,
        )
        (result.loss * loss_scale).backward()  # type: ignore[no-untyped-call]
        stats.loss += float(result.loss.detach())
        stats.loss_tokens += int(result.loss_tokens)
        for name, count in result.branch_counts.items():
            stats.branch_counts[name] = stats.branch_counts.get(name, 0.0) + count
        stats.mismatch_kl += result.mismatch_kl
        stats.entropy += result.entropy
        stats.kl_reference += result.kl_reference
    parameters = [p for p in policy.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(parameters, grad_clip)
    if hasattr(norm, "full_tensor"):
        norm = norm.full_tensor()
    stats.grad_norm = float(norm)
    if not math.isfinite(stats.grad_norm):
        # A non-finite gradient would poison the weights every worker loads next: skip it.
        optimizer.zero_grad(set_to_none=True)
    else:
        optimizer.step()
    stats.learning_rate = float(optimizer.param_groups[0]["lr"])
    scheduler.step()
    return stats


@torch.no_grad()
def behaviour_logprobs(
    policy: nn.Module,
    sequences: Sequence[TrainingSequence],
    pad_id: int,
    device: torch.device,
    micro_batch_size: int = 64,
) -> list[list[float]]:
    """Each sequence's completion-token log-probabilities under ``policy`` (no gradient): the
    trainer's own recomputation of ``μ`` with the checkpoint a rollout was sampled with, for
    rollouts a validator did not re-check."""
    results: list[list[float]] = []
    for start in range(0, len(sequences), micro_batch_size):
        chunk = sequences[start : start + micro_batch_size]
        batch = pack(chunk, pad_id, device)
        logprobs, _ = policy(
            batch.input_ids,
            batch.attention_mask,
            batch.positions,
            batch.targets,
            batch.temperatures,
        )
        flat = logprobs.float().cpu().tolist()
        offset = 0
        for sequence in chunk:
            size = len(sequence.completion_ids)
            results.append(flat[offset : offset + size])
            offset += size
    return results
