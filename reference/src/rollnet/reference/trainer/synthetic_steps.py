"""Consecutive steps of the reference trainer on synthetic rollouts, published as it publishes.

Deltas between checkpoints (:mod:`rollnet.sdk.broadcast.delta`) are only as small as the
trainer's updates are sparse in bf16, so tests and ``bench/broadcast.py`` measure them on the
trainer's own code: :class:`~rollnet.reference.trainer.learner.Learner` (fp32 master weights,
AdamW with warm-up, gradient clipping, the configured GRPO loss) at the given
:class:`~rollnet.reference.trainer.config.TrainerConfig` (its defaults unless told otherwise),
and :func:`~rollnet.reference.trainer.publish.export_checkpoint` for every step, into the same
layout as a trainer's data directory (``checkpoints/step-<n>``).

Each step trains on ``batch_groups`` seeded groups of ``group_size`` completions: random prompt
and completion tokens, rewards drawn uniformly so every group has signal, GRPO advantages from
:func:`~rollnet.reference.trainer.advantages.group_advantages`, and behaviour log-probabilities
recomputed from the published bf16 checkpoint of the step before (what a worker sampling that
checkpoint would report, as the trainer itself recomputes them).
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path
from typing import Any

import torch

from rollnet.reference.model.tiny import TinyModelSpec, init_tiny_model
from rollnet.reference.trainer.advantages import group_advantages
from rollnet.reference.trainer.config import TrainerConfig
from rollnet.reference.trainer.policy import PolicyForward, TrainingSequence, behaviour_logprobs
from rollnet.reference.trainer.publish import checkpoint_dir, export_checkpoint

__all__ = ["PROMPT_TOKENS", "synthetic_groups", "write_trainer_steps"]

PROMPT_TOKENS = 16
"""Prompt length of the synthetic rollouts (completions are ``max_new_tokens`` long)."""


def synthetic_groups(
    config: TrainerConfig, vocab_size: int, draw: random.Random
) -> list[TrainingSequence]:
    """One step's worth of rollouts: ``batch_groups`` groups of ``group_size`` completions of
    one prompt each, with rewards drawn from ``draw`` (log-probabilities left empty: fill them
    in with :func:`~rollnet.reference.trainer.policy.behaviour_logprobs`)."""
    sequences = []
    for _ in range(config.batch_groups):
        prompt = [draw.randrange(vocab_size) for _ in range(PROMPT_TOKENS)]
        rewards = [draw.random() for _ in range(config.group_size)]
        advantages = group_advantages(rewards, normalize_std=config.normalize_advantage_std)
        for advantage in advantages:
            completion = [draw.randrange(vocab_size) for _ in range(config.max_new_tokens)]
            sequences.append(
                TrainingSequence(
                    prompt_ids=prompt,
                    completion_ids=completion,
                    behaviour_logprobs=[0.0] * len(completion),
                    validated_logprobs=None,
                    advantage=advantage,
                    temperature=config.temperature,
                )
            )
    return sequences


def write_trainer_steps(
    out_root: Path,
    steps: int,
    *,
    spec: TinyModelSpec | None = None,
    config: TrainerConfig | None = None,
    seed: int = 0,
) -> list[Path]:
    """Write checkpoint 0 (a fresh tiny model of ``spec``) and ``steps`` trainer steps after it
    under ``out_root/checkpoints`` (``step-0`` ... ``step-<steps>``, each a bf16 Hugging Face
    directory as the trainer publishes); returns the directories in order."""
    from transformers import AutoModelForCausalLM

    from rollnet.reference.trainer.learner import Learner

    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    config = config or TrainerConfig()
    model_dir = init_tiny_model(out_root / "model", seed=seed, spec=spec or TinyModelSpec())
    learner = Learner(config, model_dir, None, 0)
    device = torch.device(config.device)
    vocab = int(learner.model.config.vocab_size)
    draw = random.Random(seed + 1)
    loader: Any = AutoModelForCausalLM

    def publish(step: int) -> Path:
        weights, _ = learner.full_state()
        return export_checkpoint(learner.model, weights, model_dir, checkpoint_dir(out_root, step))

    directories = [publish(0)]
    for step in range(1, steps + 1):
        sampled_with = loader.from_pretrained(
            directories[-1], dtype=torch.float32, local_files_only=True
        )
        behaviour = PolicyForward(sampled_with.to(device).eval())
        sequences = synthetic_groups(config, vocab, draw)
        with torch.no_grad():
            logprobs = behaviour_logprobs(
                behaviour, sequences, learner.pad_id, device, config.micro_batch_size
            )
        sequences = [
            dataclasses.replace(s, behaviour_logprobs=mu, validated_logprobs=mu)
            for s, mu in zip(sequences, logprobs, strict=True)
        ]
        learner.step(sequences)
        directories.append(publish(step))
    return directories
