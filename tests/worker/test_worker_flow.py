"""A worker against a real coordinator in-process: register, pull, fetch and verify the
checkpoint, generate, upload, commit, keep the receipt; the proofs and claimed rewards verify."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from swarm_testing import Ledger
from worker_testing import request_tasks, start_trainer, worker_config

from rollnet.ledger.enums import NodeState
from rollnet.reference.coordinator.config import CoordinatorConfig
from rollnet.reference.coordinator.server import start_coordinator
from rollnet.reference.envs import load_environment
from rollnet.reference.inference.tokenization import CheckpointTokenizer
from rollnet.reference.inference.torch_backend import TorchBackend
from rollnet.reference.worker import InferenceGenerator, make_backend
from rollnet.sdk.checkpoints import CheckpointStore
from rollnet.sdk.commitments import verify_receipt
from rollnet.sdk.identity import Identity
from rollnet.sdk.prompts import encode_prompt
from rollnet.sdk.proofs import LeaseBinding, RolloutAssignment, RolloutClaim, verify_rollout
from rollnet.sdk.proofs.binding import commitment_digest
from rollnet.sdk.proofs.thresholds import FLOAT32
from rollnet.sdk.testing import NETWORK_ID, wait_until
from rollnet.sdk.worker import Worker
from rollnet.v1 import rollout_pb2

FINISH = {rollout_pb2.FINISH_REASON_EOS: "eos", rollout_pb2.FINISH_REASON_LENGTH: "length"}


def reference_generator(data_dir: Path) -> InferenceGenerator:
    store = CheckpointStore(data_dir / "checkpoints", network_id=NETWORK_ID, keep=3)
    return InferenceGenerator(lambda: make_backend("torch"), store)


@pytest.mark.timeout(180)
@pytest.mark.slow
async def test_worker_commits_verifiable_rollouts(
    coordinator_config: CoordinatorConfig,
    trainer_identity: Identity,
    tiny_model: Path,
    tmp_path: Path,
    sqlite_url: str,
) -> None:
    coordinator = await start_coordinator(coordinator_config)
    ledger = Ledger(sqlite_url)
    trainer = await start_trainer(coordinator.address, trainer_identity, tiny_model)
    identity = Identity.generate()
    data_dir = tmp_path / "worker"
    worker = Worker(
        worker_config(coordinator.address, data_dir), identity, reference_generator(data_dir)
    )
    running = asyncio.create_task(worker.run())
    try:
        task_ids = await request_tasks(trainer, 2)
        await wait_until(lambda: worker.receipts_kept == 2, within=90, what="two receipts")
        worker.request_stop()
        await asyncio.wait_for(running, 30)

        # The receipts are kept in the data dir, signed by the coordinator.
        from rollnet.sdk.worker import Outbox

        outbox = Outbox(data_dir)
        responses = outbox.receipts()
        assert outbox.pending() == []
        outbox.close()
        assert sorted(r.commitment.task_id for r in responses) == sorted(task_ids)
        for response in responses:
            assert verify_receipt(response.receipt, coordinator.ctx.identity.public_key)
        assert ledger.commitments_per_task() == {t: [identity.node_id] for t in task_ids}
        assert ledger.node_state(identity.node_id) is NodeState.DEREGISTERED
        # The checkpoint was fetched and verified into the data dir.
        assert (data_dir / "checkpoints" / "step-1" / "model.safetensors").is_file()

        # A validator's view: re-prefill each rollout and run every check.
        validator = TorchBackend()
        validator.load(str(tiny_model))
        tokenizer = CheckpointTokenizer.load(tiny_model)
        for response in responses:
            commitment = response.commitment
            blob = await trainer.blobs.download(commitment.rollout_batch.blake3)
            batch = rollout_pb2.RolloutBatch.FromString(blob)
            assert batch.node_id == identity.node_id
            lease = LeaseBinding(
                NETWORK_ID,
                identity.node_id,
                commitment.task_id,
                commitment.lease_id,
                commitment.fencing_token,
            )
            environment = load_environment("arithmetic", {})
            assert len(batch.rollouts) == 4
            for index, rollout in enumerate(batch.rollouts):
                problem = environment.prompt(rollout.prompt_id)
                assigned = encode_prompt(tokenizer, problem.prompt)
                claim = RolloutClaim(
                    prompt_ids=tuple(rollout.prompt_token_ids),
                    completion_ids=tuple(rollout.completion_token_ids),
                    finish_reason=FINISH[rollout.finish_reason],
                    proof=rollout.toploc_proof,
                    sampling_seed=rollout.sampling_seed,
                    rollout_index=index,
                    commitment_digest=commitment_digest(
                        lease,
                        blob_blake3=commitment.rollout_batch.blake3,
                        rollout_index=index,
                        sampling_seed=rollout.sampling_seed,
                        prompt_ids=rollout.prompt_token_ids,
                        completion_ids=rollout.completion_token_ids,
                        proof=rollout.toploc_proof,
                    ),
                )
                prefill = validator.prefill(assigned, rollout.completion_token_ids)
                report = verify_rollout(
                    claim,
                    RolloutAssignment(
                        lease=lease,
                        blob_blake3=commitment.rollout_batch.blake3,
                        assigned_prompt_ids=assigned,
                        temperature=1.0,
                        max_new_tokens=8,
                        eos_token_ids=validator.eos_token_ids,
                    ),
                    hidden_states=prefill.hidden_states,
                    logits=prefill.logits,
                    thresholds=FLOAT32,
                )
                assert report.accepted, report
                text = tokenizer.decode(rollout.completion_token_ids, skip_special_tokens=True)
                expected = environment.reward(problem, text, len(rollout.completion_token_ids))
                assert rollout.claimed_reward.total == expected.total
                assert len(rollout.behaviour_logprobs) == len(rollout.completion_token_ids)
    finally:
        worker.request_stop()
        if not running.done():
            running.cancel()
        await trainer.close()
        await coordinator.stop(grace=0.5)
        ledger.close()
