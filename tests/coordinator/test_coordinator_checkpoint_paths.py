"""PublishCheckpoint enforces the canonical checkpoint path rule, the SDK's, over the same table
of cases the SDK is tested with (``checkpoint_paths`` in ``protos/rollnet/v1/vectors.json``):
a manifest the coordinator accepts is one every worker writes to disk, and one it refuses names
each bad path as a field violation (INVALID_ARGUMENT / INVALID_FIELDS)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import grpc
import pytest
from coordinator_testing import register, sqlite_only

from rollnet.reference.coordinator.server import Coordinator
from rollnet.sdk import Identity, RollnetError
from rollnet.sdk.domains import CHECKPOINT_DOMAIN
from rollnet.sdk.testing import NETWORK_ID, connect
from rollnet.v1 import (
    blob_service_pb2,
    checkpoint_pb2,
    checkpoint_service_pb2,
    common_pb2,
)

VECTORS = json.loads(
    (Path(__file__).resolve().parents[2] / "protos" / "rollnet" / "v1" / "vectors.json").read_text()
)["checkpoint_paths"]


def _manifest(step: int, paths: list[str], shard: common_pb2.BlobRef) -> bytes:
    return checkpoint_pb2.CheckpointManifest(
        step=step,
        network_id=NETWORK_ID,
        files=[
            checkpoint_pb2.CheckpointFile(path=path, content=shard, shards=[shard])
            for path in paths
        ],
        flops_per_token=1,
    ).SerializeToString()


@sqlite_only
async def test_publish_checkpoint_applies_the_sdk_path_rule(
    coordinator: Coordinator, trainer_identity: Identity
) -> None:
    trainer = connect(coordinator.address, trainer_identity)
    try:
        await register(trainer, trainer_identity, common_pb2.ROLE_TRAINER)
        stored = await trainer.blobs.upload(b"weights", blob_service_pb2.BLOB_KIND_CHECKPOINT_SHARD)
        shard = common_pb2.BlobRef(blake3=stored.blob.blake3, size=stored.blob.size)
        cases: list[dict[str, Any]] = list(VECTORS["cases"])
        many = [f"f{index}" for index in range(4097)]
        cases.append({**VECTORS["too_many_files"], "paths": many, "valid": False})
        assert any(c["valid"] for c in cases)
        assert any(not c["valid"] for c in cases)
        step = 0
        for case in cases:
            manifest = _manifest(step + 1, case["paths"], shard)
            request = checkpoint_service_pb2.PublishCheckpointRequest(
                manifest=manifest, signature=trainer_identity.sign(CHECKPOINT_DOMAIN + manifest)
            )
            if case["valid"]:
                published = await trainer.checkpoints.publish_checkpoint(request)
                step = published.checkpoint.step
                continue
            with pytest.raises(RollnetError) as refused:
                await trainer.checkpoints.publish_checkpoint(request)
            error = refused.value
            assert error.code is grpc.StatusCode.INVALID_ARGUMENT, case["paths"][:3]
            assert error.reason == "INVALID_FIELDS"
            got = [(v.field, v.description) for v in error.field_violations]
            want = [(f"manifest.{v['field']}", v["description"]) for v in case["violations"]]
            assert got == want, case["paths"][:3]
        assert step == sum(1 for c in cases if c["valid"]), "every valid manifest was published"
    finally:
        await trainer.close()
