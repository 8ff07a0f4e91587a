"""Honest and dishonest rollouts on a local model, for validator tests and calibration.

``RolloutFactory`` plays an honest worker (or one of the attacks of the detection matrix in
``docs/verification.md``) and ``validate`` plays the validator: batched re-prefill with the
claimed checkpoint, then :func:`rollnet.sdk.proofs.verify_rollouts` on the batch.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import blake3
import numpy as np
import torch

from rollnet.reference.inference.base import Generation, Prefill, SamplingParams
from rollnet.reference.inference.torch_backend import TorchBackend
from rollnet.sdk.proofs import toploc
from rollnet.sdk.proofs.binding import LeaseBinding, commitment_digest, derive_sampling_seed
from rollnet.sdk.proofs.report import VerificationReport
from rollnet.sdk.proofs.thresholds import Thresholds
from rollnet.sdk.proofs.verify import RolloutAssignment, RolloutClaim, verify_rollouts
from rollnet.sdk.testing import NETWORK_ID


@dataclass(frozen=True)
class Rollout:
    """A submitted rollout (the worker's claim) with what the validator knows about it."""

    claim: RolloutClaim
    assignment: RolloutAssignment


def lease(node: int, task: int, attempt: int = 1) -> LeaseBinding:
    """A deterministic lease for node ``node`` working on task ``task``."""
    return LeaseBinding(
        network_id=NETWORK_ID,
        node_id=f"node-{node}",
        task_id=f"task-{task}",
        lease_id=f"lease-{task}-{attempt}",
        fencing_token=attempt,
    )


def blob_hash(lease_binding: LeaseBinding) -> bytes:
    """A stand-in for the BLAKE3 of the lease's uploaded blob (the coordinator checks it)."""
    return bytes(blake3.blake3(lease_binding.lease_id.encode()).digest())


def seal(
    generation_prompt: Sequence[int],
    completion: Sequence[int],
    *,
    finish_reason: str,
    proof: bytes,
    seed: int,
    lease_binding: LeaseBinding,
    rollout_index: int,
) -> RolloutClaim:
    """The claim a worker submits, with the commitment digest it signs."""
    digest = commitment_digest(
        lease_binding,
        blob_blake3=blob_hash(lease_binding),
        rollout_index=rollout_index,
        sampling_seed=seed,
        prompt_ids=generation_prompt,
        completion_ids=completion,
        proof=proof,
    )
    return RolloutClaim(
        prompt_ids=tuple(generation_prompt),
        completion_ids=tuple(completion),
        finish_reason=finish_reason,
        proof=proof,
        sampling_seed=seed,
        rollout_index=rollout_index,
        commitment_digest=digest,
    )


@dataclass
class RolloutFactory:
    """Generates rollouts for ``(lease, rollout index, assigned prompt)`` slots with a backend."""

    temperature: float
    max_new_tokens: int
    eos_token_ids: frozenset[int]

    def assignment(self, lease_binding: LeaseBinding, prompt: Sequence[int]) -> RolloutAssignment:
        """What the validator knows for a slot."""
        return RolloutAssignment(
            lease=lease_binding,
            blob_blake3=blob_hash(lease_binding),
            assigned_prompt_ids=tuple(prompt),
            temperature=self.temperature,
            max_new_tokens=self.max_new_tokens,
            eos_token_ids=self.eos_token_ids,
        )

    def generate(
        self,
        backend: TorchBackend,
        slots: Sequence[tuple[LeaseBinding, int, Sequence[int]]],
        *,
        batch_size: int = 64,
        generation_prompts: Sequence[Sequence[int]] | None = None,
    ) -> list[tuple[Generation, LeaseBinding, int, Sequence[int]]]:
        """Generate every slot (lease, rollout index, assigned prompt) with its derived seed.

        ``generation_prompts`` replaces the prompts actually fed to the model (an attack).
        """
        out: list[tuple[Generation, LeaseBinding, int, Sequence[int]]] = []
        fed = list(generation_prompts) if generation_prompts is not None else [s[2] for s in slots]
        for start in range(0, len(slots), batch_size):
            chunk = slots[start : start + batch_size]
            seeds = [
                derive_sampling_seed(lb.network_id, lb.task_id, index) for lb, index, _ in chunk
            ]
            sampling = SamplingParams(
                temperature=self.temperature, max_new_tokens=self.max_new_tokens, seeds=seeds
            )
            generations = backend.generate(fed[start : start + batch_size], sampling)
            for generation, (lb, index, prompt) in zip(generations, chunk, strict=True):
                out.append((generation, lb, index, prompt))
        return out

    def honest(
        self,
        backend: TorchBackend,
        slots: Sequence[tuple[LeaseBinding, int, Sequence[int]]],
        *,
        batch_size: int = 64,
    ) -> list[Rollout]:
        """Honest rollouts: generated as assigned, sealed for their own lease."""
        rollouts = []
        for generation, lb, index, prompt in self.generate(backend, slots, batch_size=batch_size):
            claim = seal(
                prompt,
                generation.completion_ids,
                finish_reason=generation.finish_reason,
                proof=generation.proof,
                seed=derive_sampling_seed(lb.network_id, lb.task_id, index),
                lease_binding=lb,
                rollout_index=index,
            )
            rollouts.append(Rollout(claim, self.assignment(lb, prompt)))
        return rollouts


def validate(
    validator: TorchBackend,
    rollouts: Sequence[Rollout],
    thresholds: Thresholds,
    *,
    batch_size: int = 64,
) -> list[VerificationReport]:
    """Re-prefill each rollout (assigned prompt + claimed completion) and verify it, as the
    validator does: one batched prefill and the batched checks per ``batch_size`` rollouts."""
    reports: list[VerificationReport] = []
    for start in range(0, len(rollouts), batch_size):
        chunk = rollouts[start : start + batch_size]
        prefills = validator.prefill_batch(
            [(r.assignment.assigned_prompt_ids, r.claim.completion_ids) for r in chunk]
        )
        reports.extend(verify_prefilled(chunk, prefills, thresholds))
    return reports


def verify_prefilled(
    rollouts: Sequence[Rollout], prefills: Sequence[Prefill], thresholds: Thresholds
) -> list[VerificationReport]:
    """Every check of every rollout against its prefill (the checks vectorized across them)."""
    return verify_rollouts(
        [r.claim for r in rollouts],
        [r.assignment for r in rollouts],
        hidden_states=[p.hidden_states for p in prefills],
        logits=[p.logits for p in prefills],
        thresholds=thresholds,
    )


# -- model transformations used by the attacks ------------------------------------------------


def perturb_layer(model: Any, relative: float, seed: int, layer: int = -1) -> None:
    """Multiply every weight of one decoder layer by ``1 + relative * N(0, 1)`` (in place)."""
    generator = torch.Generator().manual_seed(seed)
    target = model.get_decoder().layers[layer]
    with torch.no_grad():
        for parameter in target.parameters():
            noise = torch.randn(parameter.shape, generator=generator, dtype=torch.float32)
            parameter.mul_(1 + relative * noise.to(parameter.dtype))


def round_weights_fp16(model: Any) -> None:
    """Round every weight to float16 and back (a worker running fp16 weights)."""
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(parameter.to(torch.float16).to(parameter.dtype))


def fake_quantize_int8(model: Any) -> None:
    """Symmetric per-output-channel int8 fake quantization of every 2-D weight."""
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.ndim != 2:
                continue
            scale = parameter.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127
            parameter.copy_(torch.round(parameter / scale).clamp(-127, 127) * scale)


def transformed_backend(
    base: TorchBackend, transform: Callable[[Any], None], **backend_args: bool | int
) -> TorchBackend:
    """A backend on a deep copy of ``base``'s model with ``transform`` applied."""
    model = copy.deepcopy(base.model)
    transform(model)
    backend = TorchBackend(**backend_args)  # type: ignore[arg-type]
    backend.attach(
        model, device=str(base.device), dtype=base.dtype, eos_token_ids=base.eos_token_ids
    )
    return backend


def reprove(
    validator_like: TorchBackend, prompt: Sequence[int], completion: Sequence[int]
) -> bytes:
    """Build a proof for given tokens by an honest prefill (what a cheating worker can do)."""
    prefill = validator_like.prefill(prompt, completion)
    return toploc.build_proof(prefill.hidden_states)


def with_claim(rollout: Rollout, **changes: object) -> Rollout:
    """The rollout with some claim fields replaced (digest untouched)."""
    return Rollout(replace(rollout.claim, **changes), rollout.assignment)  # type: ignore[arg-type]


def random_prompts(count: int, seed: int) -> list[list[int]]:
    """Arithmetic prompts such as ``"12+345="``, encoded with the tiny character tokenizer."""
    from rollnet.reference.model.tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    rng = np.random.default_rng(seed)
    prompts = []
    for _ in range(count):
        a, b = (int(v) for v in rng.integers(0, 1000, size=2))
        op = "+-*"[int(rng.integers(0, 3))]
        prompts.append(list(tokenizer.encode(f"{a}{op}{b}=").ids))
    return prompts


# -- the detection matrix's attacks -------------------------------------------------------------

Slot = tuple[LeaseBinding, int, Sequence[int]]


@dataclass
class AttackBench:
    """Everything an attack needs: the honest model, alternatives, and the rollout settings."""

    factory: RolloutFactory
    honest: TorchBackend
    """The claimed checkpoint (the validator runs the same weights)."""
    other: TorchBackend
    """A different model of the same shape."""
    cheap: TorchBackend
    """A cheaper model (fewer layers) with the same tokenizer."""
    seed: int = 0

    def _rng(self, salt: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, salt])

    def _reseal(self, rollout: Rollout, **changes: Any) -> Rollout:
        claim = replace(rollout.claim, **changes)
        lease_binding = rollout.assignment.lease
        sealed = seal(
            claim.prompt_ids,
            claim.completion_ids,
            finish_reason=claim.finish_reason,
            proof=claim.proof,
            seed=claim.sampling_seed,
            lease_binding=lease_binding,
            rollout_index=claim.rollout_index,
        )
        return Rollout(sealed, rollout.assignment)

    def _reprove_all(self, rollouts: Sequence[Rollout]) -> list[Rollout]:
        """Replace each proof by one built from an honest prefill of the claimed tokens."""
        prefills = self.honest.prefill_batch(
            [(r.claim.prompt_ids, r.claim.completion_ids) for r in rollouts]
        )
        return [
            self._reseal(r, proof=toploc.build_proof(p.hidden_states))
            for r, p in zip(rollouts, prefills, strict=True)
        ]

    def perturbed_weights(self, slots: Sequence[Slot]) -> list[Rollout]:
        """1: 1% relative noise on every weight of the last decoder layer."""
        worker = transformed_backend(self.honest, lambda m: perturb_layer(m, 0.01, self.seed))
        return self.factory.honest(worker, slots)

    def other_model(self, slots: Sequence[Slot]) -> list[Rollout]:
        """2: a different model of the same shape."""
        return self.factory.honest(self.other, slots)

    def fp16_weights(self, slots: Sequence[Slot]) -> list[Rollout]:
        """3a: the weights rounded to float16."""
        return self.factory.honest(transformed_backend(self.honest, round_weights_fp16), slots)

    def int8_weights(self, slots: Sequence[Slot]) -> list[Rollout]:
        """3b: the weights fake-quantized to int8 (per output channel)."""
        return self.factory.honest(transformed_backend(self.honest, fake_quantize_int8), slots)

    def token_altered(self, slots: Sequence[Slot]) -> list[Rollout]:
        """4: one completion token replaced by another (non-EOS) token; re-signed."""
        rng = self._rng(4)
        vocab = self.honest.vocab_size
        out = []
        for rollout in self.factory.honest(self.honest, slots):
            tokens = list(rollout.claim.completion_ids)
            position = int(rng.integers(0, len(tokens)))
            replacement = tokens[position]
            while replacement == tokens[position] or replacement in self.factory.eos_token_ids:
                replacement = int(rng.integers(0, vocab))
            tokens[position] = replacement
            out.append(self._reseal(rollout, completion_ids=tuple(tokens)))
        return out

    def prompt_altered(self, slots: Sequence[Slot]) -> list[Rollout]:
        """5: generated from a modified prompt (first token changed), claimed as assigned."""
        rng = self._rng(5)
        vocab = self.honest.vocab_size
        altered = []
        for _, _, prompt in slots:
            changed = list(prompt)
            while changed[0] == prompt[0]:
                changed[0] = int(rng.integers(6, vocab))
            altered.append(changed)
        out = []
        for generation, lease_binding, index, prompt in self.factory.generate(
            self.honest, slots, generation_prompts=altered
        ):
            claim = seal(
                prompt,
                generation.completion_ids,
                finish_reason=generation.finish_reason,
                proof=generation.proof,
                seed=derive_sampling_seed(lease_binding.network_id, lease_binding.task_id, index),
                lease_binding=lease_binding,
                rollout_index=index,
            )
            out.append(Rollout(claim, self.factory.assignment(lease_binding, prompt)))
        return out

    def cheap_then_prefill(self, slots: Sequence[Slot]) -> list[Rollout]:
        """6: tokens from a cheaper model (same seeds), proof from an honest prefill."""
        return self._reprove_all(self.factory.honest(self.cheap, slots))

    def truncated(self, slots: Sequence[Slot]) -> list[Rollout]:
        """7: an honest completion cut short (claimed as hitting the length limit), re-proved.

        Slots whose honest completion has a single token cannot be cut and are skipped.
        """
        rng = self._rng(7)
        cut = []
        for rollout in self.factory.honest(self.honest, slots):
            tokens = rollout.claim.completion_ids
            if len(tokens) < 2:
                continue
            keep = int(rng.integers(1, len(tokens)))
            cut.append(self._reseal(rollout, completion_ids=tokens[:keep], finish_reason="length"))
        return self._reprove_all(cut)

    def proof_reused(self, slots: Sequence[Slot]) -> list[Rollout]:
        """8: a valid rollout and commitment resubmitted unchanged by another node (even slots)
        or as another rollout index of the same lease (odd slots)."""
        out = []
        for number, rollout in enumerate(self.factory.honest(self.honest, slots)):
            original = rollout.assignment.lease
            if number % 2 == 0:
                thief = replace(original, node_id=original.node_id + "-thief")
                assignment = replace(rollout.assignment, lease=thief, blob_blake3=blob_hash(thief))
                out.append(Rollout(rollout.claim, assignment))
            else:
                claim = replace(rollout.claim, rollout_index=rollout.claim.rollout_index + 1)
                out.append(Rollout(claim, rollout.assignment))
        return out

    def proof_rebound(self, slots: Sequence[Slot]) -> list[Rollout]:
        """8': another node's tokens and proof, re-signed for the thief's own lease and seed on
        another task with the same prompts (on the same task the seeds are equal by design: the
        coordinator's duplicate index refuses that copy, docs/verification.md)."""
        out = []
        for rollout in self.factory.honest(self.honest, slots):
            original = rollout.assignment.lease
            thief = replace(
                original, node_id=original.node_id + "-thief", task_id=original.task_id + "-copy"
            )
            assignment = replace(rollout.assignment, lease=thief, blob_blake3=blob_hash(thief))
            seed = derive_sampling_seed(
                thief.network_id, thief.task_id, rollout.claim.rollout_index
            )
            moved = Rollout(replace(rollout.claim, sampling_seed=seed), assignment)
            out.append(self._reseal(moved))
        return out

    def easier_prompts(self, slots: Sequence[Slot]) -> list[Rollout]:
        """9: the worker swaps the assigned prompts for ones of its choosing and says so."""
        easy = random_prompts(len(slots), seed=self.seed + 9)
        easy = [
            e if list(e) != list(s[2]) else [*e, e[-1]] for e, s in zip(easy, slots, strict=True)
        ]
        out = []
        for generation, lease_binding, index, prompt in self.factory.generate(
            self.honest, slots, generation_prompts=easy
        ):
            claim = seal(
                generation.prompt_ids,
                generation.completion_ids,
                finish_reason=generation.finish_reason,
                proof=generation.proof,
                seed=derive_sampling_seed(lease_binding.network_id, lease_binding.task_id, index),
                lease_binding=lease_binding,
                rollout_index=index,
            )
            out.append(Rollout(claim, self.factory.assignment(lease_binding, prompt)))
        return out


ATTACKS: tuple[tuple[str, str, str], ...] = (
    ("perturbed_weights", "toploc", "1. weights perturbed (1% relative noise, last layer)"),
    ("other_model", "toploc", "2. a different model of the same shape"),
    ("fp16_weights", "toploc", "3a. reduced precision: fp16 weights"),
    ("int8_weights", "toploc", "3b. reduced precision: int8 fake-quantized weights"),
    ("token_altered", "sampling", "4. one completion token altered"),
    ("prompt_altered", "toploc", "5. prompt altered (generated from another prompt)"),
    ("cheap_then_prefill", "sampling", "6. cheaper model generates, honest prefill proves"),
    ("truncated", "termination", "7. generation truncated early"),
    ("proof_reused", "binding", "8. valid proof reused (other node / other rollout)"),
    ("proof_rebound", "sampling", "8'. reused tokens+proof re-signed for the thief's task"),
    ("easier_prompts", "assigned_data", "9. prompts swapped for easier ones"),
)
"""(method of AttackBench, check expected to fail, description) for each attack."""
