"""``TorchBackend``: transformers model, batched KV-cache decode, Gumbel-max sampling, TOPLOC.

Decoding is batched with left padding (attention mask + explicit position ids). A forward hook on
the final norm (``model.model.norm``) captures the last hidden state, the LM head's input; each
step's row for every live sequence goes into a 32-row window buffer, and a window is committed
(``rollnet.sdk.proofs.toploc.encode_windows``) as soon as it is full or its sequence ends, on a
background thread so that decoding continues meanwhile (as prime-rl's TOPLOC cache does).
"""

from __future__ import annotations

import inspect
from collections.abc import Collection, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import torch
from transformers import AutoModelForCausalLM, DynamicCache

from rollnet.reference.inference.base import (
    DType,
    FinishReason,
    Generation,
    Prefill,
    SamplingParams,
    eos_token_ids_of,
)
from rollnet.sdk.proofs import toploc
from rollnet.sdk.proofs.sampling import check_seed
from rollnet.sdk.proofs.sampling import gumbel_noise as numpy_gumbel_noise
from rollnet.sdk.proofs.sampling_torch import gumbel_noise
from rollnet.sdk.proofs.termination import checkpoint_eos_token_ids, finish_reason

_TORCH_DTYPES: dict[str, torch.dtype] = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _bf16_bits(hidden: torch.Tensor) -> npt.NDArray[np.uint16]:
    """bf16 bit patterns of a hidden-state tensor (rounding to nearest even, like numpy's twin)."""
    as_int = hidden.detach().to(torch.bfloat16).view(torch.int16)
    return np.asarray(as_int.cpu().numpy().view(np.uint16))


class TorchBackend:
    """The reference inference backend (CPU or GPU; fp32 or bf16).

    ``use_kv_cache=False`` recomputes the whole sequence at every step (slow; a numerically
    different but honest way to decode, used to calibrate thresholds). ``proof_threads=0`` builds
    proofs inline on the decoding thread. ``prefill_batch`` runs ``prefill_chunk`` rollouts per
    forward pass (on a CPU, 8-16 beat both 1 and 64: padding and attention cost grow with it).
    """

    def __init__(
        self, *, use_kv_cache: bool = True, proof_threads: int = 1, prefill_chunk: int = 8
    ) -> None:
        self.use_kv_cache = use_kv_cache
        self.proof_threads = proof_threads
        self.prefill_chunk = prefill_chunk
        self._model: Any = None
        self._captured: torch.Tensor | None = None
        self._eos_ids: frozenset[int] = frozenset()
        self._pad_id = 0
        self._cache_kwarg = "past_key_values"
        self.device = torch.device("cpu")
        self.dtype: DType = "float32"

    # -- loading ---------------------------------------------------------------------------

    def load(self, model_dir: str, device: str = "cpu", dtype: DType = "float32") -> None:
        """Load a local Hugging Face model directory (never downloads)."""
        loader: Any = AutoModelForCausalLM
        model = loader.from_pretrained(model_dir, dtype=_TORCH_DTYPES[dtype], local_files_only=True)
        # The protocol's EOS rule, from the files (as the vLLM backend reads it too).
        self.attach(
            model, device=device, dtype=dtype, eos_token_ids=checkpoint_eos_token_ids(model_dir)
        )

    def attach(
        self,
        model: Any,
        device: str = "cpu",
        dtype: DType = "float32",
        eos_token_ids: Collection[int] | None = None,
    ) -> None:
        """Use an already constructed model (e.g. one built in memory by a test).

        ``eos_token_ids``: the EOS set (a model copied from a loaded backend passes that
        backend's); by default the rule applied to the model's own config objects.
        """
        model = model.to(device=torch.device(device), dtype=_TORCH_DTYPES[dtype]).eval()
        self._model = model
        self.device = torch.device(device)
        self.dtype = dtype
        self._eos_ids = (
            frozenset(eos_token_ids)
            if eos_token_ids is not None
            else eos_token_ids_of(model.config, getattr(model, "generation_config", None))
        )
        pad = model.config.pad_token_id
        self._pad_id = int(pad) if pad is not None else min(self._eos_ids, default=0)
        # transformers 5 renamed the forward's cache argument; support both spellings.
        params = inspect.signature(model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        base = model.get_decoder()
        base.norm.register_forward_hook(self._capture)

    def _capture(self, module: torch.nn.Module, inputs: Any, output: torch.Tensor) -> None:
        self._captured = output

    @property
    def model(self) -> Any:
        """The loaded model."""
        if self._model is None:
            raise RuntimeError("no model loaded: call load() first")
        return self._model

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Token ids that end a completion."""
        return self._eos_ids

    @property
    def vocab_size(self) -> int:
        """Size of the LM head's output."""
        return int(self.model.get_output_embeddings().weight.shape[0])

    # -- decoding --------------------------------------------------------------------------

    def _forward(
        self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits [B, V] (float32) and hidden state [B, d] at the last position."""
        kwargs: dict[str, Any] = {}
        if cache is not None:
            kwargs[self._cache_kwarg] = cache
        self._captured = None
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=cache is not None,
            logits_to_keep=1,
            **kwargs,
        )
        if self._captured is None:
            raise RuntimeError("the final-norm hook did not fire")
        return out.logits[:, -1].float(), self._captured[:, -1]

    def generate(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingParams
    ) -> list[Generation]:
        """Complete every prompt in one batch; proofs are committed while decoding."""
        batch = len(prompts)
        if batch == 0:
            return []
        if any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        seeds = list(sampling.seeds) if sampling.seeds is not None else None
        if sampling.gumbel and (seeds is None or len(seeds) != batch):
            raise ValueError("Gumbel sampling needs one seed per prompt")
        if seeds is not None:
            for seed in seeds:
                check_seed(seed)
        device = self.device
        width = max(len(p) for p in prompts)
        ids = torch.full((batch, width), self._pad_id, dtype=torch.long)
        mask = torch.zeros((batch, width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            ids[row, width - len(prompt) :] = torch.tensor(list(prompt), dtype=torch.long)
            mask[row, width - len(prompt) :] = 1
        ids, mask = ids.to(device), mask.to(device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        gumbel_seeds = seeds if sampling.gumbel and seeds is not None else [0] * batch
        seed_tensor = torch.tensor(gumbel_seeds, dtype=torch.int64, device=device)
        generator = None
        if not sampling.gumbel:
            generator = torch.Generator(device=device)
            generator.manual_seed(seeds[0] if seeds else 0)
        eos = torch.tensor(sorted(self._eos_ids), dtype=torch.long, device=device)

        tokens = torch.full((batch, sampling.max_new_tokens), self._pad_id, dtype=torch.long)
        logprobs = torch.zeros((batch, sampling.max_new_tokens), dtype=torch.float32)
        lengths = np.zeros(batch, dtype=np.int64)
        finished = torch.zeros(batch, dtype=torch.bool, device=device)
        # Commit windows as they fill, in groups of 32: a lone window costs ~0.45 ms of numpy
        # call overhead, 32 together ~0.04 ms each. At batch 1 that is every 1,024 tokens.
        proofs = _ProofWindows(batch, self.proof_threads) if sampling.proofs else None

        with torch.inference_mode():
            cache = DynamicCache(config=self.model.config) if self.use_kv_cache else None
            logits, hidden = self._forward(ids, mask, positions, cache)
            all_ids = ids
            for step in range(sampling.max_new_tokens):
                live = ~finished
                live_np = live.cpu().numpy()
                scaled = logits / sampling.temperature
                if sampling.gumbel:
                    steps = torch.full((batch,), step, dtype=torch.int64, device=device)
                    if device.type == "cpu":
                        # Same bits as the torch twin; numpy dispatches small arrays faster.
                        noise = torch.from_numpy(
                            numpy_gumbel_noise(gumbel_seeds, steps.numpy(), scaled.shape[-1])
                        )
                    else:
                        noise = gumbel_noise(seed_tensor, steps, scaled.shape[-1])
                    token = self._pick(scaled.double() + noise, scaled, sampling.temperature)
                else:
                    probs = torch.softmax(scaled, dim=-1)
                    token = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
                token = torch.where(live, token, torch.full_like(token, self._pad_id))
                logp = torch.log_softmax(scaled, dim=-1).gather(-1, token[:, None]).squeeze(-1)
                tokens[:, step] = token.cpu()
                logprobs[:, step] = logp.cpu()
                lengths[live_np] += 1
                hit_eos = live & torch.isin(token, eos)
                finished = finished | hit_eos
                last_step = step == sampling.max_new_tokens - 1
                if proofs is not None:
                    proofs.add_row(step, hidden)
                    if (step + 1) % toploc.WINDOW == 0:
                        proofs.close_windows(step, live_np)
                    elif last_step or bool(hit_eos.any()):
                        proofs.close_windows(step, live_np & (finished.cpu().numpy() | last_step))
                if last_step or bool(finished.all()):
                    break
                next_ids = token[:, None]
                mask = torch.cat([mask, torch.ones((batch, 1), dtype=mask.dtype, device=device)], 1)
                positions = positions[:, -1:] + 1
                if cache is None:
                    all_ids = torch.cat([all_ids, next_ids], dim=1)
                    full_positions = (mask.cumsum(-1) - 1).clamp(min=0)
                    logits, hidden = self._forward(all_ids, mask, full_positions, None)
                else:
                    logits, hidden = self._forward(next_ids, mask, positions, cache)

        window_proofs = proofs.finish() if proofs is not None else [[] for _ in range(batch)]
        results: list[Generation] = []
        for row in range(batch):
            n = int(lengths[row])
            completion = tuple(int(t) for t in tokens[row, :n].tolist())
            # The protocol's rule (an EOS last is "eos" even at exactly max_new_tokens); decoding
            # stops at the first EOS or the limit, so the rule always has an answer here.
            reason = finish_reason(completion, self._eos_ids, sampling.max_new_tokens)
            assert reason is not None, "decoding stopped before EOS and the length limit"
            results.append(
                Generation(
                    prompt_ids=tuple(int(t) for t in prompts[row]),
                    completion_ids=completion,
                    logprobs=tuple(float(v) for v in logprobs[row, :n].tolist()),
                    finish_reason=cast(FinishReason, reason),
                    proof=b"".join(window_proofs[row]),
                    seed=seeds[row] if sampling.gumbel and seeds is not None else None,
                )
            )
        return results

    def _pick(self, scores: torch.Tensor, scaled: torch.Tensor, temperature: float) -> torch.Tensor:
        """The token of each row of seeded Gumbel scores ``[B, V]`` (``scaled + noise``,
        ``scaled`` the logits / ``temperature``): the argmax (the protocol's rule; an adversary
        overrides this to steer)."""
        del scaled, temperature
        return torch.argmax(scores, dim=-1)

    # -- validator prefill -----------------------------------------------------------------

    def prefill(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> Prefill:
        """One forward pass over the prompt and all but the last completion token."""
        return self.prefill_batch([(prompt_ids, completion_ids)])[0]

    def prefill_batch(
        self, rollouts: Sequence[tuple[Sequence[int], Sequence[int]]]
    ) -> list[Prefill]:
        """Right-padded batched prefill; returns each rollout's completion rows."""
        results: list[Prefill] = []
        for start in range(0, len(rollouts), self.prefill_chunk):
            results.extend(self._prefill_chunk(rollouts[start : start + self.prefill_chunk]))
        return results

    def _prefill_chunk(
        self, rollouts: Sequence[tuple[Sequence[int], Sequence[int]]]
    ) -> list[Prefill]:
        if not rollouts:
            return []
        inputs = [list(p) + list(c)[:-1] for p, c in rollouts]
        width = max(len(i) for i in inputs)
        batch = len(inputs)
        ids = torch.full((batch, width), self._pad_id, dtype=torch.long)
        for row, sequence in enumerate(inputs):
            ids[row, : len(sequence)] = torch.tensor(sequence, dtype=torch.long)
        # Completion rows of every rollout, gathered into one [N, d] block for one LM-head call:
        # rollout r's rows are (r * width + len(prompt_r) - 1) + 0..len(completion_r)-1.
        lengths = torch.tensor([len(c) for _, c in rollouts], dtype=torch.long)
        firsts = torch.tensor([row * width + len(p) - 1 for row, (p, _) in enumerate(rollouts)])
        offsets = torch.cumsum(lengths, 0) - lengths
        total = int(lengths.sum())
        flat = torch.repeat_interleave(firsts - offsets, lengths) + torch.arange(total)
        with torch.inference_mode():
            self._captured = None
            # Right padding needs no attention mask: under the causal mask a real position never
            # attends to a later (padding) one, and the positions of real tokens are 0..n-1
            # either way. Without a mask SDPA runs its causal kernel and no [B, 1, L, L] mask is
            # built. Padding rows compute garbage that nobody reads.
            self.model.get_decoder()(input_ids=ids.to(self.device), use_cache=False)
            if self._captured is None:
                raise RuntimeError("the final-norm hook did not fire")
            hidden = self._captured.reshape(batch * width, -1)[flat.to(self.device)]
            logits = self.model.get_output_embeddings()(hidden)
            hidden_np = hidden.float().cpu().numpy()
            logits_np = logits.float().cpu().numpy()
        results = []
        offset = 0
        for n in lengths.tolist():
            results.append(
                Prefill(
                    hidden_states=hidden_np[offset : offset + n],
                    logits=logits_np[offset : offset + n],
                )
            )
            offset += n
        return results


class _ProofWindows:
    """Per-sequence 32-row buffers of bf16 hidden states, committed as windows close.

    Closed windows are queued (zero-padded to a full window, which leaves their proofs
    unchanged) and committed in batches of ``batch_windows`` on a background thread: batching
    amortizes the numpy call overhead of the field arithmetic across windows.
    """

    def __init__(self, batch: int, threads: int, batch_windows: int = 32) -> None:
        self._batch = batch
        self._batch_windows = batch_windows
        self._pool = ThreadPoolExecutor(max_workers=threads) if threads > 0 else None
        self._buffer: torch.Tensor | None = None
        self._pending_rows: list[npt.NDArray[np.int64]] = []
        self._pending_bits: list[npt.NDArray[np.uint16]] = []
        self._pending_lengths: list[npt.NDArray[np.int64]] = []
        self._jobs: list[tuple[npt.NDArray[np.int64], Future[list[bytes]] | list[bytes]]] = []

    def add_row(self, step: int, hidden: torch.Tensor) -> None:
        """Store step ``step``'s hidden rows [B, d] (as bf16, on the model's device).

        Every sequence's row is written, finished ones too: a finished sequence's window was
        queued when it ended and its buffer is never read again.
        """
        if self._buffer is None:
            self._buffer = torch.zeros(
                (self._batch, toploc.WINDOW, hidden.shape[-1]),
                dtype=torch.bfloat16,
                device=hidden.device,
            )
        self._buffer[:, step % toploc.WINDOW] = hidden

    def close_windows(self, step: int, which: npt.NDArray[np.bool_]) -> None:
        """Queue the current window of the sequences in ``which`` (rows up to ``step``)."""
        rows = np.flatnonzero(which)
        if rows.size == 0 or self._buffer is None:
            return
        used = step % toploc.WINDOW + 1
        self._pending_rows.append(rows)
        window = self._buffer[torch.from_numpy(rows).to(self._buffer.device)]
        self._pending_bits.append(_bf16_bits(window).reshape(rows.size, -1))
        self._pending_lengths.append(np.full(rows.size, used * self._buffer.shape[2]))
        if sum(r.size for r in self._pending_rows) >= self._batch_windows:
            self._dispatch()

    def _dispatch(self) -> None:
        if not self._pending_rows:
            return
        rows = np.concatenate(self._pending_rows)
        bits = np.concatenate(self._pending_bits)
        lengths = np.concatenate(self._pending_lengths)
        self._pending_rows, self._pending_bits, self._pending_lengths = [], [], []
        job: Future[list[bytes]] | list[bytes]
        if self._pool is not None:
            job = self._pool.submit(toploc.encode_windows, bits, toploc.TOPK, lengths.tolist())
        else:
            job = toploc.encode_windows(bits, toploc.TOPK, lengths.tolist())
        self._jobs.append((rows, job))

    def finish(self) -> list[list[bytes]]:
        """Commit what is queued, wait, and return each sequence's windows in order."""
        self._dispatch()
        per_sequence: list[list[bytes]] = [[] for _ in range(self._batch)]
        for rows, job in self._jobs:
            encoded = job.result() if isinstance(job, Future) else job
            for row, window in zip(rows.tolist(), encoded, strict=True):
                per_sequence[row].append(window)
        if self._pool is not None:
            self._pool.shutdown()
        return per_sequence
