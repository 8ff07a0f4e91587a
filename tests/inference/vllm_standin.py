"""A CPU stand-in for the parts of vLLM 0.33.0 that ``VllmBackend`` uses.

vLLM cannot be installed here (no GPU), so the backend is driven by this engine instead: it runs
the real tiny model with transformers and calls the backend's logits processor the way Model
Runner V2 does (read from the 0.33.0 source, not copied): a request takes a persistent-batch slot
(``add_request``; slots are recycled through a free list), each step ``apply_staged_writes`` then
``apply(logits, ctx)`` once for the batch, with rows in an order that changes every step
(``ctx.expanded_idx_mapping``: row -> slot), float32 unscaled logits, and ``ctx.pos`` the input
position of each row. It also does what makes the bookkeeping hard: the first chunk of a long
prompt is prefilled in a step of its own (a row vLLM computes and discards), and one request is
preempted and re-prefilled with its output so far (``prefill_len`` > ``prompt_len``). After the
processors, its sampler adds noise of its own (as vLLM's does), so only forced rows are
deterministic. The final norm is ``model.model.norm``, hooked through ``apply_model``.
"""

from __future__ import annotations

import abc
import json
import os
import sys
import types
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, ClassVar

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

MAX_NUM_REQS = 3
"""Slots in the stand-in's persistent batch: fewer than the tests' prompts, so slots recycle."""

CHUNK = 4
"""A prompt longer than this is prefilled in two steps; the first step's row is discarded."""

PADDING = 3
"""Rows the stand-in's prefill-only forwards carry after the request's tokens."""

PREEMPT_AT_STEP = 5
"""The engine step at which the stand-in preempts one running request."""


class LogitsProcessor(abc.ABC):
    """Shape of ``vllm.v1.worker.gpu.sample.logits_processor.LogitsProcessor`` (0.33.0)."""

    def __init__(self, vllm_config: Any, req_states: Any) -> None:  # noqa: B027
        pass

    @classmethod  # noqa: B027
    def validate_params(cls, sampling_params: Any) -> None:
        pass

    def add_request(self, req_idx: int, sampling_params: Any) -> bool:
        return True

    def apply_staged_writes(self) -> None:  # noqa: B027
        pass

    @abc.abstractmethod
    def apply(self, logits: torch.Tensor, ctx: Any) -> torch.Tensor:
        raise NotImplementedError


_SAMPLING_DEFAULTS: dict[str, Any] = {
    "n": 1,
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "min_tokens": 0,
    "stop_token_ids": None,
    "ignore_eos": False,
    "max_tokens": 16,
    "detokenize": True,
    "skip_special_tokens": True,
    "logit_bias": None,
    "allowed_token_ids": None,
    "bad_words": None,
    "structured_outputs": None,
    "thinking_token_budget": None,
    "extra_args": None,
}


class SamplingParams:
    """``vllm.SamplingParams``: the fields the backend sets or the processor checks."""

    # The fields the tests read; __init__ sets every field of _SAMPLING_DEFAULTS.
    temperature: float
    stop_token_ids: list[int] | None
    ignore_eos: bool
    max_tokens: int
    extra_args: dict[str, Any] | None

    def __init__(self, **kwargs: Any) -> None:
        unknown = set(kwargs) - set(_SAMPLING_DEFAULTS)
        if unknown:
            raise TypeError(f"unexpected SamplingParams fields {sorted(unknown)}")
        self.kwargs = kwargs
        for name, default in _SAMPLING_DEFAULTS.items():
            setattr(self, name, kwargs.get(name, default))


class _HostAndDevice:
    """``UvaBackedTensor``'s interface: ``np`` the host truth, ``gpu`` the device view."""

    def __init__(self, size: int) -> None:
        self.np = np.zeros(size, dtype=np.int32)
        self.gpu = torch.zeros(size, dtype=torch.int32)

    def copy_to_uva(self) -> None:
        self.gpu = torch.from_numpy(self.np.copy())


class LogitsModule(torch.nn.Module):
    """vLLM's ``LogitsProcessor`` module: called as ``(lm_head, hidden_states)``."""

    def forward(self, lm_head: Any, hidden_states: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = lm_head(hidden_states)
        return logits


class StandinModel(torch.nn.Module):
    """What ``apply_model`` hands over: ``model.norm`` inside ``.model``, ``compute_logits``
    through a ``logits_processor`` module, as vLLM's Llama/Qwen2 classes have them."""

    def __init__(self, causal_lm: Any) -> None:
        super().__init__()
        self.causal_lm = causal_lm
        self.model = causal_lm.model
        self.logits_processor = LogitsModule()
        self.vocab_size = int(causal_lm.config.vocab_size)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.logits_processor(self.causal_lm.lm_head, hidden)
        # vLLM pads its LM head's rows; the backend keeps the checkpoint's vocabulary.
        padding = torch.full((logits.shape[0], 64 - self.vocab_size % 64), -1e4)
        return torch.cat([logits, padding], dim=-1)

    def prefill_logits(self, tokens: Sequence[int], padding: int) -> torch.Tensor:
        padded = torch.tensor([[*tokens, *([0] * padding)]])
        with torch.inference_mode():
            hidden = self.model(input_ids=padded, use_cache=False).last_hidden_state
            logits = self.compute_logits(hidden[0, len(tokens) - 1 : len(tokens)])
        return logits[0, : self.vocab_size].float()

    def rows_logits(self, sequences: Sequence[Sequence[int]]) -> torch.Tensor:
        """Logits after each sequence's last token: one right-padded forward (causal, so the
        padding changes no real row), recomputing every sequence in full."""
        width = max(len(s) for s in sequences)
        ids = torch.zeros((len(sequences), width), dtype=torch.long)
        for row, sequence in enumerate(sequences):
            ids[row, : len(sequence)] = torch.tensor(list(sequence))
        last = torch.tensor([len(s) - 1 for s in sequences])
        with torch.inference_mode():
            hidden = self.model(input_ids=ids, use_cache=False).last_hidden_state
            # As Model Runner V2: the logits of the rows to sample, one row per request.
            logits = self.compute_logits(hidden[torch.arange(len(sequences)), last])
        return logits[:, : self.vocab_size].float()


class _Request:
    def __init__(self, index: int, prompt: list[int], params: SamplingParams) -> None:
        self.index = index
        self.prompt = prompt
        self.params = params
        self.output: list[int] = []
        self.slot: int | None = None
        self.prefill_len = 0
        self.computed = 0  # tokens whose KV the stand-in pretends to hold
        self.done = False
        self.needs_processing = False

    @property
    def tokens(self) -> list[int]:
        return self.prompt + self.output


class LLM:
    """``vllm.LLM`` on CPU: in-process engine, tiny batch, recycled slots, preemption."""

    instances: ClassVar[list[LLM]] = []
    matmul_precision_override: str | None = None
    """A precision to set whatever the environment says (for the TF32 refusal test)."""

    def __init__(self, model: str, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.model_dir = Path(model)
        # As vLLM's GPU worker does, from VLLM_FLOAT32_MATMUL_PRECISION (default "highest").
        precision = type(self).matmul_precision_override or os.environ.get(
            "VLLM_FLOAT32_MATMUL_PRECISION", "highest"
        )
        torch.set_float32_matmul_precision(precision)
        causal_lm = AutoModelForCausalLM.from_pretrained(model, local_files_only=True)
        self.model = StandinModel(causal_lm.eval())  # type: ignore[no-untyped-call]
        config = json.loads((self.model_dir / "config.json").read_text())
        self.eos_token_id = config.get("eos_token_id")
        self.prompt_len = _HostAndDevice(MAX_NUM_REQS)
        self.prefill_len = _HostAndDevice(MAX_NUM_REQS)
        req_states = SimpleNamespace(
            device=torch.device("cpu"),
            max_num_reqs=MAX_NUM_REQS,
            vocab_size=self.model.vocab_size,
            prompt_len=self.prompt_len,
            prefill_len=self.prefill_len,
        )
        self.processor_classes = list(kwargs.get("logits_processors") or [])
        self.processors = [cls(None, req_states) for cls in self.processor_classes]
        self.sampler_noise = torch.Generator().manual_seed(1234)
        self.preempted = 0
        self.discarded_rows = 0
        self.steps = 0
        self.requests_seen: list[tuple[list[int], SamplingParams]] = []
        type(self).instances.append(self)

    def apply_model(self, func: Any) -> list[Any]:
        return [func(self.model)]

    # -- the engine -----------------------------------------------------------------------

    def generate(
        self, prompts: Sequence[dict[str, Any]], params: Any, use_tqdm: bool = True
    ) -> list[Any]:
        params_list = list(params) if isinstance(params, list) else [params] * len(prompts)
        requests = []
        for index, (prompt, param) in enumerate(zip(prompts, params_list, strict=True)):
            for cls in self.processor_classes:
                cls.validate_params(param)
            self.requests_seen.append((list(prompt["prompt_token_ids"]), param))
            requests.append(_Request(index, list(prompt["prompt_token_ids"]), param))
        waiting = list(requests)
        running: list[_Request] = []
        free_slots = list(range(MAX_NUM_REQS))
        step = 0
        while waiting or running:
            while waiting and free_slots:
                request = waiting.pop(0)
                self._admit(request, free_slots.pop())
                running.append(request)
            if step == PREEMPT_AT_STEP and len(running) > 1 and not self.preempted:
                victim = next((r for r in running if r.output), None)
                if victim is not None:
                    assert victim.slot is not None
                    running.remove(victim)
                    free_slots.append(victim.slot)
                    victim.slot, victim.computed = None, 0
                    waiting.insert(0, victim)
                    self.preempted += 1
            # Rows in an order that changes every step (vLLM reorders its batch).
            shift = step % max(len(running), 1)
            order = running[shift:] + running[:shift]
            if step % 2:
                order.reverse()
            self._step(order)
            for request in list(running):
                if request.done:
                    running.remove(request)
                    assert request.slot is not None
                    free_slots.append(request.slot)
            step += 1
        self.steps += step
        return [
            SimpleNamespace(outputs=[SimpleNamespace(token_ids=list(r.output))]) for r in requests
        ]

    def _admit(self, request: _Request, slot: int) -> None:
        request.slot = slot
        request.prefill_len = len(request.tokens)
        self.prompt_len.np[slot] = len(request.prompt)
        self.prefill_len.np[slot] = request.prefill_len
        self.prompt_len.copy_to_uva()
        self.prefill_len.copy_to_uva()
        # Every processor hears of the request, whatever the others answer.
        answers = [p.add_request(slot, request.params) for p in self.processors]
        request.needs_processing = any(answers)

    def _step(self, rows: list[_Request]) -> None:
        for processor in self.processors:
            processor.apply_staged_writes()
        positions = []
        for request in rows:
            chunked = request.computed == 0 and request.prefill_len > CHUNK
            if chunked and request.params.max_tokens > 1:
                # First chunk of a long prefill: its last row is computed, and discarded.
                positions.append(CHUNK - 1)
            else:
                positions.append(len(request.tokens) - 1)
        if any(r.params.max_tokens == 1 for r in rows):
            # Prefill-only requests: one forward each through the decoder (the hooked norm),
            # with padding rows after the request's tokens as vLLM may add.
            batch = torch.stack(
                [self.model.prefill_logits(r.tokens, padding=PADDING) for r in rows]
            )
        else:
            batch = self.model.rows_logits(
                [r.tokens[: p + 1] for r, p in zip(rows, positions, strict=True)]
            )
        slots = np.array([r.slot for r in rows], dtype=np.int64)
        if any(r.needs_processing for r in rows):
            ctx = SimpleNamespace(
                expanded_idx_mapping=torch.from_numpy(slots),
                idx_mapping=torch.from_numpy(slots),
                idx_mapping_np=slots,
                expanded_local_pos=torch.zeros(len(rows), dtype=torch.int64),
                input_ids=torch.tensor([r.tokens[p] for r, p in zip(rows, positions, strict=True)]),
                pos=torch.tensor(positions, dtype=torch.int64),
                seq_lens_upper_bound_np=np.array(positions) + 1,
            )
            for processor in self.processors:
                batch = processor.apply(batch, ctx)
        temperatures = torch.tensor([r.params.temperature for r in rows])
        greedy = temperatures == 0
        scaled = batch / torch.where(greedy, 1.0, temperatures)[:, None]
        uniform = torch.rand(scaled.shape, generator=self.sampler_noise).clamp(1e-12, 1 - 1e-12)
        noise = torch.where(greedy[:, None], 0.0, -torch.log(-torch.log(uniform)))
        sampled = torch.argmax(scaled + noise, dim=-1).tolist()
        for request, position, token in zip(rows, positions, sampled, strict=True):
            request.computed = position + 1
            if position + 1 < request.prefill_len:
                self.discarded_rows += 1
                continue
            request.output.append(int(token))
            params = request.params
            stops = set(params.stop_token_ids or ())
            if not params.ignore_eos and self.eos_token_id is not None:
                stops.add(int(self.eos_token_id))
            if int(token) in stops or len(request.output) >= params.max_tokens:
                request.done = True


def install(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """Put the stand-in where ``import vllm`` finds it, and make CUDA look present."""
    from rollnet.reference.inference import vllm_backend

    root = types.ModuleType("vllm")
    root.LLM = LLM  # type: ignore[attr-defined]
    root.SamplingParams = SamplingParams  # type: ignore[attr-defined]
    root.__version__ = "0.33.0+cpu-standin"  # type: ignore[attr-defined]
    names = ["vllm.v1", "vllm.v1.worker", "vllm.v1.worker.gpu", "vllm.v1.worker.gpu.sample"]
    monkeypatch.setitem(sys.modules, "vllm", root)
    for name in names:
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    interface = types.ModuleType("vllm.v1.worker.gpu.sample.logits_processor")
    interface.LogitsProcessor = LogitsProcessor  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, interface.__name__, interface)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(vllm_backend, "_PROCESSOR_CLASS", None)
    monkeypatch.setattr(LLM, "instances", [])
    for name in (*vllm_backend._ENGINE_ENVIRONMENT, "VLLM_BATCH_INVARIANT"):
        monkeypatch.delenv(name, raising=False)
    return root
