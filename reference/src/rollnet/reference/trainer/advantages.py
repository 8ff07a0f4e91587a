"""GRPO group advantages from validated rewards, and which groups carry a learning signal."""

from __future__ import annotations

import math
from collections.abc import Sequence

__all__ = ["group_advantages", "has_signal"]


def has_signal(rewards: Sequence[float]) -> bool:
    """Whether a group's rewards differ at all: a group whose rewards are all equal has every
    advantage zero and teaches nothing (it is dropped and replaced: online filtering)."""
    if not rewards:
        return False
    return max(rewards) != min(rewards)


def group_advantages(
    rewards: Sequence[float], *, normalize_std: bool = False, epsilon: float = 1e-6
) -> list[float]:
    """Per completion: ``r − mean(group)``, or ``(r − mean)/(std + ε)`` with ``normalize_std``
    (the population standard deviation of the group's rewards)."""
    if not rewards:
        raise ValueError("a group has at least one reward")
    if not all(math.isfinite(r) for r in rewards):
        raise ValueError("rewards must be finite")
    if epsilon <= 0:
        raise ValueError("epsilon must be positive")
    mean = math.fsum(rewards) / len(rewards)
    centred = [r - mean for r in rewards]
    if not normalize_std:
        return centred
    std = math.sqrt(math.fsum(c * c for c in centred) / len(rewards))
    return [c / (std + epsilon) for c in centred]
