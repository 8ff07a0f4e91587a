"""Commitments: checking a committed rollout batch, recording it with a signed receipt, the
spot check that queues its validation (or credits it unchecked), and reading it back."""

from __future__ import annotations

import asyncio
import secrets
from datetime import datetime

from sqlalchemy.orm import Session

from rollnet.ledger import artifacts, chain, fingerprints, nodes, tasks, validation
from rollnet.ledger.artifacts import NewCommitment
from rollnet.ledger.chain import NewEntry
from rollnet.ledger.engine import read_only_session
from rollnet.ledger.enums import AttemptOutcome, EntryKind, TaskState
from rollnet.ledger.leases import LeaseClaim, LeaseOutcome
from rollnet.ledger.models import Commitment
from rollnet.ledger.tasks import TaskTerms
from rollnet.reference.coordinator import copies
from rollnet.reference.coordinator.batches import (
    batch_terms,
    check_batch,
    commitment_binding,
    load_batch,
)
from rollnet.reference.coordinator.context import CoordinatorContext, run_to_completion
from rollnet.reference.coordinator.credit import (
    spot_check_draw,
    spot_check_probability,
    work_units,
)
from rollnet.reference.coordinator.dispatch import PROMPT_TOKENS
from rollnet.reference.coordinator.refusal import Refusal, lease_outcome_refusal
from rollnet.reference.coordinator.serde import (
    commitment_to_proto,
    receipt_to_proto,
    timestamp,
)
from rollnet.reference.coordinator.standing import (
    Caller,
    refuse_unless_in_standing,
    refuse_unless_reaching_others,
    refuse_unusable,
)
from rollnet.sdk.batches import binding_digest
from rollnet.sdk.commitments import receipt_message
from rollnet.sdk.errors import ErrorReason
from rollnet.sdk.methods import method_path
from rollnet.v1 import checkpoint_pb2, commitment_pb2, commitment_service_pb2, rollout_pb2

_GET_COMMITMENT = method_path("CommitmentService", "GetCommitment")

_PRECHECKED_BYTES = 1 << 20
"""Rollout blobs above this size are read only for a caller whose lease may submit them."""
_FINGERPRINT_INLINE_BYTES = 64 << 10
"""Batches up to this size are fingerprinted on the event loop (a few ms at most), larger ones
on a thread."""


class _Copied(Refusal):
    """A commitment refused as a copy: the lease is taken back after the rollback."""

    def __init__(self, found: list[copies.Copy]) -> None:
        super().__init__(ErrorReason.ROLLOUT_DUPLICATE, copies.refusal_message(found))
        self.copies = found


def _task_and_repeat(
    session: Session, caller: Caller, request: commitment_service_pb2.SubmitCommitmentRequest
) -> tuple[TaskTerms, Commitment | None]:
    """The task's terms (refused when there is no such task), and the commitment this request
    repeats — the same node, lease and blob already committed — if any."""
    task = tasks.get_terms(session, request.task_id)
    if task is None:
        raise Refusal(ErrorReason.LEASE_NOT_FOUND, f"no task {request.task_id}")
    existing = artifacts.find_commitment(session, request.task_id, request.fencing_token)
    if (
        existing is not None
        and existing.node_id == caller.node_id
        and existing.lease_id == request.lease_id
        and existing.rollout_blob_hash == request.rollout_batch.blake3.hex()
    ):
        return task, existing
    return task, None


def _claim(
    caller: Caller, request: commitment_service_pb2.SubmitCommitmentRequest, now: datetime
) -> LeaseClaim:
    """The caller's claim, in this request, to hold the lease on its task."""
    return LeaseClaim(request.task_id, request.lease_id, request.fencing_token, caller.node_id, now)


def flops_per_token(session: Session, step: int) -> int:
    """Forward FLOPs per token of the checkpoint of ``step`` (0 when it is not published)."""
    row = artifacts.get_checkpoint(session, step)
    if row is None:
        return 0
    return int(checkpoint_pb2.CheckpointManifest.FromString(row.manifest).flops_per_token)


def read_commitment(session: Session, row: Commitment) -> commitment_pb2.Commitment:
    """The wire form of a stored commitment, with what its state and record need read."""
    task = tasks.get_task(session, row.task_id)
    assert task is not None
    blob = None if row.record is not None else artifacts.get_blob(session, row.rollout_blob_hash)
    return commitment_to_proto(
        row,
        task_state=task.state,
        checkpoint_step=task.checkpoint_step,
        verdict=validation.get_verdict_for_commitment(session, row.id),
        blob_size=blob.size if blob else 0,
    )


class CommitmentDesk:
    """CommitmentService: records commitments for held leases, answers with signed receipts."""

    def __init__(self, ctx: CoordinatorContext) -> None:
        self.ctx = ctx

    def _checked_batch(
        self, caller: Caller, request: commitment_service_pb2.SubmitCommitmentRequest
    ) -> tuple[rollout_pb2.RolloutBatch, int]:
        """A blob over ``_PRECHECKED_BYTES``, on a thread: read only after :meth:`_precheck`
        (a read-only session) found the lease good and the blob within the task's bound. A
        smaller one costs less to parse than that read (~3 ms of coordinator CPU per
        commitment, measured) and is bounded by the commitment's own rollout count."""
        with read_only_session(self.ctx.sessions) as session:
            terms = self._precheck(session, caller, request)
        return load_batch(self.ctx.blobs, request.rollout_batch.blake3, terms)

    def _precheck(
        self,
        session: Session,
        caller: Caller,
        request: commitment_service_pb2.SubmitCommitmentRequest,
    ) -> tuple[int, int]:
        """Before the blob is read: the task's batch terms (:func:`batch_terms`), or a refusal when
        this lease may not submit it and this is not a repeat of work it committed (a repeat
        goes on to be answered, request-id checks and all, in the transaction)."""
        task = tasks.get_terms(session, request.task_id)
        if task is None:
            raise Refusal(ErrorReason.LEASE_NOT_FOUND, f"no task {request.task_id}")
        outcome = tasks.submission_outcome(session, _claim(caller, request, self.ctx.clock()))
        if outcome is not LeaseOutcome.OK and _task_and_repeat(session, caller, request)[1] is None:
            raise lease_outcome_refusal(outcome, f"task {request.task_id}")
        return batch_terms(task)

    async def submit(
        self, caller: Caller, request: commitment_service_pb2.SubmitCommitmentRequest
    ) -> commitment_service_pb2.SubmitCommitmentResponse:
        """Accept a commitment for a held lease, answer with a signed receipt."""
        config = self.ctx.config
        expected_binding = binding_digest(
            commitment_binding(config.network_id, caller.node_id, request),
            request.rollout_batch.blake3,
        )
        if expected_binding != request.binding_digest:
            raise Refusal(
                ErrorReason.COMMITMENT_BINDING_INVALID,
                "binding_digest does not bind this network, node, task, lease and blob",
            )
        uploads = self.ctx.uploads
        digest = request.rollout_batch.blake3

        async def record() -> commitment_service_pb2.SubmitCommitmentResponse:
            # Pinned from the existence check until the row is written: the orphan sweeper
            # does not delete a batch a commitment is being recorded for.
            with uploads.pin((digest,)):
                response, queued = await self._record_commitment(caller, request)
            signals = self.ctx.signals
            signals.fire(signals.jobs_available if queued else signals.rollouts_accepted)
            return response

        # To its end even if the caller goes away: the row may be committing on the writer's
        # thread, and the pin must outlive it (and the settle and wake-ups follow it).
        return await run_to_completion(record())

    async def _record_commitment(
        self, caller: Caller, request: commitment_service_pb2.SubmitCommitmentRequest
    ) -> tuple[commitment_service_pb2.SubmitCommitmentResponse, bool]:
        """Check the stored batch and record the commitment (its blob pinned by the caller);
        returns the response and whether a validation job was queued."""
        config = self.ctx.config
        if not self.ctx.blobs.exists(request.rollout_batch.blake3):
            raise Refusal(ErrorReason.BLOB_NOT_FOUND, "upload the rollout batch first")
        try:
            digest = request.rollout_batch.blake3
            if self.ctx.blobs.size(digest) <= _PRECHECKED_BYTES:
                # Cheaper to parse here than to hand over to a thread (or read the lease for).
                terms = (len(request.rollouts), _PRECHECKED_BYTES)
                batch, batch_size = load_batch(self.ctx.blobs, digest, terms)
            else:
                batch, batch_size = await asyncio.to_thread(self._checked_batch, caller, request)
        except Refusal as refusal:
            # Without its traceback, the refusal keeps no frame (and no blob) alive.
            raise refusal.with_traceback(None) from None
        now = self.ctx.clock()
        claim = _claim(caller, request, now)
        # Everything the receipt covers is known now: sign outside the writer's transaction.
        commitment_id = secrets.token_hex(12)
        signature = self.ctx.identity.sign(
            receipt_message(commitment_id, request.binding_digest, now)
        )
        blob_location = self.ctx.blobs.location_of(request.rollout_batch.blake3)
        if batch_size <= _FINGERPRINT_INLINE_BYTES:
            prints = copies.fingerprints(batch)  # ~16 us a rollout of 42 tokens
        else:
            # ~0.35 ms a rollout of 700 tokens: a large batch's would stall the event loop.
            prints = await asyncio.to_thread(copies.fingerprints, batch)

        def check_terms(task: TaskTerms) -> None:
            if batch_size != request.rollout_batch.size:
                raise Refusal(ErrorReason.BLOB_SIZE_MISMATCH, "rollout_batch.size is wrong")
            check_batch(batch, request, caller.node_id, task, config.network_id)

        def refused_or_repeated(
            session: Session,
        ) -> tuple[commitment_service_pb2.SubmitCommitmentResponse, bool]:
            # Nothing changed. The same work submitted again (a retry whose first answer was
            # lost) is answered with the original commitment and receipt; else say why not.
            task, existing = _task_and_repeat(session, caller, request)
            if existing is not None:
                return self._response(session, existing, request.binding_digest), False
            refuse_unless_in_standing(session, caller)  # ejected, banned: say so, not the lease
            check_terms(task)
            outcome = tasks.why_not_submitted(session, claim)
            raise lease_outcome_refusal(outcome, f"task {request.task_id}")

        def work(
            session: Session,
        ) -> tuple[commitment_service_pb2.SubmitCommitmentResponse, bool]:
            # The common case in one statement: the lease allows it, the task becomes SUBMITTED
            # and its terms come back. Any refusal below rolls that back with the rest.
            task = tasks.submit_and_get_terms(session, claim)
            if task is None:
                return refused_or_repeated(session)
            check_terms(task)
            found = copies.find_copies(prints, copies.originals(session, prints))
            if found:
                raise _Copied(found)  # rolls the submission back; the lease is taken below
            artifacts.record_blob(
                session,
                blake3_hex=request.rollout_batch.blake3.hex(),
                size=batch_size,
                location=blob_location,
                uploader_id=caller.node_id,
                now=now,
            )
            prefill = sum(len(r.prompt_token_ids) for r in batch.rollouts)
            decode = sum(len(r.completion_token_ids) for r in batch.rollouts)
            record = commitment_pb2.Commitment(
                commitment_id=commitment_id,
                task_id=request.task_id,
                lease_id=request.lease_id,
                fencing_token=request.fencing_token,
                node_id=caller.node_id,
                rollout_batch=request.rollout_batch,
                checkpoint_step=task.checkpoint_step,
                rollouts=request.rollouts,
                # The coordinator's own count of the batch's tokens, not the node's claim: only
                # figures the coordinator checked are shown (GetCommitment, validation jobs).
                claimed_work=commitment_pb2.WorkClaim(prefill_tokens=prefill, decode_tokens=decode),
                binding_digest=request.binding_digest,
                received_at=timestamp(now),
            )
            artifacts.record_commitment(
                session,
                NewCommitment(
                    commitment_id=commitment_id,
                    task_id=request.task_id,
                    node_id=caller.node_id,
                    lease_id=request.lease_id,
                    fencing_token=request.fencing_token,
                    rollout_blob_hash=request.rollout_batch.blake3.hex(),
                    proof_blob_hash=None,
                    sampling_seed=task.seed,
                    claimed_work=prefill + decode,
                    request_id=request.request_id,
                    signature=signature,
                    record=record.SerializeToString(deterministic=True),
                ),
                now=now,
            )
            fingerprints.record_fingerprints(session, commitment_id, caller.node_id, prints)
            node = nodes.get_standing(session, caller.node_id)
            assert node is not None
            refuse_unusable(node)  # rolls the submission back
            # Work whose prompt lengths the coordinator does not know (prompt_lengths.py) is
            # never credited unvalidated: its count could not be bounded.
            probability = (
                spot_check_probability(
                    node.accepted_streak, config.trusted_streak, config.min_validation_rate
                )
                if PROMPT_TOKENS in task.sampling
                else 1.0
            )
            check = spot_check_draw(config.seed, commitment_id) < probability
            if check:
                validation.enqueue_validation_job(
                    session,
                    job_id=secrets.token_hex(12),
                    commitment_id=commitment_id,
                    now=now,
                    check_probability=probability,
                )
            else:
                self._credit_unchecked(
                    session, task, commitment_id, caller.node_id, prefill, decode, now
                )
            # A fresh commitment's state is known without reading it back: PENDING while its
            # validation is queued, ACCEPTED when the spot check skipped it.
            record.state = (
                commitment_pb2.Commitment.STATE_PENDING
                if check
                else commitment_pb2.Commitment.STATE_ACCEPTED
            )
            return self._receipted(record, request.binding_digest, signature, now), check

        try:
            response, queued = await self.ctx.run_in_transaction(work)
        except _Copied as copied:
            await self._take_back_copy(caller, request, copied)
            raise copied.with_traceback(None) from None
        # Recorded: the batch is no longer its uploader's to answer for, nor an orphan.
        self.ctx.uploads.settle((request.rollout_batch.blake3,))
        return response, queued

    async def _take_back_copy(
        self,
        caller: Caller,
        request: commitment_service_pb2.SubmitCommitmentRequest,
        copied: _Copied,
    ) -> None:
        """End the copier's lease (the task is queued again, same seeds) and record why."""
        now = self.ctx.clock()
        max_attempts = self.ctx.config.max_attempts

        def work(session: Session) -> LeaseOutcome:
            return tasks.give_back_task(
                session,
                _claim(caller, request, now),
                max_attempts=max_attempts,
                reason=ErrorReason.ROLLOUT_DUPLICATE.value,
                detail=copied.message,
                outcome=AttemptOutcome.DUPLICATE,
            )

        outcome = await self.ctx.run_in_transaction(work)
        metrics = self.ctx.metrics
        metrics.duplicate_rollouts.inc(len(copied.copies))
        if outcome is LeaseOutcome.OK:
            metrics.attempts_ended.labels(caller.node_id, AttemptOutcome.DUPLICATE.value).inc()
            self.ctx.signals.fire(self.ctx.signals.work_available)

    def _response(
        self, session: Session, row: Commitment, binding_digest: bytes
    ) -> commitment_service_pb2.SubmitCommitmentResponse:
        commitment = read_commitment(session, row)
        return self._receipted(commitment, binding_digest, row.signature, row.received_at)

    def _receipted(
        self,
        commitment: commitment_pb2.Commitment,
        binding_digest: bytes,
        signature: bytes,
        received_at: datetime,
    ) -> commitment_service_pb2.SubmitCommitmentResponse:
        receipt = receipt_to_proto(
            commitment.commitment_id,
            binding_digest,
            received_at,
            self.ctx.identity.public_key,
            signature,
        )
        return commitment_service_pb2.SubmitCommitmentResponse(
            commitment=commitment, receipt=receipt
        )

    def _credit_unchecked(
        self,
        session: Session,
        task: TaskTerms,
        commitment_id: str,
        node_id: str,
        prefill: int,
        decode: int,
        now: datetime,
    ) -> None:
        flops = flops_per_token(session, task.checkpoint_step)
        tasks.transition_task(
            session, task.id, from_state=TaskState.SUBMITTED, to_state=TaskState.ACCEPTED, now=now
        )
        chain.append_entries(
            session,
            [
                NewEntry(
                    node_id=node_id,
                    kind=EntryKind.CREDIT,
                    amount=work_units(prefill, decode, flops),
                    commitment_id=commitment_id,
                    memo="spot check skipped (trusted node)",
                )
            ],
            now=now,
        )

    async def get_commitment(
        self, caller: Caller, commitment_id: str
    ) -> commitment_service_pb2.GetCommitmentResponse:
        """A commitment and its state."""

        def work(session: Session) -> commitment_service_pb2.GetCommitmentResponse:
            row = artifacts.get_commitment(session, commitment_id)
            if row is None:
                raise Refusal(ErrorReason.COMMITMENT_NOT_FOUND, f"no commitment {commitment_id}")
            if row.node_id != caller.node_id:
                refuse_unless_reaching_others(
                    _GET_COMMITMENT, caller, "read another node's commitment"
                )
            return commitment_service_pb2.GetCommitmentResponse(
                commitment=read_commitment(session, row)
            )

        return await self.ctx.run_read(work)
