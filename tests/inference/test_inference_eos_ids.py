"""Both inference backends derive their EOS set from one helper: config + generation config.

Chat checkpoints (Llama-3-Instruct, Qwen2.5-Instruct) list their end-of-turn token only in
``generation_config.json``; a backend that read ``config.json`` alone would disagree with the
validator about where honest completions end. vLLM is not installed here: its backend is loaded
against the CPU stand-in for vLLM (``vllm_standin``), which stops where vLLM 0.33.0 would.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import vllm_standin

from rollnet.reference.inference import SamplingParams
from rollnet.reference.inference import torch_backend as torch_backend_module
from rollnet.reference.inference.base import eos_token_ids_of
from rollnet.reference.inference.torch_backend import TorchBackend
from rollnet.reference.inference.vllm_backend import VllmBackend
from rollnet.reference.model import init_tiny_model
from rollnet.sdk.proofs import checkpoint_eos_token_ids
from rollnet.sdk.testing import NETWORK_ID

EXTRA_EOS = 5  # a token the tiny model's config.json does not call EOS


def _json(path: Path) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(path.read_text())
    return loaded


@pytest.fixture(scope="module")
def chat_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny checkpoint whose generation_config.json adds a second EOS id, like chat models."""
    path = init_tiny_model(tmp_path_factory.mktemp("chat-tiny"), seed=0)
    generation = _json(path / "generation_config.json")
    base_eos = _json(path / "config.json")["eos_token_id"]
    assert base_eos != EXTRA_EOS
    generation["eos_token_id"] = [base_eos, EXTRA_EOS]
    (path / "generation_config.json").write_text(json.dumps(generation))
    return path


def base_eos(path: Path) -> int:
    value: int = _json(path / "config.json")["eos_token_id"]
    return value


@pytest.mark.parametrize(
    ("config_eos", "generation_eos", "expected"),
    [
        (2, None, {2}),
        (2, 7, {2, 7}),
        (2, [2, 7, 9], {2, 7, 9}),
        ([2, 3], [7], {2, 3, 7}),
        (None, [7], {7}),
        (None, None, set()),
    ],
)
def test_the_helper_unites_config_and_generation_config(
    config_eos: Any, generation_eos: Any, expected: set[int]
) -> None:
    config = SimpleNamespace(eos_token_id=config_eos)
    generation = SimpleNamespace(eos_token_id=generation_eos)
    assert eos_token_ids_of(config, generation) == frozenset(expected)


def test_the_helper_accepts_configs_without_the_attribute_and_refuses_odd_values() -> None:
    assert eos_token_ids_of(SimpleNamespace(), SimpleNamespace()) == frozenset()
    assert eos_token_ids_of(SimpleNamespace(eos_token_id=[2, 3]), None) == {2, 3}
    with pytest.raises(ValueError, match="eos_token_id"):
        eos_token_ids_of(SimpleNamespace(eos_token_id="2"))
    with pytest.raises(ValueError, match="eos_token_id"):
        eos_token_ids_of(SimpleNamespace(eos_token_id=[2, None]))


def test_checkpoint_eos_ids_include_the_generation_config(chat_dir: Path) -> None:
    assert checkpoint_eos_token_ids(chat_dir) == {base_eos(chat_dir), EXTRA_EOS}


def test_checkpoint_eos_ids_without_a_generation_config(tmp_path: Path) -> None:
    path = init_tiny_model(tmp_path / "tiny", seed=0)
    (path / "generation_config.json").unlink()
    assert checkpoint_eos_token_ids(path) == {base_eos(path)}


def test_the_torch_backend_uses_the_shared_helper(
    chat_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = TorchBackend()
    backend.load(str(chat_dir))
    assert backend.eos_token_ids == checkpoint_eos_token_ids(chat_dir)
    assert EXTRA_EOS in backend.eos_token_ids
    calls: list[tuple[Any, Any]] = []

    def spy(config: Any, generation_config: Any = None) -> frozenset[int]:
        calls.append((config, generation_config))
        return frozenset({11, 12})

    monkeypatch.setattr(torch_backend_module, "eos_token_ids_of", spy)
    backend.attach(backend.model)
    assert backend.eos_token_ids == {11, 12}
    assert calls == [(backend.model.config, backend.model.generation_config)]


@pytest.fixture
def vllm_standin_module(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    precision = torch.get_float32_matmul_precision()
    vllm_standin.install(monkeypatch)
    yield
    torch.set_float32_matmul_precision(precision)


@pytest.mark.usefixtures("vllm_standin_module")
def test_the_vllm_backend_has_the_torch_backends_eos_set_and_stops_on_it(chat_dir: Path) -> None:
    reference = TorchBackend()
    reference.load(str(chat_dir))
    backend = VllmBackend()
    backend.load(str(chat_dir))
    assert backend.eos_token_ids == reference.eos_token_ids == {base_eos(chat_dir), EXTRA_EOS}

    # Seeds whose rollouts (by the validator's backend) end on the extra EOS, on the base EOS,
    # and at the length limit: the vLLM backend must end each the same way.
    limit, prompt = 8, [1, 2]
    candidates = reference.generate(
        [prompt] * 96, SamplingParams(max_new_tokens=limit, seeds=range(96), proofs=False)
    )
    ends: dict[int | None, int | None] = {EXTRA_EOS: None, base_eos(chat_dir): None, None: None}
    for seed, generation in enumerate(candidates):
        last = generation.completion_ids[-1]
        key = last if last in reference.eos_token_ids else None
        if ends.get(key, 0) is None:
            ends[key] = seed
    seeds = [seed for seed in ends.values() if seed is not None]
    assert ends[EXTRA_EOS] is not None, "some rollout ends on the extra EOS"
    params = SamplingParams(max_new_tokens=limit, seeds=seeds, proofs=False)
    generations = backend.generate([prompt] * len(seeds), params)
    expected = [candidates[seed] for seed in seeds]
    assert [g.completion_ids for g in generations] == [g.completion_ids for g in expected]
    assert [g.finish_reason for g in generations] == [g.finish_reason for g in expected]
    assert generations[0].completion_ids[-1] == EXTRA_EOS
    assert generations[0].finish_reason == "eos"
    llm: vllm_standin.LLM = backend._llm
    for _, sent in llm.requests_seen:
        assert sent.stop_token_ids == sorted(reference.eos_token_ids)
        assert sent.ignore_eos is True  # the tokenizer's own EOS stops nothing extra


def test_a_checkpoints_eos_set_is_what_its_files_name_not_the_model_class_default(
    tmp_path: Path,
) -> None:
    """transformers gives a Llama config without ``eos_token_id`` the class default (2); the
    protocol's set is the files' alone, so the backend must not stop on 2 here."""
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
    )
    assert config.eos_token_id == 2, "the class default this test is about"
    directory = tmp_path / "llama"
    LlamaForCausalLM(config).save_pretrained(directory)
    written = _json(directory / "config.json")
    written.pop("eos_token_id", None)
    (directory / "config.json").write_text(json.dumps(written))
    (directory / "generation_config.json").write_text(json.dumps({"eos_token_id": [7]}))

    assert checkpoint_eos_token_ids(directory) == {7}
    backend = TorchBackend()
    backend.load(str(directory))
    assert backend.eos_token_ids == {7}


def test_an_eos_at_exactly_the_length_limit_is_eos_for_worker_and_validator(
    tmp_path: Path,
) -> None:
    """docs/protocol.md, "End of sequence": a completion of exactly ``max_new_tokens`` tokens that
    ends with EOS finishes with EOS. The worker's backend says so, the validator's checks accept
    it, and the same completion claimed as LENGTH is refused."""
    from rollnet.sdk.proofs import (
        FLOAT32,
        LeaseBinding,
        Reason,
        RolloutAssignment,
        RolloutClaim,
        commitment_digest,
        derive_sampling_seed,
        finish_reason,
        verify_rollouts,
    )

    path = init_tiny_model(tmp_path / "tiny", seed=0)
    # Half the vocabulary ends a completion, so EOS lands on the last allowed step often.
    generation = _json(path / "generation_config.json")
    generation["eos_token_id"] = list(range(0, 101, 2))
    (path / "generation_config.json").write_text(json.dumps(generation))
    backend = TorchBackend()
    backend.load(str(path))
    eos = backend.eos_token_ids
    lease = LeaseBinding(NETWORK_ID, "node-a", "task-1", "lease-1", 1)
    count, limit, prompt = 48, 3, [30, 31, 32]
    seeds = [derive_sampling_seed(lease.network_id, lease.task_id, index) for index in range(count)]
    generations = backend.generate(
        [prompt] * count, SamplingParams(temperature=1.0, max_new_tokens=limit, seeds=seeds)
    )
    at_limit = [
        i
        for i, g in enumerate(generations)
        if len(g.completion_ids) == limit and g.completion_ids[-1] in eos
    ]
    assert at_limit, "some completion ends with EOS on its last allowed token"
    assert any(g.finish_reason == "length" for g in generations), "and some run out of room"
    for g in generations:
        assert g.finish_reason == finish_reason(g.completion_ids, eos, limit)
    for i in at_limit:
        assert generations[i].finish_reason == "eos"

    def claims(flip: bool) -> list[RolloutClaim]:
        made = []
        for index, g in enumerate(generations):
            claimed = "length" if flip and index in at_limit else g.finish_reason
            digest = commitment_digest(
                lease,
                blob_blake3=bytes(32),
                rollout_index=index,
                sampling_seed=seeds[index],
                prompt_ids=prompt,
                completion_ids=g.completion_ids,
                proof=g.proof,
            )
            claim = RolloutClaim(
                prompt, g.completion_ids, claimed, g.proof, seeds[index], index, digest
            )
            made.append(claim)
        return made

    assignments = [
        RolloutAssignment(lease, bytes(32), prompt, 1.0, limit, frozenset(eos)) for _ in generations
    ]
    prefills = backend.prefill_batch([(prompt, g.completion_ids) for g in generations])
    hidden = [p.hidden_states for p in prefills]
    logits = [p.logits for p in prefills]
    honest = verify_rollouts(
        claims(False), assignments, hidden_states=hidden, logits=logits, thresholds=FLOAT32
    )
    assert all(report.verdict == "accept" for report in honest), [r.summary() for r in honest]
    flipped = verify_rollouts(
        claims(True), assignments, hidden_states=hidden, logits=logits, thresholds=FLOAT32
    )
    for index, report in enumerate(flipped):
        if index in at_limit:
            assert report.first_failure is not None
            assert report.first_failure.reason is Reason.FINISH_REASON_MISMATCH
        else:
            assert report.verdict == "accept"
