"""The inference backend interface a worker (generation) and a validator (prefill) use."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import numpy as np
import numpy.typing as npt

from rollnet.sdk.proofs.termination import eos_token_ids

FinishReason = Literal["eos", "length"]
DType = Literal["float32", "bfloat16"]


def eos_token_ids_of(config: Any, generation_config: Any = None) -> frozenset[int]:
    """The protocol's EOS rule (:func:`rollnet.sdk.proofs.eos_token_ids`) applied to loaded
    config objects: ``config.eos_token_id`` united with ``generation_config.eos_token_id``.

    For models built in memory, which have no files. A checkpoint directory's set is
    :func:`rollnet.sdk.proofs.checkpoint_eos_token_ids`, read from the JSON files themselves, so
    that a library's defaults for the model class never add an id the files do not name. Each
    attribute may be an int, a list of ints, or None/absent (``generation_config`` itself may be
    None). A worker and the validator that re-checks its rollouts must agree on the set exactly,
    or honest rollouts are refused (EOS before the end, finish reason mismatch).
    """
    documents: list[dict[str, Any] | None] = []
    for source in (config, generation_config):
        value = getattr(source, "eos_token_id", None) if source is not None else None
        documents.append(
            None
            if source is None
            else {"eos_token_id": list(value) if isinstance(value, tuple) else value}
        )
    return eos_token_ids(documents[0] or {}, documents[1])


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
