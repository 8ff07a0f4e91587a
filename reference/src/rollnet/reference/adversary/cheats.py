"""Cheating workers for tests and the demo: one configurable cheat per instance.

Every cheat plugs into the real worker stack — the SDK :class:`~rollnet.sdk.worker.Worker`
runtime and the reference :class:`~rollnet.reference.worker.InferenceGenerator` — at the one place
a dishonest operator would change it:

* the inference backend (:class:`CheatingBackend`, a :class:`TorchBackend`): altered weights, a
  cheaper model, other prompts or seeds, edited or truncated completions with re-built proofs;
* the generator (:class:`CheatingGenerator`): inflated self-reported rewards;
* the runtime's sealing step (:class:`CheatingWorker`): commitment digests reused from another
  lease.

The model transformations are the detection matrix's (``rollnet.reference.inference.harness``).
:data:`CHEATS` maps each cheat to the check that must catch it (``docs/validator.md``).
"""

from __future__ import annotations

import copy
import threading
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any, cast

import torch

from rollnet.reference.inference import harness
from rollnet.reference.inference.base import DType, Generation, SamplingParams
from rollnet.reference.inference.torch_backend import TorchBackend
from rollnet.reference.worker import InferenceGenerator
from rollnet.sdk.batches import SealedBatch, rollout_digests
from rollnet.sdk.checkpoints import CheckpointStore
from rollnet.sdk.identity import Identity
from rollnet.sdk.proofs import LeaseBinding, toploc
from rollnet.sdk.proofs.thresholds import thresholds_for
from rollnet.sdk.worker import LeaseContext, Worker, WorkerConfig
from rollnet.v1 import rollout_pb2, task_pb2


class Cheat(StrEnum):
    """The attacks an adversarial worker can run (one per instance)."""

    PERTURBED_WEIGHTS = "perturbed_weights"
    OTHER_MODEL = "other_model"
    FP16_WEIGHTS = "fp16_weights"
    INT8_WEIGHTS = "int8_weights"
    PROMPT_ALTERED = "prompt_altered"
    EASIER_PROMPTS = "easier_prompts"
    TOKEN_ALTERED = "token_altered"
    WRONG_SEED = "wrong_seed"
    CHEAP_THEN_PREFILL = "cheap_then_prefill"
    TRUNCATED = "truncated"
    REWARD_INFLATED = "reward_inflated"
    PROOF_REUSED = "proof_reused"
    STEER_DIGIT = "steer_digit"
    STEER_EOS = "steer_eos"


NODE_STATISTICS = "node_statistics"
"""``caught_by`` of the cheats no single job shows: every token passes its check, and the
coordinator's per-node statistics flag the node (``docs/verification.md``)."""

STEERING_FRACTION = 0.9
"""A steering cheat takes its preferred token when its score is within this fraction of the
sampling tolerance of the winner's (inside what the per-token check admits)."""


@dataclass(frozen=True)
class CheatSpec:
    """What a cheat does and the check designed to catch it."""

    cheat: Cheat
    caught_by: str
    """The verdict's check name that must fail (``toploc``, ``sampling``, ...)."""
    description: str


CHEATS: dict[Cheat, CheatSpec] = {
    spec.cheat: spec
    for spec in (
        CheatSpec(Cheat.PERTURBED_WEIGHTS, "toploc", "1% relative noise on the last layer"),
        CheatSpec(Cheat.OTHER_MODEL, "toploc", "a different model of the same shape"),
        CheatSpec(Cheat.FP16_WEIGHTS, "toploc", "weights rounded to float16"),
        CheatSpec(Cheat.INT8_WEIGHTS, "toploc", "weights fake-quantized to int8"),
        CheatSpec(Cheat.PROMPT_ALTERED, "toploc", "generated from another prompt, claimed as"),
        CheatSpec(
            Cheat.EASIER_PROMPTS,
            "assigned_data",
            "answers a prompt of its choosing, as long as the assigned one",
        ),
        CheatSpec(Cheat.TOKEN_ALTERED, "sampling", "one completion token edited"),
        CheatSpec(
            Cheat.STEER_DIGIT,
            NODE_STATISTICS,
            "picks a digit whenever its score is within 0.9 tolerance of the winner",
        ),
        CheatSpec(
            Cheat.STEER_EOS,
            NODE_STATISTICS,
            "picks EOS whenever its score is within 0.9 tolerance of the winner (stops early)",
        ),
        CheatSpec(Cheat.WRONG_SEED, "sampling", "sampled with seeds of its choosing"),
        CheatSpec(Cheat.CHEAP_THEN_PREFILL, "sampling", "1-layer model generates, prefill proves"),
        CheatSpec(Cheat.TRUNCATED, "termination", "completions cut short, claimed at the limit"),
        CheatSpec(Cheat.REWARD_INFLATED, "reward", "self-reported reward raised by 1"),
        CheatSpec(Cheat.PROOF_REUSED, "binding", "commitment digests made under another lease"),
    )
}
"""Every cheat with the check that catches it."""

_LOAD_LOCK = threading.Lock()


def shuffle_weights(model: Any, seed: int) -> None:
    """Permute the elements of every weight tensor: same shapes and value spread, another model."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            flat = parameter.reshape(-1)
            order = torch.randperm(flat.numel(), generator=generator)
            parameter.copy_(flat[order].reshape(parameter.shape))


def cheap_copy(model: Any, layers: int = 1) -> Any:
    """A copy of ``model`` that keeps only its first ``layers`` decoder layers (cheaper)."""
    cheap = copy.deepcopy(model)
    cheap.model.layers = cheap.model.layers[:layers]
    cheap.config.num_hidden_layers = layers
    if getattr(cheap.config, "layer_types", None):
        cheap.config.layer_types = cheap.config.layer_types[:layers]
    return cheap


class CheatingBackend(TorchBackend):
    """A :class:`TorchBackend` that cheats the way ``cheat`` says (honest for other cheats)."""

    def __init__(self, cheat: Cheat, *, seed: int = 0) -> None:
        super().__init__()
        self.cheat = cheat
        self.seed = seed
        self._cheap: TorchBackend | None = None
        self._easy_prompt: list[int] = []
        self._preferred: torch.Tensor | None = None
        self._steering_fraction = STEERING_FRACTION

    def load(self, model_dir: str, device: str = "cpu", dtype: DType = "float32") -> None:
        """Load the checkpoint honestly, then apply the cheat's model change."""
        # transformers' loading is not thread-safe (its meta-device init is process-wide), and
        # tests run several cheating workers in one process.
        with _LOAD_LOCK:
            super().load(model_dir, device=device, dtype=dtype)
        model = self.model
        if self.cheat is Cheat.PERTURBED_WEIGHTS:
            harness.perturb_layer(model, 0.01, self.seed)
        elif self.cheat is Cheat.OTHER_MODEL:
            shuffle_weights(model, self.seed)
        elif self.cheat is Cheat.FP16_WEIGHTS:
            harness.round_weights_fp16(model)
        elif self.cheat is Cheat.INT8_WEIGHTS:
            harness.fake_quantize_int8(model)
        elif self.cheat is Cheat.CHEAP_THEN_PREFILL:
            self._cheap = TorchBackend()
            self._cheap.attach(
                cheap_copy(model), device=device, dtype=dtype, eos_token_ids=self.eos_token_ids
            )
        elif self.cheat is Cheat.EASIER_PROMPTS:
            from rollnet.reference.inference.tokenization import CheckpointTokenizer

            self._easy_prompt = CheckpointTokenizer.load(model_dir).encode("1+1=")
        elif self.cheat in (Cheat.STEER_DIGIT, Cheat.STEER_EOS):
            self.steer_towards(_preferred_tokens(self.cheat, model_dir, self.eos_token_ids))

    def steer_towards(self, preferred: Sequence[int], fraction: float = STEERING_FRACTION) -> None:
        """Steer: take a token of ``preferred`` whenever its seeded score is within
        ``fraction`` of the network dtype's sampling tolerance of the winner's."""
        self._preferred = torch.tensor(sorted(set(preferred)), dtype=torch.long)
        self._steering_fraction = fraction

    def _pick(self, scores: torch.Tensor, scaled: torch.Tensor, temperature: float) -> torch.Tensor:
        winner = super()._pick(scores, scaled, temperature)
        if self._preferred is None:
            return winner
        # The validator's per-row tolerance (the error model: dtype, the row's logit magnitude,
        # 1 / T), of which the steerer uses the given fraction.
        thresholds = thresholds_for(self.dtype)
        magnitude = scaled.abs().amax(dim=-1).double()
        tolerance = self._steering_fraction * (
            thresholds.logit_error_relative * magnitude + thresholds.logit_error_floor / temperature
        )
        preferred = self._preferred.to(scores.device)
        best, index = scores[:, preferred].max(dim=-1)
        close = best >= scores.max(dim=-1).values - tolerance
        return torch.where(close, preferred[index], winner)

    def _reprove(self, generation: Generation, completion: Sequence[int]) -> bytes:
        # What a cheat can always do: an honest prefill over the tokens it wants to claim.
        return toploc.build_proof(self.prefill(generation.prompt_ids, completion).hidden_states)

    def generate(
        self, prompts: Sequence[Sequence[int]], sampling: SamplingParams
    ) -> list[Generation]:
        """Generate, cheating as configured."""
        cheat = self.cheat
        if cheat is Cheat.PROMPT_ALTERED:
            vocab = self.vocab_size
            altered = [[(p[0] + 1) % vocab or 1, *p[1:]] for p in prompts]
            generations = super().generate(altered, sampling)
            return [
                replace(g, prompt_ids=tuple(int(t) for t in p))
                for g, p in zip(generations, prompts, strict=True)
            ]
        if cheat is Cheat.EASIER_PROMPTS:
            # As long as the assigned prompt: the coordinator records each assigned prompt's
            # length and refuses a batch whose prompts differ from it at submission, so only
            # the validator's assigned-data check can catch a prompt of the same length.
            easy = []
            for p in prompts:
                chosen = (self._easy_prompt * (len(p) // len(self._easy_prompt) + 1))[: len(p)]
                if chosen == list(p):
                    chosen = [*chosen[1:], chosen[0]] if len(set(chosen)) > 1 else chosen[::-1]
                easy.append(chosen)
            return super().generate(easy, sampling)
        if cheat is Cheat.WRONG_SEED:
            assert sampling.seeds is not None
            chosen = [(seed + 1) % (1 << 63) for seed in sampling.seeds]
            generations = super().generate(prompts, replace(sampling, seeds=chosen))
            return [
                replace(g, seed=int(seed))
                for g, seed in zip(generations, sampling.seeds, strict=True)
            ]
        if cheat is Cheat.CHEAP_THEN_PREFILL:
            assert self._cheap is not None
            cheap = self._cheap.generate(prompts, sampling)
            return [replace(g, proof=self._reprove(g, g.completion_ids)) for g in cheap]
        generations = super().generate(prompts, sampling)
        if cheat is Cheat.TOKEN_ALTERED:
            return [self._alter_token(g) for g in generations]
        if cheat is Cheat.TRUNCATED:
            return [self._truncate(g) for g in generations]
        return generations

    def _alter_token(self, generation: Generation) -> Generation:
        tokens = list(generation.completion_ids)
        # Edit the last token that is not EOS: the proof stays the honest one, and the edit
        # only touches rows after it, so TOPLOC still passes and the sampling check must catch it.
        position = len(tokens) - 1
        if tokens and tokens[position] in self.eos_token_ids:
            position -= 1
        if position < 0:
            return generation
        replacement = (tokens[position] + 1) % self.vocab_size
        while replacement in self.eos_token_ids or replacement == tokens[position]:
            replacement = (replacement + 1) % self.vocab_size
        tokens[position] = replacement
        return replace(generation, completion_ids=tuple(tokens))

    def _truncate(self, generation: Generation) -> Generation:
        tokens = generation.completion_ids
        if len(tokens) < 2:
            return generation
        keep = tokens[: len(tokens) // 2]
        return replace(
            generation,
            completion_ids=keep,
            logprobs=generation.logprobs[: len(keep)],
            finish_reason="length",
            proof=self._reprove(generation, keep),
        )


def _preferred_tokens(cheat: Cheat, model_dir: str, eos_token_ids: frozenset[int]) -> list[int]:
    if cheat is Cheat.STEER_EOS:
        return sorted(eos_token_ids)
    from rollnet.reference.inference.tokenization import CheckpointTokenizer

    tokenizer = CheckpointTokenizer.load(model_dir)
    return sorted({t for digit in "0123456789" for t in tokenizer.encode(digit)})


class CheatingGenerator(InferenceGenerator):
    """The reference generator; with ``REWARD_INFLATED`` it over-reports every reward by 1."""

    def __init__(
        self,
        cheat: Cheat,
        checkpoints: CheckpointStore,
        *,
        seed: int = 0,
        dtype: DType = "float32",
    ) -> None:
        super().__init__(lambda: CheatingBackend(cheat, seed=seed), checkpoints, dtype=dtype)
        self.cheat = cheat

    async def generate(
        self, task: task_pb2.Task, lease: LeaseContext
    ) -> Sequence[rollout_pb2.Rollout]:
        """Generate (through the cheating backend), then inflate rewards if so configured."""
        rollouts = list(await super().generate(task, lease))
        if self.cheat is Cheat.REWARD_INFLATED:
            for rollout in rollouts:
                rollout.claimed_reward.task_reward += 1.0
                rollout.claimed_reward.total += 1.0
        return rollouts


class CheatingWorker(Worker):
    """The SDK worker; with ``PROOF_REUSED`` each rollout's commitment digest is the one made
    under another lease (its previous one): valid work, replayed under a lease it was not
    generated for."""

    def __init__(
        self, config: WorkerConfig, identity: Identity, generator: CheatingGenerator
    ) -> None:
        super().__init__(config, identity, generator)
        self.cheat = generator.cheat
        self._previous: LeaseBinding | None = None

    def seal(self, context: LeaseContext, rollouts: Sequence[rollout_pb2.Rollout]) -> SealedBatch:
        sealed = super().seal(context, rollouts)
        if self.cheat is not Cheat.PROOF_REUSED:
            return sealed
        other = self._previous or replace(
            context.binding, lease_id=context.binding.lease_id + "-replayed"
        )
        self._previous = context.binding
        request = sealed.request
        replayed = rollout_digests(other, request.rollout_batch.blake3, rollouts)
        del request.rollouts[:]
        request.rollouts.extend(replayed)
        return sealed


def build_cheating_worker(
    cheat: Cheat, config: WorkerConfig, identity: Identity, *, keep_checkpoints: int = 3
) -> CheatingWorker:
    """A worker running ``cheat``, with its checkpoint store under ``config.data_dir``,
    computing in the first of ``config.dtypes``."""
    store = CheckpointStore(
        config.data_dir / "checkpoints", network_id=config.network_id, keep=keep_checkpoints
    )
    dtype = cast(DType, config.dtypes[0] if config.dtypes else "float32")
    return CheatingWorker(config, identity, CheatingGenerator(cheat, store, dtype=dtype))


__all__ = [
    "CHEATS",
    "NODE_STATISTICS",
    "Cheat",
    "CheatSpec",
    "CheatingBackend",
    "CheatingGenerator",
    "CheatingWorker",
    "build_cheating_worker",
    "cheap_copy",
    "shuffle_weights",
]
