"""The trainer's token-level policy loss: three trust-region options as pure functions.

Every function here works on flat per-token tensors of the batch's completion tokens (one entry
per completion token of every rollout) and returns the *sum* of its per-token terms; the caller
divides by the batch's total loss tokens (:func:`policy_loss` does), so a token weighs the same
whatever the length of the rollout it is in, and several processes that each hold a slice of the
batch divide by the same global count.

The importance ratio ``r = π/μ = exp(logπ − logμ)`` is taken against ``μ``, the behaviour
log-probabilities, so one ratio corrects both staleness (the rollout was sampled some steps ago)
and the mismatch between the inference engine and the trainer. ``μ`` is never what a worker
reported: it is the validator's recomputation where the rollout was validated, or the trainer's
own with the rollout's checkpoint (the trainer node fills it in before the loss). Where neither
is given, :func:`behaviour_reference` takes the trainer's own ``logπ`` detached: the ratio is
exactly 1 with the on-policy gradient, so a worker's numbers cannot change a token's weight
(docs/trainer.md, "What the importance ratio trusts").

Options (``LossConfig.kind``):

* ``"clip"`` — INTELLECT-2's two-sided clipped GRPO: ``−min(min(r, δ)·A, clip(r, 1−ε, 1+ε)·A)``.
  Branches: *clipped high* (``A ≥ 0``, ``r > 1+ε``), *clipped low* (``A < 0``, ``r < 1−ε``),
  *capped* (``A < 0``, ``r > δ``): the term is constant there, its gradient zero.
* ``"mask"`` — trust region by masks, prime-rl's default: the token's whole term is dropped when
  ``π − μ`` passes ``mask_bound`` in the direction of the advantage's sign (*masked high*:
  ``A > 0`` and ``π − μ > bound``; *masked low*: ``A < 0`` and ``μ − π > bound``); kept tokens
  contribute ``−r·A + β·(log r)²``.
* ``"tis"`` — truncated importance sampling: ``−sg(min(r, C))·A·logπ``; *truncated* where
  ``r > C`` (the gradient is then ``C·A·∇logπ``, never zero).

Optional extras on every loss token: the k3 estimate of KL to a frozen reference policy
(``exp(ref − logπ) − (ref − logπ) − 1``, weight ``kl_coef``) and an entropy bonus
(``−entropy_coef·H``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

__all__ = [
    "LOSS_KINDS",
    "LossConfig",
    "LossKind",
    "LossResult",
    "TokenTerms",
    "behaviour_reference",
    "clipped_terms",
    "masked_terms",
    "policy_loss",
    "truncated_is_terms",
]

LossKind = Literal["clip", "mask", "tis"]
LOSS_KINDS: tuple[LossKind, ...] = ("clip", "mask", "tis")


@dataclass(frozen=True, slots=True)
class LossConfig:
    """Which loss and its constants (docs/trainer.md, "Loss options")."""

    kind: LossKind = "clip"
    clip_epsilon: float = 0.2
    """ε of ``"clip"``: the ratio's trust region ``[1−ε, 1+ε]``."""
    clip_delta: float = 4.0
    """δ of ``"clip"``: the ratio's cap for negative advantages (gradient zero beyond it)."""
    mask_bound: float = 0.2
    """``"mask"``: the largest probability difference ``|π − μ|`` toward the advantage's sign."""
    mask_log_ratio_coef: float = 1e-3
    """``"mask"``: β of the ``(log π/μ)²`` penalty on kept tokens."""
    tis_cap: float = 2.0
    """``"tis"``: C, the truncation of the importance weight."""
    kl_coef: float = 0.0
    """Weight of the KL to the frozen reference (0: no reference model is kept)."""
    entropy_coef: float = 0.0
    """Weight of the entropy bonus (0: none)."""

    def __post_init__(self) -> None:
        if self.kind not in LOSS_KINDS:
            raise ValueError(f"loss kind {self.kind!r} is not one of {', '.join(LOSS_KINDS)}")
        checks = {
            "clip_epsilon": 0.0 < self.clip_epsilon < 1.0,
            "clip_delta": self.clip_delta > 1.0 + self.clip_epsilon,
            "mask_bound": 0.0 < self.mask_bound <= 1.0,
            "mask_log_ratio_coef": self.mask_log_ratio_coef >= 0.0,
            "tis_cap": self.tis_cap >= 1.0,
            "kl_coef": self.kl_coef >= 0.0,
            "entropy_coef": self.entropy_coef >= 0.0,
        }
        for name, ok in checks.items():
            value = getattr(self, name)
            if not ok or not math.isfinite(value):
                raise ValueError(f"loss {name} = {value} is out of range")


@dataclass(frozen=True, slots=True)
class TokenTerms:
    """Per-token loss terms (before normalisation) and which branch each token took."""

    terms: Tensor
    """The per-token loss, zero outside the loss mask."""
    branches: dict[str, Tensor]
    """Branch name -> boolean mask over tokens (within the loss mask)."""


@dataclass(frozen=True, slots=True)
class LossResult:
    """The normalised loss and what it is made of (for metrics)."""

    loss: Tensor
    """Scalar: the sum of every term over the batch's total loss tokens."""
    policy: Tensor
    """Scalar: the policy part alone (same normalisation), detached."""
    branch_counts: dict[str, float]
    """Tokens (of this process's slice) that took each branch."""
    loss_tokens: float
    """Loss tokens of this process's slice."""
    mismatch_kl: float
    """Sum over loss tokens of ``r − 1 − log r`` against the *reported* behaviour log-probs
    (validated or not): how far trainer and inference disagree (k3 estimator)."""
    entropy: float
    """Sum over loss tokens of the policy's entropy (0 when it was not computed)."""
    kl_reference: float
    """Sum over loss tokens of the k3 KL to the reference (0 without one)."""


def behaviour_reference(logprobs: Tensor, validated: Tensor, validated_mask: Tensor) -> Tensor:
    """``logμ`` per token: the validator's log-probability where ``validated_mask`` is set, the
    trainer's own ``logπ`` detached elsewhere (ratio exactly 1, on-policy gradient).

    A worker can shade the log-probabilities it reports by anything under the validator's
    tolerance, so they never enter a ratio; an unvalidated token can then weigh no more than an
    on-policy token with the same advantage.
    """
    return torch.where(validated_mask, validated, logprobs.detach())


def clipped_terms(
    logprobs: Tensor,
    reference: Tensor,
    advantages: Tensor,
    mask: Tensor,
    epsilon: float,
    delta: float,
) -> TokenTerms:
    """INTELLECT-2's two-sided clipped objective, per token (see the module docs)."""
    ratio = torch.exp(logprobs - reference)
    positive = advantages >= 0
    clipped_high = positive & (ratio > 1.0 + epsilon) & mask
    clipped_low = ~positive & (ratio < 1.0 - epsilon) & mask
    capped = ~positive & (ratio > delta) & mask
    constant = torch.zeros_like(ratio)
    constant = torch.where(clipped_high, torch.full_like(ratio, 1.0 + epsilon), constant)
    constant = torch.where(clipped_low, torch.full_like(ratio, 1.0 - epsilon), constant)
    constant = torch.where(capped, torch.full_like(ratio, delta), constant)
    frozen = clipped_high | clipped_low | capped
    # Where a branch froze the ratio the term is a constant: no gradient reaches logπ.
    weight = torch.where(frozen, constant, ratio)
    terms = torch.where(mask, -weight * advantages, torch.zeros_like(ratio))
    return TokenTerms(
        terms, {"clipped_high": clipped_high, "clipped_low": clipped_low, "capped": capped}
    )


def masked_terms(
    logprobs: Tensor,
    reference: Tensor,
    advantages: Tensor,
    mask: Tensor,
    bound: float,
    log_ratio_coef: float,
) -> TokenTerms:
    """The trust region by probability-difference masks, per token (see the module docs)."""
    log_ratio = logprobs - reference
    ratio = torch.exp(log_ratio)
    difference = torch.exp(logprobs.detach()) - torch.exp(reference.detach())
    masked_high = (advantages > 0) & (difference > bound) & mask
    masked_low = (advantages < 0) & (-difference > bound) & mask
    keep = mask & ~masked_high & ~masked_low
    term = -ratio * advantages + log_ratio_coef * log_ratio.square()
    terms = torch.where(keep, term, torch.zeros_like(term))
    return TokenTerms(terms, {"masked_high": masked_high, "masked_low": masked_low})


def truncated_is_terms(
    logprobs: Tensor, reference: Tensor, advantages: Tensor, mask: Tensor, cap: float
) -> TokenTerms:
    """Truncated importance sampling, per token (see the module docs)."""
    ratio = torch.exp(logprobs - reference).detach()
    truncated = (ratio > cap) & mask
    weight = torch.clamp(ratio, max=cap)
    terms = torch.where(mask, -weight * advantages * logprobs, torch.zeros_like(ratio))
    return TokenTerms(terms, {"truncated": truncated})


def policy_loss(
    config: LossConfig,
    *,
    logprobs: Tensor,
    behaviour_logprobs: Tensor,
    validated_logprobs: Tensor,
    validated_mask: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    total_loss_tokens: float,
    entropy: Tensor | None = None,
    reference_logprobs: Tensor | None = None,
) -> LossResult:
    """The batch's loss, normalised by ``total_loss_tokens`` (the whole batch's, across every
    process), and its metrics.

    ``logprobs`` (with gradient) are the trainer's temperature-scaled log-probabilities of the
    completion tokens; ``behaviour_logprobs`` what the worker reported (metrics only);
    ``validated_logprobs``/``validated_mask`` the validator's where present; ``entropy`` the
    policy's per-token entropy (needed when ``entropy_coef > 0``); ``reference_logprobs`` the
    frozen reference's (needed when ``kl_coef > 0``). All are flat float tensors of one length.
    """
    if total_loss_tokens <= 0:
        raise ValueError("total_loss_tokens must be positive")
    mask = loss_mask.bool()
    reference = behaviour_reference(logprobs, validated_logprobs, validated_mask.bool())
    if config.kind == "clip":
        parts = clipped_terms(
            logprobs, reference, advantages, mask, config.clip_epsilon, config.clip_delta
        )
    elif config.kind == "mask":
        parts = masked_terms(
            logprobs,
            reference,
            advantages,
            mask,
            config.mask_bound,
            config.mask_log_ratio_coef,
        )
    else:
        parts = truncated_is_terms(logprobs, reference, advantages, mask, config.tis_cap)
    total = parts.terms.sum()
    policy = total.detach() / total_loss_tokens
    zero = torch.zeros_like(logprobs)
    entropy_sum = 0.0
    if entropy is not None:
        masked_entropy = torch.where(mask, entropy, zero)
        entropy_sum = float(masked_entropy.detach().sum())
        if config.entropy_coef > 0:
            total = total - config.entropy_coef * masked_entropy.sum()
    elif config.entropy_coef > 0:
        raise ValueError("entropy_coef > 0 needs the per-token entropy")
    kl_sum = 0.0
    if reference_logprobs is not None:
        delta = reference_logprobs - logprobs
        k3 = torch.where(mask, torch.exp(delta) - delta - 1.0, zero)
        kl_sum = float(k3.detach().sum())
        if config.kl_coef > 0:
            total = total + config.kl_coef * k3.sum()
    elif config.kl_coef > 0:
        raise ValueError("kl_coef > 0 needs the reference model's log-probabilities")
    with torch.no_grad():
        log_ratio = logprobs.detach() - behaviour_logprobs
        mismatch = torch.where(mask, torch.exp(log_ratio) - 1.0 - log_ratio, zero)
    return LossResult(
        loss=total / total_loss_tokens,
        policy=policy,
        branch_counts={name: float(hit.sum()) for name, hit in parts.branches.items()},
        loss_tokens=float(mask.sum()),
        mismatch_kl=float(mismatch.sum()),
        entropy=entropy_sum,
        kl_reference=kl_sum,
    )
