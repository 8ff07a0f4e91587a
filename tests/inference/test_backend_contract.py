"""The contract every inference backend keeps, run on each backend.

A worker's rollouts must pass a validator that re-prefills with the *reference* (torch) backend,
whatever backend generated them: tokens drawn by seeded Gumbel-max, behaviour log-probs, EOS or
length termination, TOPLOC proofs of the right size that verify, deterministic for given seeds.
vLLM's run needs vllm and a CUDA GPU and is skipped with the reason elsewhere.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rollnet.reference.inference import InferenceBackend, SamplingParams
from rollnet.reference.inference.harness import random_prompts
from rollnet.reference.inference.torch_backend import TorchBackend
from rollnet.reference.inference.vllm_backend import vllm_available
from rollnet.reference.model import init_tiny_model
from rollnet.reference.worker import make_backend
from rollnet.sdk.proofs import sampling, toploc
from rollnet.sdk.proofs.thresholds import FLOAT32

PROMPTS = random_prompts(12, seed=11)
SEEDS = list(range(7_000, 7_012))
MAX_NEW = 40


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return init_tiny_model(tmp_path_factory.mktemp("contract-tiny"), seed=3)


@pytest.fixture(scope="module")
def validator(tiny_dir: Path) -> TorchBackend:
    reference = TorchBackend()
    reference.load(str(tiny_dir))
    return reference


@pytest.fixture(
    scope="module",
    params=[pytest.param("torch", id="torch"), pytest.param("vllm", id="vllm")],
)
def backend(request: pytest.FixtureRequest, tiny_dir: Path) -> InferenceBackend:
    name: str = request.param
    if name == "vllm":
        reason = vllm_available()
        if reason is not None:
            pytest.skip(f"vLLM backend contract not run: {reason}")
    instance = make_backend(name)
    instance.load(str(tiny_dir), device="cuda" if name == "vllm" else "cpu")
    return instance


def eos_ids(backend: InferenceBackend) -> frozenset[int]:
    ids: frozenset[int] = getattr(backend, "eos_token_ids")  # noqa: B009 - not in the Protocol
    return ids


@pytest.mark.slow
def test_generations_are_well_formed(backend: InferenceBackend) -> None:
    generations = backend.generate(
        PROMPTS, SamplingParams(temperature=1.0, max_new_tokens=MAX_NEW, seeds=SEEDS)
    )
    assert len(generations) == len(PROMPTS)
    eos = eos_ids(backend)
    for prompt, seed, generation in zip(PROMPTS, SEEDS, generations, strict=True):
        n = len(generation.completion_ids)
        assert generation.prompt_ids == tuple(prompt)
        assert generation.seed == seed
        assert 1 <= n <= MAX_NEW
        assert len(generation.logprobs) == n
        assert all(lp <= 0.0 for lp in generation.logprobs)
        assert len(generation.proof) == toploc.proof_size(n)
        assert not set(generation.completion_ids[:-1]) & eos
        if generation.finish_reason == "eos":
            assert generation.completion_ids[-1] in eos
        else:
            assert n == MAX_NEW


@pytest.mark.slow
def test_same_seeds_same_rollouts(backend: InferenceBackend) -> None:
    params = SamplingParams(temperature=0.8, max_new_tokens=16, seeds=SEEDS[:4])
    first = backend.generate(PROMPTS[:4], params)
    second = backend.generate(PROMPTS[:4], params)
    assert [g.completion_ids for g in first] == [g.completion_ids for g in second]
    assert [g.proof for g in first] == [g.proof for g in second]
    other = backend.generate(
        PROMPTS[:4], SamplingParams(temperature=0.8, max_new_tokens=16, seeds=SEEDS[4:8])
    )
    assert [g.completion_ids for g in other] != [g.completion_ids for g in first]


@pytest.mark.slow
def test_reference_validator_accepts_proofs_and_sampling(
    backend: InferenceBackend, validator: TorchBackend
) -> None:
    temperature = 0.9
    generations = backend.generate(
        PROMPTS, SamplingParams(temperature=temperature, max_new_tokens=MAX_NEW, seeds=SEEDS)
    )
    prefills = validator.prefill_batch([(g.prompt_ids, g.completion_ids) for g in generations])
    for generation, prefill in zip(generations, prefills, strict=True):
        n = len(generation.completion_ids)
        assert prefill.hidden_states.shape[0] == n
        assert prefill.logits.shape[0] == n
        toploc_result = toploc.check_toploc(generation.proof, prefill.hidden_states, FLOAT32)
        assert toploc_result.passed, toploc_result
        sampling_result = sampling.check_sampling(
            prefill.logits,
            generation.completion_ids,
            seed=generation.seed or 0,
            temperature=temperature,
            thresholds=FLOAT32,
        )
        assert sampling_result.passed, sampling_result
        # Behaviour log-probs are the generator's own log-softmax at the sampling temperature.
        expected = np.log(
            np.exp(prefill.logits / temperature).T / np.exp(prefill.logits / temperature).sum(-1)
        ).T[np.arange(n), list(generation.completion_ids)]
        np.testing.assert_allclose(generation.logprobs, expected, atol=1e-3)


def test_proofs_can_be_turned_off(backend: InferenceBackend) -> None:
    generations = backend.generate(
        PROMPTS[:2],
        SamplingParams(temperature=1.0, max_new_tokens=8, seeds=SEEDS[:2], proofs=False),
    )
    assert [g.proof for g in generations] == [b"", b""]
