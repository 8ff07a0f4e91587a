"""Publication of trainer-signed checkpoint manifests, and their discovery."""

from __future__ import annotations

from collections.abc import AsyncIterator

import blake3
from google.protobuf.message import DecodeError
from sqlalchemy.orm import Session

from rollnet.ledger import artifacts
from rollnet.ledger.artifacts import ConflictError
from rollnet.reference.coordinator.context import (
    CoordinatorContext,
    run_to_completion,
    wait_for,
)
from rollnet.reference.coordinator.refusal import Refusal, Violations, invalid
from rollnet.reference.coordinator.serde import checkpoint_to_proto
from rollnet.reference.coordinator.standing import Caller
from rollnet.sdk.checkpoints import manifest_blobs
from rollnet.sdk.domains import CHECKPOINT_DOMAIN
from rollnet.sdk.errors import ErrorReason
from rollnet.sdk.identity import verify_signature
from rollnet.v1 import checkpoint_pb2, checkpoint_service_pb2


def _check_manifest(manifest: checkpoint_pb2.CheckpointManifest, network_id: str) -> None:
    v = Violations()
    v.require(manifest.network_id == network_id, "manifest.network_id", f"must be {network_id!r}")
    # The file paths were checked at the edge with the SDK's path rule (the bounds of
    # CheckpointManifest.files and CheckpointFile.path), so a manifest published here is one
    # every worker will write to disk.
    for i, item in enumerate(manifest.files):
        v.require(len(item.content.blake3) == 32, f"manifest.files[{i}].content.blake3", "32 bytes")
        v.require(
            sum(s.size for s in item.shards) == item.content.size,
            f"manifest.files[{i}].shards",
            "shard sizes must add up to the file size",
        )
        for j, shard in enumerate(item.shards):
            v.require(
                len(shard.blake3) == 32, f"manifest.files[{i}].shards[{j}].blake3", "32 bytes"
            )
        if item.HasField("delta"):
            delta = item.delta
            where = f"manifest.files[{i}].delta"
            v.require(
                delta.base_step < manifest.step,
                f"{where}.base_step",
                "must be an earlier step than the manifest's",
            )
            v.require(len(delta.base.blake3) == 32, f"{where}.base.blake3", "32 bytes")
            v.require(len(delta.content.blake3) == 32, f"{where}.content.blake3", "32 bytes")
            v.require(
                sum(s.size for s in delta.shards) == delta.content.size,
                f"{where}.shards",
                "shard sizes must add up to the delta's size",
            )
            for j, shard in enumerate(delta.shards):
                v.require(len(shard.blake3) == 32, f"{where}.shards[{j}].blake3", "32 bytes")
    v.raise_if_any()


class CheckpointDesk:
    """PublishCheckpoint, GetLatestCheckpoint, GetCheckpoint, WatchCheckpoints."""

    def __init__(self, ctx: CoordinatorContext) -> None:
        self.ctx = ctx

    async def publish(
        self, caller: Caller, request: checkpoint_service_pb2.PublishCheckpointRequest
    ) -> checkpoint_service_pb2.PublishCheckpointResponse:
        """Verify the trainer's signature and shards, then record the manifest."""
        try:
            manifest = checkpoint_pb2.CheckpointManifest.FromString(request.manifest)
        except DecodeError as error:
            raise invalid(("manifest", f"not a CheckpointManifest: {error}")) from error
        _check_manifest(manifest, self.ctx.config.network_id)
        if not verify_signature(
            caller.public_key, request.signature, CHECKPOINT_DOMAIN + request.manifest
        ):
            raise Refusal(
                ErrorReason.CHECKPOINT_SIGNATURE_INVALID,
                "signature does not verify over 'rollnet-checkpoint-v1\\n' || manifest",
            )
        now = self.ctx.clock()
        manifest_hash = blake3.blake3(request.manifest).hexdigest()

        def work(session: Session) -> checkpoint_service_pb2.PublishCheckpointResponse:
            latest = artifacts.latest_checkpoint(session)
            if latest is not None and manifest.step <= latest.step:
                if latest.step == manifest.step and latest.manifest_hash == manifest_hash:
                    return checkpoint_service_pb2.PublishCheckpointResponse(
                        checkpoint=checkpoint_to_proto(latest)
                    )
                raise Refusal(
                    ErrorReason.CHECKPOINT_STEP_NOT_MONOTONIC,
                    f"step {manifest.step} is not after the latest published step {latest.step}",
                )
            try:
                row = artifacts.record_checkpoint(
                    session,
                    step=manifest.step,
                    manifest=request.manifest,
                    manifest_hash=manifest_hash,
                    signature=request.signature,
                    signer_public_key=caller.public_key,
                    publisher_id=caller.node_id,
                    now=now,
                )
            except ConflictError as error:
                raise Refusal(ErrorReason.CHECKPOINT_STEP_NOT_MONOTONIC, str(error)) from error
            return checkpoint_service_pb2.PublishCheckpointResponse(
                checkpoint=checkpoint_to_proto(row)
            )

        shards = [shard.blake3 for _, shard in manifest_blobs(manifest)]
        uploads = self.ctx.uploads

        async def record() -> checkpoint_service_pb2.PublishCheckpointResponse:
            # Pinned from the existence checks until the manifest is recorded: the orphan
            # sweeper does not delete a shard a checkpoint is being published with.
            with uploads.pin(shards):
                self._check_shards_stored(manifest)
                recorded = await self.ctx.run_in_transaction(work)
                uploads.settle(shards)
            self.ctx.signals.fire(self.ctx.signals.checkpoint_published)
            return recorded

        # To its end even if the caller goes away: the pin must outlive the transaction.
        return await run_to_completion(record())

    def _check_shards_stored(self, manifest: checkpoint_pb2.CheckpointManifest) -> None:
        for path, shard in manifest_blobs(manifest):
            if not self.ctx.blobs.exists(shard.blake3):
                raise Refusal(
                    ErrorReason.CHECKPOINT_SHARD_MISSING,
                    f"shard {shard.blake3.hex()} of {path} is not uploaded",
                )

    async def latest(self) -> checkpoint_pb2.Checkpoint | None:
        """The newest checkpoint, if any."""

        def work(session: Session) -> checkpoint_pb2.Checkpoint | None:
            row = artifacts.latest_checkpoint(session)
            return None if row is None else checkpoint_to_proto(row)

        return await self.ctx.run_read(work)

    async def get(self, step: int) -> checkpoint_pb2.Checkpoint:
        """The checkpoint of ``step``."""

        def work(session: Session) -> checkpoint_pb2.Checkpoint:
            row = artifacts.get_checkpoint(session, step)
            if row is None:
                raise Refusal(ErrorReason.CHECKPOINT_NOT_FOUND, f"no checkpoint at step {step}")
            return checkpoint_to_proto(row)

        return await self.ctx.run_read(work)

    async def watch(self, after_step: int) -> AsyncIterator[checkpoint_pb2.Checkpoint]:
        """Yield the newest checkpoint after ``after_step``, then each newer one seen, forever
        (one superseded between two looks is skipped: only the newest matters to a watcher)."""
        last = after_step
        while True:
            latest = await self.latest()
            if latest is not None and latest.step > last:
                last = latest.step
                yield latest
                continue
            if self.ctx.signals.stopping:
                return  # the stream ends; the node watches again, on another replica or later
            await wait_for(self.ctx.signals.checkpoint_published, 1.0)
