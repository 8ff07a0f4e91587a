"""Binding digests and seeds, assigned data, termination, the report and verify_rollout."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from typing import Any

import blake3
import numpy as np
import pytest

from rollnet.sdk import proofs
from rollnet.sdk.proofs import binding
from rollnet.sdk.proofs.report import CheckName, Reason, Verdict
from rollnet.sdk.proofs.thresholds import FLOAT32

LEASE = binding.LeaseBinding("net", "node-a", "task-1", "lease-1", 3)
BLOB = bytes(range(32))


def test_field_encoding_is_tagged_and_length_prefixed() -> None:
    assert binding.encode_field("ab") == b"\x01\x00\x00\x00\x02ab"
    assert binding.encode_field(b"\x00\xff") == b"\x02\x00\x00\x00\x02\x00\xff"
    assert binding.encode_field(-2) == b"\x03" + b"\xff" * 7 + b"\xfe"
    assert binding.encode_field("é") == b"\x01\x00\x00\x00\x02\xc3\xa9"
    with pytest.raises(TypeError):
        binding.encode_field(True)
    # ("a", "bc") and ("ab", "c") must not collide.
    assert binding.domain_digest("d", ["a", "bc"]) != binding.domain_digest("d", ["ab", "c"])


def test_domain_digest_is_blake3_of_the_encoding() -> None:
    expected = blake3.blake3(
        binding.encode_field("rollnet/v1/x") + binding.encode_field(7) + binding.encode_field("y")
    ).digest()
    assert binding.domain_digest("rollnet/v1/x", [7, "y"]) == expected


def _seed(lease: binding.LeaseBinding, index: int) -> int:
    return binding.derive_sampling_seed(lease.network_id, lease.task_id, index)


def test_seed_is_derived_from_network_task_and_index_only() -> None:
    seed = _seed(LEASE, 0)
    assert 0 <= seed < 2**63
    assert seed == _seed(LEASE, 0)
    assert seed != _seed(LEASE, 1)
    for field in dataclasses.fields(LEASE):
        value: Any = getattr(LEASE, field.name)
        new_value: Any = value + 1 if isinstance(value, int) else value + "x"
        changed = dataclasses.replace(LEASE, **{field.name: new_value})
        # Who leases the task, and how often, cannot change its seeds: no re-rolling.
        if field.name in ("network_id", "task_id"):
            assert _seed(changed, 0) != seed, field.name
        else:
            assert _seed(changed, 0) == seed, field.name
    expected = blake3.blake3(
        binding.encode_field("rollnet/v1/task-sampling-seed")
        + binding.encode_field(LEASE.network_id)
        + binding.encode_field(LEASE.task_id)
        + binding.encode_field(0)
    ).digest()
    assert seed == int.from_bytes(expected[:8], "big") >> 1
    with pytest.raises(ValueError, match="rollout_index"):
        binding.derive_sampling_seed(LEASE.network_id, LEASE.task_id, -1)


def _digest(**overrides: object) -> bytes:
    args: dict[str, object] = {
        "blob_blake3": BLOB,
        "rollout_index": 0,
        "sampling_seed": _seed(LEASE, 0),
        "prompt_ids": [1, 2],
        "completion_ids": [3, 4],
        "proof": b"p",
    }
    lease = overrides.pop("lease", LEASE)
    args.update(overrides)
    return binding.commitment_digest(lease, **args)  # type: ignore[arg-type]


def test_commitment_digest_binds_every_field() -> None:
    base = _digest()
    variants = [
        _digest(lease=dataclasses.replace(LEASE, node_id="node-b")),
        _digest(lease=dataclasses.replace(LEASE, fencing_token=4)),
        _digest(blob_blake3=bytes(32)),
        _digest(rollout_index=1),
        _digest(sampling_seed=1),
        _digest(prompt_ids=[1, 2, 3], completion_ids=[4]),
        _digest(completion_ids=[3, 5]),
        _digest(proof=b"q"),
    ]
    assert len({base, *variants}) == len(variants) + 1


def _check(lease: binding.LeaseBinding, seed: int, digest: bytes) -> proofs.CheckResult:
    return binding.check_binding(
        lease,
        blob_blake3=BLOB,
        rollout_index=0,
        claimed_seed=seed,
        claimed_digest=digest,
        prompt_ids=[1, 2],
        completion_ids=[3, 4],
        proof=b"p",
    )


def test_check_binding_reasons() -> None:
    seed = _seed(LEASE, 0)
    assert _check(LEASE, seed, _digest()).passed
    stolen = _check(dataclasses.replace(LEASE, node_id="thief"), seed, _digest())
    assert stolen.reason is Reason.COMMITMENT_DIGEST_MISMATCH
    chosen_seed = _check(LEASE, 5, _digest(sampling_seed=5))
    assert chosen_seed.reason is Reason.SEED_NOT_DERIVED
    # The message says what the expected derivation is, for a worker on the old rule.
    assert "rollnet/v1/task-sampling-seed" in chosen_seed.detail
    old_rule = binding.domain_digest(
        "rollnet/v1/sampling-seed",
        [LEASE.network_id, LEASE.node_id, LEASE.task_id, LEASE.lease_id, LEASE.fencing_token, 0],
    )
    old_seed = int.from_bytes(old_rule[:8], "big") >> 1
    old = _check(LEASE, old_seed, _digest(sampling_seed=old_seed))
    assert old.reason is Reason.SEED_NOT_DERIVED


def test_assigned_data() -> None:
    assert proofs.check_assigned_data([1, 2, 3], [1, 2, 3]).passed
    swapped = proofs.check_assigned_data([1, 2, 3], [1, 9, 3, 4])
    assert (swapped.passed, swapped.reason) == (False, Reason.PROMPT_NOT_ASSIGNED)
    assert swapped.figures["differing_tokens"] == 2


def _termination(
    tokens: list[int],
    reason: str,
    eos_logit: float = 0.0,
    limit: int = 5,
    eos_margin: float | None = None,
) -> proofs.CheckResult:
    logits = np.zeros(10)
    logits[0] = eos_logit
    return proofs.check_termination(
        tokens,
        finish_reason=reason,
        eos_token_ids=frozenset({0}),
        max_new_tokens=limit,
        last_logits=logits,
        temperature=1.0,
        thresholds=FLOAT32,
        eos_margin=eos_margin,
    )


def test_termination_cases() -> None:
    assert _termination([5, 6, 0], "eos").passed
    assert _termination([5, 6, 7, 8, 9], "length").passed
    cases = {
        Reason.EMPTY_COMPLETION: _termination([], "eos"),
        Reason.TOO_LONG: _termination([5] * 6, "length"),
        Reason.EOS_BEFORE_END: _termination([5, 0, 6], "length"),
        Reason.TRUNCATED: _termination([5, 6], "length"),
        Reason.FINISH_REASON_MISMATCH: _termination([5, 6, 0], "length"),
        Reason.EOS_IMPROBABLE: _termination([5, 0], "eos", eos_logit=-30.0),
    }
    for reason, result in cases.items():
        assert (result.passed, result.reason) == (False, reason)
    assert _termination([5, 0], "eos").figures["eos_probability"] == pytest.approx(0.1)


def test_an_improbable_eos_that_won_the_seeded_draw_was_sampled() -> None:
    # Honest sampling draws an EOS of probability below the floor now and then; when the
    # sampling check shows it won its seeded draw clearly (by its row's tolerance under the
    # error model), it is not rejected for that.
    row = np.zeros(10)
    row[0] = -30.0
    tolerance = float(proofs.sampling_tolerances(row, 1.0, FLOAT32))
    assert tolerance == pytest.approx(FLOAT32.logit_error_relative * 30 + FLOAT32.logit_error_floor)
    assert _termination([5, 0], "eos", eos_logit=-30.0, eos_margin=1.2).passed
    assert _termination([5, 0], "eos", eos_logit=-30.0, eos_margin=tolerance).passed
    # Won within the tolerance (numeric noise could have flipped it), or no margin known:
    # the floor applies.
    for margin in (tolerance / 2, -tolerance / 2, None):
        result = _termination([5, 0], "eos", eos_logit=-30.0, eos_margin=margin)
        assert (result.passed, result.reason) == (False, Reason.EOS_IMPROBABLE)
    # A NaN EOS probability proves nothing.
    result = _termination([5, 0], "eos", eos_logit=float("nan"))
    assert (result.passed, result.reason) == (False, Reason.EOS_IMPROBABLE)


def test_an_honestly_sampled_improbable_eos_is_accepted() -> None:
    # EOS has probability ~4e-5 (below the 1e-4 floor) at every row; rows are sampled with the
    # lease-derived seed until EOS wins its draw. That is honest work: accepted, through
    # verify_rollout, because the sampling check's final margin reaches the termination check.
    rng = np.random.default_rng(11)
    vocab, eos, rows = 40, 0, 300_000
    logits = rng.standard_normal((rows, vocab))
    logits[:, eos] = -6.0
    seed = _seed(LEASE, 0)
    winners = np.argmax(proofs.gumbel_scores(logits, seed, 1.0), axis=1)
    end = int(np.flatnonzero(winners == eos)[0])
    completion = winners[: end + 1].tolist()
    logits = logits[: end + 1]
    probability = proofs.eos_probabilities(logits[-1:], frozenset({eos}), 1.0)[0]
    assert probability < FLOAT32.min_eos_probability
    hidden = rng.standard_normal((end + 1, 16)).astype(np.float32)
    proof = proofs.build_proof(hidden)
    prompt = [1, 2, 3]
    digest = binding.commitment_digest(
        LEASE,
        blob_blake3=BLOB,
        rollout_index=0,
        sampling_seed=seed,
        prompt_ids=prompt,
        completion_ids=completion,
        proof=proof,
    )
    claim = proofs.RolloutClaim(prompt, completion, "eos", proof, seed, 0, digest)
    assignment = proofs.RolloutAssignment(LEASE, BLOB, prompt, 1.0, rows, frozenset({eos}))
    report = proofs.verify_rollout(
        claim, assignment, hidden_states=hidden, logits=logits, thresholds=FLOAT32
    )
    assert report.verdict is Verdict.ACCEPT, report.summary()
    sampled = next(c for c in report.checks if c.name is CheckName.SAMPLING)
    assert float(sampled.figures["final_margin"]) >= float(sampled.figures["final_tolerance"])


def test_verify_rollout_end_to_end_on_synthetic_tensors() -> None:
    rng = np.random.default_rng(0)
    prompt = [1, 2, 3]
    logits = rng.standard_normal((40, 10)).astype(np.float32) * 3
    hidden = rng.standard_normal((40, 64)).astype(np.float32)
    seed = _seed(LEASE, 2)
    tokens = proofs.gumbel_scores(logits, seed, 1.0).argmax(axis=1)
    tokens[tokens == 0] = 1  # keep EOS (id 0) out; fix the logits so these still win
    logits[np.arange(40), tokens] += 100
    completion = tokens.tolist()
    proof = proofs.build_proof(hidden)
    digest = binding.commitment_digest(
        LEASE,
        blob_blake3=BLOB,
        rollout_index=2,
        sampling_seed=seed,
        prompt_ids=prompt,
        completion_ids=completion,
        proof=proof,
    )
    claim = proofs.RolloutClaim(prompt, completion, "length", proof, seed, 2, digest)
    assignment = proofs.RolloutAssignment(LEASE, BLOB, prompt, 1.0, 40, frozenset({0}))
    report = proofs.verify_rollout(
        claim, assignment, hidden_states=hidden, logits=logits, thresholds=FLOAT32
    )
    assert report.verdict is Verdict.ACCEPT, report.summary()
    assert [c.name for c in report.checks] == list(CheckName)
    tampered = proofs.verify_rollout(
        claim, assignment, hidden_states=hidden * 1.01, logits=logits, thresholds=FLOAT32
    )
    assert tampered.first_failure is not None
    assert tampered.first_failure.name is CheckName.TOPLOC
    assert tampered.summary().startswith("reject toploc:")
    with pytest.raises(ValueError, match="completion length"):
        proofs.verify_rollout(
            claim, assignment, hidden_states=hidden[:5], logits=logits, thresholds=FLOAT32
        )


def test_thresholds_lookup() -> None:
    assert proofs.thresholds_for("float32") is proofs.FLOAT32
    assert proofs.thresholds_for("bf16") is proofs.BFLOAT16
    with pytest.raises(ValueError, match="float16"):
        proofs.thresholds_for("float16")


def test_importing_proofs_does_not_import_torch() -> None:
    code = "import sys, rollnet.sdk.proofs; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_public_exports() -> None:
    assert sorted(proofs.__all__) == sorted(set(proofs.__all__))
    for name in proofs.__all__:
        assert hasattr(proofs, name), name


def test_golden_vectors_documented_in_verification_md() -> None:
    # docs/verification.md quotes these values; a change here is a protocol change.
    lease = binding.LeaseBinding("rollnet-main", "node-a", "task-1", "lease-1", 3)
    seed = _seed(lease, 0)
    assert seed == 6915462183822903976
    assert (
        binding.tokens_digest([1, 2, 3], [4, 5]).hex()
        == "76672e1c2e5410fe7538ae47fe415cb409d0ca9058a8317686604a50e0c8bfec"
    )
    digest = binding.commitment_digest(
        lease,
        blob_blake3=bytes(range(32)),
        rollout_index=0,
        sampling_seed=seed,
        prompt_ids=[1, 2, 3],
        completion_ids=[4, 5],
        proof=b"\x01\x02",
    )
    assert digest.hex() == "bd090591302f0fd0458ff79eef4c60213dcafa3884025358dda2d3488afef49e"
    assert proofs.noise_bits([42], [7], 4)[0].tolist() == [
        0x9EA086CB,
        0x53881BF6,
        0x2BCE117B,
        0x757B8FFA,
    ]
