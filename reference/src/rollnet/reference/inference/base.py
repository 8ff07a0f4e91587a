"""The inference backend interface a worker (generation) and a validator (prefill) use."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

FinishReason = Literal["eos", "length"]
DType = Literal["float32", "bfloat16"]


def eos_token_ids_of(config: Any, generation_config: Any = None) -> frozenset[int]:
    """The token ids that end a completion: ``config.eos_token_id`` united with
    ``generation_config.eos_token_id``.

    Each may be an int, a list of ints, or None/absent (``generation_config`` itself may be
    None). Chat checkpoints (Llama-3-Instruct, Qwen2.5-Instruct) list their end-of-turn token in
    ``generation_config.json`` only, so the model config alone misses it. Every backend derives
    its EOS set here: a worker and the validator that re-checks its rollouts must agree on it
    exactly, or honest rollouts are refused (EOS before the end, finish reason mismatch).
    """
    ids: set[int] = set()
    for source in (config, generation_config):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        if value is None:
            continue
        if isinstance(value, int) and not isinstance(value, bool):
            ids.add(value)
        elif isinstance(value, list | tuple) and all(
            isinstance(v, int) and not isinstance(v, bool) for v in value
        ):
            ids.update(value)
        else:
            raise TypeError(f"eos_token_id must be an int, a list of ints or None, not {value!r}")
    return frozenset(ids)


def checkpoint_eos_token_ids(model_dir: str | os.PathLike[str]) -> frozenset[int]:
    """:func:`eos_token_ids_of` for a local Hugging Face checkpoint directory.

    Reads ``config.json`` and, when present, ``generation_config.json`` through transformers
    (so class defaults apply exactly as when the model itself is loaded); never downloads.
    """
    from transformers import AutoConfig, GenerationConfig  # heavy: only when asked

    config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    generation_config = None
    if (Path(model_dir) / "generation_config.json").is_file():
        generation_config = GenerationConfig.from_pretrained(model_dir, local_files_only=True)
    return eos_token_ids_of(config, generation_config)


@dataclass(frozen=True)
class SamplingParams:
    """How to sample: temperature, length limit and the per-sequence Gumbel seeds.

    With ``gumbel=True`` (the verifiable mode) every sequence needs a seed and tokens are
    ``argmax(logits / T + g(seed, position, token))``. With ``gumbel=False`` tokens are drawn by
    ``torch.multinomial`` (not re-checkable; for benchmarks and baselines) and ``seeds`` only seed
    the generator. ``proofs=False`` skips TOPLOC commitments.
    """

    temperature: float = 1.0
    max_new_tokens: int = 64
    seeds: Sequence[int] | None = None
    gumbel: bool = True
    proofs: bool = True

    def __post_init__(self) -> None:
        if not self.temperature > 0:
            raise ValueError("temperature must be > 0")
        if self.max_new_tokens < 1:
            raise ValueError("max_new_tokens must be >= 1")


@dataclass(frozen=True)
class Generation:
    """One generated completion with its behaviour log-probs and TOPLOC proof."""

    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    """log p(token) under the worker's logits at the sampling temperature, one per token."""
    finish_reason: FinishReason
    proof: bytes
    """Concatenated 258-byte TOPLOC windows (empty when proofs are off)."""
    seed: int | None


@dataclass(frozen=True)
class Prefill:
    """A validator's re-computation of one rollout: rows are the positions that predicted each
    completion token (the last prompt position, then every completion token but the last)."""

    hidden_states: npt.NDArray[np.float32]
    """[T, d]: the final-norm output (input of the LM head), as float32."""
    logits: npt.NDArray[np.float32]
    """[T, V]: the LM head output, as float32."""


class InferenceBackend(Protocol):
    """Generation with verifiable sampling and proofs, and validator prefill, on one model."""

    def load(self, model_dir: str, device: str = "cpu", dtype: DType = "float32") -> None:
        """Load a Hugging Face model directory (local path only)."""

    def generate(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingParams
    ) -> list[Generation]:
        """Complete every prompt; proofs are built while decoding."""

    def prefill(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> Prefill:
        """Hidden states and logits of one rollout's completion positions, in one forward pass."""

    def prefill_batch(
        self, rollouts: Sequence[tuple[Sequence[int], Sequence[int]]]
    ) -> list[Prefill]:
        """:meth:`prefill` for many rollouts (batched; numerically close, not identical)."""
