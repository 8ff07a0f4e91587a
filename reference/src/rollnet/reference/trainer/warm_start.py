"""``rollnet model warm-start``: a short supervised start on an environment's *format*.

A randomly initialised tiny model writes noise: on a task it cannot do at all every GRPO group has
equal rewards and RL has nothing to learn from. The warm start teaches only the shape of an
answer, not the task: for ``reverse`` the model learns to *copy* the string after the prompt and
stop (an EOS token), which scores ``≈ 1/len`` under the graded reward (one letter in order), so
that RL itself has to discover the reversal. Seconds on a CPU, deterministic for a seed.

Formats (``--format``): ``copy`` (the prompt's source string, then EOS: for ``reverse``) and
``answer`` (the environment's reference answer, then EOS: a real supervised start, for comparison
and for environments whose format cannot be separated from the task).
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F

from rollnet.reference.envs import Environment, Problem, load_environment
from rollnet.sdk.prompts import encode_problem

__all__ = ["WARM_START_FORMATS", "WarmStartResult", "warm_start"]

WarmStartFormat = Literal["copy", "answer"]
WARM_START_FORMATS: tuple[WarmStartFormat, ...] = ("copy", "answer")


@dataclass(frozen=True, slots=True)
class WarmStartResult:
    """What :func:`warm_start` did."""

    out_dir: Path
    steps: int
    first_loss: float
    final_loss: float


def _target(problem: Problem, fmt: WarmStartFormat) -> str:
    return problem.source_id if fmt == "copy" else problem.answer


def warm_start(
    model_dir: Path,
    out_dir: Path,
    environment: str,
    environment_config: Mapping[str, Any] | None = None,
    *,
    fmt: WarmStartFormat = "copy",
    answer_share: float = 0.0,
    steps: int = 300,
    batch_size: int = 32,
    learning_rate: float = 3e-3,
    seed: int = 0,
    progress: Callable[[int, float], None] | None = None,
) -> WarmStartResult:
    """Train ``model_dir`` on ``environment``'s prompts followed by the format's target and
    EOS, and save the result (Hugging Face layout, fp32) to ``out_dir``."""
    from transformers import AutoModelForCausalLM

    from rollnet.reference.inference.tokenization import CheckpointTokenizer

    if fmt not in WARM_START_FORMATS:
        raise ValueError(f"format {fmt!r} is not one of {', '.join(WARM_START_FORMATS)}")
    if not 0.0 <= answer_share <= 1.0:
        raise ValueError("answer_share must be within [0, 1]")
    if steps < 1 or batch_size < 1 or not learning_rate > 0:
        raise ValueError("steps and batch_size must be positive, learning_rate > 0")
    env: Environment = load_environment(environment, dict(environment_config or {}))
    tokenizer = CheckpointTokenizer.load(model_dir)
    loader: Any = AutoModelForCausalLM
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = loader.from_pretrained(model_dir, dtype=torch.float32, local_files_only=True)
        model.train()
        eos = int(model.config.eos_token_id)
        pad = int(model.config.pad_token_id if model.config.pad_token_id is not None else eos)
        optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0)
        draw = random.Random(seed)
        limit = env.num_prompts
        first = final = float("nan")
        for step in range(steps):
            problems = [
                env.prompt(draw.randrange(limit if limit is not None else 2**62))
                for _ in range(batch_size)
            ]
            rows: list[tuple[list[int], list[int]]] = []
            for problem in problems:
                # A share of reference answers gives RL a behaviour to find and reinforce.
                shown = "answer" if draw.random() < answer_share else fmt
                target = _target(problem, shown)
                prompt = encode_problem(tokenizer, problem)
                rows.append((prompt, [*tokenizer.encode(target), eos]))
            length = max(len(p) + len(c) for p, c in rows)
            input_ids = torch.full((batch_size, length), pad, dtype=torch.long)
            labels = torch.full((batch_size, length), -100, dtype=torch.long)
            attention = torch.zeros((batch_size, length), dtype=torch.long)
            for i, (prompt, completion) in enumerate(rows):
                row = prompt + completion
                input_ids[i, : len(row)] = torch.tensor(row)
                attention[i, : len(row)] = 1
                labels[i, len(prompt) : len(row)] = torch.tensor(completion)
            logits = model(input_ids=input_ids, attention_mask=attention).logits
            loss = F.cross_entropy(
                logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                labels[:, 1:].reshape(-1),
                ignore_index=-100,
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            value = float(loss.detach())
            if step == 0:
                first = value
            final = value
            if progress is not None:
                progress(step, value)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.eval()
    model.save_pretrained(out_dir, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        source = model_dir / name
        if source.exists():
            (out_dir / name).write_bytes(source.read_bytes())
    (out_dir / "rollnet_warm_start.json").write_text(
        json.dumps(
            {
                "base": str(model_dir),
                "environment": environment,
                "environment_config": dict(env.config),
                "format": fmt,
                "answer_share": answer_share,
                "steps": steps,
                "batch_size": batch_size,
                "learning_rate": learning_rate,
                "seed": seed,
                "first_loss": first,
                "final_loss": final,
            },
            indent=2,
            sort_keys=True,
        )
        + "\n"
    )
    return WarmStartResult(out_dir=out_dir, steps=steps, first_loss=first, final_loss=final)
