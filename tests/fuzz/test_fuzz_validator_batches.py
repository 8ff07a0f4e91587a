"""Hostile rollout batches to the validator's checks (issue 25): a malformed proof, wrong
lengths, out-of-vocabulary tokens, NaN log-probabilities, unknown enum values, huge lists.

An honest batch of the tiny model is made once; hypothesis rewrites one of its rollouts on the
wire (any field, edge values, fields sent twice) and the batch is sealed again the way a
coordinator hands it out, so the commitment matches and every per-rollout check runs; or the
blob itself is damaged. The property: :func:`validate_job` returns a verdict (a rejection names
its reason) or raises :class:`JobUncheckable` (the job is not the worker's fault), never
anything else, and never stalls (a stalled or crashing validator leaves the job to the next
one, which stalls or crashes too).
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import cast

import blake3
import pytest
from fuzz_testing import NETWORK, fuzz_settings
from google.protobuf.message import DecodeError
from hypothesis import event, given
from hypothesis import strategies as st
from wire_strategies import Pools, mangled, message

from rollnet.reference.adversary import Cheat, CheatingGenerator
from rollnet.reference.inference.tokenization import CheckpointTokenizer
from rollnet.reference.inference.torch_backend import TorchBackend
from rollnet.reference.validator import (
    CheckpointModel,
    EnvironmentCache,
    JobUncheckable,
    validate_job,
)
from rollnet.sdk.checkpoints import CheckpointStore
from rollnet.sdk.client import RollnetClient
from rollnet.sdk.proofs import FLOAT32, LeaseBinding, commitment_digest, proof_digest
from rollnet.sdk.worker import LeaseContext
from rollnet.v1 import (
    commitment_pb2,
    common_pb2,
    rollout_pb2,
    task_pb2,
    validation_pb2,
)

EXAMPLES = 10
#: Far above what one check of the tiny model's batch takes; past it the validator stalls.
STALL_SECONDS = 120.0


@dataclass
class Honest:
    model: CheckpointModel
    environments: EnvironmentCache
    task: task_pb2.Task
    lease: LeaseBinding
    rollouts: list[rollout_pb2.Rollout]
    pool: concurrent.futures.ThreadPoolExecutor


@pytest.fixture(scope="module")
def honest(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Honest]:
    from rollnet.reference.model.tiny import init_tiny_model

    root = tmp_path_factory.mktemp("validator-fuzz")
    model_dir = init_tiny_model(root / "checkpoints" / "step-1", seed=0)
    backend = TorchBackend()
    backend.load(str(model_dir))
    model = CheckpointModel(
        step=1,
        backend=backend,
        tokenizer=CheckpointTokenizer.load(model_dir),
        thresholds=FLOAT32,
    )
    task = task_pb2.Task(
        task_id="task-fuzz",
        environment="arithmetic",
        prompt_ids=[3, 17],
        samples_per_prompt=2,
        sampling=common_pb2.SamplingParams(temperature=1.0, max_new_tokens=12),
        checkpoint_step=1,
    )
    context = LeaseContext(
        task=task,
        lease=task_pb2.Lease(lease_id="lease-fuzz", fencing_token=1),
        network_id=NETWORK,
        node_id="node-fuzz",
        client=cast(RollnetClient, None),  # the checkpoint is in the store: never asked
        deadline=time.monotonic() + 600,
    )
    # PROOF_REUSED cheats only when sealing: its generator is the honest one.
    generator = CheatingGenerator(
        Cheat.PROOF_REUSED, CheckpointStore(root / "checkpoints", network_id=NETWORK)
    )
    try:
        import asyncio

        rollouts = list(asyncio.run(generator.generate(task, context)))
    finally:
        generator.close()
    environments = EnvironmentCache()
    pool = concurrent.futures.ThreadPoolExecutor(1)
    try:
        yield Honest(model, environments, task, context.binding, rollouts, pool)
    finally:
        pool.shutdown(wait=False, cancel_futures=True)
        environments.close()


def seal(
    task: task_pb2.Task, lease: LeaseBinding, rollouts: Sequence[rollout_pb2.Rollout]
) -> tuple[validation_pb2.ValidationJob, bytes]:
    """The job a coordinator would hand out for ``rollouts`` (digests that match), and the
    batch's bytes."""
    batch = rollout_pb2.RolloutBatch(
        task_id=task.task_id,
        lease_id=lease.lease_id,
        fencing_token=lease.fencing_token,
        node_id=lease.node_id,
        checkpoint_step=task.checkpoint_step,
        rollouts=rollouts,
    ).SerializeToString(deterministic=True)
    blob = blake3.blake3(batch).digest()
    digests = [
        commitment_pb2.RolloutDigest(
            sampling_seed=r.sampling_seed,
            proof_blake3=proof_digest(r.toploc_proof),
            completion_tokens=len(r.completion_token_ids),
            commitment_digest=_digest(lease, blob, i, r),
        )
        for i, r in enumerate(rollouts)
    ]
    commitment = commitment_pb2.Commitment(
        commitment_id="commitment-fuzz",
        task_id=task.task_id,
        lease_id=lease.lease_id,
        fencing_token=lease.fencing_token,
        node_id=lease.node_id,
        rollout_batch=common_pb2.BlobRef(blake3=blob, size=len(batch)),
        checkpoint_step=task.checkpoint_step,
        rollouts=digests,
    )
    job = validation_pb2.ValidationJob(
        job_id="job-fuzz", commitment=commitment, task=task, network_id=lease.network_id
    )
    return job, batch


def _digest(lease: LeaseBinding, blob: bytes, index: int, rollout: rollout_pb2.Rollout) -> bytes:
    if rollout.sampling_seed >= 1 << 63:  # no digest holds it: a cheat sends any 32 bytes
        return bytes(32)
    return commitment_digest(
        lease,
        blob_blake3=blob,
        rollout_index=index,
        sampling_seed=rollout.sampling_seed,
        prompt_ids=rollout.prompt_token_ids,
        completion_ids=rollout.completion_token_ids,
        proof=rollout.toploc_proof,
    )


_ROLLOUT = rollout_pb2.Rollout.DESCRIPTOR
_POOLS = Pools(numbers=[0, 1, 2, 3, 17, 255, 256, 511, 512, 2**32 - 1])
_REWRITE = mangled(_ROLLOUT, message(_ROLLOUT, _POOLS), oversize=1 << 16)


@fuzz_settings(EXAMPLES)
@given(
    index=st.integers(0, 3),
    extra=_REWRITE,
    replace=st.booleans(),
    keep_order=st.sampled_from([True, True, True, False]),
    damage=st.one_of(st.none(), st.none(), st.none(), st.integers(1, 64)),
)
def test_validator_rejects_hostile_batches(
    honest: Honest,
    index: int,
    extra: bytes,
    replace: bool,
    keep_order: bool,
    damage: int | None,
) -> None:
    rollouts = [rollout_pb2.Rollout() for _ in honest.rollouts]
    for mine, theirs in zip(rollouts, honest.rollouts, strict=True):
        mine.CopyFrom(theirs)
    original = honest.rollouts[index].SerializeToString(deterministic=True)
    try:
        rewritten = rollout_pb2.Rollout.FromString(extra if replace else original + extra)
    except DecodeError:
        rewritten = None
    if rewritten is not None:
        if keep_order:  # where it sits in the batch stays right: the per-rollout checks run
            theirs = honest.rollouts[index]
            rewritten.prompt_index, rewritten.sample_index = (
                theirs.prompt_index,
                theirs.sample_index,
            )
            rewritten.prompt_id = theirs.prompt_id
        rollouts[index] = rewritten
    job, blob = seal(honest.task, honest.lease, rollouts)
    if rewritten is None or damage is not None:
        # Bytes a worker uploaded that do not parse, or a blob cut short: what the commitment
        # names is still these bytes (a coordinator checks only its digest and size).
        bad = blob[: max(len(blob) - (damage or 0), 0)] + (extra if rewritten is None else b"")
        job.commitment.rollout_batch.CopyFrom(
            common_pb2.BlobRef(blake3=blake3.blake3(bad).digest(), size=len(bad))
        )
        blob = bad
    checking = honest.pool.submit(validate_job, job, blob, honest.model, honest.environments)
    try:
        outcome = checking.result(timeout=STALL_SECONDS)
    except JobUncheckable as uncheckable:
        event(f"uncheckable: {type(uncheckable).__name__}")
        return
    except concurrent.futures.TimeoutError:
        raise AssertionError(f"validate_job still running after {STALL_SECONDS} s") from None
    if outcome.accepted:
        event("accepted")
        assert all(check.passed for check in outcome.checks)
    else:
        event(f"rejected: {outcome.reject_reason}")
        assert outcome.reject_reason, "a rejection without a reason"
        request = outcome.to_request("job-fuzz", "lease", 1, "request")
        assert request.decision == validation_pb2.Verdict.DECISION_REJECT
        assert request.reject_reason == outcome.reject_reason
