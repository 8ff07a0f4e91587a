"""``validate_job`` on real rollouts of the tiny model: honest work is accepted with every check's
figures; each cheat of the adversary is rejected by the check designed to catch it; a tampered
blob or batch is rejected before any model runs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import blake3
import numpy as np
import pytest
from validator_testing import seal_job

from rollnet.reference.adversary import CHEATS, NODE_STATISTICS, Cheat, CheatingGenerator
from rollnet.reference.envs import RewardBreakdown, RewardResult
from rollnet.reference.inference.tokenization import CheckpointTokenizer
from rollnet.reference.inference.torch_backend import TorchBackend
from rollnet.reference.validator import (
    CheckpointModel,
    EnvironmentCache,
    JobUncheckable,
    ValidatorReason,
    validate_job,
)
from rollnet.reference.validator.pipeline import refuse_oversized
from rollnet.sdk.checkpoints import CheckpointStore
from rollnet.sdk.client import RollnetClient
from rollnet.sdk.commitments import max_batch_bytes
from rollnet.sdk.proofs import FLOAT32, LeaseBinding, derive_sampling_seed, token_logprobs
from rollnet.sdk.testing import NETWORK_ID
from rollnet.sdk.worker import LeaseContext
from rollnet.v1 import common_pb2, rollout_pb2, task_pb2, validation_pb2

MAX_NEW_TOKENS = 40
PROMPTS = (3, 17)
SAMPLES = 2


@dataclass
class Bench:
    root: Path
    model: CheckpointModel
    environments: EnvironmentCache
    counter: Iterator[int]


@pytest.fixture(scope="module")
def bench(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bench]:
    from rollnet.reference.model.tiny import init_tiny_model

    root = tmp_path_factory.mktemp("pipeline")
    model_dir = init_tiny_model(root / "checkpoints" / "step-1", seed=0)
    backend = TorchBackend()
    backend.load(str(model_dir))
    # As the validator loads it (validator/checkpoint_cache.py): the checkpoint's tokenizer.json.
    tokenizer = CheckpointTokenizer.load(model_dir)
    model = CheckpointModel(step=1, backend=backend, tokenizer=tokenizer, thresholds=FLOAT32)
    environments = EnvironmentCache()
    yield Bench(root, model, environments, iter(range(10**6)))
    environments.close()


# Problems in the example datasets of the environments with a bounded number of prompts.
DATASET_SIZES = {"math": 22, "code": 12}


def make_task(
    number: int, environment: str = "arithmetic", config: dict[str, Any] | None = None
) -> task_pb2.Task:
    size = DATASET_SIZES.get(environment)
    task = task_pb2.Task(
        task_id=f"task-{number}",
        environment=environment,
        prompt_ids=[p + number if size is None else (p + number) % size for p in PROMPTS],
        samples_per_prompt=SAMPLES,
        sampling=common_pb2.SamplingParams(temperature=1.0, max_new_tokens=MAX_NEW_TOKENS),
        checkpoint_step=1,
    )
    task.environment_config.update(config or {})
    return task


async def generate(
    bench: Bench,
    cheat: Cheat | None,
    environment: str = "arithmetic",
    config: dict[str, Any] | None = None,
) -> tuple[task_pb2.Task, LeaseBinding, list[rollout_pb2.Rollout]]:
    """Rollouts from the reference generator behind a (possibly cheating) backend."""
    number = next(bench.counter)
    task = make_task(number, environment, config)
    lease_pb = task_pb2.Lease(lease_id=f"lease-{number}", fencing_token=1)
    # The generator finds checkpoint 1 in its store, so it never needs the client.
    store = CheckpointStore(bench.root / "checkpoints", network_id=NETWORK_ID)
    # PROOF_REUSED cheats only when sealing, so its generator is the honest one.
    generator = CheatingGenerator(cheat or Cheat.PROOF_REUSED, store)
    context = LeaseContext(
        task=task,
        lease=lease_pb,
        network_id=NETWORK_ID,
        node_id=f"node-{number}",
        client=cast(RollnetClient, None),
        deadline=time.monotonic() + 600,
    )
    try:
        rollouts = list(await generator.generate(task, context))
    finally:
        generator.close()
    return task, context.binding, rollouts


def judge(bench: Bench, job: validation_pb2.ValidationJob, blob: bytes) -> Any:
    return validate_job(job, blob, bench.model, bench.environments)


@pytest.mark.slow
async def test_honest_batch_is_accepted_with_figures(bench: Bench) -> None:
    task, lease, rollouts = await generate(bench, None)
    job, blob = seal_job(task, lease, rollouts)
    outcome = judge(bench, job, blob)
    assert outcome.accepted, [c for c in outcome.checks if not c.passed]
    assert outcome.reject_reason == ""
    count = len(PROMPTS) * SAMPLES
    per_rollout = {
        "binding",
        "assigned_data",
        "termination",
        "toploc",
        "sampling",
        "behaviour_logprobs",
        "reward",
    }
    for index in range(count):
        names = {
            c.check
            for c in outcome.checks
            if c.HasField("rollout_index") and c.rollout_index == index
        }
        assert names == per_rollout
    assert {c.check for c in outcome.checks if not c.HasField("rollout_index")} == {
        "integrity",
        "batch",
    }
    toploc = [c for c in outcome.checks if c.check == "toploc"]
    assert all(c.figures for c in toploc)
    assert len(outcome.validated_rewards) == count
    for rollout, reward in zip(rollouts, outcome.validated_rewards, strict=True):
        assert reward.total == rollout.claimed_reward.total
    assert outcome.prefill_tokens == sum(len(r.prompt_token_ids) for r in rollouts)
    assert outcome.decode_tokens == sum(len(r.completion_token_ids) for r in rollouts)
    request = outcome.to_request("j", "l", 1, "r")
    assert request.decision == validation_pb2.Verdict.DECISION_ACCEPT
    assert request.validated_work.decode_tokens == outcome.decode_tokens


@pytest.mark.slow
async def test_math_jobs_are_scored_off_the_main_thread(bench: Bench) -> None:
    # Worker and validator both compute rewards on threads, where math-verify's time limit
    # (SIGALRM) cannot work: the reward sandbox scores them in a child process instead.
    task, lease, rollouts = await generate(bench, None, "math")
    job, blob = seal_job(task, lease, rollouts)
    outcome = await asyncio.to_thread(judge, bench, job, blob)
    assert outcome.accepted, [c for c in outcome.checks if not c.passed]
    rewards = [c for c in outcome.checks if c.check == "reward"]
    assert len(rewards) == len(rollouts)
    assert all(c.figures["verifier_failed"] == 0.0 for c in rewards)


@pytest.mark.slow
async def test_rollouts_failing_another_check_are_not_scored(bench: Bench) -> None:
    # Their completions are text the worker chose: the verifier never sees them.
    task, lease, rollouts = await generate(bench, Cheat.TOKEN_ALTERED)
    job, blob = seal_job(task, lease, rollouts)
    outcome = judge(bench, job, blob)
    failed = {c.rollout_index for c in outcome.checks if not c.passed}
    assert failed
    for index, reward in enumerate(outcome.validated_rewards):
        checks = {c.check for c in outcome.checks if c.rollout_index == index}
        assert ("reward" in checks) == (index not in failed)
        if index in failed:
            assert reward == common_pb2.Reward()


@pytest.mark.parametrize(
    "cheat",
    [c for c in Cheat if c is not Cheat.PROOF_REUSED and CHEATS[c].caught_by != NODE_STATISTICS],
)
@pytest.mark.slow
async def test_every_cheat_is_rejected_by_its_check(bench: Bench, cheat: Cheat) -> None:
    task, lease, rollouts = await generate(bench, cheat)
    job, blob = seal_job(task, lease, rollouts)
    outcome = judge(bench, job, blob)
    assert not outcome.accepted
    assert CHEATS[cheat].caught_by in outcome.failed_checks, outcome.failed_checks
    first = next(c for c in outcome.checks if not c.passed)
    assert outcome.reject_reason == first.reason != ""


@pytest.mark.slow
async def test_proof_reused_under_another_lease_fails_binding(bench: Bench) -> None:
    task, lease, rollouts = await generate(bench, None)
    other = LeaseBinding(lease.network_id, lease.node_id, lease.task_id, "another-lease", 1)
    job, blob = seal_job(task, lease, rollouts, digest_lease=other)
    outcome = judge(bench, job, blob)
    assert outcome.failed_checks == {"binding"}
    assert outcome.reject_reason == "COMMITMENT_DIGEST_MISMATCH"


@pytest.mark.slow
async def test_rollouts_rebound_to_another_task_fail_sampling(bench: Bench) -> None:
    # Another node's valid tokens and proofs, re-signed for the thief's own lease on another
    # task with the same prompts (a fresh copy after a reject, another demand) with that task's
    # seeds: binding holds, but the tokens were not drawn with those seeds. (On the same task
    # the seeds are the same; the coordinator's duplicate index refuses that copy instead.)
    task, lease, rollouts = await generate(bench, None)
    copy = task_pb2.Task()
    copy.CopyFrom(task)
    copy.task_id = task.task_id + "-copy"
    thief = LeaseBinding(lease.network_id, "thief", copy.task_id, "thief-lease", 2)
    for index, rollout in enumerate(rollouts):
        rollout.sampling_seed = derive_sampling_seed(thief.network_id, thief.task_id, index)
    job, blob = seal_job(copy, thief, rollouts)
    outcome = judge(bench, job, blob)
    assert outcome.failed_checks == {"sampling"}
    assert outcome.reject_reason == "TOKEN_NOT_SAMPLED"


@pytest.mark.slow
async def test_tampered_blob_and_batch_are_rejected_before_the_model(bench: Bench) -> None:
    task, lease, rollouts = await generate(bench, None)
    job, blob = seal_job(task, lease, rollouts)
    outcome = judge(bench, job, blob[:-1] + bytes([blob[-1] ^ 1]))
    assert outcome.reject_reason == ValidatorReason.BLOB_DIGEST_MISMATCH
    assert [c.check for c in outcome.checks] == ["integrity"]

    # A batch that answers another task's prompts (sealed consistently) is a batch mismatch.
    wrong = task_pb2.Task()
    wrong.CopyFrom(task)
    wrong.prompt_ids[0] += 1
    job, blob = seal_job(wrong, lease, rollouts)
    outcome = judge(bench, job, blob)
    assert outcome.reject_reason == ValidatorReason.BATCH_MISMATCH
    assert outcome.decode_tokens == 0

    # Too few rollouts for the task.
    job, blob = seal_job(task, lease, rollouts[:-1])
    assert judge(bench, job, blob).reject_reason == ValidatorReason.BATCH_MISMATCH


async def test_unprefillable_rollouts_are_rejected_without_running_them(bench: Bench) -> None:
    task, lease, rollouts = await generate(bench, None)
    vocab = bench.model.backend.vocab_size
    rollouts[0].completion_token_ids[0] = vocab + 5
    rollouts[1].completion_token_ids.extend([1] * (MAX_NEW_TOKENS + 1))
    job, blob = seal_job(task, lease, rollouts)
    outcome = judge(bench, job, blob)
    reasons = {(c.rollout_index, c.reason) for c in outcome.checks if not c.passed}
    assert (0, "TOKEN_OUT_OF_VOCABULARY") in reasons
    assert (1, "TOO_LONG") in reasons
    # The other rollouts were still prefilled and checked.
    assert all(
        c.passed for c in outcome.checks if c.HasField("rollout_index") and c.rollout_index >= 2
    )


async def test_a_seed_outside_63_bits_is_rejected_without_crashing(bench: Bench) -> None:
    # uint64 on the wire: a hostile worker can send a seed no digest or noise can take.
    task, lease, rollouts = await generate(bench, None)
    job, sealed = seal_job(task, lease, rollouts)
    batch = rollout_pb2.RolloutBatch.FromString(sealed)
    batch.rollouts[0].sampling_seed = 2**64 - 1
    blob = batch.SerializeToString(deterministic=True)
    commitment = job.commitment
    commitment.rollouts[0].sampling_seed = 2**64 - 1
    commitment.rollout_batch.blake3 = blake3.blake3(blob).digest()
    commitment.rollout_batch.size = len(blob)
    outcome = judge(bench, job, blob)
    failures = [(c.rollout_index, c.check, c.reason) for c in outcome.checks if not c.passed]
    assert failures[0] == (0, "binding", "SEED_NOT_DERIVED")
    assert outcome.reject_reason == "SEED_NOT_DERIVED"
    # The new blob hash breaks the other rollouts' digests; nothing else fails.
    assert {f[1:] for f in failures[1:]} == {("binding", "COMMITMENT_DIGEST_MISMATCH")}


async def test_oversized_rollouts_are_refused_from_their_lengths(bench: Bench) -> None:
    # A completion over the limit or a prompt longer than the assigned one is refused before
    # its tokens are copied or hashed (a hostile rollout may carry as many as the blob holds).
    task, lease, rollouts = await generate(bench, None)
    rollouts[0].completion_token_ids.extend([5] * 100_000)
    rollouts[1].prompt_token_ids.extend([5] * 100_000)
    job, blob = seal_job(task, lease, rollouts)
    outcome = judge(bench, job, blob)
    by_rollout: dict[int, set[tuple[str, str]]] = {}
    for check in outcome.checks:
        if check.HasField("rollout_index"):
            by_rollout.setdefault(check.rollout_index, set()).add((check.check, check.reason))
    assert by_rollout[0] == {("termination", "TOO_LONG")}
    assert by_rollout[1] == {("assigned_data", "PROMPT_NOT_ASSIGNED")}
    assert outcome.reject_reason == "TOO_LONG"
    assert all(c.passed for c in outcome.checks if c.rollout_index >= 2)


@pytest.mark.slow
async def test_a_job_whose_environment_cannot_be_rebuilt_here_is_not_judged(
    bench: Bench,
) -> None:
    # Not the worker's fault: no reject (which would slash it), an error the node turns into
    # an abandoned job for another validator.
    task, lease, rollouts = await generate(bench, None)
    unknown = task_pb2.Task()
    unknown.CopyFrom(task)
    unknown.environment = "no-such-environment"
    job, blob = seal_job(unknown, lease, rollouts)
    with pytest.raises(JobUncheckable, match="no-such-environment"):
        judge(bench, job, blob)
    # Prompt ids the environment does not have (the math example has 22 problems).
    task, lease, rollouts = await generate(bench, None, "math")
    del task.prompt_ids[:]
    task.prompt_ids.extend([500, 501])
    for rollout in rollouts:
        rollout.prompt_id = task.prompt_ids[rollout.prompt_index]
    job, blob = seal_job(task, lease, rollouts)
    with pytest.raises(JobUncheckable, match="cannot rebuild the assigned prompts"):
        judge(bench, job, blob)


async def test_an_empty_batch_is_not_accepted(bench: Bench) -> None:
    task, lease, _ = await generate(bench, None)
    empty = task_pb2.Task()
    empty.CopyFrom(task)
    del empty.prompt_ids[:]
    job, blob = seal_job(empty, lease, [])
    outcome = judge(bench, job, blob)
    assert outcome.reject_reason == ValidatorReason.BATCH_MISMATCH


async def test_behaviour_logprobs_the_trainer_will_use_are_checked(bench: Bench) -> None:
    # Forwarded to the trainer with accepted rollouts: NaN, a wrong count, positive values or
    # values off the validator's own are rejects, not poison for its loss.
    task, lease, honest = await generate(bench, None)
    job, blob = seal_job(task, lease, honest)
    accepted = judge(bench, job, blob)
    logprobs = [c for c in accepted.checks if c.check == "behaviour_logprobs"]
    errors = [c.figures["max_abs_error"] for c in logprobs]
    assert len(errors) == len(honest)
    assert max(errors) <= 1e-5  # fp32: the largest honest drift measured is 6.2e-7
    cases: dict[str, list[Callable[[rollout_pb2.Rollout], None]]] = {
        "LOGPROBS_MALFORMED": [
            lambda r: r.behaviour_logprobs.__setitem__(1, float("nan")),
            lambda r: r.behaviour_logprobs.append(-1.0),
            lambda r: r.behaviour_logprobs.__setitem__(0, 0.5),
        ],
        "LOGPROBS_MISMATCH": [
            lambda r: r.behaviour_logprobs.__setitem__(2, r.behaviour_logprobs[2] - 0.01),
        ],
    }
    for reason, edits in cases.items():
        for edit in edits:
            rollouts = [rollout_pb2.Rollout.FromString(r.SerializeToString()) for r in honest]
            edit(rollouts[1])
            job, blob = seal_job(task, lease, rollouts)
            outcome = judge(bench, job, blob)
            failed = [(c.rollout_index, c.check, c.reason) for c in outcome.checks if not c.passed]
            assert failed == [(1, "behaviour_logprobs", reason)], failed


async def test_an_accept_carries_the_validators_own_log_probabilities(bench: Bench) -> None:
    # The trainer's importance ratios use these: the prefill's log_softmax(logits / T) of each
    # completion token, in batch order, sent as float32 with an ACCEPT and never with a REJECT.
    task, lease, honest = await generate(bench, None)
    job, blob = seal_job(task, lease, honest)
    outcome = judge(bench, job, blob)
    assert outcome.accepted
    assert [len(v) for v in outcome.validated_logprobs] == [
        len(r.completion_token_ids) for r in honest
    ]
    prefills = bench.model.backend.prefill_batch(
        [(list(r.prompt_token_ids), list(r.completion_token_ids)) for r in honest]
    )
    for values, prefill, rollout in zip(outcome.validated_logprobs, prefills, honest, strict=True):
        expected = token_logprobs(prefill.logits, rollout.completion_token_ids, 1.0)
        np.testing.assert_allclose(values, expected, rtol=0, atol=1e-6)
    request = outcome.to_request(job.job_id, "lease", 1, "request")
    sent = [np.asarray(e.logprobs, dtype=np.float32) for e in request.validated_logprobs]
    assert len(sent) == len(honest)
    for values, mine in zip(sent, outcome.validated_logprobs, strict=True):
        assert np.array_equal(values, mine.astype(np.float32))
    # A rejected job's request carries none (the coordinator refuses them with a REJECT).
    rollouts = [rollout_pb2.Rollout.FromString(r.SerializeToString()) for r in honest]
    rollouts[0].behaviour_logprobs[0] -= 0.01
    job, blob = seal_job(task, lease, rollouts)
    rejected = judge(bench, job, blob)
    assert not rejected.accepted
    assert not rejected.to_request(job.job_id, "lease", 1, "request").validated_logprobs


async def test_rollouts_are_checked_in_groups_within_the_logits_budget(
    bench: Bench, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A job's logits (tokens x vocabulary) are held a group at a time; the verdict and every
    # figure are the same whatever the grouping.
    from rollnet.reference.validator import pipeline

    task, lease, rollouts = await generate(bench, Cheat.TOKEN_ALTERED)
    job, blob = seal_job(task, lease, rollouts)
    whole = judge(bench, job, blob)
    backend = bench.model.backend
    calls: list[int] = []
    real = backend.prefill_batch

    def counted(pairs: Any) -> Any:
        calls.append(len(pairs))
        return real(pairs)

    monkeypatch.setattr(backend, "prefill_batch", counted)
    judge(bench, job, blob)
    assert calls == [len(rollouts)]
    calls.clear()
    # Room for one rollout's logits per group (a group holds at most half the budget: two are
    # held at once, one checked while the next is prefilled).
    longest = max(len(r.completion_token_ids) for r in rollouts)
    monkeypatch.setattr(pipeline, "LOGITS_BUDGET", 2 * longest * backend.vocab_size)
    grouped = judge(bench, job, blob)
    # Greedy over the rollouts by length, as the pipeline groups them: short ones may share.
    ordered = sorted(rollouts, key=lambda r: len(r.prompt_token_ids) + len(r.completion_token_ids))
    expected: list[int] = []
    held = 0
    for rollout in ordered:
        size = len(rollout.completion_token_ids)
        if not expected or held + size > longest:
            expected.append(0)
            held = 0
        expected[-1] += 1
        held += size
    assert calls == expected
    assert len(calls) > 1
    # Prefills of other groupings pad differently, which moves the last bits of some figures.
    assert len(grouped.checks) == len(whole.checks)
    for one, other in zip(grouped.checks, whole.checks, strict=True):
        assert (one.check, one.passed, one.reason, one.rollout_index) == (
            other.check,
            other.passed,
            other.reason,
            other.rollout_index,
        )
        # Figures measured in tolerances (``*_fraction``) are ratios of the honest numeric noise
        # itself, which the padding moves by tens of percent: compared on the tolerance's scale.
        noise = {k for k in one.figures if k.endswith("_fraction")}
        assert {k: v for k, v in one.figures.items() if k not in noise} == pytest.approx(
            {k: v for k, v in other.figures.items() if k not in noise}, rel=1e-5, abs=1e-6
        )
        for key in noise:
            # (Far from the bound, a figure is thousands of tolerances: relative there.)
            assert one.figures[key] == pytest.approx(other.figures[key], rel=1e-4, abs=0.01), key
    assert list(grouped.validated_rewards) == list(whole.validated_rewards)


async def test_a_claim_is_not_slashed_when_the_validators_verifier_did_not_finish(
    bench: Bench, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Verifier timing differs between machines (a warm sympy cache, a completion on
    # math-verify's limit): when the validator's own verifier ran out of time, its value (the
    # environment's unverifiable_reward, which the trainer gets) proves nothing about the claim.
    task, lease, rollouts = await generate(bench, None)
    job, blob = seal_job(task, lease, rollouts)

    def timed_out(environment: Any, items: Any) -> list[RewardResult]:
        return [
            RewardResult(environment.unverifiable_reward(problem, count), "time_limit")
            for problem, _, count in items
        ]

    monkeypatch.setattr(bench.environments.sandbox, "rewards", timed_out)
    outcome = judge(bench, job, blob)
    assert outcome.accepted, [c for c in outcome.checks if not c.passed]
    rewards = [c for c in outcome.checks if c.check == "reward"]
    assert all(c.figures["verifier_failed"] == 1.0 for c in rewards)
    assert all(r.task_reward == 0.0 for r in outcome.validated_rewards)
    assert any("time_limit" in note for note in outcome.notes)


async def test_a_blob_larger_than_any_batch_for_its_task_is_judged_unread(bench: Bench) -> None:
    task, lease, rollouts = await generate(bench, None)
    job, _ = seal_job(task, lease, rollouts)
    assert refuse_oversized(job) is None
    limit = max_batch_bytes(len(rollouts), task.sampling.max_new_tokens)
    job.commitment.rollout_batch.size = limit + 1
    outcome = refuse_oversized(job)
    assert outcome is not None
    assert outcome.reject_reason == ValidatorReason.BATCH_TOO_LARGE
    assert judge(bench, job, b"").reject_reason == ValidatorReason.BATCH_TOO_LARGE


async def test_a_claim_of_the_unverifiable_reward_is_not_slashed(
    bench: Bench, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker's verifier hit its limit (there, not here): it claims the environment's
    # unverifiable_reward; the validator's verifier finishes with another value, which counts.
    task, lease, rollouts = await generate(bench, None)
    environment = bench.environments.get("arithmetic", {})
    for rollout in rollouts:
        problem = environment.prompt(int(rollout.prompt_id))
        fallback = environment.unverifiable_reward(problem, len(rollout.completion_token_ids))
        rollout.claimed_reward.task_reward = fallback.task_reward
        rollout.claimed_reward.length_penalty = fallback.length_penalty
        rollout.claimed_reward.total = fallback.total
    job, blob = seal_job(task, lease, rollouts)

    def solved(environment: Any, items: Any) -> list[RewardResult]:
        results = []
        for problem, _, count in items:
            penalty = environment.unverifiable_reward(problem, count).length_penalty
            results.append(RewardResult(RewardBreakdown(1.0, penalty, 1.0 - penalty)))
        return results

    monkeypatch.setattr(bench.environments.sandbox, "rewards", solved)
    outcome = judge(bench, job, blob)
    assert outcome.accepted, [c for c in outcome.checks if not c.passed]
    rewards = [c for c in outcome.checks if c.check == "reward"]
    assert all(c.figures["claimed_unverifiable"] == 1.0 for c in rewards)
    assert all(r.task_reward == 1.0 for r in outcome.validated_rewards)
    # A claim of anything else that differs is still a reject.
    rollouts[0].claimed_reward.task_reward = 0.5
    job, blob = seal_job(task, lease, rollouts)
    assert judge(bench, job, blob).reject_reason == ValidatorReason.REWARD_MISMATCH


@pytest.mark.usefixtures("sandbox_host")
@pytest.mark.slow
async def test_code_rewards_are_recomputed_in_the_sandbox_and_a_differing_claim_rejected(
    bench: Bench,
) -> None:
    # The whole completion is the program: the tiny model's text runs against the tests, on the
    # worker's side and again here, each test in a sandbox of its own.
    task, lease, rollouts = await generate(bench, None, "code", {"program": "completion"})
    job, blob = seal_job(task, lease, rollouts)
    outcome = await asyncio.to_thread(judge, bench, job, blob)
    assert outcome.accepted, [c for c in outcome.checks if not c.passed]
    assert [r.total for r in outcome.validated_rewards] == [
        r.claimed_reward.total for r in rollouts
    ]
    rollouts[1].claimed_reward.task_reward = rollouts[1].claimed_reward.total = 1.0
    job, blob = seal_job(task, lease, rollouts)
    outcome = await asyncio.to_thread(judge, bench, job, blob)
    assert outcome.reject_reason == ValidatorReason.REWARD_MISMATCH
    failed = [c for c in outcome.checks if not c.passed]
    assert [(c.check, c.rollout_index) for c in failed] == [("reward", 1)]
