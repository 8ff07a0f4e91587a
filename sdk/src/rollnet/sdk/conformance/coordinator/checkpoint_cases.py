"""The coordinator suite's cases: checkpoints."""

from __future__ import annotations

import os

import grpc

from rollnet.sdk.checkpoints import CHECKPOINT_DOMAIN
from rollnet.sdk.conformance.coordinator._base import C, case, expect
from rollnet.sdk.conformance.suite import CaseFailure
from rollnet.sdk.conformance.target import (
    GET_CHECKPOINT,
    LATEST,
    PUBLISH,
    WATCH,
    Target,
    new_request_id,
)
from rollnet.sdk.identity import verify_signature
from rollnet.v1 import checkpoint_pb2, checkpoint_service_pb2, common_pb2


@case(
    "checkpoint.publish",
    "a published step is the latest, reads back signed, and WatchCheckpoints streams it",
)
async def checkpoint_publish(target: Target) -> None:
    trainer = await target.peer("trainer")
    step = await target.publish(trainer)
    latest = await trainer.call(
        LATEST,
        checkpoint_service_pb2.GetLatestCheckpointRequest(),
        checkpoint_service_pb2.GetLatestCheckpointResponse,
    )
    manifest = checkpoint_pb2.CheckpointManifest.FromString(latest.checkpoint.manifest)
    expect(manifest.step == step, f"GetLatestCheckpoint answers step {manifest.step}, not {step}")
    expect(
        verify_signature(
            trainer.identity.public_key,
            latest.checkpoint.signature,
            CHECKPOINT_DOMAIN + latest.checkpoint.manifest,
        ),
        "the stored manifest and signature do not verify with the trainer's key",
    )
    read = await trainer.call(
        GET_CHECKPOINT,
        checkpoint_service_pb2.GetCheckpointRequest(step=step),
        checkpoint_service_pb2.GetCheckpointResponse,
    )
    expect(read.checkpoint.manifest == latest.checkpoint.manifest, "GetCheckpoint differs")
    body = checkpoint_service_pb2.WatchCheckpointsRequest(after_step=step - 1).SerializeToString()
    call = target.wire.server_stream(
        WATCH,
        body,
        trainer.headers(WATCH, body),
        checkpoint_service_pb2.WatchCheckpointsResponse,
        timeout=target.config.call_timeout,
    )
    try:
        async for update in call:
            got = checkpoint_pb2.CheckpointManifest.FromString(update.checkpoint.manifest).step
            expect(got == step, f"WatchCheckpoints(after {step - 1}) streamed step {got} first")
            return
    finally:
        call.cancel()
    raise CaseFailure("WatchCheckpoints ended without a checkpoint")


@case(
    "checkpoint.refusals",
    "bad signature, old step, missing shard, other network, bad path: each refused",
)
async def checkpoint_refusals(target: Target) -> None:
    trainer = await target.peer("trainer")
    step = await target.publish(trainer)

    async def refused(
        manifest: bytes,
        signature: bytes,
        code: grpc.StatusCode,
        reason: str,
        field: str | None = None,
    ) -> None:
        request = checkpoint_service_pb2.PublishCheckpointRequest(
            request_id=new_request_id(), manifest=manifest, signature=signature
        )
        await trainer.refused(PUBLISH, request, code, reason, field=field)

    manifest, _ = await target.manifest(trainer, step + 1)
    await refused(
        manifest,
        trainer.identity.sign(b"something else"),
        C.INVALID_ARGUMENT,
        "CHECKPOINT_SIGNATURE_INVALID",
    )
    old, old_signature = await target.manifest(trainer, step)
    await refused(old, old_signature, C.FAILED_PRECONDITION, "CHECKPOINT_STEP_NOT_MONOTONIC")
    other, other_signature = await target.manifest(
        trainer, step + 1, network_id="conformance-other"
    )
    await refused(
        other, other_signature, C.INVALID_ARGUMENT, "INVALID_FIELDS", "manifest.network_id"
    )
    bad, bad_signature = await target.manifest(trainer, step + 1, path="../escape.bin")
    await refused(
        bad, bad_signature, C.INVALID_ARGUMENT, "INVALID_FIELDS", "manifest.files[0].path"
    )
    ghost = common_pb2.BlobRef(blake3=os.urandom(32), size=10)
    missing = checkpoint_pb2.CheckpointManifest(
        step=step + 1,
        network_id=target.config.network_id,
        files=[checkpoint_pb2.CheckpointFile(path="model.bin", content=ghost, shards=[ghost])],
    ).SerializeToString(deterministic=True)
    await refused(
        missing,
        trainer.identity.sign(CHECKPOINT_DOMAIN + missing),
        C.FAILED_PRECONDITION,
        "CHECKPOINT_SHARD_MISSING",
    )
    await trainer.refused(
        GET_CHECKPOINT,
        checkpoint_service_pb2.GetCheckpointRequest(step=1 << 62),
        C.NOT_FOUND,
        "CHECKPOINT_NOT_FOUND",
    )


@case("checkpoint.republish", "republishing the identical latest manifest is idempotent")
async def checkpoint_republish(target: Target) -> None:
    trainer = await target.peer("trainer")
    latest = await target.latest_step(trainer)
    step = 1 if latest is None else latest + 1
    manifest, signature = await target.manifest(trainer, step)
    for _ in range(2):
        await trainer.call(
            PUBLISH,
            checkpoint_service_pb2.PublishCheckpointRequest(
                request_id=new_request_id(), manifest=manifest, signature=signature
            ),
            checkpoint_service_pb2.PublishCheckpointResponse,
        )
