"""The trainer's model side: weights, optimizer and steps, in one process or under ``torchrun``.

:class:`Learner` owns the fp32 master model, the policy forward, AdamW with warm-up and the
optional frozen reference. In one process every method simply runs. Under ``torchrun`` (FSDP2,
:mod:`~rollnet.reference.trainer.fsdp`) rank 0 is the node — it talks to the coordinator and
decides — and the other ranks run :meth:`Learner.follow`: rank 0 broadcasts each collective
operation (a step on a batch, gathering the full state, stopping) before taking part in it, so
every rank enters the same collectives in the same order.

Weights and optimizer state are saved and loaded in the *full* (unsharded) form, keyed by
parameter name, so a run may resume with another number of processes.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from rollnet.reference.trainer import fsdp
from rollnet.reference.trainer.config import TrainerConfig
from rollnet.reference.trainer.policy import (
    PolicyForward,
    StepStats,
    TrainingSequence,
    warmup_lambda,
)

__all__ = ["Learner"]


class Learner:
    """Model, optimizer and steps (see the module docs)."""

    def __init__(
        self, config: TrainerConfig, model_dir: Path, master: dict[str, Any] | None, step: int
    ) -> None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_optimizer_state_dict,
        )
        from transformers import AutoModelForCausalLM

        self.config = config
        fsdp.setup(config.device)
        torch.manual_seed(config.seed)
        loader: Any = AutoModelForCausalLM
        model = loader.from_pretrained(model_dir, dtype=torch.float32, local_files_only=True)
        if master is not None:
            model.load_state_dict(master["model"])
        self.model = model.to(config.device)
        self.model.train()
        self.reference: PolicyForward | None = None
        if config.loss.kl_coef > 0:
            # The frozen reference is the starting model, never sharded (it has no gradient).
            start = loader.from_pretrained(model_dir, dtype=torch.float32, local_files_only=True)
            self.reference = PolicyForward(start.to(config.device).eval())
        self.policy = fsdp.shard(PolicyForward(self.model), self.model)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(),
            lr=config.learning_rate,
            betas=(config.adam_beta1, config.adam_beta2),
            weight_decay=config.weight_decay,
        )
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, warmup_lambda(config.warmup_steps)
        )
        if master is not None:
            set_optimizer_state_dict(
                self.model,
                self.optimizer,
                optim_state_dict=master["optimizer"],
                options=StateDictOptions(full_state_dict=True),
            )
        for _ in range(step):
            self.scheduler.step()
        pad = self.model.config.pad_token_id
        self.pad_id = int(pad if pad is not None else self.model.config.eos_token_id)

    @property
    def leads(self) -> bool:
        """Whether this process is the node (rank 0, or the only process)."""
        return fsdp.rank() == 0

    def _announce(self, command: tuple[Any, ...]) -> None:
        if fsdp.world_size() > 1:
            dist.broadcast_object_list([command], src=0)

    def step(self, sequences: Sequence[TrainingSequence]) -> StepStats:
        """One optimizer step over the batch (rank 0 calls; the followers join)."""
        self._announce(("step", list(sequences)))
        return self._step(sequences)

    def _step(self, sequences: Sequence[TrainingSequence]) -> StepStats:
        config = self.config
        return fsdp.distributed_step(
            self.policy,
            self.optimizer,
            self.scheduler,
            sequences,
            config.loss,
            pad_id=self.pad_id,
            device=torch.device(config.device),
            micro_batch_size=config.micro_batch_size,
            grad_clip=config.grad_clip,
            reference=self.reference,
        )

    def full_state(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """The full weights and optimizer state (rank 0 calls; the followers join)."""
        self._announce(("gather",))
        return self._gather()

    def _gather(self) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
        )

        weights = fsdp.full_state_dict(self.model)
        optimizer = get_optimizer_state_dict(
            self.model, self.optimizer, options=StateDictOptions(full_state_dict=True)
        )
        return weights, copy.deepcopy(optimizer)

    def stop(self) -> None:
        """Release the followers (rank 0 calls)."""
        self._announce(("stop",))

    def follow(self) -> None:
        """A follower's loop: take part in what rank 0 announces until it says stop."""
        while True:
            holder: list[Any] = [None]
            dist.broadcast_object_list(holder, src=0)
            command = holder[0]
            if command[0] == "step":
                self._step(command[1])
            elif command[0] == "gather":
                self._gather()
            else:
                return
