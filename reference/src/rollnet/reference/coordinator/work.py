"""Finished work: blobs, commitments, validation jobs, verdicts, credit and slashes."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import math
import secrets
import struct
from collections.abc import AsyncIterator
from datetime import datetime
from fractions import Fraction
from functools import partial
from typing import Any

from google.protobuf.message import DecodeError
from sqlalchemy.orm import Session

from rollnet.ledger import (
    artifacts,
    attempts,
    chain,
    fingerprints,
    nodes,
    overview,
    tasks,
    validation,
)
from rollnet.ledger.artifacts import NewCommitment
from rollnet.ledger.chain import NewEntry
from rollnet.ledger.engine import read_only_session
from rollnet.ledger.enums import AttemptOutcome, EntryKind, NodeRole, NodeState, TaskState
from rollnet.ledger.leases import LeaseOutcome
from rollnet.ledger.models import Commitment
from rollnet.ledger.tasks import TaskTerms
from rollnet.reference.coordinator import copies, logprobs, node_statistics
from rollnet.reference.coordinator.blobstore import (
    BlobDigestMismatch,
    BlobSizeMismatch,
    BlobTooLarge,
    StoredBlob,
)
from rollnet.reference.coordinator.context import (
    CoordinatorContext,
    run_to_completion,
    wait_for,
)
from rollnet.reference.coordinator.dispatch import (
    PROMPT_TOKENS,
    TASK_STATE_TO_PROTO,
    lease_outcome_refusal,
    task_to_proto,
)
from rollnet.reference.coordinator.nodes import (
    REFUSED_STATES,
    Caller,
    duration,
    eject_node,
    refuse_unless_in_standing,
    refuse_unless_reaching_others,
    refuse_unusable,
    timestamp,
)
from rollnet.reference.coordinator.refusal import Refusal, Violations, invalid
from rollnet.reference.coordinator.uploads import QuotaExceeded, has_room
from rollnet.sdk.commitments import batch_binding_digest, max_batch_bytes, receipt_message
from rollnet.sdk.errors import ErrorReason
from rollnet.sdk.methods import method_path
from rollnet.sdk.proofs.binding import SEED_DOMAIN, derive_sampling_seed, proof_digest
from rollnet.sdk.proofs.challenge import sign_challenge
from rollnet.sdk.proofs.statistics import policy_for as statistics_policy_for
from rollnet.v1 import (
    blob_service_pb2,
    commitment_pb2,
    commitment_service_pb2,
    common_pb2,
    rollout_pb2,
    task_pb2,
    validation_pb2,
    validation_service_pb2,
)

_GET_COMMITMENT = method_path("CommitmentService", "GetCommitment")

# Work units are MFLOPs: tokens x forward FLOPs per token / 10^6.
FLOPS_PER_WORK_UNIT = 1_000_000


def work_units(prefill_tokens: int, decode_tokens: int, flops_per_token: int) -> int:
    """Integer work units (MFLOPs) for a number of processed tokens."""
    return (prefill_tokens + decode_tokens) * flops_per_token // FLOPS_PER_WORK_UNIT


def spot_check_probability(streak: int, trusted_streak: int, min_rate: float) -> float:
    """BOINC-style adaptive replication: validate everything until trusted, then thin out."""
    if streak < trusted_streak:
        return 1.0
    return max(min_rate, trusted_streak / max(streak, 1))


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


_PRECHECKED_BYTES = 1 << 20
"""Rollout blobs above this size are read only for a caller whose lease may submit them."""
_FINGERPRINT_INLINE_BYTES = 64 << 10
"""Batches up to this size are fingerprinted on the event loop (a few ms at most), larger ones
on a thread."""

_ROLLOUTS_FIELD = 6
"""``RolloutBatch.rollouts``' field number."""


def count_rollouts(data: bytes, limit: int) -> int:
    """The ``rollouts`` entries of a serialized ``RolloutBatch``, counted on the wire up to
    ``limit`` (the scan stops there) without parsing them; ``-1`` when the bytes are not a
    well-formed message (a truncated or impossible field)."""
    view = memoryview(data)
    position, count, size = 0, 0, len(data)

    def varint() -> int:
        nonlocal position
        value, shift = 0, 0
        while True:
            if position >= size or shift > 63:
                raise ValueError("truncated varint")
            byte = view[position]
            position += 1
            value |= (byte & 0x7F) << shift
            if not byte & 0x80:
                return value
            shift += 7

    try:
        while position < size and count < limit:
            tag = varint()
            field, wire = tag >> 3, tag & 7
            if wire == 0:
                varint()
            elif wire == 1:
                position += 8
            elif wire == 5:
                position += 4
            elif wire == 2:
                length = varint()  # before the add: varint() moves the position itself
                position += length
                if field == _ROLLOUTS_FIELD:
                    count += 1
            else:  # groups (3, 4) are not in this schema; 6 and 7 do not exist
                return -1
            if position > size:
                return -1
    except ValueError:
        return -1
    return count


def slash_amount(units: int, check_probability: float) -> int:
    """What a rejected commitment costs its node: the claimed work divided by the probability
    with which it was chosen for checking, rounded up.

    Unchecked commitments are credited, so with a slash of the work alone, cheating on work
    checked one time in ten would pay nine times over. Divided by p, a cheat's expected value is
    at most zero: (1 - p) x W credited, p x W / p slashed.
    """
    if not 0 < check_probability <= 1:
        raise ValueError(f"check probability {check_probability} is not in (0, 1]")
    # Exact rational arithmetic: no rounding of p (a tiny p, after a long streak with
    # min_validation_rate = 0, must neither divide by zero nor shrink the slash).
    return math.ceil(Fraction(units) / Fraction(check_probability))


def spot_check_draw(seed: int, commitment_id: str) -> float:
    """A reproducible uniform draw in [0, 1) for one commitment."""
    digest = hashlib.blake2b(f"{seed}:{commitment_id}".encode(), digest_size=8).digest()
    value: int = struct.unpack(">Q", digest)[0]
    return value / 2**64


_DRAIN_SECONDS = 30.0
"""Longest a refused upload's remaining bytes are read before the refusal is sent."""


class _Copied(Refusal):
    """A commitment refused as a copy: the lease is taken back after the rollback."""

    def __init__(self, found: list[copies.Copy]) -> None:
        super().__init__(ErrorReason.ROLLOUT_DUPLICATE, copies.refusal_message(found))
        self.copies = found


async def _drain(chunks: AsyncIterator[bytes], limit: int, seconds: float) -> None:
    """Read and drop up to ``limit`` more bytes of ``chunks``, for at most ``seconds``."""

    async def read() -> None:
        left = limit
        async for chunk in chunks:
            left -= len(chunk)
            if left <= 0:
                return

    with contextlib.suppress(Exception):  # the refusal is the answer, whatever happens here
        await asyncio.wait_for(read(), seconds)


class WorkDesk:
    """Receives uploads and commitments, routes validation, records verdicts."""

    def __init__(self, ctx: CoordinatorContext) -> None:
        self.ctx = ctx

    # ---------------------------------------------------------------- blobs
    async def upload(
        self, caller: Caller, header: blob_service_pb2.BlobHeader, chunks: AsyncIterator[bytes]
    ) -> blob_service_pb2.UploadBlobResponse:
        """Store a streamed blob after checking its size and digest.

        A worker may upload rollout batches only, charged to its quota of unreferenced uploads
        until a commitment records them; a trainer's checkpoint shards are not charged. No
        upload may take the store below its free-space reserve.
        """
        config = self.ctx.config
        digest, size = header.blob.blake3, header.blob.size
        trusted = caller.role == NodeRole.TRAINER
        refused = self.ctx.metrics.uploads_refused
        if header.kind != blob_service_pb2.BLOB_KIND_ROLLOUT_BATCH and not trusted:
            refused.labels("role").inc()
            raise Refusal(ErrorReason.ROLE_NOT_ALLOWED, "only trainers upload checkpoint shards")
        if size > self.ctx.blobs.max_bytes:
            raise Refusal(
                ErrorReason.BLOB_TOO_LARGE,
                f"blob of {size} bytes exceeds the cap of {self.ctx.blobs.max_bytes}",
            )
        # An ejected (or deregistered) worker has nothing left to commit: no quota, no disk.
        # Its state as the call's key was resolved (no read on this per-lease path); a key
        # evicted since then is read again, and so is one whose cached state would refuse: the
        # node may have registered again (or been reinstated) since, here or on another replica.
        # SubmitCommitment reads it in its transaction.
        state = self.ctx.cached_state(caller.public_key)
        if state is None or state in REFUSED_STATES:
            await self.ctx.run_read(partial(refuse_unless_in_standing, caller=caller))
        uploads = self.ctx.uploads

        def over_quota(error: QuotaExceeded) -> Refusal:
            refused.labels("quota").inc()
            return Refusal(ErrorReason.UPLOAD_QUOTA_EXCEEDED, str(error))

        def storage_full(what: str) -> Refusal:
            refused.labels("storage").inc()
            return Refusal(
                ErrorReason.STORAGE_FULL,
                f"{what} would leave less than the reserve of {config.min_free_disk_bytes} "
                f"bytes free",
                retry_after=config.blob_sweep_interval.total_seconds(),
            )

        # The reserve is kept at the header, at every chunk of a large upload (written to its
        # temporary file as it comes) and before a small one is stored; bytes held in memory by
        # uploads in flight count, as the disk's free space does not show them yet.
        if not self.ctx.blobs.exists(digest) and not has_room(
            self.ctx.blobs.root,
            uploads.footprint(size) + uploads.buffered_bytes(),
            config.min_free_disk_bytes,
        ):
            raise storage_full(f"storing {size} bytes")
        # Charged from the header, whether or not the content is stored already (it may be
        # swept before the stream ends); the stream whose bytes become the file owns it, told
        # by the thread that renames it into place (even if this call is cancelled meanwhile).
        to_disk = self.ctx.blobs.streams_to_disk(size)
        try:
            reservation = uploads.begin(
                None if trusted else caller.node_id, digest, size, in_memory=not to_disk
            )
        except QuotaExceeded as error:
            raise over_quota(error) from None

        full: list[Refusal] = []  # set when the disk reached the reserve mid-stream

        async def counted() -> AsyncIterator[bytes]:
            async for chunk in chunks:
                uploads.received(reservation, len(chunk))
                # Written to the temporary file before any other coroutine runs: the check and
                # the write cannot interleave with another upload's.
                if to_disk and not has_room(
                    self.ctx.blobs.root,
                    len(chunk) + uploads.buffered_bytes(),
                    config.min_free_disk_bytes,
                ):
                    full.append(storage_full("the rest of this upload"))
                    raise full[0]
                yield chunk

        def admit(_size: int) -> None:
            uploads.admit(reservation)
            # Its bytes and those of the other small uploads not on the disk yet must fit now.
            if not to_disk and not has_room(
                self.ctx.blobs.root, uploads.buffered_bytes(), config.min_free_disk_bytes
            ):
                raise storage_full(f"storing these {size} bytes")

        try:
            stored: StoredBlob = await self.ctx.blobs.write(
                digest,
                size,
                counted(),
                on_created=lambda actual: uploads.created(reservation, actual),
                admit=admit,
                on_done=lambda complete: uploads.finish(reservation, stored=complete),
            )
        except QuotaExceeded as error:  # a free re-send that would store its file anew
            raise over_quota(error) from None
        except BlobTooLarge as error:
            raise Refusal(ErrorReason.BLOB_TOO_LARGE, str(error)) from error
        except BlobSizeMismatch as error:
            raise Refusal(ErrorReason.BLOB_SIZE_MISMATCH, str(error)) from error
        except BlobDigestMismatch as error:
            raise Refusal(ErrorReason.BLOB_HASH_MISMATCH, str(error)) from error
        except Refusal:
            if full:
                # The temporary file is gone and the room released; read (and drop) what the
                # client still sends, up to its declared size and for a bounded time, before
                # answering: a client still sending when the call ends sees gRPC's INTERNAL
                # instead of this refusal.
                await _drain(chunks, size - reservation.received, _DRAIN_SECONDS)
            raise
        # No database write here: the file is the blob. Its row is written in the transaction
        # of the commitment (or checkpoint) that references it, saving a commit per upload.
        return blob_service_pb2.UploadBlobResponse(
            blob=common_pb2.BlobRef(blake3=stored.digest, size=stored.size),
            already_present=stored.already_present,
        )

    async def download(
        self, request: blob_service_pb2.GetBlobRequest, chunk_size: int = 1 << 20
    ) -> AsyncIterator[blob_service_pb2.GetBlobResponse]:
        """Stream a stored blob from ``offset``."""
        if not self.ctx.blobs.exists(request.blake3):
            name = request.blake3.hex()
            row = await self.ctx.run_read(lambda session: artifacts.get_blob(session, name))
            if row is not None and row.pruned_at is not None:
                raise Refusal(
                    ErrorReason.BLOB_NOT_FOUND,
                    f"blob {name} (the batch of uncredited work) was deleted at "
                    f"{row.pruned_at.isoformat()}, rejected_blob_ttl after its validation ended",
                )
            raise Refusal(ErrorReason.BLOB_NOT_FOUND, f"no blob {name}")
        offset = request.offset
        end: int | None = request.offset + request.length if request.length else None
        while True:
            want = chunk_size if end is None else min(chunk_size, end - offset)
            if want <= 0:
                return
            total, data = self.ctx.blobs.read_range(request.blake3, offset, want)
            if offset > total:
                raise invalid(("offset", f"{offset} is beyond the blob's size {total}"))
            if not data:
                if offset == total and offset == request.offset:
                    yield blob_service_pb2.GetBlobResponse(offset=offset, total_size=total)
                return
            yield blob_service_pb2.GetBlobResponse(offset=offset, chunk=data, total_size=total)
            offset += len(data)

    # ---------------------------------------------------------------- commitments
    def _checked_batch(
        self, caller: Caller, request: commitment_service_pb2.SubmitCommitmentRequest
    ) -> tuple[rollout_pb2.RolloutBatch, int]:
        """A blob over ``_PRECHECKED_BYTES``, on a thread: read only after :meth:`_precheck`
        (a read-only session) found the lease good and the blob within the task's bound. A
        smaller one costs less to parse than that read (~3 ms of coordinator CPU per
        commitment, measured) and is bounded by the commitment's own rollout count."""
        with read_only_session(self.ctx.sessions) as session:
            terms = self._precheck(session, caller, request)
        return self._load_batch(request.rollout_batch.blake3, terms)

    def _precheck(
        self,
        session: Session,
        caller: Caller,
        request: commitment_service_pb2.SubmitCommitmentRequest,
    ) -> tuple[int, int]:
        """Before the blob is read: the task's batch terms (:meth:`_batch_terms`), or a refusal when
        this lease may not submit it and this is not a repeat of work it committed (a repeat
        goes on to be answered, request-id checks and all, in the transaction)."""
        task = tasks.get_terms(session, request.task_id)
        if task is None:
            raise Refusal(ErrorReason.LEASE_NOT_FOUND, f"no task {request.task_id}")
        outcome = tasks.submission_outcome(
            session,
            task_id=request.task_id,
            lease_id=request.lease_id,
            fencing_token=request.fencing_token,
            node_id=caller.node_id,
            now=self.ctx.clock(),
        )
        if outcome is not LeaseOutcome.OK and _task_and_repeat(session, caller, request)[1] is None:
            raise lease_outcome_refusal(outcome, f"task {request.task_id}")
        return self._batch_terms(task)

    @staticmethod
    def _batch_terms(task: TaskTerms) -> tuple[int, int]:
        """The rollouts a task's batch holds, and the most bytes it may take."""
        rollouts = len(task.prompt_ids) * int(task.sampling["samples_per_prompt"])
        return rollouts, max_batch_bytes(rollouts, int(task.sampling["max_new_tokens"]))

    def _load_batch(
        self, digest: bytes, terms: tuple[int, int]
    ) -> tuple[rollout_pb2.RolloutBatch, int]:
        expected, limit = terms
        size = self.ctx.blobs.size(digest)
        if size > limit:
            raise Refusal(
                ErrorReason.ROLLOUT_BATCH_INVALID,
                f"rollout blob is {size} bytes, a batch for this task is at most {limit}",
            )
        _, data = self.ctx.blobs.read_range(digest, 0, 0)
        # Counted on the wire before anything is built: a blob of many tiny rollouts grows
        # ~50x when parsed (2 bytes each on the wire, ~110 in memory).
        count = count_rollouts(data, limit=expected + 1)
        if count < 0:
            raise Refusal(ErrorReason.ROLLOUT_BATCH_INVALID, "rollout blob is not a RolloutBatch")
        if count != expected:
            more = "more than " if count > expected else ""
            raise Refusal(
                ErrorReason.ROLLOUT_BATCH_INVALID,
                f"batch holds {more}{min(count, expected)} rollouts, {expected} expected",
            )
        try:
            return rollout_pb2.RolloutBatch.FromString(data), len(data)
        except DecodeError as error:
            raise Refusal(
                ErrorReason.ROLLOUT_BATCH_INVALID, f"rollout blob is not a RolloutBatch: {error}"
            ) from None

    def _check_batch(
        self,
        batch: rollout_pb2.RolloutBatch,
        request: commitment_service_pb2.SubmitCommitmentRequest,
        caller: Caller,
        task: TaskTerms,
    ) -> None:
        problems: list[str] = []
        if batch.task_id != request.task_id:
            problems.append("batch.task_id differs from the commitment's task")
        if batch.lease_id != request.lease_id or batch.fencing_token != request.fencing_token:
            problems.append("batch lease differs from the commitment's lease")
        if batch.node_id != caller.node_id:
            problems.append("batch.node_id is not the submitting node")
        if batch.checkpoint_step != task.checkpoint_step:
            problems.append(
                f"batch.checkpoint_step {batch.checkpoint_step} != task's {task.checkpoint_step}"
            )
        spec = task.sampling
        expected = len(task.prompt_ids) * int(spec["samples_per_prompt"])
        if len(batch.rollouts) != expected:
            problems.append(f"batch holds {len(batch.rollouts)} rollouts, task asks {expected}")
        if len(request.rollouts) != len(batch.rollouts):
            problems.append("commitment lists a different number of rollouts than the batch")
        max_new_tokens = int(spec["max_new_tokens"])
        samples = int(spec["samples_per_prompt"])
        network_id, task_id = self.ctx.config.network_id, request.task_id
        prompt_tokens: list[int] | None = spec.get(PROMPT_TOKENS)
        for index, (rollout, digest) in enumerate(
            zip(batch.rollouts, request.rollouts, strict=False)
        ):
            # Checked here, not only by a validator: a commitment that is not spot-checked is
            # credited for its prompt and completion tokens, so both are bounded by what the
            # coordinator knows: each prompt's recorded length, and max_new_tokens.
            prompt = index // samples
            if prompt_tokens is not None and prompt < len(prompt_tokens):
                if rollout.prompt_index != prompt:
                    problems.append(
                        f"rollouts[{index}].prompt_index is {rollout.prompt_index}; the "
                        f"rollout order puts prompt {prompt} there"
                    )
                elif len(rollout.prompt_token_ids) != prompt_tokens[prompt]:
                    problems.append(
                        f"rollouts[{index}] has {len(rollout.prompt_token_ids)} prompt tokens; "
                        f"prompt {prompt} has {prompt_tokens[prompt]} with the task's checkpoint"
                    )
            if len(rollout.completion_token_ids) > max_new_tokens:
                problems.append(
                    f"rollouts[{index}] has {len(rollout.completion_token_ids)} completion "
                    f"tokens, the task allows {max_new_tokens}"
                )
            if proof_digest(rollout.toploc_proof) != digest.proof_blake3:
                problems.append(f"rollouts[{index}].proof_blake3 does not match the batch")
            if rollout.sampling_seed != digest.sampling_seed:
                problems.append(f"rollouts[{index}].sampling_seed does not match the batch")
            elif rollout.sampling_seed != derive_sampling_seed(network_id, task_id, index):
                # Checked here too, not only by a validator: unchecked work is credited.
                problems.append(
                    f"rollouts[{index}].sampling_seed is not the task's seed "
                    f"{derive_sampling_seed(network_id, task_id, index)}: BLAKE3("
                    f'"{SEED_DOMAIN}", network id, task id, rollout index)[:8] >> 1 '
                    "(docs/verification.md, Binding)"
                )
            if len(rollout.completion_token_ids) != digest.completion_tokens:
                problems.append(f"rollouts[{index}].completion_tokens does not match the batch")
            if len(problems) > 8:
                break
        if problems:
            raise Refusal(ErrorReason.ROLLOUT_BATCH_INVALID, "; ".join(problems[:8]))

    async def submit(
        self, caller: Caller, request: commitment_service_pb2.SubmitCommitmentRequest
    ) -> commitment_service_pb2.SubmitCommitmentResponse:
        """Accept a commitment for a held lease, answer with a signed receipt."""
        config = self.ctx.config
        expected_binding = batch_binding_digest(
            config.network_id,
            caller.node_id,
            request.task_id,
            request.lease_id,
            request.fencing_token,
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
                batch, batch_size = self._load_batch(digest, terms)
            else:
                batch, batch_size = await asyncio.to_thread(self._checked_batch, caller, request)
        except Refusal as refusal:
            # Without its traceback, the refusal keeps no frame (and no blob) alive.
            raise refusal.with_traceback(None) from None
        now = self.ctx.clock()
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

        def check_batch(task: TaskTerms) -> None:
            if batch_size != request.rollout_batch.size:
                raise Refusal(ErrorReason.BLOB_SIZE_MISMATCH, "rollout_batch.size is wrong")
            self._check_batch(batch, request, caller, task)

        def refused_or_repeated(
            session: Session,
        ) -> tuple[commitment_service_pb2.SubmitCommitmentResponse, bool]:
            # Nothing changed. The same work submitted again (a retry whose first answer was
            # lost) is answered with the original commitment and receipt; else say why not.
            task, existing = _task_and_repeat(session, caller, request)
            if existing is not None:
                return self._response(session, existing, request.binding_digest), False
            refuse_unless_in_standing(session, caller)  # ejected, banned: say so, not the lease
            check_batch(task)
            outcome = tasks.why_not_submitted(
                session,
                task_id=request.task_id,
                lease_id=request.lease_id,
                fencing_token=request.fencing_token,
                node_id=caller.node_id,
                now=now,
            )
            raise lease_outcome_refusal(outcome, f"task {request.task_id}")

        def work(
            session: Session,
        ) -> tuple[commitment_service_pb2.SubmitCommitmentResponse, bool]:
            # The common case in one statement: the lease allows it, the task becomes SUBMITTED
            # and its terms come back. Any refusal below rolls that back with the rest.
            task = tasks.submit_and_get_terms(
                session,
                task_id=request.task_id,
                lease_id=request.lease_id,
                fencing_token=request.fencing_token,
                node_id=caller.node_id,
                now=now,
            )
            if task is None:
                return refused_or_repeated(session)
            check_batch(task)
            found = copies.find_copies(prints, fingerprints.find_originals(session, prints))
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
                task_id=request.task_id,
                lease_id=request.lease_id,
                fencing_token=request.fencing_token,
                node_id=caller.node_id,
                now=now,
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
        commitment = commitment_to_proto(session, row)
        return self._receipted(commitment, binding_digest, row.signature, row.received_at)

    def _receipted(
        self,
        commitment: commitment_pb2.Commitment,
        binding_digest: bytes,
        signature: bytes,
        received_at: datetime,
    ) -> commitment_service_pb2.SubmitCommitmentResponse:
        receipt = commitment_pb2.Receipt(
            commitment_id=commitment.commitment_id,
            binding_digest=binding_digest,
            received_at=timestamp(received_at),
            coordinator_public_key=self.ctx.identity.public_key,
            signature=signature,
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
        flops = _flops_per_token(session, task.checkpoint_step)
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
                commitment=commitment_to_proto(session, row)
            )

        return await self.ctx.run_read(work)

    # ---------------------------------------------------------------- validation
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
            record = commitment_to_proto(session, commitment)
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
                lease=task_pb2.Lease(
                    lease_id=leased.lease_id,
                    fencing_token=leased.fencing_token,
                    deadline=timestamp(leased.lease_deadline),
                    issued_at=timestamp(now),
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
        """Record a verdict: credit or slash, trust update, ejection after repeated rejects."""
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
        config = self.ctx.config
        now = self.ctx.clock()
        verdict_id = secrets.token_hex(12)
        accepted = request.decision == accept
        ejected: list[str] = []  # the worker, when this reject ejects it
        rejected: list[str] = []  # the worker, when this is a reject
        flagged: list[str] = []  # the per-node test that flagged the worker, if one did

        def work(session: Session) -> validation_service_pb2.SubmitVerdictResponse:
            refuse_unless_in_standing(session, caller)
            job = validation.get_job(session, request.job_id)
            if job is None:
                raise Refusal(ErrorReason.JOB_NOT_FOUND, f"no validation job {request.job_id}")
            commitment = artifacts.get_commitment(session, job.commitment_id)
            assert commitment is not None
            task = tasks.get_task(session, commitment.task_id)
            assert task is not None
            expected = len(task.prompt_ids) * int(task.sampling["samples_per_prompt"])
            if accepted and len(request.validated_rewards) != expected:
                raise invalid(
                    ("validated_rewards", f"must hold {expected} rewards, one per rollout")
                )
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
            flops = _flops_per_token(session, task.checkpoint_step)
            if accepted:
                units = work_units(
                    request.validated_work.prefill_tokens,
                    request.validated_work.decode_tokens,
                    flops,
                )
            else:
                units = work_units(commitment.claimed_work, 0, flops)
            figures: dict[str, Any] = {
                "checks": [_check_to_json(c) for c in request.checks],
                "validated_rewards": [
                    [r.task_reward, r.length_penalty, r.total] for r in request.validated_rewards
                ],
            }
            outcome = validation.submit_verdict(
                session,
                job_id=request.job_id,
                lease_id=request.lease_id,
                fencing_token=request.fencing_token,
                validator_id=caller.node_id,
                verdict_id=verdict_id,
                accepted=accepted,
                reasons=[] if accepted else [request.reject_reason],
                check_figures=figures,
                awarded_work=units if accepted else 0,
                now=now,
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
            worker = nodes.get_node(session, commitment.node_id)
            assert worker is not None
            entries = []
            if accepted:
                tasks.transition_task(
                    session,
                    task.id,
                    from_state=TaskState.VALIDATING,
                    to_state=TaskState.ACCEPTED,
                    now=now,
                )
                entries.append(
                    NewEntry(
                        node_id=commitment.node_id,
                        kind=EntryKind.CREDIT,
                        amount=units,
                        commitment_id=commitment.id,
                        verdict_id=verdict_id,
                    )
                )
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
                    temperature=float(task.sampling["temperature"]),
                    now=now,
                )
                if flag is not None:
                    flagged.append(flag.test)
                if flag is not None and worker.state not in (NodeState.BANNED, NodeState.EJECTED):
                    # This commitment's work passed every check: it stays credited. What the
                    # node holds besides (leases, pending validation) is taken back as for any
                    # ejection; its committed batches are still judged one by one.
                    ejected.append(commitment.node_id)
                    eject_node(
                        session,
                        commitment.node_id,
                        NodeState.EJECTED,
                        flag.reason,
                        now=now,
                        max_attempts=config.max_attempts,
                        max_validation_attempts=config.max_validation_attempts,
                    )
            else:
                tasks.transition_task(
                    session,
                    task.id,
                    from_state=TaskState.VALIDATING,
                    to_state=TaskState.REJECTED,
                    now=now,
                )
                attempts.record_attempts(
                    session,
                    [
                        attempts.EndedLease(
                            task.id,
                            commitment.node_id,
                            commitment.lease_id,
                            commitment.fencing_token,
                        )
                    ],
                    outcome=AttemptOutcome.REJECTED,
                    now=now,
                    reason=request.reject_reason,
                )
                rejected[:] = [commitment.node_id]
                # The prompts still need honest rollouts: queue a fresh copy of the task.
                tasks.requeue_copy(session, task.id, new_task_id=secrets.token_hex(12), now=now)
                entries.append(
                    NewEntry(
                        node_id=commitment.node_id,
                        kind=EntryKind.SLASH,
                        amount=-slash_amount(units, job.check_probability),
                        commitment_id=commitment.id,
                        verdict_id=verdict_id,
                        memo=request.reject_reason[:200],
                    )
                )
                nodes.set_trust(session, commitment.node_id, trust=0.0, accepted_streak=0)
                rejects = validation.count_rejected_commitments(session, commitment.node_id)
                # Rejects an operator forgave by reinstating the node do not count again.
                counted = rejects - worker.rejects_forgiven
                if counted >= config.eject_after_rejects and worker.state not in (
                    NodeState.BANNED,
                    NodeState.EJECTED,
                ):
                    ejected.append(commitment.node_id)
                    eject_node(
                        session,
                        commitment.node_id,
                        NodeState.EJECTED,
                        f"{rejects} rejected commitments (last: {request.reject_reason})",
                        now=now,
                        max_attempts=config.max_attempts,
                        max_validation_attempts=config.max_validation_attempts,
                    )
            entries.append(
                NewEntry(
                    node_id=caller.node_id,
                    kind=EntryKind.VALIDATOR_REWARD,
                    amount=max(1, units // 100),
                    commitment_id=commitment.id,
                    verdict_id=verdict_id,
                )
            )
            chain.append_entries(session, entries, now=now)
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
            return validation_service_pb2.SubmitVerdictResponse(verdict=verdict)

        response = await self.ctx.run_in_transaction(work)
        if ejected:
            self.ctx.forget_keys()  # its cached state is ACTIVE no more
        verdict = response.verdict
        metrics = self.ctx.metrics
        metrics.verdicts.labels(
            "accept" if accepted else "reject", request.reject_reason or "none"
        ).inc()
        signals = self.ctx.signals
        for test in flagged:
            metrics.nodes_flagged.labels(test).inc()
        if accepted:
            metrics.work_units.inc(verdict.work_units)
            signals.fire(signals.rollouts_accepted)
        else:
            for node_id in rejected:
                metrics.attempts_ended.labels(node_id, AttemptOutcome.REJECTED.value).inc()
            signals.fire(signals.work_available)
        return response

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


def _check_to_json(check: validation_pb2.CheckResult) -> dict[str, Any]:
    item: dict[str, Any] = {
        "check": check.check,
        "passed": check.passed,
        "reason": check.reason,
        "figures": dict(check.figures),
    }
    if check.HasField("rollout_index"):
        item["rollout_index"] = check.rollout_index
    return item


def _flops_per_token(session: Session, step: int) -> int:
    from rollnet.v1 import checkpoint_pb2

    row = artifacts.get_checkpoint(session, step)
    if row is None:
        return 0
    return int(checkpoint_pb2.CheckpointManifest.FromString(row.manifest).flops_per_token)


COMMITMENT_STATE = {
    TaskState.SUBMITTED: commitment_pb2.Commitment.STATE_PENDING,
    TaskState.VALIDATING: commitment_pb2.Commitment.STATE_VALIDATING,
    TaskState.ACCEPTED: commitment_pb2.Commitment.STATE_ACCEPTED,
    TaskState.REJECTED: commitment_pb2.Commitment.STATE_REJECTED,
    # A task FAILED after a commitment was made: its validation was given up.
    TaskState.FAILED: commitment_pb2.Commitment.STATE_UNVERIFIABLE,
}


def commitment_to_proto(session: Session, row: Commitment) -> commitment_pb2.Commitment:
    """The wire form of a stored commitment (state derived from its task and verdict)."""
    task = tasks.get_task(session, row.task_id)
    assert task is not None
    verdict = validation.get_verdict_for_commitment(session, row.id)
    if verdict is not None:
        state = (
            commitment_pb2.Commitment.STATE_ACCEPTED
            if verdict.accepted
            else commitment_pb2.Commitment.STATE_REJECTED
        )
    else:
        state = COMMITMENT_STATE.get(task.state, commitment_pb2.Commitment.STATE_PENDING)
    if row.record is not None:
        commitment = commitment_pb2.Commitment.FromString(row.record)
        claimed = commitment.claimed_work
        if claimed.prefill_tokens + claimed.decode_tokens != row.claimed_work:
            # Recorded as the node sent it (before the coordinator stored its own count): a
            # figure nobody checked is not shown.
            commitment.ClearField("claimed_work")
    else:  # stored before migration 0003: only what the row's columns hold
        blob = artifacts.get_blob(session, row.rollout_blob_hash)
        commitment = commitment_pb2.Commitment(
            commitment_id=row.id,
            task_id=row.task_id,
            lease_id=row.lease_id,
            fencing_token=row.fencing_token,
            node_id=row.node_id,
            rollout_batch=common_pb2.BlobRef(
                blake3=bytes.fromhex(row.rollout_blob_hash), size=blob.size if blob else 0
            ),
            checkpoint_step=task.checkpoint_step,
            claimed_work=commitment_pb2.WorkClaim(decode_tokens=row.claimed_work),
            received_at=timestamp(row.received_at),
        )
    commitment.state = state
    commitment.validated = verdict is not None
    return commitment


__all__ = ["TASK_STATE_TO_PROTO", "WorkDesk"]
