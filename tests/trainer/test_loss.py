"""The policy loss against hand-computed values, branch by branch, for every option."""

from __future__ import annotations

import math

import pytest
import torch

from rollnet.reference.trainer.advantages import group_advantages, has_signal
from rollnet.reference.trainer.loss import LossConfig, LossResult, policy_loss


def _case(
    log_mu: list[float], ratios: list[float], advantages: list[float], mask: list[bool]
) -> dict[str, torch.Tensor]:
    mu = torch.tensor(log_mu, dtype=torch.float64)
    logprobs = (mu + torch.log(torch.tensor(ratios, dtype=torch.float64))).requires_grad_(True)
    return {
        "logprobs": logprobs,
        "behaviour_logprobs": mu.clone(),
        "validated_logprobs": mu.clone(),
        "validated_mask": torch.ones(len(ratios), dtype=torch.bool),
        "advantages": torch.tensor(advantages, dtype=torch.float64),
        "loss_mask": torch.tensor(mask),
    }


def _loss_and_grad(
    config: LossConfig, case: dict[str, torch.Tensor], tokens: float
) -> tuple[LossResult, list[float]]:
    result = policy_loss(config, total_loss_tokens=tokens, **case)
    result.loss.backward()  # type: ignore[no-untyped-call]
    grad = case["logprobs"].grad
    assert grad is not None
    return result, grad.tolist()


def test_clip_every_branch_matches_hand_values() -> None:
    # unclipped A>0 | clipped high | clipped low | A<0 above 1+eps (unclipped) | capped at delta
    # | A>0 below 1-eps (unclipped) | outside the loss mask
    ratios = [1.1, 1.5, 0.5, 2.0, 5.0, 0.5, 3.0]
    advantages = [1.0, 1.0, -1.0, -1.0, -1.0, 0.5, 1.0]
    mask = [True] * 6 + [False]
    case = _case([-2.0] * 7, ratios, advantages, mask)
    result, grad = _loss_and_grad(LossConfig(kind="clip"), case, 6)
    expected_terms = [-1.1, -1.2, 0.8, 2.0, 4.0, -0.25]
    assert result.loss.item() == pytest.approx(sum(expected_terms) / 6)
    # d(term)/dlogπ = −r·A where the ratio is free; zero where clipped, capped or masked.
    expected_grad = [-1.1 / 6, 0.0, 0.0, 2.0 / 6, 0.0, -0.25 / 6, 0.0]
    assert grad == pytest.approx(expected_grad)
    assert result.branch_counts == {"clipped_high": 1.0, "clipped_low": 1.0, "capped": 1.0}
    assert result.loss_tokens == 6


def test_clip_constants_follow_the_config() -> None:
    case = _case([-2.0, -2.0], [1.25, 3.0], [1.0, -1.0], [True, True])
    result, grad = _loss_and_grad(
        LossConfig(kind="clip", clip_epsilon=0.1, clip_delta=2.5), case, 2
    )
    assert result.loss.item() == pytest.approx((-1.1 + 2.5) / 2)
    assert grad == pytest.approx([0.0, 0.0])


def test_mask_every_branch_matches_hand_values() -> None:
    beta = 1e-3
    mu = [0.3, 0.3, 0.6, 0.3, 0.6, 0.3]
    pi = [0.45, 0.6, 0.3, 0.6, 0.3, 0.9]
    advantages = [1.0, 1.0, -1.0, -1.0, 1.0, 1.0]
    mask = [True] * 5 + [False]
    ratios = [p / m for p, m in zip(pi, mu, strict=True)]
    case = _case([math.log(m) for m in mu], ratios, advantages, mask)
    result, grad = _loss_and_grad(LossConfig(kind="mask"), case, 5)
    # kept: 1 (π−μ = 0.15), 4 (π rose, A<0: not toward the sign), 5 (π fell, A>0)
    # masked high: 2 (A>0, π−μ = 0.3); masked low: 3 (A<0, μ−π = 0.3); 6 outside the mask
    kept = {0: (1.5, 1.0), 3: (2.0, -1.0), 4: (0.5, 1.0)}
    terms = {i: -r * a + beta * math.log(r) ** 2 for i, (r, a) in kept.items()}
    assert result.loss.item() == pytest.approx(sum(terms.values()) / 5)
    expected_grad = [0.0] * 6
    for i, (r, a) in kept.items():
        expected_grad[i] = (-r * a + 2 * beta * math.log(r)) / 5
    assert grad == pytest.approx(expected_grad)
    assert result.branch_counts == {"masked_high": 1.0, "masked_low": 1.0}


def test_truncated_is_matches_hand_values_and_never_zeroes_the_gradient() -> None:
    case = _case(
        [-2.0, -2.0, -2.0, -2.0], [1.5, 3.0, 0.5, 1.0], [1.0, 1.0, -1.0, 1.0], [True] * 3 + [False]
    )
    logprobs = case["logprobs"].detach().tolist()
    result, grad = _loss_and_grad(LossConfig(kind="tis", tis_cap=2.0), case, 3)
    expected = (-1.5 * logprobs[0] - 2.0 * logprobs[1] + 0.5 * logprobs[2]) / 3
    assert result.loss.item() == pytest.approx(expected)
    assert grad == pytest.approx([-1.5 / 3, -2.0 / 3, 0.5 / 3, 0.0])
    assert result.branch_counts == {"truncated": 1.0}


@pytest.mark.parametrize("kind", ["clip", "mask", "tis"])
def test_unvalidated_tokens_ignore_what_the_worker_reported(kind: str) -> None:
    """Without the validator's numbers the ratio is 1: a shaded report changes nothing."""
    honest = _case([-1.0, -1.0], [1.0, 1.0], [1.0, -1.0], [True, True])
    honest["validated_mask"] = torch.zeros(2, dtype=torch.bool)
    shaded = {key: value.clone() for key, value in honest.items()}
    shaded["logprobs"] = honest["logprobs"].detach().clone().requires_grad_(True)
    shaded["behaviour_logprobs"] = torch.tensor([-9.0, -0.01], dtype=torch.float64)
    shaded["validated_logprobs"] = torch.tensor([-9.0, -0.01], dtype=torch.float64)
    config = LossConfig(kind=kind)  # type: ignore[arg-type]
    first, grad_first = _loss_and_grad(config, honest, 2)
    second, grad_second = _loss_and_grad(config, shaded, 2)
    assert first.loss.item() == pytest.approx(second.loss.item())
    assert grad_first == pytest.approx(grad_second)
    # The on-policy gradient of −A·logπ: an unvalidated token weighs exactly |A|.
    assert grad_first == pytest.approx([-0.5, 0.5])
    # The mismatch metric does see the report.
    assert second.mismatch_kl > first.mismatch_kl


def test_kl_to_reference_and_entropy_bonus() -> None:
    case = _case([-1.0, -1.0], [1.0, 1.0], [0.0, 0.0], [True, True])
    reference = torch.tensor([-1.5, -0.5], dtype=torch.float64)
    entropy = torch.tensor([2.0, 1.0], dtype=torch.float64, requires_grad=True)
    config = LossConfig(kind="clip", kl_coef=0.1, entropy_coef=0.01)
    result = policy_loss(
        config, total_loss_tokens=2, entropy=entropy, reference_logprobs=reference, **case
    )
    result.loss.backward()  # type: ignore[no-untyped-call]
    deltas = [-0.5, 0.5]  # reference − logπ
    k3 = [math.exp(d) - d - 1 for d in deltas]
    assert result.loss.item() == pytest.approx((0.1 * sum(k3) - 0.01 * 3.0) / 2)
    assert result.kl_reference == pytest.approx(sum(k3))
    assert result.entropy == pytest.approx(3.0)
    grad = case["logprobs"].grad
    assert grad is not None
    assert grad.tolist() == pytest.approx([0.1 * (1 - math.exp(d)) / 2 for d in deltas])
    assert entropy.grad is not None
    assert entropy.grad.tolist() == pytest.approx([-0.005, -0.005])


def test_loss_is_normalised_by_the_global_token_count() -> None:
    case = _case([-1.0], [1.0], [1.0], [True])
    result = policy_loss(LossConfig(), total_loss_tokens=4, **case)
    assert result.loss.item() == pytest.approx(-0.25)
    with pytest.raises(ValueError, match="total_loss_tokens"):
        policy_loss(LossConfig(), total_loss_tokens=0, **case)


def test_extras_need_their_inputs() -> None:
    case = _case([-1.0], [1.0], [1.0], [True])
    with pytest.raises(ValueError, match="entropy"):
        policy_loss(LossConfig(entropy_coef=0.1), total_loss_tokens=1, **case)
    with pytest.raises(ValueError, match="reference"):
        policy_loss(LossConfig(kl_coef=0.1), total_loss_tokens=1, **case)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("kind", "ppo"),
        ("clip_epsilon", 0.0),
        ("clip_delta", 1.1),
        ("mask_bound", 1.5),
        ("tis_cap", 0.5),
        ("kl_coef", -1.0),
        ("entropy_coef", float("nan")),
    ],
)
def test_loss_config_refuses_out_of_range_values(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field if field != "kind" else "loss kind"):
        LossConfig(**{field: value})  # type: ignore[arg-type]


def test_group_advantages() -> None:
    assert group_advantages([1.0, 0.0, 0.5, 0.5]) == pytest.approx([0.5, -0.5, 0.0, 0.0])
    std = math.sqrt((0.25 + 0.25) / 4)
    assert group_advantages([1.0, 0.0, 0.5, 0.5], normalize_std=True, epsilon=1e-6) == (
        pytest.approx([0.5 / (std + 1e-6), -0.5 / (std + 1e-6), 0.0, 0.0])
    )
    assert group_advantages([0.3, 0.3]) == [0.0, 0.0]
    with pytest.raises(ValueError, match="finite"):
        group_advantages([1.0, float("inf")])
    with pytest.raises(ValueError, match="at least one"):
        group_advantages([])


def test_has_signal() -> None:
    assert has_signal([0.0, 1.0])
    assert has_signal([0.25, 0.2500001])
    assert not has_signal([0.5, 0.5, 0.5])
    assert not has_signal([])
