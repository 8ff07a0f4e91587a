"""The trainer's metrics: Prometheus gauges and counters, and one JSON line per step.

Each step's line (``metrics.jsonl`` in the data directory) holds: ``step``;
``sampled_task_reward`` (mean task reward of every group scored since the previous step, those
dropped for having no signal included: what the policy's samples are worth) and
``sampled_rollouts``; ``reward`` and ``task_reward`` (means over the batch, validated or
recomputed), ``length_penalty``;
``advantage_mean``/``advantage_std``/``advantage_abs_max``; the loss; per-branch fractions of
loss tokens (``frac_<branch>``); ``mismatch_kl`` (trainer vs reported behaviour log-probs, per
token); ``entropy`` (per token); ``grad_norm`` (before clipping); ``staleness`` (lag -> groups
in this batch) and the cumulative ``dropped_stale``/``dropped_no_signal``; ``validated_fraction``
(tokens whose ratio used the validator's log-probs); ``samples_per_s``/``tokens_per_s`` (over
the step's wall time) and ``idle_fraction`` (the share of it spent waiting for rollouts);
``sequences`` (the stream sequence numbers trained on, so a resumed run can be audited).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge

__all__ = ["TrainerMetrics", "append_jsonl", "read_jsonl"]


class TrainerMetrics:
    """Prometheus metrics of one trainer (a registry of its own)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.step = Gauge("rollnet_trainer_step", "Last committed step", registry=self.registry)
        self.reward = Gauge(
            "rollnet_trainer_reward",
            "Mean reward of the last step's batch, by part",
            ["part"],
            registry=self.registry,
        )
        self.step_values = Gauge(
            "rollnet_trainer_step_value",
            "Figures of the last step (loss, grad_norm, entropy, mismatch_kl, fractions, ...)",
            ["name"],
            registry=self.registry,
        )
        self.groups = Counter(
            "rollnet_trainer_groups",
            "Complete groups by what happened to them",
            ["outcome"],
            registry=self.registry,
        )
        self.samples = Counter(
            "rollnet_trainer_samples", "Rollouts trained on", registry=self.registry
        )
        self.tokens = Counter(
            "rollnet_trainer_tokens", "Completion tokens trained on", registry=self.registry
        )
        self.idle_seconds = Counter(
            "rollnet_trainer_idle_seconds",
            "Seconds spent waiting for rollouts",
            registry=self.registry,
        )
        self.busy_seconds = Counter(
            "rollnet_trainer_busy_seconds",
            "Seconds spent training, saving and publishing",
            registry=self.registry,
        )

    def record(self, line: dict[str, Any]) -> None:
        """Update the gauges and counters from one step's metrics line."""
        self.step.set(line["step"])
        for part in ("reward", "task_reward", "length_penalty"):
            self.reward.labels(part).set(line[part])
        skip = ("step", "reward", "task_reward", "length_penalty")
        for name, value in line.items():
            if isinstance(value, float | int) and not isinstance(value, bool) and name not in skip:
                self.step_values.labels(name).set(value)
        self.samples.inc(line["samples"])
        self.tokens.inc(line["loss_tokens"])
        self.idle_seconds.inc(line["idle_seconds"])
        self.busy_seconds.inc(line["busy_seconds"])

    def count_groups(self, outcome: str, amount: int) -> None:
        """Add ``amount`` groups to ``outcome`` (trained, dropped_stale, dropped_no_signal)."""
        if amount > 0:
            self.groups.labels(outcome).inc(amount)


def append_jsonl(path: Path, line: dict[str, Any]) -> None:
    """Append one line and flush it to disk (a line torn by a crash is cut off first)."""
    import os

    with open(path, "a+b") as handle:
        size = handle.seek(0, os.SEEK_END)
        if size:
            handle.seek(size - 1)
            if handle.read(1) != b"\n":
                handle.seek(0)
                content = handle.read()
                handle.truncate(content.rfind(b"\n") + 1)
        handle.write((json.dumps(line, sort_keys=True) + "\n").encode())
        handle.flush()
        os.fsync(handle.fileno())


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every complete line of a metrics file (a torn last line is ignored)."""
    if not path.exists():
        return []
    lines = []
    for raw in path.read_text(encoding="utf-8").splitlines():
        try:
            lines.append(json.loads(raw))
        except json.JSONDecodeError:
            continue
    return lines
