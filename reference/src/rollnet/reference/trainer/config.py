"""The trainer's configuration: one dataclass, read from a TOML file by an opt-in helper.

Every key, its default and meaning is in docs/trainer.md ("Configuration"); ``[loss]`` holds the
fields of :class:`~rollnet.reference.trainer.loss.LossConfig`. An unknown key, a wrong type or
a value out of range is refused with a message naming the key.
"""

from __future__ import annotations

import dataclasses
import math
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollnet.reference.trainer.loss import LossConfig

__all__ = ["TrainerConfig", "TrainerConfigError", "load_trainer_config"]


class TrainerConfigError(ValueError):
    """The configuration is invalid; the message names the key."""


@dataclass(frozen=True)
class TrainerConfig:
    """What the trainer trains on and how."""

    environment: str = "reverse"
    environment_config: dict[str, Any] = field(default_factory=dict)
    group_size: int = 8
    """Completions per prompt (the GRPO group)."""
    batch_groups: int = 16
    """Groups with signal per optimizer step."""
    prompts_per_task: int = 4
    max_new_tokens: int = 12
    temperature: float = 1.0
    max_off_policy_steps: int = 0
    """The staleness bound: a rollout of checkpoint ``c`` is trained on at most this many steps
    after ``c`` (0: synchronous)."""
    max_steps: int = 0
    """Stop after this step (0: train until stopped)."""
    learning_rate: float = 1e-6
    """AdamW's learning rate: RL on language models runs 3e-7 to 1e-6 (INTELLECT-2); the tiny
    demo model needs about 3e-3 and sets it itself."""
    adam_beta1: float = 0.9
    adam_beta2: float = 0.99
    weight_decay: float = 0.0
    warmup_steps: int = 0
    grad_clip: float = 0.1
    """Gradient-norm clip (INTELLECT-2 found 0.05-0.1 necessary)."""
    normalize_advantage_std: bool = False
    """``(r − mean)/(std + ε)`` instead of ``r − mean``."""
    micro_batch_size: int = 64
    """Sequences per forward pass (gradients accumulate over a step's micro-batches)."""
    demand_timeout: float = 300.0
    """Seconds without a new group after which outstanding demand is written off and made
    again (its tasks failed or were lost)."""
    seed: int = 0
    device: str = "cpu"
    loss: LossConfig = field(default_factory=LossConfig)

    def __post_init__(self) -> None:
        positive = {
            "group_size": self.group_size >= 2,
            "batch_groups": self.batch_groups >= 1,
            "prompts_per_task": self.prompts_per_task >= 1,
            "max_new_tokens": self.max_new_tokens >= 1,
            "max_off_policy_steps": self.max_off_policy_steps >= 0,
            "max_steps": self.max_steps >= 0,
            "warmup_steps": self.warmup_steps >= 0,
            "micro_batch_size": self.micro_batch_size >= 1,
            "seed": self.seed >= 0,
            "temperature": 0.001 <= self.temperature <= 100.0,
            "learning_rate": 0.0 < self.learning_rate < 1.0,
            "adam_beta1": 0.0 <= self.adam_beta1 < 1.0,
            "adam_beta2": 0.0 <= self.adam_beta2 < 1.0,
            "weight_decay": self.weight_decay >= 0.0,
            "grad_clip": self.grad_clip > 0.0,
            "demand_timeout": self.demand_timeout > 0.0,
        }
        for name, ok in positive.items():
            value = getattr(self, name)
            if not ok or (isinstance(value, float) and not math.isfinite(value)):
                raise TrainerConfigError(f"{name} = {value!r} is out of range")
        if not self.environment:
            raise TrainerConfigError("environment must not be empty")

    @property
    def keep_checkpoints(self) -> int:
        """Published checkpoints kept on disk: the ones a rollout may still come from."""
        return self.max_off_policy_steps + 1


def _typed(name: str, value: Any, expected: type) -> Any:
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expected is bool:
        ok = isinstance(value, bool)
    elif expected is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    else:
        ok = isinstance(value, expected)
    if not ok:
        raise TrainerConfigError(f"{name}: expected {expected.__name__}, got {value!r}")
    return value


def _fields(cls: type) -> dict[str, type]:
    types = {"int": int, "float": float, "bool": bool, "str": str}
    found: dict[str, type] = {}
    for item in dataclasses.fields(cls):
        annotation = str(item.type)
        if annotation in types:
            found[item.name] = types[annotation]
        elif annotation.startswith("dict"):
            found[item.name] = dict
    return found


def trainer_config_from_mapping(data: dict[str, Any], where: str = "config") -> TrainerConfig:
    """Build a :class:`TrainerConfig` from parsed TOML data (``[loss]`` a table)."""
    top = _fields(TrainerConfig)
    values: dict[str, Any] = {}
    loss_values: dict[str, Any] = {}
    for key, value in data.items():
        if key == "loss":
            if not isinstance(value, dict):
                raise TrainerConfigError(f"{where}: loss must be a table ([loss])")
            loss_fields = _fields(LossConfig)
            loss_fields["kind"] = str
            for loss_key, loss_value in value.items():
                if loss_key not in loss_fields:
                    known = ", ".join(sorted(loss_fields))
                    raise TrainerConfigError(
                        f"{where}: unknown key loss.{loss_key} (known: {known})"
                    )
                loss_values[loss_key] = _typed(
                    f"loss.{loss_key}", loss_value, loss_fields[loss_key]
                )
            continue
        if key not in top:
            raise TrainerConfigError(
                f"{where}: unknown key {key!r} (known: {', '.join(sorted([*top, 'loss']))})"
            )
        values[key] = _typed(key, value, top[key])
    try:
        loss = LossConfig(**loss_values)
    except ValueError as error:
        raise TrainerConfigError(f"{where}: {error}") from None
    try:
        return TrainerConfig(**values, loss=loss)
    except TrainerConfigError as error:
        raise TrainerConfigError(f"{where}: {error}") from None


def load_trainer_config(path: Path) -> TrainerConfig:
    """Read ``path`` (TOML)."""
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as error:
        raise TrainerConfigError(f"{path}: cannot read: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        raise TrainerConfigError(f"{path}: not UTF-8 text (TOML is UTF-8): {error}") from None
    except RecursionError:  # tomllib recurses once per level of nesting
        raise TrainerConfigError(f"{path}: not TOML: nested too deeply") from None
    except ValueError as error:  # TOMLDecodeError, or int()'s 4300-digit limit
        raise TrainerConfigError(f"{path}: not TOML: {error}") from None
    return trainer_config_from_mapping(data, str(path))
