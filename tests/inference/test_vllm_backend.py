"""``VllmBackend`` without vLLM: its arithmetic on CPU tensors, its slot bookkeeping, its proof
rows, and the whole backend driven by a CPU stand-in for vLLM 0.33.0 (``vllm_standin``), checked
by the reference validator. The real engine runs in ``test_backend_contract.py`` where vLLM and a
GPU exist.
"""

from __future__ import annotations

import gc
import json
import os
import pickle
import shutil
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
import vllm_standin

from rollnet.reference.inference import SamplingParams
from rollnet.reference.inference import vllm_backend as vb
from rollnet.reference.inference.harness import random_prompts
from rollnet.reference.inference.torch_backend import TorchBackend
from rollnet.sdk.proofs import sampling, toploc
from rollnet.sdk.proofs.sampling import gumbel_noise as numpy_gumbel_noise
from rollnet.sdk.proofs.thresholds import FLOAT32

PROMPTS = random_prompts(7, seed=5)
SEEDS = [9_000 + i for i in range(7)]


@pytest.fixture(scope="module")
def reference(tiny_model: Path) -> TorchBackend:
    backend = TorchBackend()
    backend.load(str(tiny_model))
    return backend


@pytest.fixture
def standin(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    precision = torch.get_float32_matmul_precision()
    yield vllm_standin.install(monkeypatch)
    torch.set_float32_matmul_precision(precision)


@pytest.fixture
def backend(standin: Any, tiny_model: Path) -> vb.VllmBackend:
    instance = vb.VllmBackend()
    instance.load(str(tiny_model), device="cuda")
    return instance


def engine(backend: vb.VllmBackend) -> vllm_standin.LLM:
    llm: vllm_standin.LLM = backend._llm
    return llm


# -- arithmetic -------------------------------------------------------------------------------


def test_gumbel_max_rows_is_the_protocols_rule() -> None:
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 97, generator=generator) * 3
    seeds = torch.tensor([1, 2**40 + 3, 7, 7, 2**63 - 1])
    positions = torch.tensor([0, 5, 5, 6, 1000])
    temperatures = torch.tensor([1.0, 0.7, 1.3, 1.3, 0.5])
    tokens, logprobs = vb.gumbel_max_rows(logits, seeds, positions, temperatures)
    noise = numpy_gumbel_noise(seeds.tolist(), positions.numpy(), 97)
    for row in range(5):
        scaled = logits[row].numpy() / np.float32(temperatures[row].item())
        expected = int(np.argmax(scaled.astype(np.float64) + noise[row]))
        assert int(tokens[row]) == expected
        log_z = np.log(np.exp(scaled.astype(np.float64) - scaled.max()).sum()) + scaled.max()
        assert float(logprobs[row]) == pytest.approx(scaled[expected] - log_z, abs=1e-5)
    # The same seed at the next position draws other noise.
    assert not torch.equal(
        vb.gumbel_max_rows(logits[2:3], seeds[2:3], positions[2:3] + 1, temperatures[2:3])[0],
        tokens[2:3],
    ) or not torch.equal(
        vb.gumbel_max_rows(logits[2:3], seeds[2:3], positions[2:3] + 2, temperatures[2:3])[0],
        tokens[2:3],
    )


def test_force_tokens_leaves_one_finite_logit_in_forced_rows_only() -> None:
    logits = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    forced = vb.force_tokens(logits, torch.tensor([2, 0, 1]), torch.tensor([True, False, True]))
    assert forced[0].tolist() == [float("-inf"), float("-inf"), 0.0, float("-inf")]
    assert torch.equal(forced[1], logits[1])
    assert forced[2].tolist() == [float("-inf"), 0.0, float("-inf"), float("-inf")]


@pytest.mark.parametrize(
    ("entry", "says"),
    [
        ("x", "must be a mapping"),
        ({"seed": 1, "temperature": 1.0}, "'ticket'"),
        ({"ticket": 1, "seed": "1", "temperature": 1.0}, "'seed'"),
        ({"ticket": 1, "seed": True, "temperature": 1.0}, "'seed'"),
        ({"ticket": -1, "seed": 1, "temperature": 1.0}, "ticket"),
        ({"ticket": 1, "seed": 2**63, "temperature": 1.0}, "sampling seed"),
        ({"ticket": 1, "seed": 1, "temperature": 0.0}, "temperature"),
        ({"ticket": 1, "seed": 1, "temperature": float("nan")}, "temperature"),
    ],
)
def test_malformed_extra_args_are_refused_by_name(entry: Any, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        vb.GumbelRequest.from_extra_args({vb.EXTRA_ARGS_KEY: entry})


def test_extra_args_round_trip_and_other_requests_are_not_ours() -> None:
    request = vb.GumbelRequest(ticket=4, seed=2**62, temperature=0.8)
    assert vb.GumbelRequest.from_extra_args(request.as_extra_args()) == request
    assert vb.GumbelRequest.from_extra_args(None) is None
    assert vb.GumbelRequest.from_extra_args({"other": 1}) is None


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("repetition_penalty", 1.1),
        ("presence_penalty", 0.5),
        ("logit_bias", {3: 1.0}),
        ("bad_words", ["x"]),
        ("allowed_token_ids", [1, 2]),
        ("top_k", 5),
        ("temperature", 0.7),
        ("n", 2),
    ],
)
def test_options_that_change_the_logits_are_refused(option: str, value: Any) -> None:
    params = vllm_standin.SamplingParams(
        extra_args=vb.GumbelRequest(1, 1, 1.0).as_extra_args(), **{option: value}
    )
    with pytest.raises(ValueError, match=option):
        vb.GumbelMaxLogic.validate_params(params)
    # The same options on a request that is not rollnet's are not this processor's business.
    vb.GumbelMaxLogic.validate_params(vllm_standin.SamplingParams(**{option: value}))


# -- slot bookkeeping -------------------------------------------------------------------------


class _Batch:
    """A persistent batch as Model Runner V2 keeps it, for driving the processor by hand."""

    def __init__(self, slots: int, vocab: int) -> None:
        self.vocab = vocab
        self.prompt_len = vllm_standin._HostAndDevice(slots)
        self.prefill_len = vllm_standin._HostAndDevice(slots)
        self.req_states = SimpleNamespace(
            device=torch.device("cpu"),
            max_num_reqs=slots,
            vocab_size=vocab,
            prompt_len=self.prompt_len,
            prefill_len=self.prefill_len,
        )
        self.processor = vb.GumbelMaxLogic(None, self.req_states)
        self.logits = torch.Generator().manual_seed(1)

    def add(self, slot: int, prompt: int, prefill: int, request: vb.GumbelRequest | None) -> bool:
        self.prompt_len.np[slot], self.prefill_len.np[slot] = prompt, prefill
        self.prompt_len.copy_to_uva()
        self.prefill_len.copy_to_uva()
        extra = request.as_extra_args() if request is not None else None
        return self.processor.add_request(slot, vllm_standin.SamplingParams(extra_args=extra))

    def step(self, rows: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """``rows``: (slot, input position) in batch order; returns (logits in, logits out)."""
        self.processor.apply_staged_writes()
        slots = np.array([slot for slot, _ in rows], dtype=np.int64)
        ctx = SimpleNamespace(
            expanded_idx_mapping=torch.from_numpy(slots),
            idx_mapping=torch.from_numpy(slots),
            idx_mapping_np=slots,
            pos=torch.tensor([pos for _, pos in rows], dtype=torch.int64),
        )
        logits = torch.randn(len(rows), self.vocab, generator=self.logits)
        return logits, self.processor.apply(logits.clone(), ctx)


def _expected(logits: torch.Tensor, request: vb.GumbelRequest, position: int) -> int:
    tokens, _ = vb.gumbel_max_rows(
        logits[None],
        torch.tensor([request.seed]),
        torch.tensor([position]),
        torch.tensor([request.temperature]),
    )
    return int(tokens[0])


def test_rows_follow_their_slots_through_reorders_reuse_and_discarded_rows() -> None:
    batch = _Batch(slots=3, vocab=50)
    a, b, c = (vb.GumbelRequest(t, 100 + t, 0.5 + t / 4) for t in (10, 11, 12))
    assert batch.add(0, prompt=3, prefill=3, request=a)
    assert batch.add(1, prompt=6, prefill=6, request=b)
    assert not batch.add(2, prompt=2, prefill=2, request=None)  # not a rollnet request

    # Step 1: a prefills (last row at position 2: samples its token 0); b's first chunk ends at
    # position 3 short of its prefill (computed, dropped); the foreign request is left alone.
    logits, out = batch.step([(1, 3), (2, 1), (0, 2)])
    assert torch.equal(out[1], logits[1])
    assert int(out[2].argmax()) == _expected(logits[2], a, 0)
    assert torch.isinf(out[0]).sum() == 49  # b's dropped row is forced too: vLLM samples it
    # Step 2, reordered: b's prefill ends (position 5: its token 0), a decodes its token 1.
    logits2, out2 = batch.step([(0, 3), (1, 5)])
    # Slot 0 is recycled for c, with a's record already taken; b decodes on.
    records = batch.processor.drain()
    assert set(records) == {10, 11}
    assert set(records[10]) == {0, 1}
    assert set(records[11]) == {0}
    assert records[10][1].token == _expected(logits2[0], a, 1) == int(out2[0].argmax())
    assert records[11][0].token == _expected(logits2[1], b, 0)
    assert batch.add(0, prompt=4, prefill=4, request=c)
    logits3, out3 = batch.step([(1, 6), (0, 3)])
    records = batch.processor.drain()
    assert set(records) == {11, 12}
    assert records[12][0].token == _expected(logits3[1], c, 0) == int(out3[1].argmax())
    assert records[11][1].token == _expected(logits3[0], b, 1)
    assert batch.processor.drain() == {}


def test_a_preempted_request_is_recomputed_at_the_same_positions() -> None:
    batch = _Batch(slots=2, vocab=40)
    request = vb.GumbelRequest(ticket=3, seed=77, temperature=1.0)
    batch.add(1, prompt=2, prefill=2, request=request)
    batch.step([(1, 1)])
    batch.step([(1, 2)])
    first = batch.processor.drain()[3]
    # Preempted after two tokens, re-admitted in another slot with prompt + output to prefill.
    batch.add(0, prompt=2, prefill=4, request=request)
    logits, out = batch.step([(0, 2)])  # a chunk that ends inside the old output: dropped
    logits, out = batch.step([(0, 3)])  # the refill's last row: token 2
    again = batch.processor.drain()[3]
    assert set(first) == {0, 1}
    assert set(again) == {2}
    assert again[2].token == _expected(logits[0], request, 2) == int(out[0].argmax())


def test_the_registry_does_not_keep_a_dropped_engines_processor_alive() -> None:
    count = vb.PROCESSORS.count()
    batch = _Batch(slots=2, vocab=10)
    assert vb.PROCESSORS.since(count) == [batch.processor]
    del batch
    gc.collect()
    assert vb.PROCESSORS.since(count) == []


def test_decode_rows_are_recorded_with_their_tokens_and_must_match_the_logits() -> None:
    batch = _Batch(slots=2, vocab=30)
    source = vb.SampledHiddenCapture()
    batch.processor.hidden_source = source
    request = vb.GumbelRequest(ticket=1, seed=5, temperature=1.0)
    batch.add(1, prompt=3, prefill=3, request=request)
    batch.add(0, prompt=2, prefill=2, request=None)
    hidden = torch.randn(2, 8)
    source(None, (None, hidden), {})  # the pre-hook, as compute_logits is called
    batch.step([(0, 1), (1, 2)])
    (recorded,) = batch.processor.drain()[1].values()
    assert recorded.hidden_bits is not None
    assert np.array_equal(recorded.hidden_bits, toploc.bf16_bits(hidden[1].numpy()))
    # Rows that are not this step's logits' rows, or none at all, stop the engine loudly.
    source(None, (), {"hidden_states": torch.randn(3, 8)})
    with pytest.raises(RuntimeError, match="3 rows, 2 logits"):
        batch.step([(0, 2), (1, 3)])
    with pytest.raises(RuntimeError, match="None rows"):
        batch.step([(0, 2), (1, 3)])


def test_behaviour_logprobs_check_what_vllm_returned() -> None:
    records = {0: vb.SampledToken(5, -0.5), 1: vb.SampledToken(6, -1.5)}
    assert vb.behaviour_logprobs(records, [5, 6]) == (-0.5, -1.5)
    with pytest.raises(RuntimeError, match="forced 6"):
        vb.behaviour_logprobs(records, [5, 7])
    with pytest.raises(RuntimeError, match="token 2 without"):
        vb.behaviour_logprobs(records, [5, 6, 8])


# -- proof rows -------------------------------------------------------------------------------


def test_completion_rows_are_taken_from_the_one_forward_ignoring_padding() -> None:
    rows = torch.arange(10 * 2, dtype=torch.float32).reshape(10, 2)  # 8 tokens + 2 padding
    taken = vb.completion_rows([rows], prompt_length=3, completion_length=6)
    assert torch.equal(taken, rows[2:8])
    with pytest.raises(RuntimeError, match="2 forwards"):
        vb.completion_rows([rows[:4], rows[4:]], prompt_length=3, completion_length=6)
    with pytest.raises(RuntimeError, match="computed 5 rows"):
        vb.completion_rows([rows[:5]], prompt_length=3, completion_length=6)
    with pytest.raises(ValueError, match="at least one"):
        vb.completion_rows([rows], prompt_length=0, completion_length=6)


def test_the_capture_keeps_armed_forwards_only_and_flattens_them() -> None:
    capture = vb.FinalNormCapture()
    norm = torch.nn.LayerNorm(4)
    norm.register_forward_hook(capture)
    norm(torch.ones(1, 3, 4))
    capture.arm()
    hidden = torch.randn(1, 5, 4)
    expected = norm(hidden)
    (kept,) = capture.disarm()
    assert kept.shape == (5, 4)
    assert torch.equal(kept, expected[0])
    norm(hidden)
    assert capture.disarm() == []
    # A vLLM norm called with a residual returns (hidden, residual).
    capture.arm()
    capture(norm, (), (torch.ones(2, 4), torch.zeros(2, 4)))
    assert torch.equal(capture.disarm()[0], torch.ones(2, 4))


def test_proof_of_is_the_protocols_proof(reference: TorchBackend) -> None:
    prefill = reference.prefill(PROMPTS[0], list(range(3, 40)))
    proof = vb.proof_of(torch.from_numpy(prefill.hidden_states))
    assert proof == toploc.build_proof(prefill.hidden_states)
    assert len(proof) == toploc.proof_size(37)


# -- the backend on the stand-in engine -------------------------------------------------------


def test_load_configures_the_engine_for_fixed_rows(backend: vb.VllmBackend) -> None:
    llm = engine(backend)
    kwargs = llm.kwargs
    assert kwargs["enable_prefix_caching"] is False
    assert kwargs["enable_chunked_prefill"] is False
    assert kwargs["max_num_batched_tokens"] >= kwargs["max_model_len"] == 512
    assert kwargs["long_prefill_token_threshold"] == 0
    assert kwargs["enforce_eager"] is True
    assert kwargs["async_scheduling"] is False
    assert kwargs["generation_config"] == "vllm"
    assert kwargs["dtype"] == "float32"
    assert [cls.__name__ for cls in kwargs["logits_processors"]] == ["RollnetGumbelMaxProcessor"]
    assert os.environ["VLLM_USE_V2_MODEL_RUNNER"] == "1"
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert os.environ["VLLM_FLOAT32_MATMUL_PRECISION"] == "highest"
    assert "VLLM_BATCH_INVARIANT" not in os.environ


def test_load_refuses_what_it_cannot_run(standin: Any, tiny_model: Path) -> None:
    with pytest.raises(ValueError, match="one CUDA device"):
        vb.VllmBackend().load(str(tiny_model), device="cpu")
    with pytest.raises(RuntimeError, match="no model loaded"):
        vb.VllmBackend().generate(PROMPTS[:1], SamplingParams(seeds=[1]))


def test_load_needs_a_max_model_len(standin: Any, tiny_model: Path, tmp_path: Path) -> None:
    copy = tmp_path / "no-max-len"
    shutil.copytree(tiny_model, copy)
    config = json.loads((copy / "config.json").read_text())
    del config["max_position_embeddings"]
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"max_position_embeddings .*max_model_len=\.\.\."):
        vb.VllmBackend().load(str(copy), device="cuda")
    backend = vb.VllmBackend(max_model_len=64)
    backend.load(str(copy), device="cuda")
    assert engine(backend).kwargs["max_model_len"] == 64


def test_load_refuses_tf32(standin: Any, tiny_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(vllm_standin.LLM, "matmul_precision_override", "high")
    with pytest.raises(RuntimeError, match="TF32"):
        vb.VllmBackend().load(str(tiny_model), device="cuda")


def test_batch_invariance_is_asked_of_vllm(standin: Any, tiny_model: Path) -> None:
    vb.VllmBackend(batch_invariant=True).load(str(tiny_model), device="cuda")
    assert os.environ["VLLM_BATCH_INVARIANT"] == "1"


@pytest.mark.usefixtures("standin")
def test_the_processor_class_is_a_module_attribute_that_pickles() -> None:
    cls = vb.gumbel_processor_class()
    assert vb.RollnetGumbelMaxProcessor is cls
    assert issubclass(cls, vllm_standin.LogitsProcessor)
    assert pickle.loads(pickle.dumps(cls)) is cls
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = vb.Nope


def test_without_the_v2_interface_load_names_the_target(
    standin: Any, tiny_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(__import__("sys").modules, vb._PROCESSOR_INTERFACE, None)
    with pytest.raises(RuntimeError, match=vb.TARGET_VLLM.replace(".", r"\.")):
        vb.VllmBackend().load(str(tiny_model), device="cuda")


@pytest.mark.slow
def test_generations_pass_the_reference_validator(
    backend: vb.VllmBackend, reference: TorchBackend
) -> None:
    temperature = 0.9
    params = SamplingParams(temperature=temperature, max_new_tokens=24, seeds=SEEDS)
    generations = backend.generate(PROMPTS, params)
    llm = engine(backend)
    # The stand-in did what makes bookkeeping hard: slots recycled, a preemption, dropped rows.
    assert len(PROMPTS) > vllm_standin.MAX_NUM_REQS
    assert llm.preempted == 1
    assert llm.discarded_rows > 0
    # Proofs come from the rows the tokens were sampled from: no prefill requests were made.
    assert len(llm.requests_seen) == len(PROMPTS)
    # The tokens are the reference backend's for the same seeds (the same model, fp32).
    expected = reference.generate(PROMPTS, params)
    assert [g.completion_ids for g in generations] == [g.completion_ids for g in expected]
    prefills = reference.prefill_batch([(g.prompt_ids, g.completion_ids) for g in generations])
    eos = backend.eos_token_ids
    for generation, prefill, seed in zip(generations, prefills, SEEDS, strict=True):
        n = len(generation.completion_ids)
        assert generation.seed == seed
        assert len(generation.logprobs) == n
        assert not set(generation.completion_ids[:-1]) & eos
        ends_with_eos = generation.completion_ids[-1] in eos
        assert generation.finish_reason == ("eos" if ends_with_eos else "length")
        assert len(generation.proof) == toploc.proof_size(n)
        assert toploc.check_toploc(generation.proof, prefill.hidden_states, FLOAT32).passed
        result = sampling.check_sampling(
            prefill.logits,
            generation.completion_ids,
            seed=seed,
            temperature=temperature,
            thresholds=FLOAT32,
        )
        assert result.passed, result
        scaled = prefill.logits / temperature
        log_z = np.log(np.exp(scaled - scaled.max(-1, keepdims=True)).sum(-1)) + scaled.max(-1)
        expected_logprobs = scaled[np.arange(n), list(generation.completion_ids)] - log_z
        np.testing.assert_allclose(generation.logprobs, expected_logprobs, atol=1e-4)


def test_requests_carry_the_seed_and_stop_on_the_eos_set_only(backend: vb.VllmBackend) -> None:
    backend.generate(PROMPTS[:2], SamplingParams(max_new_tokens=4, seeds=[5, 6], proofs=False))
    sent = [params for _, params in engine(backend).requests_seen]
    assert len(sent) == 2  # proofs off: no prefill requests
    for seed, params in zip([5, 6], sent, strict=True):
        request = vb.GumbelRequest.from_extra_args(params.extra_args)
        assert request is not None
        assert (request.seed, request.temperature) == (seed, 1.0)
        assert params.temperature == 1.0
        assert params.stop_token_ids == sorted(backend.eos_token_ids)
        assert params.ignore_eos is True
    assert backend.generate([], SamplingParams(seeds=[])) == []


@pytest.mark.slow
def test_same_seeds_same_rollouts_other_seeds_others(backend: vb.VllmBackend) -> None:
    params = SamplingParams(temperature=0.8, max_new_tokens=8, seeds=SEEDS[:4])
    first = backend.generate(PROMPTS[:4], params)
    second = backend.generate(PROMPTS[:4], params)
    assert [g.completion_ids for g in first] == [g.completion_ids for g in second]
    assert [g.proof for g in first] == [g.proof for g in second]
    other = backend.generate(
        PROMPTS[:4], SamplingParams(temperature=0.8, max_new_tokens=8, seeds=SEEDS[3:7])
    )
    assert [g.completion_ids for g in other] != [g.completion_ids for g in first]


def test_generate_refuses_what_the_protocol_does_not_define(backend: vb.VllmBackend) -> None:
    with pytest.raises(ValueError, match="only samples with Gumbel-max"):
        backend.generate(PROMPTS[:1], SamplingParams(seeds=[1], gumbel=False))
    with pytest.raises(ValueError, match="one seed per prompt"):
        backend.generate(PROMPTS[:2], SamplingParams(seeds=[1]))
    with pytest.raises(ValueError, match="sampling seed"):
        backend.generate(PROMPTS[:1], SamplingParams(seeds=[-1]))
    with pytest.raises(ValueError, match="at least one token"):
        backend.generate([[]], SamplingParams(seeds=[1]))
    # vLLM would cut such a rollout at max_model_len (512 here), where the validator would not.
    with pytest.raises(ValueError, match=r"prompt 1 \(500 tokens\) \+ max_new_tokens \(13\)"):
        backend.generate([[1] * 10, [1] * 500], SamplingParams(max_new_tokens=13, seeds=[1, 2]))
    with pytest.raises(ValueError, match="prefill of 513 tokens exceeds max_model_len"):
        backend.prefill([1] * 500, [2] * 14)


@pytest.mark.slow
def test_prefill_derived_proofs_also_pass(
    standin: Any, tiny_model: Path, reference: TorchBackend
) -> None:
    with pytest.raises(ValueError, match="proof_rows"):
        vb.VllmBackend(proof_rows="both")  # type: ignore[arg-type]
    backend = vb.VllmBackend(proof_rows="prefill")
    backend.load(str(tiny_model), device="cuda")
    generations = backend.generate(PROMPTS[:3], SamplingParams(max_new_tokens=10, seeds=SEEDS[:3]))
    assert len(engine(backend).requests_seen) == 3 + 3  # a prefill per completion
    prefills = reference.prefill_batch([(g.prompt_ids, g.completion_ids) for g in generations])
    for generation, prefill in zip(generations, prefills, strict=True):
        assert toploc.check_toploc(generation.proof, prefill.hidden_states, FLOAT32).passed


def test_prefill_matches_the_reference_backend(
    backend: vb.VllmBackend, reference: TorchBackend
) -> None:
    rollouts = [(PROMPTS[1], [4, 5, 6, 7, 8]), (PROMPTS[2], [9])]
    for ours, theirs in zip(
        backend.prefill_batch(rollouts), reference.prefill_batch(rollouts), strict=True
    ):
        assert ours.hidden_states.shape == theirs.hidden_states.shape
        assert ours.logits.shape == theirs.logits.shape  # vLLM's vocabulary padding removed
        np.testing.assert_allclose(ours.hidden_states, theirs.hidden_states, atol=1e-5)
        np.testing.assert_allclose(ours.logits, theirs.logits, atol=1e-4)
