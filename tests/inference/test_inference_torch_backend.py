"""TorchBackend: batched Gumbel-max decoding with proofs, and validator prefill."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from rollnet.reference.inference import SamplingParams
from rollnet.reference.inference.harness import random_prompts
from rollnet.reference.inference.torch_backend import TorchBackend
from rollnet.sdk.proofs import sampling, toploc


@pytest.fixture(scope="module", autouse=True)
def single_thread() -> Iterator[None]:
    """One intra-op thread: the tiny model gains nothing from two, which thrash on a busy CPU."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def backend(tiny_model: Path) -> TorchBackend:
    b = TorchBackend()
    b.load(str(tiny_model))
    return b


PROMPTS = random_prompts(24, seed=5)
SEEDS = list(range(100, 124))


def test_generation_shapes_finish_reasons_and_proofs(backend: TorchBackend) -> None:
    params = SamplingParams(temperature=1.0, max_new_tokens=40, seeds=SEEDS)
    generations = backend.generate(PROMPTS, params)
    assert len(generations) == len(PROMPTS)
    reasons = set()
    for prompt, generation in zip(PROMPTS, generations, strict=True):
        n = len(generation.completion_ids)
        assert generation.prompt_ids == tuple(prompt)
        assert 1 <= n <= 40
        assert len(generation.logprobs) == n
        assert len(generation.proof) == toploc.proof_size(n)
        if generation.finish_reason == "eos":
            assert generation.completion_ids[-1] in backend.eos_token_ids
        else:
            assert n == 40
        assert not set(generation.completion_ids[:-1]) & backend.eos_token_ids
        reasons.add(generation.finish_reason)
    assert reasons == {"eos", "length"}  # both kinds occur with these seeds


def test_batch_composition_and_kv_cache_do_not_change_tokens(backend: TorchBackend) -> None:
    params = SamplingParams(temperature=0.8, max_new_tokens=24, seeds=SEEDS[:6])
    batched = backend.generate(PROMPTS[:6], params)
    for row in (0, 5):
        alone = backend.generate(
            [PROMPTS[row]], SamplingParams(temperature=0.8, max_new_tokens=24, seeds=[SEEDS[row]])
        )[0]
        assert alone.completion_ids == batched[row].completion_ids
    recompute = TorchBackend(use_kv_cache=False)
    recompute.attach(backend.model)
    assert [g.completion_ids for g in recompute.generate(PROMPTS[:6], params)] == [
        g.completion_ids for g in batched
    ]
    assert backend.generate(PROMPTS[:6], params) == batched  # deterministic, proofs included


def test_prefill_reproduces_committed_states_and_sampling(backend: TorchBackend) -> None:
    params = SamplingParams(temperature=0.7, max_new_tokens=40, seeds=SEEDS[:8])
    generations = backend.generate(PROMPTS[:8], params)
    prefills = backend.prefill_batch([(g.prompt_ids, g.completion_ids) for g in generations])
    for generation, prefill in zip(generations, prefills, strict=True):
        n = len(generation.completion_ids)
        assert prefill.hidden_states.shape == (n, 64)
        assert prefill.logits.shape == (n, backend.vocab_size)
        stats = toploc.verify_proof(generation.proof, prefill.hidden_states)
        assert all(s.exp_mismatches == 0 and s.mant_err_mean == 0 for s in stats)
        margins = sampling.sampling_margins(
            prefill.logits, generation.completion_ids, generation.seed or 0, 0.7
        )
        assert margins.min() > -1e-4
        scaled = prefill.logits.astype(np.float64) / 0.7
        log_z = np.log(np.exp(scaled - scaled.max(1, keepdims=True)).sum(1)) + scaled.max(1)
        validator_logprobs = scaled[np.arange(n), list(generation.completion_ids)] - log_z
        assert np.abs(validator_logprobs - np.array(generation.logprobs)).max() < 1e-4
    single = backend.prefill(generations[0].prompt_ids, generations[0].completion_ids)
    assert np.abs(single.hidden_states - prefills[0].hidden_states).max() < 1e-4


def test_plain_sampling_and_bf16(tiny_model: Path, backend: TorchBackend) -> None:
    plain = SamplingParams(max_new_tokens=10, seeds=[1], gumbel=False, proofs=False)
    generation = backend.generate(PROMPTS[:2], plain)
    assert all(g.proof == b"" for g in generation)
    bf16 = TorchBackend()
    bf16.load(str(tiny_model), dtype="bfloat16")
    assert bf16.model.dtype == torch.bfloat16
    out = bf16.generate(PROMPTS[:4], SamplingParams(max_new_tokens=33, seeds=SEEDS[:4]))
    assert all(len(g.proof) == toploc.proof_size(len(g.completion_ids)) for g in out)


def test_invalid_requests(backend: TorchBackend) -> None:
    with pytest.raises(ValueError, match="seed"):
        backend.generate(PROMPTS[:2], SamplingParams(seeds=[1]))
    with pytest.raises(ValueError, match="temperature"):
        SamplingParams(temperature=0.0)
    with pytest.raises(ValueError, match="prompt"):
        backend.generate([[]], SamplingParams(seeds=[1]))
    assert backend.generate([], SamplingParams(seeds=[])) == []
