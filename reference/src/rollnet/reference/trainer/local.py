"""GRPO without a swarm: the trainer's own pieces fed by local generation.

:func:`train_locally` samples each step's groups with the reference torch backend (seeded
Gumbel-max sampling, the workers' code) from the current weights, scores them with the
environment, and runs them through the same :class:`~rollnet.reference.trainer.intake.RolloutIntake`
(online filtering, advantages) and :func:`~rollnet.reference.trainer.policy.train_step` as the
trainer node. It is what the learning test and the benchmark run: RL on this machine in seconds,
with every number the swarm would add (validation, transport) left out.
"""

from __future__ import annotations

import copy
import random
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from rollnet.reference.trainer.config import TrainerConfig
from rollnet.reference.trainer.intake import RolloutIntake
from rollnet.reference.trainer.policy import (
    PolicyForward,
    TrainingSequence,
    pack,
    train_step,
    warmup_lambda,
)
from rollnet.sdk.prompts import encode_problem
from rollnet.v1 import common_pb2, rollout_pb2

__all__ = ["LocalStep", "train_locally"]


@dataclass(slots=True)
class LocalStep:
    """One local step: the reward of everything sampled, and what the update did."""

    step: int
    reward: float
    task_reward: float
    groups_with_signal: int
    loss: float
    grad_norm: float
    generate_seconds: float
    train_seconds: float
    extra: dict[str, Any] = field(default_factory=dict)


def train_locally(
    model_dir: Path,
    config: TrainerConfig,
    steps: int,
    *,
    seed: int = 0,
    progress: Callable[[LocalStep], None] | None = None,
    environment_config: Mapping[str, Any] | None = None,
) -> list[LocalStep]:
    """Run ``steps`` synchronous GRPO steps on ``config.environment`` (``batch_groups``
    prompts of ``group_size`` completions each, sampled fresh every step)."""
    from transformers import AutoModelForCausalLM

    from rollnet.reference.envs import load_environment
    from rollnet.reference.inference.base import SamplingParams
    from rollnet.reference.inference.tokenization import CheckpointTokenizer
    from rollnet.reference.inference.torch_backend import TorchBackend

    environment = load_environment(
        config.environment, dict(environment_config or config.environment_config)
    )
    tokenizer = CheckpointTokenizer.load(model_dir)
    loader: Any = AutoModelForCausalLM
    torch.manual_seed(seed)
    model = loader.from_pretrained(model_dir, dtype=torch.float32, local_files_only=True)
    model.train()
    policy = PolicyForward(model)
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=config.learning_rate,
        betas=(config.adam_beta1, config.adam_beta2),
        weight_decay=config.weight_decay,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup_lambda(config.warmup_steps))
    pad = int(model.config.pad_token_id or model.config.eos_token_id)
    draw = random.Random(seed)
    limit = environment.num_prompts
    sequence = 0
    history: list[LocalStep] = []
    for step in range(steps):
        started = time.monotonic()
        sampler = TorchBackend()
        sampler.attach(copy.deepcopy(model))
        problems = [
            environment.prompt(draw.randrange(limit if limit is not None else 2**62))
            for _ in range(config.batch_groups)
        ]
        prompts = [encode_problem(tokenizer, p) for p in problems for _ in range(config.group_size)]
        seeds = [draw.randrange(2**63) for _ in prompts]
        generations = sampler.generate(
            prompts,
            SamplingParams(
                temperature=config.temperature,
                max_new_tokens=config.max_new_tokens,
                seeds=seeds,
                proofs=False,
            ),
        )
        intake = RolloutIntake(
            group_size=config.group_size,
            batch_groups=1,
            max_off_policy_steps=0,
            reward_of=lambda r: (r.validated_reward.total, r.validated_reward.task_reward),
            normalize_std=config.normalize_advantage_std,
        )
        rewards: list[float] = []
        tasks: list[float] = []
        for index, generation in enumerate(generations):
            problem = problems[index // config.group_size]
            completion = list(generation.completion_ids)
            text = tokenizer.decode(completion, skip_special_tokens=True)
            reward = environment.reward(problem, text, len(completion))
            rewards.append(reward.total)
            tasks.append(reward.task_reward)
            sequence += 1
            intake.offer(
                rollout_pb2.AcceptedRollout(
                    sequence=sequence,
                    group_id=f"{step}-{index // config.group_size}",
                    checkpoint_step=step,
                    rollout=rollout_pb2.Rollout(
                        prompt_token_ids=list(generation.prompt_ids),
                        completion_token_ids=completion,
                        behaviour_logprobs=list(generation.logprobs),
                    ),
                    validated_reward=common_pb2.Reward(
                        task_reward=reward.task_reward,
                        length_penalty=reward.length_penalty,
                        total=reward.total,
                    ),
                    # Generated here, by this process: as trustworthy as a validator's.
                    validated_logprobs=list(generation.logprobs),
                ),
                step,
            )
        generated = time.monotonic()
        groups = []
        while (taken := intake.take_batch(step)) is not None:
            groups.extend(taken)
        loss = grad_norm = 0.0
        if groups:
            sequences = [
                TrainingSequence(
                    prompt_ids=list(r.rollout.prompt_token_ids),
                    completion_ids=list(r.rollout.completion_token_ids),
                    behaviour_logprobs=list(r.rollout.behaviour_logprobs),
                    validated_logprobs=list(r.validated_logprobs),
                    advantage=advantage,
                    temperature=config.temperature,
                )
                for group in groups
                for r, advantage in zip(group.rollouts, group.advantages, strict=True)
            ]
            size = config.micro_batch_size
            micro = [
                pack(sequences[i : i + size], pad, torch.device("cpu"))
                for i in range(0, len(sequences), size)
            ]
            stats = train_step(
                policy,
                optimizer,
                scheduler,
                micro,
                config.loss,
                total_loss_tokens=sum(m.loss_tokens for m in micro),
                grad_clip=config.grad_clip,
            )
            loss, grad_norm = stats.loss, stats.grad_norm
        record = LocalStep(
            step=step + 1,
            reward=statistics.fmean(rewards),
            task_reward=statistics.fmean(tasks),
            groups_with_signal=len(groups),
            loss=loss,
            grad_norm=grad_norm,
            generate_seconds=generated - started,
            train_seconds=time.monotonic() - generated,
        )
        history.append(record)
        if progress is not None:
            progress(record)
    return history
