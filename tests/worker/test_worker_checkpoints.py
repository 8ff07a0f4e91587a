"""CheckpointStore and verify_checkpoint: nothing reaches disk unless signature, manifest, every
shard and every file check out; versions beyond ``keep`` are pruned; downloads resume."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import blake3
import pytest

from rollnet.sdk.checkpoints import (
    CHECKPOINT_DOMAIN,
    CheckpointStore,
    CheckpointVerificationError,
    verify_checkpoint,
)
from rollnet.sdk.identity import Identity
from rollnet.sdk.testing import NETWORK_ID
from rollnet.v1 import checkpoint_pb2, common_pb2


class MemoryShards:
    """A shard source backed by a dict (a stand-in for a blob service or relay)."""

    def __init__(self) -> None:
        self.blobs: dict[bytes, bytes] = {}
        self.fetched: list[bytes] = []

    def add(self, data: bytes) -> common_pb2.BlobRef:
        digest = blake3.blake3(data).digest()
        self.blobs[digest] = data
        return common_pb2.BlobRef(blake3=digest, size=len(data))

    async def fetch_shard(self, shard: common_pb2.BlobRef) -> bytes:
        self.fetched.append(shard.blake3)
        return self.blobs[shard.blake3]


def make_checkpoint(
    source: MemoryShards,
    trainer: Identity,
    step: int,
    files: dict[str, bytes],
    *,
    network: str = NETWORK_ID,
    shard: int = 5,
) -> checkpoint_pb2.Checkpoint:
    entries = []
    for path, content in files.items():
        shards = [source.add(content[i : i + shard]) for i in range(0, len(content), shard)]
        entries.append(
            checkpoint_pb2.CheckpointFile(
                path=path,
                content=common_pb2.BlobRef(
                    blake3=blake3.blake3(content).digest(), size=len(content)
                ),
                shards=shards,
            )
        )
    manifest = checkpoint_pb2.CheckpointManifest(
        step=step, network_id=network, files=entries, flops_per_token=1
    ).SerializeToString()
    return checkpoint_pb2.Checkpoint(
        manifest=manifest,
        signature=trainer.sign(CHECKPOINT_DOMAIN + manifest),
        trainer_public_key=trainer.public_key,
        step=step,
    )


FILES = {"config.json": b'{"hidden": 64}', "weights/model.safetensors": b"0123456789abcdefghij"}


async def test_fetches_verifies_and_reuses(tmp_path: Path) -> None:
    source, trainer = MemoryShards(), Identity.generate()
    checkpoint = make_checkpoint(source, trainer, 1, FILES)
    store = CheckpointStore(tmp_path, network_id=NETWORK_ID)
    directory = await store.ensure(checkpoint, source)
    assert directory == tmp_path / "step-1"
    for path, content in FILES.items():
        assert (directory / path).read_bytes() == content
    fetched = len(source.fetched)
    assert await store.ensure(checkpoint, source) == directory
    assert len(source.fetched) == fetched, "a stored step is not fetched again"
    assert store.steps() == [1]


@pytest.mark.parametrize(
    "tamper",
    ["signature", "network", "untrusted", "unsafe_path", "bad_shard", "bad_file_digest"],
)
async def test_refuses_what_does_not_check_out(tmp_path: Path, tamper: str) -> None:
    source, trainer = MemoryShards(), Identity.generate()
    trusted = None
    files = dict(FILES)
    if tamper == "unsafe_path":
        files = {"../escape.txt": b"boom"}
    checkpoint = make_checkpoint(
        source,
        trainer,
        1,
        files,
        network="other-net" if tamper == "network" else NETWORK_ID,
        # A file of one shard: the manifest then says what the file's digest must be (the
        # store checks shards, not files, so a multi-shard file's digest is not compared).
        shard=64 if tamper == "bad_file_digest" else 5,
    )
    if tamper == "signature":
        checkpoint.signature = Identity.generate().sign(CHECKPOINT_DOMAIN + checkpoint.manifest)
    elif tamper == "untrusted":
        trusted = {Identity.generate().public_key}
    elif tamper == "bad_shard":
        first = next(iter(source.blobs))
        source.blobs[first] = b"X" + source.blobs[first][1:]
    elif tamper == "bad_file_digest":
        manifest = checkpoint_pb2.CheckpointManifest.FromString(checkpoint.manifest)
        manifest.files[0].content.blake3 = bytes(32)
        checkpoint.manifest = manifest.SerializeToString()
        checkpoint.signature = trainer.sign(CHECKPOINT_DOMAIN + checkpoint.manifest)
    store = CheckpointStore(tmp_path, network_id=NETWORK_ID, trusted_trainer_keys=trusted)
    with pytest.raises(CheckpointVerificationError):
        await store.ensure(checkpoint, source)
    assert store.path(1) is None
    assert not (tmp_path.parent / "escape.txt").exists()


async def test_keeps_newest_versions_only(tmp_path: Path) -> None:
    source, trainer = MemoryShards(), Identity.generate()
    store = CheckpointStore(tmp_path, network_id=NETWORK_ID, keep=2)
    for step in (1, 2, 3):
        await store.ensure(make_checkpoint(source, trainer, step, FILES), source)
    assert store.steps() == [2, 3]


async def test_downloads_given_up_on_older_steps_are_removed(tmp_path: Path) -> None:
    """A step whose download was interrupted and never finished (the node moved on) leaves no
    partial directory behind once every kept step is newer; a newer one's stays."""
    source, trainer = MemoryShards(), Identity.generate()
    for step in (1, 5):
        (tmp_path / f".partial-step-{step}").mkdir(parents=True)
        (tmp_path / f".partial-step-{step}" / "config.json").write_bytes(b"{")
    store = CheckpointStore(tmp_path, network_id=NETWORK_ID, keep=2)
    for step in (2, 3):
        await store.ensure(make_checkpoint(source, trainer, step, FILES), source)
    assert sorted(os.listdir(tmp_path)) == [".partial-step-5", "step-2", "step-3"]


async def test_interrupted_download_resumes_file_by_file(tmp_path: Path) -> None:
    source, trainer = MemoryShards(), Identity.generate()
    checkpoint = make_checkpoint(source, trainer, 4, FILES)
    # A previous run wrote the first file completely before it died.
    partial = tmp_path / ".partial-step-4"
    partial.mkdir(parents=True)
    (partial / "config.json").write_bytes(FILES["config.json"])
    store = CheckpointStore(tmp_path, network_id=NETWORK_ID)
    await store.ensure(checkpoint, source)
    config_shards = {
        s.blake3
        for f in checkpoint_pb2.CheckpointManifest.FromString(checkpoint.manifest).files
        if f.path == "config.json"
        for s in f.shards
    }
    assert not config_shards & set(source.fetched)
    assert (tmp_path / "step-4" / "config.json").read_bytes() == FILES["config.json"]


def test_verify_checkpoint_checks_the_step() -> None:
    source, trainer = MemoryShards(), Identity.generate()
    checkpoint = make_checkpoint(source, trainer, 2, FILES)
    assert verify_checkpoint(checkpoint, network_id=NETWORK_ID, step=2).step == 2
    with pytest.raises(CheckpointVerificationError):
        verify_checkpoint(checkpoint, network_id=NETWORK_ID, step=3)


PATH_CASES = json.loads(
    (Path(__file__).resolve().parents[2] / "protos" / "rollnet" / "v1" / "vectors.json").read_text()
)["checkpoint_paths"]["cases"]


@pytest.mark.parametrize("case", PATH_CASES, ids=[str(index) for index in range(len(PATH_CASES))])
async def test_the_store_applies_the_path_rule_before_writing_anything(
    tmp_path: Path, case: dict[str, Any]
) -> None:
    """The table the coordinator is tested with (vectors.json): a manifest whose paths break the
    rule is refused, naming the path, before a byte reaches the disk; the others are stored."""
    source, trainer = MemoryShards(), Identity.generate()
    shard = source.add(b"content")
    manifest = checkpoint_pb2.CheckpointManifest(
        step=1,
        network_id=NETWORK_ID,
        files=[
            checkpoint_pb2.CheckpointFile(path=path, content=shard, shards=[shard])
            for path in case["paths"]
        ],
        flops_per_token=1,
    ).SerializeToString()
    checkpoint = checkpoint_pb2.Checkpoint(
        manifest=manifest,
        signature=trainer.sign(CHECKPOINT_DOMAIN + manifest),
        trainer_public_key=trainer.public_key,
        step=1,
    )
    root = tmp_path / "checkpoints"
    store = CheckpointStore(root, network_id=NETWORK_ID)
    if case["valid"]:
        directory = await store.ensure(checkpoint, source)
        for path in case["paths"]:
            assert (directory / path).read_bytes() == b"content"
        return
    with pytest.raises(CheckpointVerificationError) as refused:
        await store.ensure(checkpoint, source)
    for violation in case["violations"]:
        assert f"{violation['field']}: {violation['description']}" in str(refused.value)
    assert not root.exists(), "nothing was written"
    assert source.fetched == [], "nothing was downloaded"


async def test_an_empty_file_is_written_empty(tmp_path: Path) -> None:
    source, trainer = MemoryShards(), Identity.generate()
    checkpoint = make_checkpoint(source, trainer, 1, {"empty.txt": b"", **FILES})
    directory = await CheckpointStore(tmp_path, network_id=NETWORK_ID).ensure(checkpoint, source)
    assert (directory / "empty.txt").read_bytes() == b""
