"""Turn one validation job into a verdict: every check of ``docs/validator.md``, with figures.

:func:`validate_job` is pure with respect to the network: it takes the job, the blob bytes the
validator downloaded and a loaded checkpoint (:class:`CheckpointModel`), and returns a
:class:`JobOutcome` that converts to a ``SubmitVerdictRequest``. The order of work:

1. **integrity** — the blob hashes to the commitment's BLAKE3 digest and size;
2. **batch** — it decodes as a ``RolloutBatch`` that answers this commitment and task: task, lease,
   fencing token, node and checkpoint step, ``len(prompt_ids) × samples_per_prompt`` rollouts in
   ``(prompt_index, sample_index)`` order for the task's prompt ids, and the commitment's
   per-rollout digests (seed, proof digest, completion length) match the rollouts;
3. per rollout, the proofs library's checks (:func:`rollnet.sdk.proofs.verify_rollout`): binding,
   assigned data, termination, TOPLOC, sampling — fed by ONE batched prefill of every
   *challenged* rollout's assigned prompt followed by its claimed completion. The job's
   post-commitment challenge (:mod:`rollnet.sdk.proofs.challenge`, signed by the coordinator
   after the commitment was recorded) names ``challenged_rollouts`` of the batch; the others
   get the checks that need no model (binding, assigned data): their tokens and proofs are
   bound by the commitment, so a bad one is caught whenever the challenge draws it;
4. per rollout that passed every check above, **reward**: the environment's verifier on the
   completion, run in a :class:`~rollnet.reference.envs.RewardSandbox` (a child process with a
   hard time limit per completion), must give exactly the claimed reward (tolerance 0; rewards
   are IEEE-754 binary64 and deterministic). A rollout that failed another check is not scored:
   the job is rejected anyway, and its completion is text the worker chose, not the model.

The verdict is ACCEPT only when every check of every rollout passed. A reject names the first
failing check's reason: batch-level checks first, then rollouts in batch order, and within a
rollout the order above.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

import blake3
import numpy as np
import numpy.typing as npt
from google.protobuf import json_format
from google.protobuf.message import DecodeError

from rollnet.reference.envs import (
    Environment,
    Problem,
    RewardResult,
    RewardSandbox,
    load_environment,
)
from rollnet.reference.inference.base import Prefill
from rollnet.reference.inference.tokenization import CheckpointTokenizer
from rollnet.sdk import batches
from rollnet.sdk.batches import BatchRule, BatchTerms
from rollnet.sdk.commitments import max_batch_bytes
from rollnet.sdk.prompts import encode_problem
from rollnet.sdk.proofs import (
    CheckName,
    LeaseBinding,
    Reason,
    RolloutAssignment,
    RolloutClaim,
    Thresholds,
    check_assigned_data,
    check_binding,
    verify_rollouts,
)
from rollnet.sdk.proofs import CheckResult as ProofCheck
from rollnet.sdk.proofs.challenge import challenged_rollouts, verify_challenge
from rollnet.sdk.proofs.logit_figures import TokenFigures, token_figures
from rollnet.sdk.proofs.sampling import MAX_SEED, LogprobBounds
from rollnet.sdk.proofs.statistics import RolloutStatistics, rollout_statistics_from_figures
from rollnet.sdk.proofs.thresholds import logprob_bounds
from rollnet.v1 import (
    commitment_pb2,
    common_pb2,
    rollout_pb2,
    validation_pb2,
    validation_service_pb2,
)

_FINISH = {rollout_pb2.FINISH_REASON_EOS: "eos", rollout_pb2.FINISH_REASON_LENGTH: "length"}


class ValidatorCheck(StrEnum):
    """Checks the validator runs besides the proofs library's per-rollout ones."""

    INTEGRITY = "integrity"
    BATCH = "batch"
    LOGPROBS = "behaviour_logprobs"
    REWARD = "reward"


class ValidatorReason(StrEnum):
    """Reject reasons of the validator's own checks (the proofs library's are
    :class:`rollnet.sdk.proofs.Reason`)."""

    BLOB_DIGEST_MISMATCH = "BLOB_DIGEST_MISMATCH"
    BATCH_UNDECODABLE = "BATCH_UNDECODABLE"
    BATCH_MISMATCH = "BATCH_MISMATCH"
    BATCH_TOO_LARGE = "BATCH_TOO_LARGE"
    LOGPROBS_MALFORMED = "LOGPROBS_MALFORMED"
    LOGPROBS_MISMATCH = "LOGPROBS_MISMATCH"
    REWARD_MISMATCH = "REWARD_MISMATCH"
    TARGET_LENGTH_MISMATCH = "TARGET_LENGTH_MISMATCH"


class JobUncheckable(Exception):
    """This validator cannot judge the job for a reason that is not the worker's (the task's
    environment or prompts cannot be rebuilt here): give no verdict, let another try."""


class ChallengeInvalid(JobUncheckable):
    """The job's challenge is not the coordinator's signature of it (or there is no key to
    check it against): which rollouts to check is unknown, and none of that is the worker's
    doing, so there is no verdict."""


class PrefillBackend(Protocol):
    """What validation needs from an inference backend (``TorchBackend`` provides it)."""

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Token ids that end a completion."""

    @property
    def vocab_size(self) -> int:
        """Size of the LM head's output."""

    def prefill_batch(
        self, rollouts: Sequence[tuple[Sequence[int], Sequence[int]]]
    ) -> list[Prefill]:
        """Hidden states and logits of each rollout's completion positions."""


@dataclass(frozen=True)
class CheckpointModel:
    """A loaded, manifest-verified checkpoint: the backend, its tokenizer and thresholds."""

    step: int
    backend: PrefillBackend
    tokenizer: CheckpointTokenizer
    thresholds: Thresholds


class EnvironmentCache:
    """Environments by (name, configuration), built once: building one may load a dataset.

    Rewards are recomputed in ``sandbox`` (a :class:`RewardSandbox`: a child process with a
    hard time limit per completion); :meth:`close` stops it.
    """

    def __init__(self, sandbox: RewardSandbox | None = None) -> None:
        self._environments: dict[tuple[str, str], Environment] = {}
        self.sandbox = sandbox if sandbox is not None else RewardSandbox()

    def close(self) -> None:
        """Stop the reward sandbox's child process."""
        self.sandbox.close()

    def get(self, name: str, config: Mapping[str, Any]) -> Environment:
        """The environment ``name`` with ``config`` (JSON data), checked to be scorable by the
        sandbox here (:meth:`RewardSandbox.check`)."""
        key = (name, json.dumps(config, sort_keys=True))
        environment = self._environments.get(key)
        if environment is None:
            environment = load_environment(name, dict(config))
            self.sandbox.check(environment)
            self._environments[key] = environment
        return environment


@dataclass
class JobOutcome:
    """The verdict on one job, ready to submit."""

    checks: list[validation_pb2.CheckResult] = field(default_factory=list)
    validated_rewards: list[common_pb2.Reward] = field(default_factory=list)
    prefill_tokens: int = 0
    decode_tokens: int = 0
    validated_logprobs: list[npt.NDArray[np.float64]] = field(default_factory=list)
    """Per rollout in batch order, this validator's log-probability of each completion token
    under the task's sampling distribution (its prefill's; set when every challenged rollout
    was prefilled and its log-probability check ran; empty for a rollout the challenge did not
    draw). Sent with an ACCEPT, as float32."""
    challenged: tuple[int, ...] = ()
    """The rollouts checked in full (prefilled), by batch index."""
    prefill_seconds: float = 0.0
    """Wall seconds spent in the backend's prefills (the floor of the job's cost)."""
    rollout_statistics: list[RolloutStatistics] = field(default_factory=list)
    """Per rollout in batch order, its statistics for the coordinator's per-node tests (an empty
    entry for a rollout the challenge did not draw). Sent with an ACCEPT."""
    notes: list[str] = field(default_factory=list)
    """Human-readable details of batch-level failures (for logs; not sent)."""

    @property
    def accepted(self) -> bool:
        """True when every check passed (and there was at least one)."""
        return bool(self.checks) and all(c.passed for c in self.checks)

    @property
    def reject_reason(self) -> str:
        """The first failing check's reason; empty when accepted."""
        for check in self.checks:
            if not check.passed:
                return check.reason
        return ""

    @property
    def failed_checks(self) -> set[str]:
        """Names of the checks that failed (for any rollout)."""
        return {c.check for c in self.checks if not c.passed}

    def to_request(
        self, job_id: str, lease_id: str, fencing_token: int, request_id: str
    ) -> validation_service_pb2.SubmitVerdictRequest:
        """The ``SubmitVerdict`` request carrying this outcome."""
        decision = (
            validation_pb2.Verdict.DECISION_ACCEPT
            if self.accepted
            else validation_pb2.Verdict.DECISION_REJECT
        )
        return validation_service_pb2.SubmitVerdictRequest(
            request_id=request_id,
            job_id=job_id,
            lease_id=lease_id,
            fencing_token=fencing_token,
            decision=decision,
            reject_reason=self.reject_reason,
            checks=self.checks,
            validated_rewards=self.validated_rewards,
            validated_work=commitment_pb2.WorkClaim(
                prefill_tokens=self.prefill_tokens, decode_tokens=self.decode_tokens
            ),
            # The trainer's importance ratios use these, never the worker's numbers.
            validated_logprobs=(
                [
                    validation_pb2.ValidatedLogprobs(logprobs=values.astype(np.float32).tolist())
                    for values in self.validated_logprobs
                ]
                if self.accepted
                else []
            ),
            rollout_statistics=(
                [
                    validation_pb2.RolloutStatistics(
                        tokens=stats.tokens,
                        near_tie_losses=stats.near_tie_losses,
                        near_tie_wins=stats.near_tie_wins,
                        logprob_excess=stats.logprob_excess,
                        logprob_variance=stats.logprob_variance,
                        eos_near_tie_losses=stats.eos_near_tie_losses,
                        eos_near_tie_passes=stats.eos_near_tie_passes,
                        logprob_dispersion=stats.logprob_dispersion,
                        dispersion_tokens=stats.dispersion_tokens,
                    )
                    for stats in self.rollout_statistics
                ]
                if self.accepted
                else []
            ),
        )


_NUMBERS = (int, float)
"""Figure values the wire keeps (bool is an int: it becomes 0.0 / 1.0)."""


def _result(
    check: str,
    passed: bool,
    reason: str = "",
    figures: Mapping[str, Any] | None = None,
    rollout_index: int | None = None,
) -> validation_pb2.CheckResult:
    result = validation_pb2.CheckResult(check=check, passed=passed, reason="" if passed else reason)
    if figures:
        # The wire keeps finite numbers only; labels (strings) stay in the logs. Stored item
        # by item as they are filtered (~1,500 figures per 32-rollout job): a dict handed to
        # the constructor goes through the generic (pure Python) MutableMapping.update, twice
        # as slow, and an intermediate dict costs a second loop.
        stored = result.figures
        isfinite = math.isfinite
        for key, value in figures.items():
            # A tuple, not int | float: isinstance against a tuple is about twice as fast.
            if isinstance(value, _NUMBERS):
                number = float(value)
                if isfinite(number):
                    stored[key] = number
    if rollout_index is not None:
        result.rollout_index = rollout_index
    return result


def _from_proof(check: ProofCheck, rollout_index: int) -> validation_pb2.CheckResult:
    reason = check.reason.value if check.reason is not None else ""
    return _result(check.name.value, check.passed, reason, check.figures, rollout_index)


def job_binding(job: validation_pb2.ValidationJob) -> LeaseBinding:
    """The lease the job's commitment was made under."""
    commitment = job.commitment
    return LeaseBinding(
        network_id=job.network_id,
        node_id=commitment.node_id,
        task_id=commitment.task_id,
        lease_id=commitment.lease_id,
        fencing_token=commitment.fencing_token,
    )


def _batch_problems(
    job: validation_pb2.ValidationJob, batch: rollout_pb2.RolloutBatch
) -> list[str]:
    problems = batches.check(
        job_binding(job), BatchTerms.of_task(job.task), batch, job.commitment.rollouts
    )
    # A seed that is not the derived one is judged per rollout by the binding check, whose
    # verdict names the rollout and the reason (SEED_NOT_DERIVED).
    notes = (p.note for p in problems if p.rule is not BatchRule.SEED_NOT_DERIVED)
    return list(dict.fromkeys(notes))


def validate_job(
    job: validation_pb2.ValidationJob,
    blob: bytes,
    model: CheckpointModel,
    environments: EnvironmentCache,
    coordinator_public_key: bytes = b"",
) -> JobOutcome:
    """Run every check on ``job`` whose rollout blob is ``blob``; see the module docs.

    A job with a ``challenge`` needs ``coordinator_public_key`` to check it
    (:class:`ChallengeInvalid` when it does not verify)."""
    oversized = refuse_oversized(job)
    if oversized is not None:
        return oversized
    challenged = job_challenge(job, coordinator_public_key)
    outcome = JobOutcome()
    commitment = job.commitment
    expected = commitment.rollout_batch
    digest = blake3.blake3(blob).digest()
    intact = digest == expected.blake3 and len(blob) == expected.size
    outcome.checks.append(
        _result(
            ValidatorCheck.INTEGRITY,
            intact,
            ValidatorReason.BLOB_DIGEST_MISMATCH,
            {"blob_bytes": len(blob), "declared_bytes": expected.size},
        )
    )
    if not intact:
        return outcome
    try:
        batch = rollout_pb2.RolloutBatch.FromString(blob)
    except DecodeError:
        outcome.checks.append(
            _result(ValidatorCheck.BATCH, False, ValidatorReason.BATCH_UNDECODABLE)
        )
        return outcome
    problems = _batch_problems(job, batch)
    outcome.checks.append(
        _result(
            ValidatorCheck.BATCH,
            not problems,
            ValidatorReason.BATCH_MISMATCH,
            {
                "rollouts": len(batch.rollouts),
                "problems": len(problems),
                "challenged_rollouts": len(challenged),
            },
        )
    )
    if problems:
        outcome.notes.extend(problems)
        return outcome
    outcome.challenged = challenged
    _validate_rollouts(job, batch, model, environments, outcome)
    return outcome


def job_challenge(
    job: validation_pb2.ValidationJob, coordinator_public_key: bytes
) -> tuple[int, ...]:
    """The batch indexes ``job``'s challenge draws for full checks (every index when the job
    has none); :class:`ChallengeInvalid` when the challenge is not the coordinator's signature."""
    task = job.task
    rollouts = len(task.prompt_ids) * task.samples_per_prompt
    if not job.challenge:
        return tuple(range(rollouts))
    commitment = job.commitment
    if not coordinator_public_key:
        raise ChallengeInvalid("the job has a challenge and no coordinator key to check it")
    if not verify_challenge(
        coordinator_public_key,
        job.challenge,
        job.network_id,
        commitment.commitment_id,
        commitment.binding_digest,
        rollouts,
        job.challenged_rollouts,
    ):
        raise ChallengeInvalid(
            f"challenge of job {job.job_id} is not the coordinator's signature of commitment "
            f"{commitment.commitment_id} ({rollouts} rollouts, {job.challenged_rollouts} "
            "challenged)"
        )
    return challenged_rollouts(job.challenge, rollouts, job.challenged_rollouts)


def refuse_oversized(job: validation_pb2.ValidationJob) -> JobOutcome | None:
    """The verdict on a job whose declared blob is larger than any batch for its task may be
    (:func:`rollnet.sdk.commitments.max_batch_bytes`), reached without downloading the blob;
    ``None`` when the size is within bounds."""
    task = job.task
    rollouts = len(task.prompt_ids) * task.samples_per_prompt
    limit = max_batch_bytes(rollouts, task.sampling.max_new_tokens)
    size = job.commitment.rollout_batch.size
    if size <= limit:
        return None
    outcome = JobOutcome()
    outcome.checks.append(
        _result(
            ValidatorCheck.BATCH,
            False,
            ValidatorReason.BATCH_TOO_LARGE,
            {"declared_bytes": size, "max_bytes": limit},
        )
    )
    return outcome


@dataclass
class _Slot:
    """One rollout on its way through the checks."""

    index: int
    rollout: rollout_pb2.Rollout
    claim: RolloutClaim
    assignment: RolloutAssignment | None = None
    problem: Problem | None = None
    checks: list[validation_pb2.CheckResult] = field(default_factory=list)
    logprobs: npt.NDArray[np.float64] | None = None
    """The validator's log-probability of each completion token, once its check computed them."""
    challenged: bool = True
    """Whether the job's challenge drew it for the checks that need the model."""
    statistics: RolloutStatistics | None = None
    """Its per-node statistics, once its prefill ran."""


_EMPTY_CLAIM = RolloutClaim((), (), "unspecified", b"", 0, 0, b"")
"""Stands in for the claim of a rollout refused from its lengths alone (never checked)."""


def _validate_rollouts(
    job: validation_pb2.ValidationJob,
    batch: rollout_pb2.RolloutBatch,
    model: CheckpointModel,
    environments: EnvironmentCache,
    outcome: JobOutcome,
) -> None:
    commitment, task = job.commitment, job.task
    lease = job_binding(job)
    blob_digest = commitment.rollout_batch.blake3
    temperature = task.sampling.temperature
    max_new_tokens = task.sampling.max_new_tokens
    backend = model.backend
    vocab = backend.vocab_size
    try:
        environment = environments.get(
            task.environment, json_format.MessageToDict(task.environment_config)
        )
        # The batch's prompt ids are the task's (checked above): each problem and its tokens
        # once, before any rollout.
        assigned_prompts: dict[int, tuple[Problem, list[int]]] = {}
        for prompt_id in dict.fromkeys(int(p) for p in task.prompt_ids):
            problem = environment.prompt(prompt_id)
            assigned_prompts[prompt_id] = (problem, encode_problem(model.tokenizer, problem))
    except Exception as error:
        # Not the worker's doing: the trainer chose the environment and prompts, and the
        # coordinator accepted them. This validator cannot judge the job; another may.
        raise JobUncheckable(
            f"environment {task.environment!r}: cannot rebuild the assigned prompts here: "
            f"{type(error).__name__}: {error}"
        ) from error

    challenged = frozenset(outcome.challenged)
    slots: list[_Slot] = []
    for index, rollout in enumerate(batch.rollouts):
        problem, assigned = assigned_prompts[int(rollout.prompt_id)]
        oversized = _oversized(rollout, index, len(assigned), max_new_tokens)
        if oversized:
            # Refused before its tokens are copied or hashed: a hostile rollout may carry as
            # many as the blob holds.
            slot = _Slot(index, rollout, _EMPTY_CLAIM, problem=None, checks=oversized)
            slots.append(slot)
            continue
        claim = RolloutClaim(
            prompt_ids=tuple(rollout.prompt_token_ids),
            completion_ids=tuple(rollout.completion_token_ids),
            finish_reason=_FINISH.get(rollout.finish_reason, "unspecified"),
            proof=rollout.toploc_proof,
            sampling_seed=rollout.sampling_seed,
            rollout_index=index,
            commitment_digest=commitment.rollouts[index].commitment_digest,
        )
        slot = _Slot(index, rollout, claim, problem=problem)
        slots.append(slot)
        slot.assignment = RolloutAssignment(
            lease=lease,
            blob_blake3=blob_digest,
            assigned_prompt_ids=tuple(assigned),
            temperature=temperature,
            max_new_tokens=max_new_tokens,
            eos_token_ids=backend.eos_token_ids,
        )
        completion = slot.claim.completion_ids
        # Guards before the model runs: a token outside the vocabulary cannot be embedded.
        # (Counted only when there is one: max() runs in C, the count per token in Python.)
        out_of_vocabulary = (
            sum(1 for t in completion if t >= vocab)
            if completion and max(completion) >= vocab
            else 0
        )
        # A seed outside the 63-bit range cannot be derived, hashed into a digest or used for
        # noise: judged without the model, so a hostile batch cannot crash the validator.
        if out_of_vocabulary or not 0 <= rollout.sampling_seed <= MAX_SEED:
            slot.checks.extend(_unprefillable(slot, out_of_vocabulary))
            slot.assignment = None
        elif index not in challenged:
            # Its tokens and proof are bound by the commitment digest checked here; whether
            # the model produced them is checked only when a challenge draws it.
            slot.challenged = False
            slot.checks.extend(_unprefillable(slot, 0))
            slot.assignment = None

    # Batched prefills over every challenged rollout (assigned prompt + claimed completion),
    # then every check, the numeric ones vectorized across the rollouts of a group. Two groups
    # are held at once (one checked while the next is prefilled), each within half of
    # LOGITS_BUDGET (one rollout at least): a job's logits are tokens x vocabulary, 40 GB for 64
    # rollouts of 1,024 tokens at a 152k vocabulary. Sorted by length, so the backend's
    # right-padded chunks waste few positions on padding.
    ready = sorted(
        (s for s in slots if s.assignment is not None),
        key=lambda s: len(s.claim.prompt_ids) + len(s.claim.completion_ids),
    )
    unchallenged = [s for s in slots if not s.challenged and _scorable(s)]
    with _RewardScorer(environment, environments.sandbox, model.tokenizer) as scorer:
        # Rollouts the challenge left out are scored while the others are prefilled.
        scorer.submit(unchallenged)
        outcome.prefill_seconds = _check_pipelined(
            _logit_groups(ready, vocab, PIPELINE_ROLLOUTS),
            backend,
            temperature,
            model.thresholds,
            scorer,
        )
        rewards = scorer.results()
    # The work this job's checks covered: the rollouts that were prefilled (all of them in an
    # honest batch; a padded, refused rollout must not count as validated tokens), and those
    # the challenge left out whose commitment binds them (the challenge vouches for them: a
    # batch with bad ones among them is rejected whenever it draws one).
    vouched = [*ready, *unchallenged]
    outcome.prefill_tokens = sum(len(s.claim.prompt_ids) for s in vouched)
    outcome.decode_tokens = sum(len(s.claim.completion_ids) for s in vouched)
    _reward_checks(slots, rewards, environment, outcome)
    for slot in slots:
        outcome.checks.extend(slot.checks)
    if all(slot.logprobs is not None or not slot.challenged for slot in slots):
        outcome.validated_logprobs = [
            slot.logprobs if slot.logprobs is not None else _NO_LOGPROBS for slot in slots
        ]
    summaries = [slot.statistics if slot.challenged else _NO_STATISTICS for slot in slots]
    # All or none, and only finite sums (masked -inf logits of an accepted rollout make NaN
    # moments): the coordinator refuses a verdict whose statistics are not finite.
    if all(
        s is not None and math.isfinite(s.logprob_excess) and math.isfinite(s.logprob_variance)
        for s in summaries
    ):
        outcome.rollout_statistics = [s for s in summaries if s is not None]


_NO_LOGPROBS: npt.NDArray[np.float64] = np.zeros(0)
"""The validated log-probabilities of a rollout the challenge did not draw: none."""
_NO_STATISTICS = RolloutStatistics(
    tokens=0, near_tie_losses=0, near_tie_wins=0, logprob_excess=0.0, logprob_variance=0.0
)
"""The statistics of a rollout the challenge did not draw: no tokens summarized."""


LOGITS_BUDGET = 1 << 28
"""Logits (completion tokens x vocabulary) the validator may hold at once: 1 GiB of float32.
Two groups are held at once (one checked while the next is prefilled), so a group holds at
most half. The tiny model's whole job fits; at a 152k vocabulary a group is ~850 tokens."""

PIPELINE_ROLLOUTS = 64
"""Rollouts per pipeline group at most: the checks of one group run while the next is
prefilled. Smaller groups would hide more of the checks where a core is free, but on a busy
host (measured: 2 cores at load 14-23) the hand-offs cost more than they hide (groups of 16:
1.73x a bare prefill, one group: 1.41x), so a job is split where the logits budget splits it
(real vocabularies: long prefills per group), and the tiny model's jobs are one group."""


def _logit_groups(slots: Sequence[_Slot], vocab: int, most: int | None = None) -> list[list[_Slot]]:
    """Consecutive groups of ``slots`` within half of :data:`LOGITS_BUDGET` and of at most
    ``most`` rollouts (one rollout at least)."""
    groups: list[list[_Slot]] = []
    held = 0
    for slot in slots:
        size = len(slot.claim.completion_ids) * vocab
        if not groups or held + size > LOGITS_BUDGET // 2 or len(groups[-1]) == most:
            groups.append([])
            held = 0
        groups[-1].append(slot)
        held += size
    return groups


def _check_pipelined(
    groups: Sequence[Sequence[_Slot]],
    backend: PrefillBackend,
    temperature: float,
    thresholds: Thresholds,
    scorer: _RewardScorer,
) -> float:
    """Prefill each group on this thread while the previous group is checked on another (and
    its rewards scored on a third, in the sandbox's child process): the prefill is the floor of
    a job's cost, and the checks and the verifier run beside it rather than after it. At most
    two groups' prefills are held at once. Returns the prefills' wall seconds."""
    prefill_seconds = 0.0
    if len(groups) == 1:
        # Nothing to overlap the checks with: no hand-off to another thread.
        started = time.perf_counter()
        prefills = _prefill(groups[0], backend)
        prefill_seconds = time.perf_counter() - started
        _check_group(groups[0], prefills, temperature, thresholds, scorer)
        return prefill_seconds
    with ThreadPoolExecutor(1, thread_name_prefix="validator-checks") as checker:
        checking: Future[None] | None = None
        try:
            for group in groups:
                started = time.perf_counter()
                prefills = _prefill(group, backend)
                prefill_seconds += time.perf_counter() - started
                if checking is not None:
                    checking.result()
                checking = checker.submit(
                    _check_group, group, prefills, temperature, thresholds, scorer
                )
            if checking is not None:
                checking.result()
        finally:
            if checking is not None:
                checking.cancel()
    return prefill_seconds


def _prefill(group: Sequence[_Slot], backend: PrefillBackend) -> list[Prefill]:
    """One batched prefill of a group's assigned prompts and claimed completions."""
    pairs = []
    for slot in group:
        assert slot.assignment is not None
        pairs.append((slot.assignment.assigned_prompt_ids, slot.claim.completion_ids))
    return backend.prefill_batch(pairs)


def _check_group(
    group: Sequence[_Slot],
    prefills: Sequence[Prefill],
    temperature: float,
    thresholds: Thresholds,
    scorer: _RewardScorer,
) -> None:
    """Run the proofs library's checks and the log-probability check on each rollout of a
    prefilled group, then hand those that passed to ``scorer``; the prefill (hidden states,
    logits) is dropped when done."""
    assignments = []
    for slot in group:
        assert slot.assignment is not None
        assignments.append(slot.assignment)
    # Every per-token figure of the sampling, termination, log-probability and statistics
    # checks, in one pass over the group's logits (they used to walk them four times).
    figures = token_figures(
        [p.logits for p in prefills],
        [s.claim.completion_ids for s in group],
        seeds=[s.claim.sampling_seed for s in group],
        temperature=temperature,
        thresholds=thresholds,
        eos_token_ids=assignments[0].eos_token_ids if assignments else frozenset(),
    )
    reports = verify_rollouts(
        [s.claim for s in group],
        assignments,
        hidden_states=[p.hidden_states for p in prefills],
        logits=[p.logits for p in prefills],
        thresholds=thresholds,
        figures=figures,
    )
    summaries = rollout_statistics_from_figures(
        figures,
        [p.logits for p in prefills],
        [s.claim.completion_ids for s in group],
        [s.claim.sampling_seed for s in group],
        # The worker's behaviour log-probabilities: their dispersion around the validator's.
        [list(s.rollout.behaviour_logprobs) for s in group],
    )
    for slot, report, summary in zip(group, reports, summaries, strict=True):
        slot.statistics = summary
        slot.checks.extend(_from_proof(c, slot.index) for c in report.checks)
    accepted = [number for number, report in enumerate(reports) if report.accepted]
    for number, check in zip(accepted, _logprobs_checks(group, accepted, figures), strict=True):
        group[number].checks.append(check)
    scorer.submit([slot for slot in group if _scorable(slot)])


def _oversized(
    rollout: rollout_pb2.Rollout, index: int, assigned_tokens: int, max_new_tokens: int
) -> list[validation_pb2.CheckResult]:
    """Failing checks of a rollout longer than it may be (the completion over the limit, or
    the prompt longer than the assigned one), found from the lengths alone; empty if neither."""
    checks = []
    prompt_tokens = len(rollout.prompt_token_ids)
    if prompt_tokens > assigned_tokens:
        figures = {"assigned_tokens": assigned_tokens, "claimed_tokens": prompt_tokens}
        checks.append(
            _result(CheckName.ASSIGNED_DATA, False, Reason.PROMPT_NOT_ASSIGNED, figures, index)
        )
    length = len(rollout.completion_token_ids)
    if length > max_new_tokens:
        figures = {"completion_tokens": length, "max_new_tokens": max_new_tokens}
        checks.append(_result(CheckName.TERMINATION, False, Reason.TOO_LONG, figures, index))
    return checks


def _unprefillable(slot: _Slot, out_of_vocabulary: int) -> list[validation_pb2.CheckResult]:
    """Checks for a rollout the model will not run on (a token outside the vocabulary, a seed
    outside the 63-bit range, a rollout the challenge did not draw): binding and assigned data
    still apply."""
    assert slot.assignment is not None
    claim, assignment = slot.claim, slot.assignment
    if 0 <= claim.sampling_seed <= MAX_SEED:
        binding = _from_proof(
            check_binding(
                assignment.lease,
                blob_blake3=assignment.blob_blake3,
                rollout_index=claim.rollout_index,
                claimed_seed=claim.sampling_seed,
                claimed_digest=claim.commitment_digest,
                prompt_ids=claim.prompt_ids,
                completion_ids=claim.completion_ids,
                proof=claim.proof,
            ),
            slot.index,
        )
    else:
        binding = _result(
            CheckName.BINDING,
            False,
            Reason.SEED_NOT_DERIVED,
            {"rollout_index": claim.rollout_index, "claimed_seed": claim.sampling_seed},
            slot.index,
        )
    checks = [
        binding,
        _from_proof(
            check_assigned_data(assignment.assigned_prompt_ids, claim.prompt_ids), slot.index
        ),
    ]
    if out_of_vocabulary:
        checks.append(
            _result(
                CheckName.SAMPLING,
                False,
                Reason.TOKEN_OUT_OF_VOCABULARY,
                {"out_of_vocabulary_tokens": out_of_vocabulary},
                slot.index,
            )
        )
    return checks


def _logprobs_checks(
    group: Sequence[_Slot], numbers: Sequence[int], per_token: TokenFigures
) -> list[validation_pb2.CheckResult]:
    """The log-probability check of ``group[number]`` for each of ``numbers`` (rollouts of the
    group, whose rows ``per_token`` holds): the behaviour log-probabilities the trainer will
    use, one per completion token, finite, at most 0, and each inside the interval the error
    model gives around the validator's own (:meth:`TokenFigures.logprob_bounds`,
    :func:`rollnet.sdk.proofs.token_logprob_bounds`'s figures: every logit difference moved
    by the row's logit tolerance; ``docs/verification.md``, "Error model").

    The arithmetic is elementwise, so it runs once over every token of the group (the same
    values as per rollout), and each rollout's figures are reductions of its rows."""
    starts = per_token.starts.tolist()
    results: dict[int, validation_pb2.CheckResult] = {}
    claimed: dict[int, npt.NDArray[np.float64]] = {}
    for number in numbers:
        slot = group[number]
        values = np.asarray(slot.rollout.behaviour_logprobs, dtype=np.float64)
        tokens = starts[number + 1] - starts[number]
        if values.size != tokens or not bool(np.all(np.isfinite(values) & (values <= 0))):
            figures: dict[str, float] = {"tokens": tokens, "claimed": values.size}
            figures["non_finite"] = int(values.size - np.isfinite(values).sum())
            figures["positive"] = int((values > 0).sum())
            reason = ValidatorReason.LOGPROBS_MALFORMED
            results[number] = _result(ValidatorCheck.LOGPROBS, False, reason, figures, slot.index)
        else:
            claimed[number] = values
    checked = [n for n in numbers if n in claimed]
    if checked:
        with np.errstate(invalid="ignore", over="ignore"):  # NaN figures: NaN bounds, which fail
            rows = np.concatenate([np.arange(starts[n], starts[n + 1]) for n in checked])
            lower, upper = logprob_bounds(per_token.others[rows], per_token.tolerances[rows])
            bounds = LogprobBounds(per_token.logprobs[rows], lower, upper)
            values = np.concatenate([claimed[n] for n in checked])
            # Written so that NaN fails (the validator's own bounds, from NaN logits).
            inside = bounds.contains(values)
            errors = np.abs(values - bounds.values)
            excess = bounds.excess(values)
        lengths = [starts[n + 1] - starts[n] for n in checked]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        filled = np.flatnonzero(np.asarray(lengths) > 0)
        most_error = [0.0] * len(checked)
        most_excess = [0.0] * len(checked)
        all_inside = [True] * len(checked)
        if filled.size:
            firsts = offsets[filled]
            for target, reduced in (
                (most_error, np.maximum.reduceat(errors, firsts)),
                (most_excess, np.maximum.reduceat(excess, firsts)),
                (all_inside, np.logical_and.reduceat(inside, firsts)),
            ):
                for position, value in zip(filled.tolist(), reduced.tolist(), strict=True):
                    target[position] = value
        for position, number in enumerate(checked):
            slot = group[number]
            own = slice(int(offsets[position]), int(offsets[position + 1]))
            slot.logprobs = bounds.values[own].copy()
            figures = {
                "tokens": lengths[position],
                "claimed": lengths[position],
                "max_abs_error": most_error[position],
                "max_tolerance_fraction": most_excess[position],
            }
            if all_inside[position]:
                results[number] = _result(ValidatorCheck.LOGPROBS, True, "", figures, slot.index)
                continue
            outside = ~inside[own]
            figures["first_mismatch"] = int(np.argmax(outside))
            figures["mismatches"] = int(outside.sum())
            reason = ValidatorReason.LOGPROBS_MISMATCH
            results[number] = _result(ValidatorCheck.LOGPROBS, False, reason, figures, slot.index)
    return [results[number] for number in numbers]


def _scorable(slot: _Slot) -> bool:
    """Whether a rollout's reward is recomputed: it passed every other check (one that failed
    rejects the job anyway, and its completion is text the worker chose, which must not get to
    make the validator's verifier work up to its time limit)."""
    return slot.problem is not None and all(c.passed for c in slot.checks)


class _RewardScorer:
    """Recomputes rewards with the environment's verifier in the reward sandbox on a thread of
    its own, a batch of rollouts per :meth:`submit` in order, so the sandbox's child process
    scores one group while the validator prefills and checks the next."""

    def __init__(
        self, environment: Environment, sandbox: RewardSandbox, tokenizer: CheckpointTokenizer
    ) -> None:
        self._environment = environment
        self._sandbox = sandbox
        self._tokenizer = tokenizer
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="validator-rewards")
        self._batches: list[tuple[list[int], Future[list[RewardResult]]]] = []

    def submit(self, slots: Sequence[_Slot]) -> None:
        """Score ``slots`` (which passed every other check) after those submitted before."""
        if not slots:
            return
        items = []
        for slot in slots:
            assert slot.problem is not None
            completion = list(slot.claim.completion_ids)
            text = self._tokenizer.decode(completion, skip_special_tokens=True)
            items.append((slot.problem, text, len(completion)))
        future = self._pool.submit(self._sandbox.rewards, self._environment, items)
        self._batches.append(([slot.index for slot in slots], future))

    def results(self) -> dict[int, RewardResult]:
        """Every submitted rollout's result by batch index (raises what the sandbox raised)."""
        rewards: dict[int, RewardResult] = {}
        for indexes, future in self._batches:
            rewards.update(zip(indexes, future.result(), strict=True))
        return rewards

    def __enter__(self) -> _RewardScorer:
        return self

    def __exit__(self, *exc: object) -> None:
        for _, future in self._batches:
            future.cancel()
        self._pool.shutdown(wait=True)


def _reward_checks(
    slots: Sequence[_Slot],
    rewards: Mapping[int, RewardResult],
    environment: Environment,
    outcome: JobOutcome,
) -> None:
    """Each scored claim must equal the recomputed reward (:func:`_reward_check`); the
    validated rewards, one per rollout in batch order (zero where none was computed)."""
    for slot in slots:
        result = rewards.get(slot.index)
        if result is None:
            outcome.validated_rewards.append(common_pb2.Reward())
            continue
        assert slot.problem is not None
        if result.failure is not None:
            outcome.notes.append(f"rollouts[{slot.index}].reward: {result.failure}")
        slot.checks.append(_reward_check(slot, slot.problem, result, environment))
        expected = result.reward
        outcome.validated_rewards.append(
            common_pb2.Reward(
                task_reward=expected.task_reward,
                length_penalty=expected.length_penalty,
                total=expected.total,
            )
        )


def _reward_check(
    slot: _Slot, problem: Problem, result: RewardResult, environment: Environment
) -> validation_pb2.CheckResult:
    """The claimed reward against the recomputed one, exactly (deterministic binary64)."""
    expected = result.reward
    claimed = slot.rollout.claimed_reward
    figures = {
        "claimed_total": claimed.total,
        "validated_total": expected.total,
        "validated_task_reward": expected.task_reward,
        "validated_length_penalty": expected.length_penalty,
        "verifier_failed": result.failure is not None,
    }
    same = (
        claimed.task_reward == expected.task_reward
        and claimed.length_penalty == expected.length_penalty
        and claimed.total == expected.total
    )
    target = problem.target_length or 0
    unverifiable = environment.unverifiable_reward(problem, len(slot.claim.completion_ids))
    claimed_unverifiable = (
        claimed.task_reward == unverifiable.task_reward
        and claimed.length_penalty == unverifiable.length_penalty
        and claimed.total == unverifiable.total
    )
    # Verifier timing differs between machines (a warm sympy cache, a completion on
    # math-verify's limit), so a claim is not rejected over a verifier that did not finish:
    # neither the worker's (it claimed what a completion that cannot be scored gets) nor this
    # validator's (its value, the environment's unverifiable_reward, is what the trainer gets,
    # but proves nothing about the claim).
    if not same and claimed_unverifiable:
        figures["claimed_unverifiable"] = True
    elif not same and result.failure is not None:
        figures["claimed_task_reward"] = claimed.task_reward
    elif not same:
        return _result(
            ValidatorCheck.REWARD, False, ValidatorReason.REWARD_MISMATCH, figures, slot.index
        )
    if slot.rollout.target_length == target:
        return _result(ValidatorCheck.REWARD, True, "", figures, slot.index)
    reason = ValidatorReason.TARGET_LENGTH_MISMATCH
    figures["claimed_target_length"] = slot.rollout.target_length
    figures["target_length"] = target
    return _result(ValidatorCheck.REWARD, False, reason, figures, slot.index)


__all__ = [
    "ChallengeInvalid",
    "CheckpointModel",
    "EnvironmentCache",
    "JobOutcome",
    "JobUncheckable",
    "PrefillBackend",
    "ValidatorCheck",
    "ValidatorReason",
    "job_challenge",
    "refuse_oversized",
    "validate_job",
]
