"""Helpers for coordinator tests: registration, a trainer's checkpoint and demand, a worker's
pull-upload-commit (clients and waiting are :mod:`rollnet.sdk.testing`'s)."""

from __future__ import annotations

import contextlib
import functools
import tempfile
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from google.protobuf import duration_pb2, json_format
from google.protobuf.message import Message
from sqlalchemy.engine import Engine

from rollnet.ledger import create_engine
from rollnet.reference.coordinator.config import CoordinatorConfig
from rollnet.reference.coordinator.server import Coordinator, start_coordinator
from rollnet.reference.envs.registry import load_environment
from rollnet.reference.inference.tokenization import CheckpointTokenizer
from rollnet.reference.model.tokenizer import save_char_tokenizer
from rollnet.sdk import (
    Identity,
    RollnetClient,
    RollnetError,
    batches,
    from_rpc_error,
)
from rollnet.sdk.domains import CHECKPOINT_DOMAIN
from rollnet.sdk.methods import method_path
from rollnet.sdk.node import PROTOCOL_VERSION
from rollnet.sdk.prompts import encode_problem
from rollnet.sdk.proofs.binding import LeaseBinding, derive_sampling_seed
from rollnet.sdk.testing import NETWORK_ID, connect
from rollnet.v1 import (
    blob_service_pb2,
    checkpoint_pb2,
    checkpoint_service_pb2,
    commitment_pb2,
    commitment_service_pb2,
    common_pb2,
    node_pb2,
    node_service_pb2,
    rollout_pb2,
    rollout_service_pb2,
    task_pb2,
    task_service_pb2,
    validation_pb2,
    validation_service_pb2,
)

#: Run a test on SQLite alone (what it checks does not exist, or is the same, on PostgreSQL).
sqlite_only = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def register_request(
    identity: Identity, role: int, **fields: object
) -> node_service_pb2.RegisterNodeRequest:
    """A plausible RegisterNodeRequest for ``identity`` (``fields`` override)."""
    request = node_service_pb2.RegisterNodeRequest(
        public_key=identity.public_key,
        role=role,  # type: ignore[arg-type]
        protocol_version=PROTOCOL_VERSION,
        software_version="test/0",
        capabilities=node_pb2.Capabilities(environments=["arithmetic"]),
        hardware=node_pb2.HardwareReport(cpu_cores=2, memory_bytes=1 << 30),
    )
    for name, value in fields.items():
        if isinstance(value, Message):
            getattr(request, name).CopyFrom(value)
        else:
            setattr(request, name, value)
    return request


async def register(
    client: RollnetClient, identity: Identity, role: int, **fields: object
) -> node_service_pb2.RegisterNodeResponse:
    """Register ``identity`` with ``role``."""
    return await client.nodes.register_node(register_request(identity, role, **fields))


@functools.cache
def char_tokenizer_dir() -> Path:
    """A directory with the tiny model's character tokenizer files (made once per run)."""
    directory = Path(tempfile.mkdtemp(prefix="rollnet-test-tokenizer-"))
    save_char_tokenizer(directory, 512)
    return directory


@functools.cache
def char_tokenizer() -> CheckpointTokenizer:
    """The tokenizer of :func:`char_tokenizer_dir`."""
    return CheckpointTokenizer.load(char_tokenizer_dir())


def honest_prompt_ids(task: task_pb2.Task) -> list[list[int]]:
    """Each of ``task``'s prompts encoded as a worker encodes it, with :func:`char_tokenizer`."""
    environment = load_environment(
        task.environment, json_format.MessageToDict(task.environment_config)
    )
    return [encode_problem(char_tokenizer(), environment.prompt(int(p))) for p in task.prompt_ids]


async def publish_checkpoint(
    client: RollnetClient,
    trainer: Identity,
    step: int,
    flops_per_token: int = 2_000_000,
    *,
    tokenizer: bool = False,
) -> None:
    """Publish a one-shard checkpoint (enough for tasks to be created against it); with
    ``tokenizer``, it carries :func:`char_tokenizer_dir`'s files, so the coordinator records
    each assigned prompt's length (and work with other lengths is refused: see
    :func:`make_work`'s ``tokenizer``)."""
    contents = {"model.safetensors": f"weights of step {step}".encode()}
    if tokenizer:
        for name in ("tokenizer.json", "tokenizer_config.json"):
            contents[name] = (char_tokenizer_dir() / name).read_bytes()
    files = []
    for path, data in contents.items():
        uploaded = await client.blobs.upload(data, blob_service_pb2.BLOB_KIND_CHECKPOINT_SHARD)
        ref = common_pb2.BlobRef(blake3=uploaded.blob.blake3, size=uploaded.blob.size)
        files.append(checkpoint_pb2.CheckpointFile(path=path, content=ref, shards=[ref]))
    manifest = checkpoint_pb2.CheckpointManifest(
        step=step, network_id=NETWORK_ID, files=files, flops_per_token=flops_per_token
    ).SerializeToString()
    await client.checkpoints.publish_checkpoint(
        checkpoint_service_pb2.PublishCheckpointRequest(
            manifest=manifest, signature=trainer.sign(CHECKPOINT_DOMAIN + manifest)
        )
    )


async def request_tasks(
    client: RollnetClient, count: int, *, samples_per_prompt: int = 1, step: int = 1
) -> list[str]:
    """Ask for ``count`` one-prompt tasks; returns their ids."""
    created = await client.rollouts.request_rollouts(
        rollout_service_pb2.RequestRolloutsRequest(
            rollout_step=step,
            environment="arithmetic",
            prompt_count=count,
            samples_per_prompt=samples_per_prompt,
            sampling=common_pb2.SamplingParams(temperature=1.0, max_new_tokens=8),
            prompts_per_task=1,
        )
    )
    return list(created.task_ids)


async def pull(client: RollnetClient, wait: float = 5.0) -> task_service_pb2.PullTaskResponse:
    """One PullTask long-poll of at most ``wait`` seconds."""
    seconds = int(wait)
    return await client.tasks.pull_task(
        task_service_pb2.PullTaskRequest(
            wait=duration_pb2.Duration(seconds=seconds, nanos=int((wait - seconds) * 1e9))
        )
    )


@dataclass
class Work:
    """A leased task and a worker's finished rollout batch for it."""

    task: task_pb2.Task
    lease: task_pb2.Lease
    batch: bytes
    rollouts: list[rollout_pb2.Rollout]


#: Completion tokens of each rollout :func:`make_work` makes (its completion_token_ids).
COMPLETION_TOKENS = 3


def make_work(
    worker: Identity, task: task_pb2.Task, lease: task_pb2.Lease, *, tokenizer: bool = False
) -> Work:
    """An honest-looking rollout batch for ``task`` under ``lease``: three made-up prompt
    tokens per rollout, or with ``tokenizer`` the prompts encoded as a worker would
    (:func:`honest_prompt_ids`; for a checkpoint published with ``tokenizer``)."""
    prompts = honest_prompt_ids(task) if tokenizer else [[1, 2, 3]] * len(task.prompt_ids)
    rollouts = [
        rollout_pb2.Rollout(
            prompt_index=prompt_index,
            prompt_id=prompt_id,
            sample_index=sample,
            prompt_token_ids=prompts[prompt_index],
            completion_token_ids=[4, 5, 0],
            behaviour_logprobs=[-0.1, -0.2, -0.3],
            sampling_seed=derive_sampling_seed(
                NETWORK_ID, task.task_id, prompt_index * task.samples_per_prompt + sample
            ),
            finish_reason=rollout_pb2.FINISH_REASON_EOS,
            toploc_proof=b"\x00" * 258,
        )
        for prompt_index, prompt_id in enumerate(task.prompt_ids)
        for sample in range(task.samples_per_prompt)
    ]
    batch = batches.encode_batch(lease_binding(worker, task, lease), task.checkpoint_step, rollouts)
    return Work(task=task, lease=lease, batch=batch, rollouts=rollouts)


def lease_binding(worker: Identity, task: task_pb2.Task, lease: task_pb2.Lease) -> LeaseBinding:
    """What ``worker`` holds ``task`` under, with ``lease``."""
    return LeaseBinding(
        network_id=NETWORK_ID,
        node_id=worker.node_id,
        task_id=task.task_id,
        lease_id=lease.lease_id,
        fencing_token=lease.fencing_token,
    )


def commitment_request(
    worker: Identity, work: Work, blob: common_pb2.BlobRef
) -> commitment_service_pb2.SubmitCommitmentRequest:
    """The SubmitCommitment request for uploaded ``work``."""
    binding = lease_binding(worker, work.task, work.lease)
    return batches.commitment_request(binding, blob, work.rollouts)


async def upload_and_commit(
    client: RollnetClient, worker: Identity, work: Work
) -> commitment_service_pb2.SubmitCommitmentResponse:
    """Upload ``work``'s batch and submit its commitment."""
    uploaded = await client.blobs.upload(work.batch, blob_service_pb2.BLOB_KIND_ROLLOUT_BATCH)
    return await client.commitments.submit_commitment(
        commitment_request(worker, work, uploaded.blob)
    )


async def pull_and_commit(
    client: RollnetClient, worker: Identity, *, tokenizer: bool = False
) -> commitment_service_pb2.SubmitCommitmentResponse:
    """Lease a task (it must be there) and commit honest-looking work for it (``tokenizer``:
    see :func:`make_work`)."""
    pulled = await pull(client)
    assert pulled.HasField("task"), "a task was queued, the pull must lease it"
    work = make_work(worker, pulled.task, pulled.lease, tokenizer=tokenizer)
    return await upload_and_commit(client, worker, work)


async def judge_next_job(
    validator: RollnetClient,
    accept: bool,
    reason: str = "EXPONENT_MISMATCH",
    *,
    reward: float = 1.0,
    logprob: float | None = None,
) -> validation_service_pb2.SubmitVerdictResponse:
    """Pull the next validation job (one must be queued) and accept (every rollout's validated
    reward ``reward``; with ``logprob``, every completion token's validated log-probability) or
    reject it."""
    verdict = await try_judge_next_job(
        validator, accept, reason, wait=5.0, reward=reward, logprob=logprob
    )
    assert verdict is not None, "a validation job was queued"
    return verdict


async def try_judge_next_job(
    validator: RollnetClient,
    accept: bool,
    reason: str = "EXPONENT_MISMATCH",
    *,
    wait: float,
    reward: float = 1.0,
    logprob: float | None = None,
) -> validation_service_pb2.SubmitVerdictResponse | None:
    """Like :func:`judge_next_job`, but ``None`` when no job came within ``wait`` seconds."""
    job = await try_pull_job(validator, wait)
    if job is None:
        return None
    request = verdict_request(job, accept, reason, reward=reward)
    if accept and logprob is not None:  # make_work's rollouts have COMPLETION_TOKENS tokens each
        count = len(request.validated_rewards)
        request.validated_logprobs.extend(
            [validation_pb2.ValidatedLogprobs(logprobs=[logprob] * COMPLETION_TOKENS)] * count
        )
    return await validator.validation.submit_verdict(request)


async def try_pull_job(
    validator: RollnetClient, wait: float
) -> validation_service_pb2.PullValidationJobResponse | None:
    """One PullValidationJob long-poll of at most ``wait`` seconds; ``None`` when no job came."""
    seconds = int(wait)
    job = await validator.validation.pull_validation_job(
        validation_service_pb2.PullValidationJobRequest(
            wait=duration_pb2.Duration(seconds=seconds, nanos=int((wait - seconds) * 1e9))
        )
    )
    return job if job.HasField("job") else None


async def pull_job(
    validator: RollnetClient, wait: float = 5.0
) -> validation_service_pb2.PullValidationJobResponse:
    """The next validation job leased to ``validator`` (one must be queued)."""
    job = await try_pull_job(validator, wait)
    assert job is not None, "a validation job was queued"
    return job


def verdict_request(
    job: validation_service_pb2.PullValidationJobResponse,
    accept: bool,
    reason: str = "EXPONENT_MISMATCH",
    *,
    reward: float = 1.0,
) -> validation_service_pb2.SubmitVerdictRequest:
    """The verdict on ``job``: an accept with every rollout's validated reward ``reward`` and
    :func:`make_work`'s token counts as the validated work, or a reject for ``reason``."""
    count = len(job.job.task.prompt_ids) * job.job.task.samples_per_prompt
    request = validation_service_pb2.SubmitVerdictRequest(
        job_id=job.job.job_id,
        lease_id=job.lease.lease_id,
        fencing_token=job.lease.fencing_token,
    )
    if accept:
        request.decision = validation_pb2.Verdict.DECISION_ACCEPT
        request.validated_rewards.extend(
            [common_pb2.Reward(task_reward=reward, total=reward)] * count
        )
        request.validated_work.CopyFrom(
            commitment_pb2.WorkClaim(prefill_tokens=3 * count, decode_tokens=3 * count)
        )
    else:
        request.decision = validation_pb2.Verdict.DECISION_REJECT
        request.reject_reason = reason
    return request


@dataclass(frozen=True)
class Parties:
    """A running coordinator and its parties (:func:`running_parties`): the trainer's and a
    worker's registered clients, the worker's key, an engine on the coordinator's database,
    and the validator's client where one was registered."""

    coordinator: Coordinator
    trainer: RollnetClient
    client: RollnetClient
    worker: Identity
    engine: Engine
    validator_client: RollnetClient | None = None

    @property
    def validator(self) -> RollnetClient:
        """The validator's registered client (there must be one)."""
        assert self.validator_client is not None, "running_parties was given no validator"
        return self.validator_client


@contextlib.asynccontextmanager
async def running_parties(
    config: CoordinatorConfig,
    trainer_identity: Identity,
    validator_identity: Identity | None = None,
    *,
    checkpoint: int | None = 1,
    tokenizer: bool = False,
) -> AsyncIterator[Parties]:
    """A coordinator started with ``config``, a trainer, a fresh worker and (given its key) a
    validator registered, and checkpoint ``checkpoint`` published (none for ``None``; with
    ``tokenizer``, carrying the character tokenizer, so work is checked against the prompts'
    encoded lengths: see :func:`publish_checkpoint`); everything stopped on exit."""
    coordinator = await start_coordinator(config)
    worker = Identity.generate()
    trainer = connect(coordinator.address, trainer_identity)
    client = connect(coordinator.address, worker)
    roles = [(trainer, trainer_identity, common_pb2.ROLE_TRAINER)]
    validator = None
    if validator_identity is not None:
        validator = connect(coordinator.address, validator_identity)
        roles.append((validator, validator_identity, common_pb2.ROLE_VALIDATOR))
    roles.append((client, worker, common_pb2.ROLE_WORKER))
    engine = create_engine(config.database_url or "")
    try:
        for party, identity, role in roles:
            await register(party, identity, role)
        if checkpoint is not None:
            await publish_checkpoint(trainer, trainer_identity, checkpoint, tokenizer=tokenizer)
        yield Parties(coordinator, trainer, client, worker, engine, validator)
    finally:
        engine.dispose()
        for party, _, _ in roles:
            await party.close()
        await coordinator.stop(grace=0.1)


def upload_header(
    digest: bytes,
    size: int,
    kind: blob_service_pb2.BlobKind.ValueType = blob_service_pb2.BLOB_KIND_ROLLOUT_BATCH,
) -> blob_service_pb2.UploadBlobRequest:
    """An UploadBlob header message declaring ``digest`` and ``size``."""
    return blob_service_pb2.UploadBlobRequest(
        header=blob_service_pb2.BlobHeader(
            blob=common_pb2.BlobRef(blake3=digest, size=size), kind=kind
        )
    )


def upload_chunk(data: bytes) -> blob_service_pb2.UploadBlobRequest:
    """An UploadBlob chunk message."""
    return blob_service_pb2.UploadBlobRequest(chunk=data)


async def raw_upload(
    client: RollnetClient, messages: Sequence[blob_service_pb2.UploadBlobRequest]
) -> RollnetError:
    """Send exactly ``messages`` (signed) and return the refusal the server must answer with."""
    call: grpc.aio.StreamUnaryMultiCallable[bytes, blob_service_pb2.UploadBlobResponse] = (
        client.channel.stream_unary(
            method_path("BlobService", "UploadBlob"),
            request_serializer=None,
            response_deserializer=blob_service_pb2.UploadBlobResponse.FromString,
        )
    )

    async def stream() -> AsyncIterator[bytes]:
        for message in messages:
            yield message.SerializeToString(deterministic=True)

    try:
        await call(stream(), timeout=10)
    except grpc.aio.AioRpcError as error:
        return from_rpc_error(error)
    raise AssertionError("the upload was accepted")
