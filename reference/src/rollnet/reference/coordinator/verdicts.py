"""Validation: leasing jobs to validators, and recording their verdicts with the settle step
that applies the credit rule (:mod:`rollnet.reference.coordinator.credit`)."""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from rollnet.ledger import artifacts, attempts, chain, nodes, overview, tasks, validation
from rollnet.ledger.chain import NewEntry
from rollnet.ledger.enums import AttemptOutcome, EntryKind, NodeState, TaskState
from rollnet.ledger.leases import LeaseClaim, LeaseOutcome
from rollnet.ledger.models import Commitment, Task, ValidationJob
from rollnet.reference.coordinator import logprobs, node_statistics
from rollnet.reference.coordinator.commitments import flops_per_token, read_commitment
from rollnet.reference.coordinator.context import CoordinatorContext, wait_for
from rollnet.reference.coordinator.credit import Judgement, judged_units, settle
from rollnet.reference.coordinator.refusal import (
    Refusal,
    Violations,
    invalid,
    lease_outcome_refusal,
)
from rollnet.reference.coordinator.serde import (
    check_to_json,
    duration,
    lease_to_proto,
    task_to_proto,
    timestamp,
)
from rollnet.reference.coordinator.standing import Caller, eject_node, refuse_unless_in_standing
from rollnet.sdk.errors import ErrorReason
from rollnet.sdk.proofs.challenge import sign_challenge
from rollnet.sdk.proofs.statistics import policy_for as statistics_policy_for
from rollnet.v1 import (
    commitment_pb2,
    rollout_pb2,
    task_pb2,
    validation_pb2,
    validation_service_pb2,
)


@dataclass(frozen=True, slots=True)
class _Settled:
    """What a recorded verdict did to its worker, for the metrics and caches after commit."""

    worker_id: str
    ejected: bool
    #: The per-node statistics test that flagged the worker, if one did.
    flagged_test: str | None


class VerdictDesk:
    """ValidationService: leases validation jobs, records verdicts and settles them."""

    def __init__(self, ctx: CoordinatorContext) -> None:
        self.ctx = ctx

    async def pull_job(
        self, caller: Caller, request: validation_service_pb2.PullValidationJobRequest
    ) -> validation_service_pb2.PullValidationJobResponse:
        """Long-poll for a validation job and lease it."""
        config = self.ctx.config
        wait = config.pull_wait_max
        if request.HasField("wait"):
            wait = min(request.wait.ToTimedelta(), config.pull_wait_max)
        deadline = self.ctx.clock() + wait

        def work(session: Session) -> validation_service_pb2.PullValidationJobResponse | None:
            refuse_unless_in_standing(session, caller)
            now = self.ctx.clock()
            leased = validation.lease_next_validation_job(
                session, node_id=caller.node_id, now=now, lease_duration=config.lease_duration
            )
            if leased is None:
                return None
            commitment = artifacts.get_commitment(session, leased.commitment_id)
            assert commitment is not None
            task = tasks.get_task(session, commitment.task_id)
            assert task is not None
            tasks.transition_task(
                session,
                task.id,
                from_state=TaskState.SUBMITTED,
                to_state=TaskState.VALIDATING,
                now=now,
            )
            record = read_commitment(session, commitment)
            rollouts = len(task.prompt_ids) * int(task.sampling["samples_per_prompt"])
            challenged = min(config.challenged_rollouts, rollouts)
            job = validation_pb2.ValidationJob(
                job_id=leased.job_id,
                commitment=record,
                task=task_to_proto(
                    task, state=task_pb2.Task.STATE_VALIDATING, attempt=task.attempt
                ),
                network_id=config.network_id,
                # Signed now, after the commitment was recorded: the worker could not know
                # which rollouts it selects. Deterministic, so every lease of the job gets it.
                challenge=sign_challenge(
                    self.ctx.identity.sign,
                    config.network_id,
                    record.commitment_id,
                    record.binding_digest,
                    rollouts,
                    challenged,
                ),
                challenged_rollouts=challenged,
            )
            return validation_service_pb2.PullValidationJobResponse(
                job=job,
                lease=lease_to_proto(
                    leased.lease_id, leased.fencing_token, leased.lease_deadline, now
                ),
            )

        response = await self.ctx.run_in_transaction(work)
        while True:
            if response is not None:
                return response
            remaining = (deadline - self.ctx.clock()).total_seconds()
            if remaining <= 0 or self.ctx.signals.stopping:
                return validation_service_pb2.PullValidationJobResponse(
                    retry_after=duration(config.retry_after)
                )
            await wait_for(self.ctx.signals.jobs_available, min(remaining, 1.0))
            # An idle poll costs a read, not a write: lease only when a job waits.
            if await self.ctx.run_read(validation.has_queued_validation_job):
                response = await self.ctx.run_in_transaction(work)

    async def submit_verdict(
        self, caller: Caller, request: validation_service_pb2.SubmitVerdictRequest
    ) -> validation_service_pb2.SubmitVerdictResponse:
        """Record a verdict and settle it: credit or slash, trust update, ejection."""
        accept = validation_pb2.Verdict.DECISION_ACCEPT
        # Each field is in bounds (the FieldBoundsCheck interceptor: a known decision, finite
        # figures, rewards and log-probabilities); what relates them is checked here.
        v = Violations()
        v.require(
            request.decision == accept or bool(request.reject_reason),
            "reject_reason",
            "is required when rejecting",
        )
        logprobs.check_decision(request.validated_logprobs, request.decision == accept, v)
        node_statistics.check_decision(request.rollout_statistics, request.decision == accept, v)
        v.raise_if_any()
        now = self.ctx.clock()
        verdict_id = secrets.token_hex(12)
        accepted = request.decision == accept

        def work(
            session: Session,
        ) -> tuple[validation_service_pb2.SubmitVerdictResponse, _Settled]:
            refuse_unless_in_standing(session, caller)
            job = validation.get_job(session, request.job_id)
            if job is None:
                raise Refusal(ErrorReason.JOB_NOT_FOUND, f"no validation job {request.job_id}")
            commitment = artifacts.get_commitment(session, job.commitment_id)
            assert commitment is not None
            task = tasks.get_task(session, commitment.task_id)
            assert task is not None
            self._check_verdict(request, accepted, commitment, task)
            validated = request.validated_work
            units = judged_units(
                accepted,
                validated.prefill_tokens + validated.decode_tokens,
                commitment.claimed_work,
                flops_per_token(session, task.checkpoint_step),
            )
            figures: dict[str, Any] = {
                "checks": [check_to_json(c) for c in request.checks],
                "validated_rewards": [
                    [r.task_reward, r.length_penalty, r.total] for r in request.validated_rewards
                ],
            }
            claim = LeaseClaim(
                request.job_id, request.lease_id, request.fencing_token, caller.node_id, now
            )
            outcome = validation.submit_verdict(
                session,
                claim,
                verdict_id=verdict_id,
                accepted=accepted,
                reasons=[] if accepted else [request.reject_reason],
                check_figures=figures,
                awarded_work=units if accepted else 0,
                validated_logprobs=(
                    validation.pack_logprobs(e.logprobs for e in request.validated_logprobs)
                    if request.validated_logprobs
                    else None
                ),
            )
            if outcome is LeaseOutcome.ALREADY_SUBMITTED:
                raise Refusal(ErrorReason.VERDICT_ALREADY_RECORDED, "the job already has one")
            if outcome is not LeaseOutcome.OK:
                raise lease_outcome_refusal(outcome, f"validation job {request.job_id}")
            settled = self._settle(
                session, caller, request, job, commitment, task, units, verdict_id, now
            )
            verdict = validation_pb2.Verdict(
                verdict_id=verdict_id,
                job_id=request.job_id,
                commitment_id=commitment.id,
                validator_node_id=caller.node_id,
                decision=request.decision,
                reject_reason=request.reject_reason,
                checks=request.checks,
                validated_rewards=request.validated_rewards,
                work_units=units if accepted else -units,
                recorded_at=timestamp(now),
            )
            return validation_service_pb2.SubmitVerdictResponse(verdict=verdict), settled

        response, settled = await self.ctx.run_in_transaction(work)
        if settled.ejected:
            self.ctx.forget_keys()  # its cached state is ACTIVE no more
        metrics = self.ctx.metrics
        metrics.verdicts.labels(
            "accept" if accepted else "reject", request.reject_reason or "none"
        ).inc()
        signals = self.ctx.signals
        if settled.flagged_test is not None:
            metrics.nodes_flagged.labels(settled.flagged_test).inc()
        if accepted:
            metrics.work_units.inc(response.verdict.work_units)
            signals.fire(signals.rollouts_accepted)
        else:
            metrics.attempts_ended.labels(settled.worker_id, AttemptOutcome.REJECTED.value).inc()
            signals.fire(signals.work_available)
        return response

    def _check_verdict(
        self,
        request: validation_service_pb2.SubmitVerdictRequest,
        accepted: bool,
        commitment: Commitment,
        task: Task,
    ) -> None:
        """Refuse a verdict whose figures do not fit the judged commitment's batch."""
        expected = len(task.prompt_ids) * int(task.sampling["samples_per_prompt"])
        if accepted and len(request.validated_rewards) != expected:
            raise invalid(("validated_rewards", f"must hold {expected} rewards, one per rollout"))
        if request.validated_logprobs or request.rollout_statistics:
            completion_tokens = self._completion_tokens(commitment)
            logprobs.check_shape(request.validated_logprobs, completion_tokens)
            node_statistics.check_shape(request.rollout_statistics, completion_tokens)
        validated = request.validated_work
        if accepted and validated.prefill_tokens + validated.decode_tokens > max(
            commitment.claimed_work, 0
        ):
            # Credit is for tokens the batch holds: no validator can vouch for more.
            raise invalid(
                (
                    "validated_work",
                    f"{validated.prefill_tokens} + {validated.decode_tokens} tokens exceed "
                    f"the {commitment.claimed_work} the commitment's batch holds",
                )
            )

    def _settle(
        self,
        session: Session,
        caller: Caller,
        request: validation_service_pb2.SubmitVerdictRequest,
        job: ValidationJob,
        commitment: Commitment,
        task: Task,
        units: int,
        verdict_id: str,
        now: datetime,
    ) -> _Settled:
        """The settle step of a recorded verdict, in its transaction: the task's end state,
        the worker's trust and statistics, then the credit rule's decisions
        (:func:`~rollnet.reference.coordinator.credit.settle`) written to the ledger."""
        config = self.ctx.config
        accepted = request.decision == validation_pb2.Verdict.DECISION_ACCEPT
        worker = nodes.get_node(session, commitment.node_id)
        assert worker is not None
        flag = None
        rejects = 0
        tasks.transition_task(
            session,
            task.id,
            from_state=TaskState.VALIDATING,
            to_state=TaskState.ACCEPTED if accepted else TaskState.REJECTED,
            now=now,
        )
        if accepted:
            # One UPDATE reading the row it writes: a concurrent reject's reset (or another
            # accept) is never overwritten with a stale streak.
            nodes.record_accepted(session, commitment.node_id, config.trusted_streak)
            overview.record_step_rewards(
                session,
                int(task.sampling.get("rollout_step", 0)),
                [(r.task_reward, r.length_penalty, r.total) for r in request.validated_rewards],
                now=now,
            )
            flag = node_statistics.record(
                session,
                commitment.node_id,
                request.rollout_statistics,
                statistics_policy_for(config.compute_dtype),
                now=now,
            )
        else:
            ended = attempts.EndedLease(
                task.id, commitment.node_id, commitment.lease_id, commitment.fencing_token
            )
            attempts.record_attempts(
                session,
                [ended],
                outcome=AttemptOutcome.REJECTED,
                now=now,
                reason=request.reject_reason,
            )
            # The prompts still need honest rollouts: queue a fresh copy of the task.
            tasks.requeue_copy(session, task.id, new_task_id=secrets.token_hex(12), now=now)
            nodes.set_trust(session, commitment.node_id, trust=0.0, accepted_streak=0)
            rejects = validation.count_rejected_commitments(session, commitment.node_id)
        settlement = settle(
            Judgement(
                accepted=accepted,
                units=units,
                check_probability=job.check_probability,
                worker_state=worker.state,
                rejects=rejects,
                # Rejects an operator forgave by reinstating the node do not count again.
                rejects_forgiven=worker.rejects_forgiven,
                flagged=flag is not None,
            ),
            eject_after_rejects=config.eject_after_rejects,
        )
        if settlement.eject:
            # On a flag, this commitment's work passed every check: it stays credited. What
            # the node holds besides (leases, pending validation) is taken back as for any
            # ejection; its committed batches are still judged one by one.
            eject_node(
                session,
                commitment.node_id,
                NodeState.EJECTED,
                flag.reason
                if flag is not None
                else f"{rejects} rejected commitments (last: {request.reject_reason})",
                now=now,
                max_attempts=config.max_attempts,
                max_validation_attempts=config.max_validation_attempts,
            )
        worker_entry = NewEntry(
            node_id=commitment.node_id,
            kind=EntryKind.CREDIT if accepted else EntryKind.SLASH,
            amount=settlement.worker_amount,
            commitment_id=commitment.id,
            verdict_id=verdict_id,
            memo="" if accepted else request.reject_reason[:200],
        )
        reward = NewEntry(
            node_id=caller.node_id,
            kind=EntryKind.VALIDATOR_REWARD,
            amount=settlement.validator_reward,
            commitment_id=commitment.id,
            verdict_id=verdict_id,
        )
        chain.append_entries(session, [worker_entry, reward], now=now)
        return _Settled(
            worker_id=commitment.node_id,
            ejected=settlement.eject,
            flagged_test=None if flag is None else flag.test,
        )

    def _completion_tokens(self, commitment: Commitment) -> list[int]:
        """Completion tokens of each rollout of a commitment's batch, in order: from the stored
        commitment (its digests were checked against the batch at submission), or from the
        batch itself for a commitment stored before migration 0003 kept the record."""
        if commitment.record is not None:
            record = commitment_pb2.Commitment.FromString(commitment.record)
            return [digest.completion_tokens for digest in record.rollouts]
        _, data = self.ctx.blobs.read_range(bytes.fromhex(commitment.rollout_blob_hash), 0, 0)
        batch = rollout_pb2.RolloutBatch.FromString(data)
        return [len(rollout.completion_token_ids) for rollout in batch.rollouts]
