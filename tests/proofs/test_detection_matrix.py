"""The detection matrix on a real tiny transformer: honest rollouts pass, every attack fails.

Honest rollouts (>= 500) cover the honest variations we can reach on a CPU: batched and
single-sequence generation, 2 and 1 threads, KV-cache decode and full recompute, batched and
single validator prefill, fp32 and bf16 (each verified with its dtype's calibrated thresholds).
Each attack runs >= 50 trials; every trial must be rejected (but for the measured misses of
``MEASURED_MISSES``), and the report must name the check the attack is designed to trip.
Thresholds come from ``bench/calibrate_proofs.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import torch

from rollnet.reference.inference import harness
from rollnet.reference.inference.torch_backend import TorchBackend
from rollnet.reference.model.tiny import TinyModelSpec, init_tiny_model
from rollnet.sdk.proofs.report import CheckName, VerificationReport
from rollnet.sdk.proofs.thresholds import BFLOAT16, FLOAT32

MAX_NEW_TOKENS = 40  # two windows: 32 + 8 rows
TEMPERATURE = 1.0
TRIALS = 64
#: Attacks measured to slip through now and then, per rollout: at most this many of TRIALS may.
#: fp16-rounded weights: ~0.4-0.8% of short rollouts show no unexplained mismatch
#: (docs/verification.md, Limitations). With the same 256 slots, 2 passed under task-derived
#: seeds and 0 under the former lease-derived ones: the matrix's 64 of 64 was the draw. A
#: commitment is rejected when any rollout is, so 8 rollouts pass together with p ~ (2/256)^8.
MEASURED_MISSES = {"fp16_weights": 2}


@dataclass
class Matrix:
    honest: dict[str, list[VerificationReport]]
    attacks: dict[str, list[VerificationReport]]
    unchanged: dict[str, int]


# Building the matrix (every attack on the tiny model) takes about 18 s.
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def single_thread() -> Iterator[None]:
    """Run the bulk on one intra-op thread: the tiny model gains nothing from two, and two
    OpenMP threads thrash when the machine is busy. One scenario per dtype uses two threads."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory, single_thread: None) -> Matrix:
    root = tmp_path_factory.mktemp("matrix")
    init_tiny_model(root / "tiny", seed=0)
    init_tiny_model(root / "other", seed=1)
    init_tiny_model(root / "cheap", seed=2, spec=TinyModelSpec(num_hidden_layers=1))

    def load(name: str, dtype: str = "float32", **options: bool) -> TorchBackend:
        backend = TorchBackend(**options)
        backend.load(str(root / name), dtype=dtype)  # type: ignore[arg-type]
        return backend

    worker, validator = load("tiny"), load("tiny")
    worker16, validator16 = load("tiny", "bfloat16"), load("tiny", "bfloat16")
    no_cache = load("tiny", use_kv_cache=False)
    factory = harness.RolloutFactory(TEMPERATURE, MAX_NEW_TOKENS, worker.eos_token_ids)
    prompts = harness.random_prompts(2048, seed=3)
    counter = iter(range(10**6))

    def slots(n: int, node: int) -> list[harness.Slot]:
        picked = [next(counter) for _ in range(n)]
        return [(harness.lease(node, task), task % 4, prompts[task]) for task in picked]

    def two_threads(backend: TorchBackend, n: int) -> list[harness.Rollout]:
        torch.set_num_threads(2)
        try:
            return factory.honest(backend, slots(n, node=1))
        finally:
            torch.set_num_threads(1)

    batched = factory.honest(worker, slots(256, node=1))
    honest = {
        "fp32 batched, 1 thread": harness.validate(validator, batched, FLOAT32),
        "fp32 batched, 2 threads": harness.validate(validator, two_threads(worker, 64), FLOAT32),
        "fp32 single sequence": harness.validate(
            validator, factory.honest(worker, slots(32, node=1), batch_size=1), FLOAT32
        ),
        "fp32 no KV cache": harness.validate(
            validator, factory.honest(no_cache, slots(64, node=1)), FLOAT32
        ),
        "fp32 single-rollout validator prefill": harness.validate(
            validator, batched[:64], FLOAT32, batch_size=1
        ),
        "bf16 batched": harness.validate(
            validator16, factory.honest(worker16, slots(64, node=1)), BFLOAT16
        ),
        "bf16 batched, 2 threads": harness.validate(
            validator16, two_threads(worker16, 32), BFLOAT16
        ),
        "bf16 single sequence": harness.validate(
            validator16, factory.honest(worker16, slots(8, node=1), batch_size=1), BFLOAT16
        ),
    }

    bench = harness.AttackBench(factory, worker, load("other"), load("cheap"))
    attacks: dict[str, list[VerificationReport]] = {}
    unchanged: dict[str, int] = {}
    for method, _, _ in harness.ATTACKS:
        attack_slots = slots(TRIALS + 32 if method == "cheap_then_prefill" else TRIALS, node=2)
        rollouts = getattr(bench, method)(attack_slots)
        if method == "cheap_then_prefill":
            # A cheap model sometimes emits exactly the honest completion for the seed: that is
            # the correct work, not a forgery, and nothing can (or should) flag it.
            reference = factory.honest(worker, attack_slots)
            kept = [
                r
                for r, h in zip(rollouts, reference, strict=True)
                if r.claim.completion_ids != h.claim.completion_ids
            ]
            unchanged[method] = len(rollouts) - len(kept)
            rollouts = kept
        attacks[method] = harness.validate(validator, rollouts, FLOAT32)
    return Matrix(honest, attacks, unchanged)


def test_honest_rollouts_are_all_accepted(matrix: Matrix) -> None:
    distinct = sum(
        len(reports)
        for name, reports in matrix.honest.items()
        if name != "fp32 single-rollout validator prefill"
    )
    assert distinct >= 500
    for name, reports in matrix.honest.items():
        rejects = [r.summary() for r in reports if not r.accepted]
        assert rejects == [], f"{name}: {len(rejects)} false rejects: {rejects[:3]}"


@pytest.mark.parametrize(
    ("method", "expected"),
    [(m, e) for m, e, _ in harness.ATTACKS],
    ids=[m for m, _, _ in harness.ATTACKS],
)
def test_attack_is_always_rejected_by_its_check(matrix: Matrix, method: str, expected: str) -> None:
    reports = matrix.attacks[method]
    assert len(reports) >= 50
    tolerated = MEASURED_MISSES.get(method, 0)
    accepted = [i for i, r in enumerate(reports) if r.accepted]
    assert len(accepted) <= tolerated, (
        f"{method}: {len(accepted)} of {len(reports)} trials accepted"
    )
    check = CheckName(expected)
    missed = [r.summary() for r in reports if r.check(check).passed]
    assert len(missed) <= tolerated, (
        f"{method}: {expected} passed in {len(missed)} trials: {missed[:3]}"
    )
    for report in reports:
        failing = report.check(check)
        if failing.passed:
            continue  # one of the measured misses, counted above
        assert failing.reason is not None
        assert failing.detail
