"""``VllmBackend``: the ``InferenceBackend`` contract on vLLM (GPU; ``rollnet-reference[vllm]``).

Targets **vLLM 0.33.0** (``vllm>=0.33,<0.34``) and its *Model Runner V2* (the default runner on
CUDA since 0.32; this backend sets ``VLLM_USE_V2_MODEL_RUNNER=1`` so that vLLM refuses to start
rather than silently falling back to the V1 runner, whose logits-processor interface is another
one). It was written against the source of the 0.33.0 wheel and has **not been run**: vLLM cannot
be installed where it was written (no GPU; the wheel pins ``torch==2.14.0``). What runs here is
the same code against a CPU stand-in for vLLM that drives it the way 0.33.0 does
(``tests/inference/test_vllm_backend.py``); ``tests/inference/test_backend_contract.py`` runs the
contract on the real thing wherever vLLM and a CUDA GPU are present, and skips it elsewhere.

How it meets the contract:

* **Sampling.** One batch-level logits processor, :class:`GumbelMaxLogic` (made a subclass of
  ``vllm.v1.worker.gpu.sample.logits_processor.LogitsProcessor`` by
  :func:`gumbel_processor_class`, passed as ``LLM(logits_processors=[...])``), handles every
  request whose ``SamplingParams.extra_args`` carry :data:`EXTRA_ARGS_KEY` (seed, temperature and
  a ticket naming the request). vLLM calls ``add_request(slot, params)`` when a request takes a
  persistent-batch slot (slots are recycled) and ``apply(logits, ctx)`` once per step with
  float32, *unscaled* logits, one row per request in an order that changes every step
  (``ctx.expanded_idx_mapping``: row -> slot). For each row it adds the seeded Gumbel noise of
  :func:`rollnet.sdk.proofs.sampling_torch.gumbel_noise` at position = tokens generated so far
  (``ctx.pos + 1 - prompt_len``) to ``logits / T``, takes the argmax, records the behaviour
  log-prob under ``log_softmax(logits / T)``, and sets every other logit to ``-inf``; vLLM's
  sampler (temperature 1, no top-k/top-p/min-p) then can only pick that token. Rows vLLM
  computes but discards — the last row of a prefill chunk that is not the final one — are
  recognised (``ctx.pos + 1 < prefill_len``) and not recorded. After a preemption the request is
  re-prefilled (``prefill_len`` = prompt + output so far) and the step is recomputed at the same
  position, so the same seeded noise applies. Penalties, logit bias, bad words, allowed tokens and
  structured outputs run *before* custom processors in 0.33.0 and would change the logits the
  noise is added to; ``validate_params`` refuses them on a rollnet request. Records stay on the
  GPU (no host sync per step) until :meth:`VllmBackend.generate` reads them once vLLM returns;
  the backend checks that every token vLLM reports is the one the processor chose.
* **Proofs.** Model Runner V2 computes each step's logits as
  ``model.compute_logits(hidden_states[logits_indices])`` and hands them, row for row, to the
  sampler. A forward pre-hook on the model's ``logits_processor`` module
  (:class:`SampledHiddenCapture`, registered through the documented ``LLM.apply_model``) keeps
  those final-norm rows, and the processor records, with each token it forces, the row it was
  sampled from (as bf16, on the GPU until ``generate`` returns: steps x batch x d x 2 bytes). The
  completion's rows in order are encoded with :func:`rollnet.sdk.proofs.toploc.build_proof`:
  decode-time proofs, as ``TorchBackend`` builds them, at no extra forward. The processor refuses
  a step whose captured rows do not match its logits row for row. ``proof_rows="prefill"``
  instead re-runs each completion as one prefill after decoding (below), one extra forward per
  completion.
* **Validator prefill.** A forward hook on the final norm (``model.model.norm``) captures its
  output while armed; each rollout (prompt + completion minus its last token, ``max_tokens=1``)
  is prefilled alone, so the captured rows are that request's, in order. Full-vocabulary logits
  are ``model.compute_logits`` (vLLM's own LM head path, vocabulary padding removed) applied to
  the completion rows; vLLM's prompt log-probs are top-k only, so they are not used.
* **Which rows a prefill computes** must not depend on the engine's state: prefix caching is off
  (a cached prompt prefix would not be recomputed, so its rows would be missing), chunked prefill
  is off with ``max_num_batched_tokens >= max_model_len`` and no long-prefill cap (a request's
  prefill is one forward),
  async scheduling is off, and ``enforce_eager=True`` (no torch.compile, whose no-guard wrapper
  would ignore a hook added after compiling, and no CUDA graphs).
* **Termination.** The EOS set is the checkpoint's ``config.json`` and
  ``generation_config.json`` EOS ids together (:func:`rollnet.sdk.proofs.checkpoint_eos_token_ids`,
  the protocol's rule, as ``TorchBackend`` uses). Every request stops on exactly that set:
  ``SamplingParams(stop_token_ids=sorted(set), ignore_eos=True)``; ``ignore_eos`` keeps vLLM from
  also stopping on the tokenizer's own EOS id, and ``generation_config="vllm"`` keeps the
  checkpoint's ``generation_config.json`` from adding sampling defaults.
* **Math modes.** vLLM's worker calls ``torch.set_float32_matmul_precision`` with
  ``VLLM_FLOAT32_MATMUL_PRECISION``; this backend sets it to ``highest`` (no TF32) and refuses to
  run if the process ends up with another precision. ``batch_invariant=True`` sets
  ``VLLM_BATCH_INVARIANT=1`` (vLLM: compute capability >= 9.0), which makes a request's logits
  independent of what else is in the batch.

The engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): the hook and the
processor's records are read directly. One GPU, tensor parallel size 1, no speculative decoding.
"""

from __future__ import annotations

import importlib
import itertools
import json
import os
import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import numpy as np
import numpy.typing as npt
import torch

from rollnet.reference.inference.base import (
    DType,
    FinishReason,
    Generation,
    Prefill,
    SamplingParams,
)
from rollnet.sdk.proofs import toploc
from rollnet.sdk.proofs.sampling import check_seed
from rollnet.sdk.proofs.sampling_torch import gumbel_noise
from rollnet.sdk.proofs.termination import checkpoint_eos_token_ids, finish_reason

TARGET_VLLM = "0.33.0"
"""The vLLM release this backend was written against (``rollnet-reference[vllm]`` pins 0.33.x)."""

EXTRA_ARGS_KEY = "rollnet_gumbel"
"""Key in ``SamplingParams.extra_args``: ``{"ticket": int, "seed": int, "temperature": float}``."""

_PROCESSOR_INTERFACE = "vllm.v1.worker.gpu.sample.logits_processor"

# vLLM reads these when the engine is built; the backend depends on each value (module docstring).
_ENGINE_ENVIRONMENT = {
    "VLLM_USE_V2_MODEL_RUNNER": "1",
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_FLOAT32_MATMUL_PRECISION": "highest",
}


def _vllm() -> Any:
    """The vllm module, imported on first use (it is an optional, GPU-only dependency)."""
    return importlib.import_module("vllm")


def vllm_available() -> str | None:
    """``None`` when vLLM and a CUDA GPU are usable, else the reason they are not."""
    try:
        _vllm()
    except ImportError:
        return "vllm is not installed (pip install 'rollnet-reference[vllm]')"
    if not torch.cuda.is_available():
        return "vllm needs a CUDA GPU and none is visible"
    return None


# -- the per-row arithmetic ------------------------------------------------------------------


def gumbel_max_rows(
    logits: torch.Tensor,
    seeds: torch.Tensor,
    positions: torch.Tensor,
    temperatures: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded Gumbel-max over rows: the token ``argmax(logits / T + g(seed, position, token))``
    of each row and its behaviour log-prob ``log_softmax(logits / T)[token]``.

    ``logits`` [R, V] (any float dtype; computed in float32, the noise added in float64 as the
    protocol defines), ``seeds`` and ``positions`` [R] int64, ``temperatures`` [R]. Returns tokens
    [R] int64 and log-probs [R] float32, on ``logits``' device.
    """
    scaled = logits.float() / temperatures.to(device=logits.device, dtype=torch.float32)[:, None]
    noise = gumbel_noise(seeds.to(logits.device), positions.to(logits.device), scaled.shape[-1])
    tokens = torch.argmax(scaled.double() + noise, dim=-1)
    logprobs = torch.log_softmax(scaled, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
    return tokens, logprobs


def force_tokens(logits: torch.Tensor, tokens: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``logits`` with every entry of the rows in ``rows`` (bool [R]) set to ``-inf`` except
    ``tokens[row]``, which is 0; other rows unchanged. Any sampler then picks ``tokens``."""
    forced = torch.full_like(logits, float("-inf"))
    forced.scatter_(-1, tokens[:, None], 0.0)
    return torch.where(rows[:, None], forced, logits)


@dataclass(frozen=True)
class GumbelRequest:
    """What a rollnet request asks of the processor (``SamplingParams.extra_args``)."""

    ticket: int
    seed: int
    temperature: float

    def as_extra_args(self) -> dict[str, Any]:
        """The ``extra_args`` entry that carries this request."""
        return {
            EXTRA_ARGS_KEY: {
                "ticket": self.ticket,
                "seed": self.seed,
                "temperature": self.temperature,
            }
        }

    @classmethod
    def from_extra_args(cls, extra_args: Mapping[str, Any] | None) -> GumbelRequest | None:
        """The request in ``extra_args``; ``None`` when it carries none (not a rollnet request).

        Raises ``ValueError`` naming the field when one is missing or out of range.
        """
        if not extra_args or EXTRA_ARGS_KEY not in extra_args:
            return None
        entry = extra_args[EXTRA_ARGS_KEY]
        if not isinstance(entry, Mapping):
            raise ValueError(f"extra_args[{EXTRA_ARGS_KEY!r}] must be a mapping")
        for name, kind in (("ticket", int), ("seed", int), ("temperature", (int, float))):
            value = entry.get(name)
            if not isinstance(value, kind) or isinstance(value, bool):
                raise ValueError(
                    f"extra_args[{EXTRA_ARGS_KEY!r}][{name!r}] is missing or not a number"
                )
        ticket, seed, temperature = entry["ticket"], entry["seed"], float(entry["temperature"])
        if not 0 <= ticket < 2**63:
            raise ValueError(f"ticket must be in [0, 2**63), got {ticket}")
        check_seed(seed)
        if not (temperature > 0 and np.isfinite(temperature)):
            raise ValueError(f"temperature must be a finite number > 0, got {temperature}")
        return cls(ticket=ticket, seed=seed, temperature=temperature)


# Sampling options that change the logits before a custom processor sees them (0.33.0 order:
# bias, penalties, bad words, custom, then temperature, min_p, top-k/top-p) or that pick among
# tokens in a way the forced logits would fight. Attribute name -> neutral value.
_NEUTRAL_SAMPLING = {
    "presence_penalty": 0.0,
    "frequency_penalty": 0.0,
    "repetition_penalty": 1.0,
    "temperature": 1.0,
    "top_p": 1.0,
    "top_k": 0,
    "min_p": 0.0,
    "min_tokens": 0,
    "logit_bias": None,
    "allowed_token_ids": None,
    "bad_words": None,
    "structured_outputs": None,
    "thinking_token_budget": None,
    "n": 1,
}


def refuse_non_neutral_sampling(sampling_params: Any) -> None:
    """Raise ``ValueError`` naming the first option of a rollnet request that would change the
    logits the Gumbel noise is added to, or the token vLLM samples from the forced logits."""
    for name, neutral in _NEUTRAL_SAMPLING.items():
        value = getattr(sampling_params, name, neutral)
        if value != neutral and not (neutral is None and not value):
            raise ValueError(
                f"a rollnet Gumbel-max request must leave {name} at {neutral!r}, got {value!r}"
            )


class _ProcessorRegistry:
    """Processors built by vLLM in this process, so that the backend that built the engine can
    find the one its engine made (vLLM constructs it; nothing is handed back). Weak references:
    an engine that is dropped takes its processor (and the batch state it reads) with it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._built: list[weakref.ref[GumbelMaxLogic]] = []

    def add(self, processor: GumbelMaxLogic) -> None:
        with self._lock:
            self._built.append(weakref.ref(processor))

    def count(self) -> int:
        with self._lock:
            return len(self._built)

    def since(self, count: int) -> list[GumbelMaxLogic]:
        with self._lock:
            alive = (ref() for ref in self._built[count:])
            return [processor for processor in alive if processor is not None]


PROCESSORS = _ProcessorRegistry()


@dataclass(frozen=True, eq=False)
class SampledToken:
    """One recorded sampling step of a request: the token chosen, its behaviour log-prob, and
    the final-norm row that predicted it (bf16 bit patterns [d]; None without a hidden source)."""

    token: int
    logprob: float
    hidden_bits: npt.NDArray[np.uint16] | None = None


class SampledHiddenCapture:
    """A forward pre-hook for the model's ``logits_processor`` module: keeps the hidden rows the
    step's logits are computed from (vLLM 0.33.0's Model Runner V2 calls
    ``model.compute_logits(hidden_states[logits_indices])`` and hands those logits, row for row,
    to the sampler), so that the Gumbel processor can record the final-norm row of each token it
    forces, as ``TorchBackend`` records it while decoding."""

    def __init__(self) -> None:
        self._rows: torch.Tensor | None = None

    def __call__(self, module: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        rows = args[1] if len(args) > 1 else kwargs.get("hidden_states")
        self._rows = rows if isinstance(rows, torch.Tensor) else None

    def take(self) -> torch.Tensor | None:
        """The rows of the latest logits computation (each is taken once)."""
        rows, self._rows = self._rows, None
        return rows


class GumbelMaxLogic:
    """The rollnet Gumbel-max processor, written to vLLM 0.33.0's Model Runner V2 interface
    (``vllm.v1.worker.gpu.sample.logits_processor.LogitsProcessor``) without importing it:
    :func:`gumbel_processor_class` mixes it into that base class.

    Per-slot state (ticket, seed, temperature, active) lives in host arrays written by
    :meth:`add_request` and copied to the device in :meth:`apply_staged_writes` when it changed;
    :meth:`apply` reads it through ``ctx.expanded_idx_mapping`` and keeps each step's
    ``(ticket, position, counted, token, log-prob)`` rows on the device until :meth:`drain`.
    """

    def __init__(self, vllm_config: Any, req_states: Any) -> None:
        self._req_states = req_states
        self._device = torch.device(req_states.device)
        slots = int(req_states.max_num_reqs)
        self._active = np.zeros(slots, dtype=np.bool_)
        self._ticket = np.zeros(slots, dtype=np.int64)
        self._seed = np.zeros(slots, dtype=np.int64)
        self._temperature = np.ones(slots, dtype=np.float32)
        self._dirty = True
        self._active_gpu = torch.zeros(slots, dtype=torch.bool, device=self._device)
        self._ticket_gpu = torch.zeros(slots, dtype=torch.int64, device=self._device)
        self._seed_gpu = torch.zeros(slots, dtype=torch.int64, device=self._device)
        self._temperature_gpu = torch.ones(slots, dtype=torch.float32, device=self._device)
        self._steps: list[tuple[torch.Tensor, ...]] = []
        self.hidden_source: SampledHiddenCapture | None = None
        """Where :meth:`apply` takes the final-norm rows of its logits from (set by the backend)."""
        PROCESSORS.add(self)

    @classmethod
    def validate_params(cls, sampling_params: Any) -> None:
        """Refuse a rollnet request with malformed ``extra_args`` or non-neutral options."""
        request = GumbelRequest.from_extra_args(getattr(sampling_params, "extra_args", None))
        if request is not None:
            refuse_non_neutral_sampling(sampling_params)

    def add_request(self, req_idx: int, sampling_params: Any) -> bool:
        """Take (or clear) slot ``req_idx``; True when this processor forces its tokens."""
        request = GumbelRequest.from_extra_args(getattr(sampling_params, "extra_args", None))
        self._dirty = True
        if request is None:
            self._active[req_idx] = False
            return False
        self._active[req_idx] = True
        self._ticket[req_idx] = request.ticket
        self._seed[req_idx] = request.seed
        self._temperature[req_idx] = request.temperature
        return True

    def apply_staged_writes(self) -> None:
        """Copy the per-slot state to the device (stream-ordered after earlier steps' reads)."""
        if not self._dirty:
            return
        self._active_gpu.copy_(torch.from_numpy(self._active))
        self._ticket_gpu.copy_(torch.from_numpy(self._ticket))
        self._seed_gpu.copy_(torch.from_numpy(self._seed))
        self._temperature_gpu.copy_(torch.from_numpy(self._temperature))
        self._dirty = False

    def apply(self, logits: torch.Tensor, ctx: Any) -> torch.Tensor:
        """Force each rollnet row's Gumbel-max token and record it; other rows are untouched."""
        if not self._active[np.asarray(ctx.idx_mapping_np)].any():
            return logits
        slots = ctx.expanded_idx_mapping.to(torch.int64)
        if slots.shape[0] != logits.shape[0]:
            raise RuntimeError("logits rows and ctx.expanded_idx_mapping disagree")
        positions = ctx.pos.to(torch.int64)
        prompt_len = self._req_states.prompt_len.gpu.to(self._device)[slots].to(torch.int64)
        prefill_len = self._req_states.prefill_len.gpu.to(self._device)[slots].to(torch.int64)
        # The row at input position p samples the token at p + 1: p + 1 - prompt_len tokens have
        # been generated before it. A row short of the end of its prefill is computed and dropped.
        generated = positions + 1 - prompt_len
        counted = positions + 1 >= prefill_len
        active = self._active_gpu[slots]
        tokens, logprobs = gumbel_max_rows(
            logits,
            self._seed_gpu[slots],
            generated.clamp(min=0),
            self._temperature_gpu[slots],
        )
        step: tuple[torch.Tensor, ...] = (
            self._ticket_gpu[slots],
            generated,
            active & counted,
            tokens,
            logprobs,
        )
        if self.hidden_source is not None:
            hidden = self.hidden_source.take()
            if hidden is None or hidden.shape[0] != logits.shape[0]:
                rows = None if hidden is None else hidden.shape[0]
                raise RuntimeError(
                    "the hidden rows of this step's logits were not captured row for row "
                    f"({rows} rows, {logits.shape[0]} logits)"
                )
            step = (*step, hidden.detach().to(torch.bfloat16).view(torch.int16))
        self._steps.append(step)
        return force_tokens(logits, tokens, active)

    def drain(self) -> dict[int, dict[int, SampledToken]]:
        """Every recorded step since the last drain: ticket -> position -> token (one host sync).

        A position recorded twice (recomputed after a preemption) keeps the later record.
        """
        steps, self._steps = self._steps, []
        if not steps:
            return {}
        tickets, positions, counted, tokens, logprobs = (
            torch.cat([step[i] for step in steps]).cpu() for i in range(5)
        )
        keep = counted.numpy()
        hidden: list[npt.NDArray[np.uint16] | None] = [None] * int(keep.sum())
        if all(len(step) == 6 for step in steps):
            bits = torch.cat([step[5] for step in steps]).cpu().numpy().view(np.uint16)
            hidden = list(bits[keep])
        records: dict[int, dict[int, SampledToken]] = {}
        for ticket, position, token, logprob, row in zip(
            tickets.numpy()[keep].tolist(),
            positions.numpy()[keep].tolist(),
            tokens.numpy()[keep].tolist(),
            logprobs.numpy()[keep].tolist(),
            hidden,
            strict=True,
        ):
            records.setdefault(ticket, {})[position] = SampledToken(token, logprob, row)
        return records


def gumbel_processor_class() -> type:
    """:class:`GumbelMaxLogic` as a subclass of vLLM's Model Runner V2 ``LogitsProcessor``
    (vLLM's loader refuses other classes). Imports vLLM; the class is made once."""
    global _PROCESSOR_CLASS
    if _PROCESSOR_CLASS is None:
        try:
            interface = importlib.import_module(_PROCESSOR_INTERFACE)
        except ImportError as error:
            raise RuntimeError(
                "this vLLM has no Model Runner V2 logits-processor interface "
                f"({_PROCESSOR_INTERFACE}); the vLLM backend targets vLLM {TARGET_VLLM}"
            ) from error
        _PROCESSOR_CLASS = type(
            _PROCESSOR_NAME,
            (GumbelMaxLogic, interface.LogitsProcessor),
            {"__module__": __name__, "__qualname__": _PROCESSOR_NAME},
        )
    return _PROCESSOR_CLASS


_PROCESSOR_NAME = "RollnetGumbelMaxProcessor"
_PROCESSOR_CLASS: type | None = None


def __getattr__(name: str) -> Any:
    # ``vllm_backend.RollnetGumbelMaxProcessor`` resolves (made on first use), so the class
    # pickles by reference and can be named to vLLM as
    # ``rollnet.reference.inference.vllm_backend.RollnetGumbelMaxProcessor``.
    if name == _PROCESSOR_NAME:
        return gumbel_processor_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- final-norm rows --------------------------------------------------------------------------


class FinalNormCapture:
    """A forward hook for the final norm that keeps its outputs while armed.

    vLLM's norms take and return ``(hidden, residual)`` when called with a residual; the hidden
    part is kept, flattened to ``[tokens, d]`` (vLLM's layout; a batch-first ``[1, L, d]`` too).
    """

    def __init__(self) -> None:
        self.armed = False
        self.captured: list[torch.Tensor] = []

    def __call__(self, module: Any, inputs: Any, output: Any) -> None:
        if not self.armed:
            return
        hidden = output[0] if isinstance(output, tuple) else output
        # Cloned: vLLM reuses its activation buffers in the next forward.
        self.captured.append(hidden.detach().reshape(-1, hidden.shape[-1]).clone())

    def arm(self) -> None:
        """Start keeping outputs (forgetting earlier ones)."""
        self.captured = []
        self.armed = True

    def disarm(self) -> list[torch.Tensor]:
        """Stop keeping outputs and return those kept since :meth:`arm`."""
        self.armed = False
        captured, self.captured = self.captured, []
        return captured


def completion_rows(
    captured: Sequence[torch.Tensor], prompt_length: int, completion_length: int
) -> torch.Tensor:
    """The rows of a one-request prefill of ``prompt + completion[:-1]`` that predicted each
    completion token: rows ``prompt_length - 1 ...`` of its only forward.

    The forward may carry padding rows after the request's tokens (never before them). Raises
    ``RuntimeError`` when the prefill was not exactly one forward of at least that many rows
    (chunked prefill or a cached prefix would make rows missing or split).
    """
    if prompt_length < 1 or completion_length < 1:
        raise ValueError("a prefill needs at least one prompt and one completion token")
    tokens = prompt_length + completion_length - 1
    if len(captured) != 1:
        raise RuntimeError(
            f"the prefill of {tokens} tokens ran as {len(captured)} forwards, not one "
            "(chunked prefill or prefix caching is on?)"
        )
    (rows,) = captured
    if rows.shape[0] < tokens:
        raise RuntimeError(
            f"the prefill of {tokens} tokens computed {rows.shape[0]} rows (a cached prefix?)"
        )
    start = prompt_length - 1
    return rows[start : start + completion_length]


def proof_of(hidden: torch.Tensor) -> bytes:
    """TOPLOC proof of a completion's final-norm rows [T, d] (bf16 bit patterns, as the
    validator takes them)."""
    bits = hidden.detach().to(torch.bfloat16).view(torch.int16).cpu().numpy().view(np.uint16)
    return toploc.build_proof(bits)


# -- the backend ------------------------------------------------------------------------------


class VllmBackend:
    """vLLM generation and prefill with the same outputs and proofs as ``TorchBackend``.

    ``gpu_memory_utilization`` is vLLM's (the share of the GPU it may take);
    ``max_model_len`` bounds prompt + completion (default: the checkpoint's);
    ``batch_invariant`` turns on vLLM's batch-invariant kernels (``VLLM_BATCH_INVARIANT=1``);
    ``proof_rows`` says where proofs come from: ``"decode"`` (the rows each token was sampled
    from, kept while decoding) or ``"prefill"`` (one extra prefill per completion).
    """

    def __init__(
        self,
        *,
        gpu_memory_utilization: float = 0.8,
        max_model_len: int | None = None,
        batch_invariant: bool = False,
        proof_rows: Literal["decode", "prefill"] = "decode",
    ) -> None:
        self.gpu_memory_utilization = gpu_memory_utilization
        self.max_model_len = max_model_len
        self.batch_invariant = batch_invariant
        if proof_rows not in ("decode", "prefill"):
            raise ValueError(f"proof_rows must be 'decode' or 'prefill', not {proof_rows!r}")
        self.proof_rows = proof_rows
        self._llm: Any = None
        self._model: Any = None
        self._processor: GumbelMaxLogic | None = None
        self._capture = FinalNormCapture()
        self._eos_ids: frozenset[int] = frozenset()
        self._vocab_size = 0
        self._max_model_len = 0
        self._tickets = itertools.count()
        self.dtype: DType = "float32"

    def load(self, model_dir: str, device: str = "cuda", dtype: DType = "float32") -> None:
        """Load a local Hugging Face directory into an in-process vLLM engine (module docstring
        for every setting and why)."""
        reason = vllm_available()
        if reason is not None:
            raise RuntimeError(reason)
        if device not in ("cuda", "cuda:0"):
            raise ValueError(f"the vLLM backend runs on one CUDA device ('cuda'), not {device!r}")
        os.environ.update(_ENGINE_ENVIRONMENT)
        if self.batch_invariant:
            os.environ["VLLM_BATCH_INVARIANT"] = "1"
        config = json.loads((Path(model_dir) / "config.json").read_text())
        max_model_len = self.max_model_len or config.get("max_position_embeddings")
        if not isinstance(max_model_len, int) or max_model_len < 2:
            raise ValueError(
                f"{model_dir}/config.json has no usable max_position_embeddings "
                f"({max_model_len!r}): pass VllmBackend(max_model_len=...)"
            )
        processor_class = gumbel_processor_class()
        built_before = PROCESSORS.count()
        llm = _vllm().LLM(
            model=model_dir,
            tokenizer=model_dir,
            dtype=dtype,
            seed=0,
            gpu_memory_utilization=self.gpu_memory_utilization,
            max_model_len=max_model_len,
            enforce_eager=True,
            enable_prefix_caching=False,
            enable_chunked_prefill=False,
            # At least max_model_len, so that no prefill is ever split; more lets decode batch.
            max_num_batched_tokens=max(max_model_len, 8192),
            long_prefill_token_threshold=0,
            async_scheduling=False,
            generation_config="vllm",
            logits_processors=[processor_class],
        )
        built = PROCESSORS.since(built_before)
        if len(built) != 1:
            raise RuntimeError(
                f"vLLM built {len(built)} rollnet logits processors in this process, not one "
                "(the engine must run in-process: VLLM_ENABLE_V1_MULTIPROCESSING=0, one GPU)"
            )
        if torch.get_float32_matmul_precision() != "highest":
            raise RuntimeError(
                "float32 matmuls are not at 'highest' precision after loading vLLM (TF32 would "
                f"be used): {torch.get_float32_matmul_precision()!r}"
            )
        capture = self._capture
        models = llm.apply_model(lambda model: model)
        (model,) = models
        norm = getattr(getattr(model, "model", None), "norm", None)
        if norm is None:
            raise RuntimeError(
                f"{type(model).__name__} has no model.norm (the final norm whose output the "
                "proofs commit to); the vLLM backend supports Llama/Qwen2-style models"
            )
        llm.apply_model(lambda m: m.model.norm.register_forward_hook(capture))
        processor = built[0]
        # Decode-time proof rows: the hidden rows each step's logits come from (module docstring).
        # A model without vLLM's logits_processor module gets prefill-derived proofs instead.
        logits_module = getattr(model, "logits_processor", None)
        if isinstance(logits_module, torch.nn.Module) and self.proof_rows == "decode":
            sampled = SampledHiddenCapture()
            logits_module.register_forward_pre_hook(sampled, with_kwargs=True)
            processor.hidden_source = sampled
        self._llm, self._model, self._processor = llm, model, processor
        self._vocab_size = int(config["vocab_size"])
        self._max_model_len = max_model_len
        self.dtype = dtype
        # Not vLLM's hf_config alone: chat checkpoints add EOS ids in generation_config.json.
        self._eos_ids = checkpoint_eos_token_ids(model_dir)

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Token ids that end a completion."""
        return self._eos_ids

    def _loaded(self) -> tuple[Any, GumbelMaxLogic]:
        if self._llm is None or self._processor is None:
            raise RuntimeError("no model loaded: call load() first")
        return self._llm, self._processor

    def generate(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingParams
    ) -> list[Generation]:
        """Decode every prompt with Gumbel-max sampling, then prove each completion."""
        llm, processor = self._loaded()
        if not sampling.gumbel:
            raise ValueError("the vLLM backend only samples with Gumbel-max (gumbel=True)")
        if not prompts:
            return []
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        seeds = list(sampling.seeds or [])
        if len(seeds) != len(prompts):
            raise ValueError("Gumbel sampling needs one seed per prompt")
        for index, prompt in enumerate(prompts):
            # vLLM would end such a request early, at max_model_len, where no other backend does.
            if len(prompt) + sampling.max_new_tokens > self._max_model_len:
                raise ValueError(
                    f"prompt {index} ({len(prompt)} tokens) + max_new_tokens "
                    f"({sampling.max_new_tokens}) exceeds max_model_len ({self._max_model_len})"
                )
        for seed in seeds:
            check_seed(seed)
        requests = [
            GumbelRequest(next(self._tickets), seed, float(sampling.temperature)) for seed in seeds
        ]
        vllm_sampling = _vllm().SamplingParams
        params = [
            vllm_sampling(
                temperature=1.0,
                max_tokens=sampling.max_new_tokens,
                # Stop on exactly the EOS set TorchBackend (the validator) uses, on nothing else.
                stop_token_ids=sorted(self._eos_ids),
                ignore_eos=True,
                skip_special_tokens=False,
                detokenize=False,
                extra_args=request.as_extra_args(),
            )
            for request in requests
        ]
        processor.drain()  # nothing from an earlier, interrupted call may be read as this one's
        outputs = llm.generate(
            [{"prompt_token_ids": [int(t) for t in p]} for p in prompts], params, use_tqdm=False
        )
        records = processor.drain()
        results = []
        for prompt, request, output in zip(prompts, requests, outputs, strict=True):
            completion = tuple(int(t) for t in output.outputs[0].token_ids)
            logprobs = behaviour_logprobs(records.get(request.ticket, {}), completion)
            # The protocol's rule: EOS last means "eos" even at exactly max_new_tokens.
            reason = cast(
                FinishReason,
                finish_reason(completion, self._eos_ids, sampling.max_new_tokens) or "length",
            )
            proof = b""
            if sampling.proofs and completion:
                proof = self._proof(records.get(request.ticket, {}), prompt, completion)
            results.append(
                Generation(
                    prompt_ids=tuple(int(t) for t in prompt),
                    completion_ids=completion,
                    logprobs=logprobs,
                    finish_reason=reason,
                    proof=proof,
                    seed=request.seed,
                )
            )
        return results

    def _proof(
        self,
        recorded: Mapping[int, SampledToken],
        prompt: Sequence[int],
        completion: Sequence[int],
    ) -> bytes:
        """The completion's proof: from the rows recorded while decoding when there are, else
        from one prefill."""
        rows = [recorded[position].hidden_bits for position in range(len(completion))]
        if all(row is not None for row in rows):
            return toploc.build_proof(np.stack(cast(list[npt.NDArray[np.uint16]], rows)))
        return proof_of(self._hidden_rows(prompt, completion))

    def _hidden_rows(self, prompt: Sequence[int], completion: Sequence[int]) -> torch.Tensor:
        """Final-norm outputs at the positions predicting each completion token (one prefill)."""
        llm, _ = self._loaded()
        if not prompt or not completion:
            raise ValueError("a prefill needs at least one prompt and one completion token")
        tokens = [int(t) for t in prompt] + [int(t) for t in completion][:-1]
        if len(tokens) > self._max_model_len:
            raise ValueError(
                f"a prefill of {len(tokens)} tokens exceeds max_model_len ({self._max_model_len})"
            )
        self._capture.arm()
        try:
            llm.generate(
                [{"prompt_token_ids": tokens}],
                _vllm().SamplingParams(max_tokens=1, temperature=0.0, detokenize=False),
                use_tqdm=False,
            )
        finally:
            captured = self._capture.disarm()
        return completion_rows(captured, len(prompt), len(completion))

    def prefill(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> Prefill:
        """Hidden states and full logits of one rollout's completion positions."""
        hidden = self._hidden_rows(prompt_ids, completion_ids)
        with torch.inference_mode():
            logits = self._model.compute_logits(hidden)
        if logits is None:
            raise RuntimeError("the model computed no logits (not the last pipeline stage?)")
        logits = logits[:, : self._vocab_size]
        return Prefill(
            hidden_states=hidden.float().cpu().numpy(),
            logits=logits.float().cpu().numpy(),
        )

    def prefill_batch(
        self, rollouts: Sequence[tuple[Sequence[int], Sequence[int]]]
    ) -> list[Prefill]:
        """:meth:`prefill` for each rollout (one request at a time keeps rows unambiguous)."""
        return [self.prefill(prompt, completion) for prompt, completion in rollouts]


def behaviour_logprobs(
    recorded: Mapping[int, SampledToken], completion: Sequence[int]
) -> tuple[float, ...]:
    """The processor's log-probs for ``completion``, checking that each token vLLM returned is
    the one the processor forced at that position (else vLLM sampled around it)."""
    logprobs = []
    for position, token in enumerate(completion):
        record = recorded.get(position)
        if record is None:
            raise RuntimeError(
                f"vLLM produced token {position} without the rollnet logits processor"
            )
        if record.token != token:
            raise RuntimeError(
                f"vLLM returned token {token} at position {position} where the Gumbel-max "
                f"processor forced {record.token}"
            )
        logprobs.append(record.logprob)
    return tuple(logprobs)
