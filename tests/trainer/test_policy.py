"""The trainer's log-probabilities are the workers': same model, same tokens, same numbers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rollnet.reference.trainer.policy import PolicyForward, TrainingSequence, behaviour_logprobs


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_recomputed_behaviour_logprobs_match_the_sampler(
    tiny_model: Path, temperature: float
) -> None:
    from transformers import AutoModelForCausalLM

    from rollnet.reference.inference.base import SamplingParams
    from rollnet.reference.inference.torch_backend import TorchBackend

    sampler = TorchBackend()
    sampler.load(str(tiny_model))
    prompts = [[40, 41, 42, 30], [50, 51, 30], [60, 61, 62, 63, 64, 30]]
    generations = sampler.generate(
        prompts,
        SamplingParams(temperature=temperature, max_new_tokens=10, seeds=[1, 2, 3], proofs=False),
    )
    sequences = [
        TrainingSequence(g.prompt_ids, g.completion_ids, g.logprobs, None, 0.0, temperature)
        for g in generations
    ]
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    policy = PolicyForward(model.eval())  # type: ignore[no-untyped-call]
    # Sequences of different lengths in one padded micro-batch, and one at a time.
    for size in (3, 1):
        recomputed = behaviour_logprobs(policy, sequences, 1, torch.device("cpu"), size)
        for generation, values in zip(generations, recomputed, strict=True):
            assert len(values) == len(generation.completion_ids)
            assert values == pytest.approx(list(generation.logprobs), abs=1e-4)
