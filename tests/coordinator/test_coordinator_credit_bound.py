"""Credit for unvalidated work is bounded by what the coordinator knows without a model: each
assigned prompt's token count, recorded with its task from the checkpoint's tokenizer, and the
task's max_new_tokens. A batch whose prompts are padded (issue 17, item 12: a million tokens
each, 5 of 10 credited unvalidated) is refused at submission; honest work is credited for
exactly the recorded counts; work on a checkpoint without a tokenizer is always validated."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from coordinator_testing import (
    commitment_request,
    make_work,
    pull,
    request_tasks,
    running_parties,
)
from google.protobuf import json_format

from rollnet.reference.coordinator.config import CoordinatorConfig, with_overrides
from rollnet.reference.coordinator.credit import work_units
from rollnet.reference.envs.registry import load_environment
from rollnet.reference.inference.tokenization import CheckpointTokenizer
from rollnet.reference.model.tokenizer import save_char_tokenizer
from rollnet.sdk import ErrorReason, Identity, RollnetClient, RollnetError
from rollnet.sdk.domains import CHECKPOINT_DOMAIN
from rollnet.sdk.prompts import encode_problem
from rollnet.sdk.testing import NETWORK_ID
from rollnet.v1 import (
    blob_service_pb2,
    checkpoint_pb2,
    checkpoint_service_pb2,
    commitment_pb2,
    common_pb2,
    ledger_service_pb2,
    rollout_pb2,
    task_pb2,
)

FLOPS_PER_TOKEN = 2_000_000
SHARD = blob_service_pb2.BLOB_KIND_CHECKPOINT_SHARD
BATCH = blob_service_pb2.BLOB_KIND_ROLLOUT_BATCH


async def _publish_with_tokenizer(
    client: RollnetClient, trainer: Identity, step: int, tokenizer_dir: Path
) -> None:
    files = []
    for name, data in (
        ("model.safetensors", f"weights of step {step}".encode()),
        ("tokenizer.json", (tokenizer_dir / "tokenizer.json").read_bytes()),
        ("tokenizer_config.json", (tokenizer_dir / "tokenizer_config.json").read_bytes()),
    ):
        blob = (await client.blobs.upload(data, SHARD)).blob
        ref = common_pb2.BlobRef(blake3=blob.blake3, size=blob.size)
        files.append(checkpoint_pb2.CheckpointFile(path=name, content=ref, shards=[ref]))
    manifest = checkpoint_pb2.CheckpointManifest(
        step=step, network_id=NETWORK_ID, files=files, flops_per_token=FLOPS_PER_TOKEN
    ).SerializeToString()
    await client.checkpoints.publish_checkpoint(
        checkpoint_service_pb2.PublishCheckpointRequest(
            manifest=manifest, signature=trainer.sign(CHECKPOINT_DOMAIN + manifest)
        )
    )


def _honest_prompts(task: task_pb2.Task, tokenizer: CheckpointTokenizer) -> list[list[int]]:
    environment = load_environment(
        task.environment, json_format.MessageToDict(task.environment_config)
    )
    return [encode_problem(tokenizer, environment.prompt(int(p))) for p in task.prompt_ids]


def _with_prompts(work: object, prompts: list[list[int]], samples: int) -> None:
    """Give ``work``'s rollouts (and its batch) these prompt ids, rollout i prompt i // samples."""
    batch = rollout_pb2.RolloutBatch.FromString(work.batch)  # type: ignore[attr-defined]
    for index, rollout in enumerate(batch.rollouts):
        del rollout.prompt_token_ids[:]
        rollout.prompt_token_ids.extend(prompts[index // samples])
    work.batch = batch.SerializeToString()  # type: ignore[attr-defined]
    work.rollouts = list(batch.rollouts)  # type: ignore[attr-defined]


@pytest.mark.timeout(90)
async def test_credit_is_bounded_by_the_recorded_prompt_lengths(
    coordinator_config: CoordinatorConfig, trainer_identity: Identity, tmp_path: Path
) -> None:
    tokenizer_dir = tmp_path / "tokenizer"
    tokenizer_dir.mkdir()
    save_char_tokenizer(tokenizer_dir, 512)
    tokenizer = CheckpointTokenizer.load(tokenizer_dir)
    # Every commitment whose lengths are known skips its spot check (a trusted node).
    config = with_overrides(coordinator_config, trusted_streak=0, min_validation_rate=0.0)
    # Checkpoint 1 has no tokenizer.json: lengths unknown, so the work is validated.
    async with running_parties(config, trainer_identity) as parties:
        trainer, client, worker = parties.trainer, parties.client, parties.worker
        await request_tasks(trainer, 1, step=1)
        leased = await pull(client)
        work = make_work(worker, leased.task, leased.lease)
        blob = (await client.blobs.upload(work.batch, BATCH)).blob
        unknown = await client.commitments.submit_commitment(commitment_request(worker, work, blob))
        assert unknown.commitment.state == commitment_pb2.Commitment.STATE_PENDING

        # With the checkpoint's tokenizer, each prompt's length is recorded with its task.
        await _publish_with_tokenizer(trainer, trainer_identity, 2, tokenizer_dir)
        await request_tasks(trainer, 2, samples_per_prompt=2, step=2)
        leased = await pull(client)
        honest = _honest_prompts(leased.task, tokenizer)
        assert all(len(p) > 3 for p in honest)  # not make_work's three made-up ids

        refusals = []
        for prompts, order in (
            ([[*p, *[1] * 100_000] for p in honest], None),  # padded
            ([p[:-1] for p in honest], None),  # short
            (honest, [1, 0]),  # the right lengths, the wrong rollout order
        ):
            padded = make_work(worker, leased.task, leased.lease)
            _with_prompts(padded, prompts, 2)
            if order is not None:
                batch = rollout_pb2.RolloutBatch.FromString(padded.batch)
                batch.rollouts[0].prompt_index = order[0]
                padded.batch = batch.SerializeToString()
            blob = (await client.blobs.upload(padded.batch, BATCH)).blob
            with pytest.raises(RollnetError) as refused:
                await client.commitments.submit_commitment(commitment_request(worker, padded, blob))
            refusals.append(refused.value)
        for refusal in refusals:
            assert refusal.code == grpc.StatusCode.INVALID_ARGUMENT, refusal
            assert refusal.reason == ErrorReason.ROLLOUT_BATCH_INVALID, refusal
        assert "prompt tokens; prompt 0 has" in refusals[0].message
        assert "prompt_index" in refusals[2].message

        # Honest work: credited unvalidated, for exactly the recorded prompt lengths.
        work = make_work(worker, leased.task, leased.lease)
        _with_prompts(work, honest, 2)
        blob = (await client.blobs.upload(work.batch, BATCH)).blob
        credited = await client.commitments.submit_commitment(
            commitment_request(worker, work, blob)
        )
        assert credited.commitment.state == commitment_pb2.Commitment.STATE_ACCEPTED
        assert not credited.commitment.validated
        prefill = sum(len(p) for p in honest) * 2
        decode = sum(len(r.completion_token_ids) for r in work.rollouts)
        assert credited.commitment.claimed_work == commitment_pb2.WorkClaim(
            prefill_tokens=prefill, decode_tokens=decode
        )
        balance = await client.ledger.get_balance(
            ledger_service_pb2.GetBalanceRequest(node_id=worker.node_id)
        )
        assert balance.credited == work_units(prefill, decode, FLOPS_PER_TOKEN)
