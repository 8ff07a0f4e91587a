"""Offline difficulty filtering: pre-score an environment's problems with a model and keep a band.

INTELLECT-2 dropped the problems its base model found too easy (always solved: every group's
rewards equal, no signal) or too hard (never solved: the same). :func:`score_problems` samples
``samples`` completions of each problem with the reference backend and records the mean task
reward; :func:`write_band` keeps those with ``low <= mean <= high`` as JSON Lines
``{"id", "problem", "answer", "mean_reward", "prompt_id"}`` — for the ``math`` environment with
its default prompt template, a dataset file its ``path`` key takes as it is.
"""

from __future__ import annotations

import json
import random
import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollnet.sdk.prompts import encode_problem

__all__ = ["ScoredProblem", "score_problems", "write_band"]


@dataclass(frozen=True, slots=True)
class ScoredProblem:
    """One problem and how the model did on it."""

    prompt_id: int
    source_id: str
    prompt: str
    answer: str
    mean_reward: float


def score_problems(
    model_dir: Path,
    environment: str,
    environment_config: Mapping[str, Any] | None = None,
    *,
    problems: int = 64,
    samples: int = 8,
    max_new_tokens: int = 32,
    temperature: float = 1.0,
    seed: int = 0,
    progress: Callable[[int, int], None] | None = None,
) -> list[ScoredProblem]:
    """Score ``problems`` problems (the first ones of a dataset, seeded draws of a synthetic
    environment) with ``samples`` completions each."""
    from rollnet.reference.envs import load_environment
    from rollnet.reference.inference.base import SamplingParams
    from rollnet.reference.inference.tokenization import CheckpointTokenizer
    from rollnet.reference.inference.torch_backend import TorchBackend

    if problems < 1 or samples < 1:
        raise ValueError("problems and samples must be positive")
    env = load_environment(environment, dict(environment_config or {}))
    tokenizer = CheckpointTokenizer.load(model_dir)
    backend = TorchBackend()
    backend.load(str(model_dir))
    draw = random.Random(seed)
    limit = env.num_prompts
    ids = (
        list(range(min(problems, limit)))
        if limit is not None
        else [draw.randrange(2**62) for _ in range(problems)]
    )
    scored: list[ScoredProblem] = []
    for done, prompt_id in enumerate(ids, start=1):
        problem = env.prompt(prompt_id)
        prompt = encode_problem(tokenizer, problem)
        generations = backend.generate(
            [prompt] * samples,
            SamplingParams(
                temperature=temperature,
                max_new_tokens=max_new_tokens,
                seeds=[draw.randrange(2**63) for _ in range(samples)],
                proofs=False,
            ),
        )
        rewards = []
        for generation in generations:
            completion = list(generation.completion_ids)
            text = tokenizer.decode(completion, skip_special_tokens=True)
            rewards.append(env.reward(problem, text, len(completion)).task_reward)
        scored.append(
            ScoredProblem(
                prompt_id=prompt_id,
                source_id=problem.source_id,
                prompt=problem.prompt,
                answer=problem.answer,
                mean_reward=statistics.fmean(rewards),
            )
        )
        if progress is not None:
            progress(done, len(ids))
    return scored


def write_band(scored: list[ScoredProblem], low: float, high: float, out: Path) -> int:
    """Write the problems whose mean reward is within ``[low, high]``; returns how many."""
    if not 0.0 <= low <= high <= 1.0:
        raise ValueError("the band must satisfy 0 <= low <= high <= 1")
    kept = [s for s in scored if low <= s.mean_reward <= high]
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out, "w", encoding="utf-8") as handle:
        for item in kept:
            record = {
                "id": item.source_id,
                "problem": item.prompt,
                "answer": item.answer,
                "mean_reward": item.mean_reward,
                "prompt_id": item.prompt_id,
            }
            handle.write(json.dumps(record, sort_keys=True) + "\n")
    return len(kept)
