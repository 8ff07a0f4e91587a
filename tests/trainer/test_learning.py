"""RL itself raises the reward: the warm-started tiny model on ``reverse``, fixed seeds.

The warm start (seconds) teaches the answer's format — copy the string, then stop — with one
example in ten showing the reversed string; sampled at temperature 1 the model scores about 0.3.
Then synchronous GRPO with the trainer's own intake, loss and optimizer step, on groups sampled
by the workers' backend, takes the mean task reward of what it samples to a clearly higher
plateau. The assertion is on the reward, not on the loss.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest
import torch

from rollnet.reference.trainer.config import TrainerConfig
from rollnet.reference.trainer.local import train_locally
from rollnet.reference.trainer.warm_start import warm_start

STEPS = 50
LEARNING = TrainerConfig(
    environment="reverse",
    group_size=8,
    batch_groups=32,
    max_new_tokens=12,
    learning_rate=3e-3,
    grad_clip=1.0,
)


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_grpo_raises_the_reward_of_the_warm_started_tiny_model(
    tmp_path: Path, tiny_model: Path
) -> None:
    # One thread: the model is tiny, and a second thread only adds waiting (a lot of it on a
    # loaded machine).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        _learn(tmp_path, tiny_model)
    finally:
        torch.set_num_threads(threads)


def _learn(tmp_path: Path, tiny_model: Path) -> None:
    started = warm_start(
        tiny_model, tmp_path / "warm", "reverse", fmt="copy", answer_share=0.1, steps=400, seed=0
    )
    assert started.final_loss < started.first_loss / 3
    history = train_locally(started.out_dir, LEARNING, STEPS, seed=1)
    rewards = [step.task_reward for step in history]
    start = statistics.fmean(rewards[:3])
    end = statistics.fmean(rewards[-5:])
    print(f"reverse: mean task reward {start:.3f} (first 3 steps) -> {end:.3f} (last 5)")
    # The trajectory depends on the host's float kernels (the same seeds on two x86 hosts: 0.31
    # -> 0.51 and -> 0.6+); over seeds 1-3 on one host it ended at 0.51, 0.57 and 0.60. A
    # trainer that does not learn stays near its start (about 0.3).
    assert start <= 0.35
    assert end >= 0.45
    assert end - start >= 0.15
