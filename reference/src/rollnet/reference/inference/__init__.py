"""Inference backends: the interface, and the torch reference backend (imported on demand)."""

from rollnet.reference.inference.base import (
    FinishReason,
    Generation,
    InferenceBackend,
    Prefill,
    SamplingParams,
)

__all__ = ["FinishReason", "Generation", "InferenceBackend", "Prefill", "SamplingParams"]
