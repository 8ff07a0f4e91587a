"""``VllmBackend``: the ``InferenceBackend`` contract on vLLM (GPU; ``rollnet-reference[vllm]``).

How it meets the contract:

* **Sampling.** Every request carries a per-request logits processor (vLLM's
  ``SamplingParams.logits_processors``, callables ``(generated_ids, logits) -> logits``) that
  adds the seeded Gumbel noise of :func:`rollnet.sdk.proofs.sampling_torch.gumbel_noise` at
  position ``len(generated_ids)`` to ``logits / T``, records the behaviour log-prob of the winner
  under ``log_softmax(logits / T)``, and masks every other token to ``-inf``, so vLLM's own
  sampler can only pick the Gumbel-max token. Tokens are therefore exactly those the validator
  re-derives.
* **Proofs.** After decoding, each completion is re-run as one prefill (prompt + completion
  minus its last token, ``max_tokens=1``) while a forward hook on the model's final norm
  (``model.model.norm``) captures the last hidden states; the completion rows are encoded into
  TOPLOC windows with :func:`rollnet.sdk.proofs.toploc.encode_windows`. A prefill-derived proof is
  what the validator recomputes, so it passes the same thresholds; it costs one extra prefill.
* **Termination.** The EOS set is the checkpoint's ``config.json`` and
  ``generation_config.json`` EOS ids together, computed by the helper ``TorchBackend`` uses too
  (:func:`rollnet.sdk.proofs.checkpoint_eos_token_ids`, the protocol's rule), so a worker and its
  validator agree on where completions end. Every request stops on exactly that set:
  ``SamplingParams(stop_token_ids=sorted(set), ignore_eos=True)``; ``ignore_eos`` keeps vLLM
  from also stopping on the tokenizer's own EOS id, which need not be in the set.
* **Prefill** (validator side) uses the same hook and additionally asks vLLM for prompt
  log-probs; vLLM only returns the top ones, so full-vocabulary logits are recomputed by
  applying the model's LM head to the captured hidden rows.

What is untested: all of it on a real vLLM (only the EOS wiring is checked, against a stand-in
``vllm`` module, in ``tests/inference/test_inference_eos_ids.py``). vLLM is not installed where
this was written (no GPU); the code follows vLLM's documented V0 API (``LLM``,
``SamplingParams(logits_processors=..., stop_token_ids=..., ignore_eos=...)``,
``llm.llm_engine.model_executor.driver_worker.model_runner.model``) and needs the V0 engine
(``VLLM_USE_V1=0``) for per-request logits processors and in-process model access. The backend
contract tests (``tests/inference/test_backend_contract.py``) run it wherever vLLM and a GPU are
present and are skipped elsewhere.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Sequence
from typing import Any, cast

import numpy as np
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


class _GumbelProcessor:
    """Per-request logits processor: seeded Gumbel-max, recording behaviour log-probs."""

    def __init__(self, seed: int, temperature: float) -> None:
        self.seed = seed
        self.temperature = temperature
        self.logprobs: list[float] = []

    def __call__(self, generated: Sequence[int], logits: torch.Tensor) -> torch.Tensor:
        scaled = logits.float() / self.temperature
        step = len(generated)
        seeds = torch.tensor([self.seed], dtype=torch.int64, device=logits.device)
        steps = torch.tensor([step], dtype=torch.int64, device=logits.device)
        noise = gumbel_noise(seeds, steps, scaled.shape[-1])[0]
        token = int(torch.argmax(scaled.double() + noise))
        # vLLM may call a processor again for the same position (e.g. after preemption).
        del self.logprobs[step:]
        self.logprobs.append(float(torch.log_softmax(scaled, dim=-1)[token]))
        forced = torch.full_like(logits, float("-inf"))
        forced[token] = 0.0
        return forced


class VllmBackend:
    """vLLM generation and prefill with the same outputs and proofs as ``TorchBackend``."""

    def __init__(self, *, gpu_memory_utilization: float = 0.8) -> None:
        self.gpu_memory_utilization = gpu_memory_utilization
        self._llm: Any = None
        self._model: Any = None
        self._captured: torch.Tensor | None = None
        self._eos_ids: frozenset[int] = frozenset()
        self.dtype: DType = "float32"

    def load(self, model_dir: str, device: str = "cuda", dtype: DType = "float32") -> None:
        """Load a local Hugging Face directory into vLLM (V0 engine, eager mode)."""
        reason = vllm_available()
        if reason is not None:
            raise RuntimeError(reason)
        os.environ.setdefault("VLLM_USE_V1", "0")
        self._llm = _vllm().LLM(
            model=model_dir,
            tokenizer=model_dir,
            dtype=dtype,
            # Eager mode and no prefix caching: every forward computes exactly the tokens of its
            # requests, in order, so the hooked rows of a one-request prefill are that request's.
            enforce_eager=True,
            enable_prefix_caching=False,
            enable_chunked_prefill=False,
            seed=0,
            gpu_memory_utilization=self.gpu_memory_utilization,
        )
        self.dtype = dtype
        executor = self._llm.llm_engine.model_executor
        self._model = executor.driver_worker.model_runner.model
        self._model.model.norm.register_forward_hook(self._capture)
        # Not vLLM's hf_config alone: chat checkpoints add EOS ids in generation_config.json.
        self._eos_ids = checkpoint_eos_token_ids(model_dir)

    def _capture(self, module: Any, inputs: Any, output: Any) -> None:
        # Some vLLM norms return (hidden, residual).
        self._captured = output[0] if isinstance(output, tuple) else output

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Token ids that end a completion."""
        return self._eos_ids

    def generate(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingParams
    ) -> list[Generation]:
        """Decode every prompt with Gumbel-max sampling, then prove each completion."""
        vllm_sampling = _vllm().SamplingParams
        if not sampling.gumbel:
            raise ValueError("the vLLM backend only samples with Gumbel-max (gumbel=True)")
        seeds = list(sampling.seeds or [])
        if len(seeds) != len(prompts):
            raise ValueError("Gumbel sampling needs one seed per prompt")
        for seed in seeds:
            check_seed(seed)
        processors = [_GumbelProcessor(seed, sampling.temperature) for seed in seeds]
        params = [
            vllm_sampling(
                temperature=1.0,
                max_tokens=sampling.max_new_tokens,
                logits_processors=[processor],
                # Stop on exactly the EOS set TorchBackend (the validator) uses, on nothing else.
                stop_token_ids=sorted(self._eos_ids),
                ignore_eos=True,
                skip_special_tokens=False,
                detokenize=False,
            )
            for processor in processors
        ]
        outputs = self._llm.generate(
            [{"prompt_token_ids": list(p)} for p in prompts], params, use_tqdm=False
        )
        results = []
        for prompt, seed, processor, output in zip(
            prompts, seeds, processors, outputs, strict=True
        ):
            completion = tuple(int(t) for t in output.outputs[0].token_ids)
            # The protocol's rule: EOS last means "eos" even at exactly max_new_tokens.
            reason = cast(
                FinishReason,
                finish_reason(completion, self._eos_ids, sampling.max_new_tokens) or "length",
            )
            proof = b""
            if sampling.proofs and completion:
                hidden = self._hidden_rows(prompt, completion)
                proof = _encode_proof(hidden)
            results.append(
                Generation(
                    prompt_ids=tuple(int(t) for t in prompt),
                    completion_ids=completion,
                    logprobs=tuple(processor.logprobs[: len(completion)]),
                    finish_reason=reason,
                    proof=proof,
                    seed=seed,
                )
            )
        return results

    def _hidden_rows(self, prompt: Sequence[int], completion: Sequence[int]) -> torch.Tensor:
        """Final-norm outputs at the positions predicting each completion token."""
        tokens = list(prompt) + list(completion)[:-1]
        self._captured = None
        self._llm.generate(
            [{"prompt_token_ids": tokens}],
            _vllm().SamplingParams(max_tokens=1, temperature=1.0, detokenize=False),
            use_tqdm=False,
        )
        if self._captured is None:
            raise RuntimeError("the final-norm hook did not fire")
        # The first forward of a request is its prefill: rows are its tokens in order.
        start = len(prompt) - 1
        return self._captured[start : start + len(completion)]

    def prefill(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> Prefill:
        """Hidden states and full logits of one rollout's completion positions."""
        hidden = self._hidden_rows(prompt_ids, completion_ids)
        with torch.inference_mode():
            # vLLM's LM head is not callable (its weight is used by the sampler); with tied
            # embeddings it is the embedding table. Either way the weight is [V, d].
            logits = hidden.float() @ self._model.lm_head.weight.float().T
        return Prefill(
            hidden_states=hidden.float().cpu().numpy(),
            logits=logits.float().cpu().numpy(),
        )

    def prefill_batch(
        self, rollouts: Sequence[tuple[Sequence[int], Sequence[int]]]
    ) -> list[Prefill]:
        """:meth:`prefill` for each rollout (one request at a time keeps rows unambiguous)."""
        return [self.prefill(prompt, completion) for prompt, completion in rollouts]


def _encode_proof(hidden: torch.Tensor) -> bytes:
    """TOPLOC windows of a completion's hidden rows (bf16 bit patterns, 32 rows per window)."""
    bits = hidden.detach().to(torch.bfloat16).view(torch.int16).cpu().numpy().view(np.uint16)
    windows = []
    lengths = []
    for start in range(0, bits.shape[0], toploc.WINDOW):
        rows = bits[start : start + toploc.WINDOW]
        padded = np.zeros((toploc.WINDOW, bits.shape[1]), dtype=np.uint16)
        padded[: rows.shape[0]] = rows
        windows.append(padded.reshape(-1))
        lengths.append(rows.size)
    encoded = toploc.encode_windows(np.stack(windows), toploc.TOPK, lengths)
    return b"".join(encoded)
