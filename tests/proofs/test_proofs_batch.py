"""Batched verification (``verify_rollouts`` and its parts) gives exactly the per-rollout results.

The references here are the straightforward one-rollout, one-window-at-a-time computations the
batched code replaced: every figure and verdict must be equal, not merely close.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt
import pytest

from rollnet.sdk.proofs import (
    LeaseBinding,
    RolloutAssignment,
    RolloutClaim,
    WindowStats,
    _field,
    commitment_digest,
    derive_sampling_seed,
    sampling,
    termination,
    toploc,
    verify_rollout,
    verify_rollouts,
)
from rollnet.sdk.proofs.thresholds import BFLOAT16, FLOAT32, Thresholds, sampling_tolerances

VOCAB = 101
EOS = 0


def reference_window_stats(
    proof: bytes, hidden: npt.NDArray[np.float32], boundary_distance: float
) -> list[WindowStats]:
    """One window at a time, with numpy's own mean and median (the pre-batching code)."""
    bits = toploc.as_bf16_bits(hidden)
    low = hidden.view(np.uint32) & 0xFFFF if hidden.dtype == np.float32 else None
    slack = None
    if low is not None and low.any():
        own = np.abs(low.astype(np.float64) - 0x8000) / 0x10000
        exponent = ((hidden.view(np.uint32) >> 23) & 0xFF).astype(np.int64) - 127
        slack = np.ldexp(own, exponent)
    moduli, coefficients = toploc.parse_proof(proof)
    stats = []
    for number, (start, stop) in enumerate(toploc.window_bounds(bits.shape[0])):
        flat = bits[start:stop].reshape(1, -1)
        used = min(toploc.TOPK, flat.shape[1])
        idx = toploc.top_k_indices(flat, used)
        observed = np.take_along_axis(flat, idx, axis=1).astype(np.int64)[0]
        claimed = _field.evaluate(coefficients[number : number + 1], idx % moduli[number])[0]
        match = ((claimed >> 7) & 0xFF) == ((observed >> 7) & 0xFF)
        mant = np.abs((claimed & 0x7F) - (observed & 0x7F))[match]
        unexplained = None
        if slack is not None:
            top = int(((observed >> 7) & 0xFF).max()) - 127
            near = np.ldexp(slack[start:stop].reshape(-1)[idx[0]], -top)
            differs = claimed != observed
            unexplained = int((differs & match & (near >= boundary_distance)).sum())
        stats.append(
            WindowStats(
                window=number,
                compared=used,
                exp_mismatches=used - int(match.sum()),
                mant_err_mean=float(mant.mean()) if match.any() else float("inf"),
                mant_err_median=float(np.median(mant)) if match.any() else float("inf"),
                sign_mismatches=int((((claimed ^ observed) >> 15) & 1)[match].sum()),
                unexplained_mismatches=unexplained,
            )
        )
    return stats


def test_batched_proof_verification_equals_window_by_window() -> None:
    rng = np.random.default_rng(11)
    proofs, hidden = [], []
    for length in [1, 2, 5, 31, 32, 33, 64, 70, 96, 3, 40]:
        honest = rng.standard_normal((length, 64)).astype(np.float32)
        proofs.append(toploc.build_proof(honest))
        # Mixtures of honest noise, perturbation and a foreign model.
        kind = int(rng.integers(3))
        if kind == 0:
            seen = honest * (1 + rng.standard_normal(honest.shape).astype(np.float32) * 1e-7)
        elif kind == 1:
            seen = honest + rng.standard_normal(honest.shape).astype(np.float32) * 0.01
        else:
            seen = rng.standard_normal((length, 64)).astype(np.float32)
        hidden.append(seen.astype(np.float32))
    batched = toploc.verify_proofs(proofs, hidden, boundary_distance=2e-3)
    for proof, seen, stats in zip(proofs, hidden, batched, strict=True):
        assert stats == reference_window_stats(proof, seen, 2e-3)


def test_batched_proof_verification_isolates_bad_rollouts() -> None:
    rng = np.random.default_rng(12)
    hidden = [rng.standard_normal((n, 64)).astype(np.float32) for n in (40, 40, 8, 8)]
    proofs = [toploc.build_proof(h) for h in hidden]
    proofs[1] = proofs[1][:-1]  # malformed
    widened = (toploc.bf16_bits(hidden[3]).astype(np.uint32) << 16).view(np.float32)
    results = toploc.verify_proofs(proofs, [hidden[0], hidden[1], hidden[2], widened])
    assert isinstance(results[1], toploc.ProofFormatError)
    assert results[0] == toploc.verify_proof(proofs[0], hidden[0])
    assert results[2] == toploc.verify_proof(proofs[2], hidden[2])
    fourth = results[3]
    assert not isinstance(fourth, toploc.ProofFormatError)
    assert fourth[0].unexplained_mismatches is None  # decided per rollout, not per batch
    assert results[2][0].unexplained_mismatches == 0
    # bf16 patterns mixed with floats take the per-rollout path and agree too.
    mixed = toploc.verify_proofs(proofs[2:3] * 2, [hidden[2], toploc.bf16_bits(hidden[2])])
    assert mixed[1] == toploc.verify_proof(proofs[2], toploc.bf16_bits(hidden[2]))


def reference_check(
    logits: npt.NDArray[np.float32], ids: list[int], seed: int, thresholds: Thresholds
) -> tuple[float, int]:
    margins = sampling.sampling_margins(logits, ids, seed, 0.8)
    tolerances = sampling_tolerances(logits, 0.8, thresholds)
    return float(margins.min()), int((margins < -tolerances).sum())


@pytest.mark.parametrize("block", [None, VOCAB * 7 + 3, 1])
def test_batched_sampling_check_equals_one_rollout_at_a_time(
    block: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    if block is not None:
        # Blocks of 7 rows (and of one row): block boundaries fall inside and across rollouts.
        monkeypatch.setattr(sampling, "_MARGIN_CHUNK_ELEMENTS", block)
    rng = np.random.default_rng(13)
    logits, completions, seeds = [], [], []
    for number in range(9):
        length = int(rng.integers(0, 50))
        z = rng.standard_normal((length, VOCAB)).astype(np.float32)
        seed = int(rng.integers(0, 2**63 - 1))
        scores = sampling.gumbel_scores(z, seed, 0.8)
        ids = scores.argmax(axis=1).tolist()
        if number % 3 == 1 and ids:
            ids[-1] = (ids[-1] + 1) % VOCAB  # an altered token
        logits.append(z)
        completions.append(ids)
        seeds.append(seed)
    completions[4] = [*completions[4], VOCAB]  # out of vocabulary: judged alone, no noise
    logits[4] = np.vstack([logits[4], np.zeros((1, VOCAB), dtype=np.float32)])
    results = sampling.check_sampling_batch(
        logits, completions, seeds=seeds, temperature=0.8, thresholds=FLOAT32
    )
    for z, ids, seed, result in zip(logits, completions, seeds, results, strict=True):
        single = sampling.check_sampling(z, ids, seed=seed, temperature=0.8, thresholds=FLOAT32)
        assert result == single
        if single.reason is None or single.reason.value != "TOKEN_OUT_OF_VOCABULARY":
            minimum, violations = reference_check(z, ids, seed, FLOAT32)
            assert single.figures["violations"] == violations
            if ids:
                assert single.figures["min_margin"] == minimum


def test_eos_probabilities_equal_the_single_row_formula() -> None:
    rng = np.random.default_rng(14)
    rows = rng.standard_normal((50, VOCAB)).astype(np.float32) * 3
    batched = termination.eos_probabilities(rows, {EOS, 7}, 0.6)
    for row, value in zip(rows, batched.tolist(), strict=True):
        shifted = row.astype(np.float64) / 0.6
        shifted = shifted - shifted.max()
        logprobs = shifted - np.log(np.exp(shifted).sum())
        assert value == float(np.exp(logprobs[[EOS, 7]]).sum())


def test_verify_rollouts_equals_verify_rollout() -> None:
    rng = np.random.default_rng(15)
    lease = LeaseBinding("net", "node-a", "task-1", "lease-1", 3)
    blob = bytes(range(32))
    claims, assignments, hidden, logits = [], [], [], []
    for index in range(12):
        length = int(rng.integers(1, 70))
        z = rng.standard_normal((length, VOCAB)).astype(np.float32)
        seed = derive_sampling_seed(lease.network_id, lease.task_id, index)
        ids = sampling.gumbel_scores(z, seed, 1.0).argmax(axis=1).tolist()
        ids = [t if t != EOS else 1 for t in ids[:-1]] + [EOS if index % 2 else 5]
        h = rng.standard_normal((length, 64)).astype(np.float32)
        proof = toploc.build_proof(h if index % 4 else h[::-1].copy())
        prompt = [3, 4, 5]
        claims.append(
            RolloutClaim(
                prompt_ids=prompt,
                completion_ids=ids,
                finish_reason="eos" if index % 2 else "length",
                proof=proof if index != 6 else proof[:7],
                sampling_seed=seed,
                rollout_index=index,
                commitment_digest=commitment_digest(
                    lease,
                    blob_blake3=blob,
                    rollout_index=index,
                    sampling_seed=seed,
                    prompt_ids=prompt,
                    completion_ids=ids,
                    proof=proof,
                ),
            )
        )
        assignments.append(
            RolloutAssignment(
                lease=lease,
                blob_blake3=blob,
                assigned_prompt_ids=prompt if index != 9 else [3, 4],
                temperature=1.0 if index % 3 else 0.7,
                max_new_tokens=length if index % 5 else 70,
                eos_token_ids=frozenset({EOS}),
            )
        )
        hidden.append(h)
        logits.append(z)
    for thresholds in (FLOAT32, BFLOAT16):
        batched = verify_rollouts(
            claims, assignments, hidden_states=hidden, logits=logits, thresholds=thresholds
        )
        singles = [
            verify_rollout(c, a, hidden_states=h, logits=z, thresholds=thresholds)
            for c, a, h, z in zip(claims, assignments, hidden, logits, strict=True)
        ]
        assert batched == singles
        assert {r.summary() for r in batched} != {"accept"}  # the cases above do fail
    # The batch is not a shortcut: a rollout's verdict does not depend on its neighbours.
    alone = verify_rollouts(
        claims[3:4],
        assignments[3:4],
        hidden_states=hidden[3:4],
        logits=logits[3:4],
        thresholds=thresholds,  # the last of the loop: figures depend on the thresholds
    )
    assert alone[0] == batched[3]
