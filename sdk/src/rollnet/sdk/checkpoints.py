"""Checkpoint transfer: verify a signed manifest, fetch its shards, keep a few versions on disk.

A checkpoint is a directory (Hugging Face layout) whose files are split into content-addressed
shards stored as blobs. The trainer signs ``b"rollnet-checkpoint-v1\\n" + manifest`` where
``manifest`` is the serialized :class:`~rollnet.v1.checkpoint_pb2.CheckpointManifest` carried
verbatim in ``Checkpoint.manifest``. Nothing is trusted before it is checked:

* :func:`verify_checkpoint` checks the trainer's signature, the network id, the step and that
  every path is a safe relative path;
* :class:`CheckpointStore` downloads each shard, checks its BLAKE3 digest and size, checks each
  whole file's digest, and only then renames the directory into place, so a directory it returns
  is always complete and verified. It keeps the newest ``keep`` versions (``async_level + 1``).

The publishing side is ``rollnet.reference.checkpoints.publish_model_dir``.
Shards come from the coordinator's ``BlobService`` today; a relay client can be passed instead
through the :class:`ShardSource` protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Protocol

import blake3
from google.protobuf.message import DecodeError

from rollnet.sdk.identity import verify_signature
from rollnet.v1 import checkpoint_pb2, common_pb2

if TYPE_CHECKING:
    from rollnet.sdk.client import RollnetClient

CHECKPOINT_DOMAIN = b"rollnet-checkpoint-v1\n"
"""Prefix of the bytes a trainer signs: ``CHECKPOINT_DOMAIN + manifest``."""

_STEP_PREFIX = "step-"


class CheckpointVerificationError(Exception):
    """A checkpoint's manifest, signature or content does not check out."""


class ShardSource(Protocol):
    """Where shard bytes come from (the coordinator's blob service, or a relay)."""

    async def fetch_shard(self, shard: common_pb2.BlobRef) -> bytes:
        """The shard's bytes (the store verifies them)."""


@dataclass(frozen=True)
class BlobServiceShards:
    """A :class:`ShardSource` reading shards from the coordinator's ``BlobService``."""

    client: RollnetClient

    async def fetch_shard(self, shard: common_pb2.BlobRef) -> bytes:
        """Download one shard through ``GetBlob``."""
        return await self.client.blobs.download(shard.blake3)


def verify_checkpoint(
    checkpoint: checkpoint_pb2.Checkpoint,
    *,
    network_id: str,
    step: int | None = None,
    trusted_trainer_keys: Collection[bytes] | None = None,
) -> checkpoint_pb2.CheckpointManifest:
    """Check the signature and manifest of ``checkpoint``; return the parsed manifest.

    ``trusted_trainer_keys``: when given, the signing key must be one of them (the coordinator
    already limits publishing to allow-listed trainers; this lets a worker pin the trainer too).
    Raises :class:`CheckpointVerificationError`.
    """
    key = checkpoint.trainer_public_key
    if trusted_trainer_keys is not None and key not in trusted_trainer_keys:
        raise CheckpointVerificationError(f"checkpoint signed by untrusted key {key.hex()}")
    if not verify_signature(key, checkpoint.signature, CHECKPOINT_DOMAIN + checkpoint.manifest):
        raise CheckpointVerificationError("checkpoint manifest signature does not verify")
    try:
        manifest = checkpoint_pb2.CheckpointManifest.FromString(checkpoint.manifest)
    except DecodeError as error:
        raise CheckpointVerificationError(f"manifest does not parse: {error}") from error
    if manifest.network_id != network_id:
        raise CheckpointVerificationError(
            f"manifest is for network {manifest.network_id!r}, not {network_id!r}"
        )
    if step is not None and manifest.step != step:
        raise CheckpointVerificationError(f"manifest is for step {manifest.step}, not {step}")
    seen: set[str] = set()
    for item in manifest.files:
        _check_path(item.path)
        if item.path in seen:
            raise CheckpointVerificationError(f"manifest names {item.path!r} twice")
        seen.add(item.path)
        if sum(s.size for s in item.shards) != item.content.size:
            raise CheckpointVerificationError(f"{item.path}: shard sizes do not add up")
    if not manifest.files:
        raise CheckpointVerificationError("manifest names no files")
    return manifest


def _check_path(path: str) -> None:
    parts = PurePosixPath(path).parts
    if (
        not path
        or path.startswith("/")
        or "\\" in path
        or any(part in ("", ".", "..") for part in parts)
        or path != "/".join(parts)
    ):
        raise CheckpointVerificationError(f"unsafe path in manifest: {path!r}")


class CheckpointStore:
    """Verified checkpoint directories under ``root``: ``root/step-<n>/``, newest ``keep`` kept.

    ``ensure`` is safe to call concurrently for the same step (one download happens). Partial
    downloads live in ``root/.partial-step-<n>/``; verified shards already written there are kept,
    so an interrupted download resumes file by file.
    """

    def __init__(
        self,
        root: Path,
        *,
        network_id: str,
        keep: int = 3,
        trusted_trainer_keys: Collection[bytes] | None = None,
        concurrency: int = 4,
    ) -> None:
        if keep < 1:
            raise ValueError("keep must be at least 1")
        self.root = Path(root)
        self.network_id = network_id
        self.keep = keep
        self.trusted_trainer_keys = trusted_trainer_keys
        self.concurrency = concurrency
        self._locks: dict[int, asyncio.Lock] = {}

    def path(self, step: int) -> Path | None:
        """The verified directory of ``step``, or ``None`` when it is not stored."""
        directory = self.root / f"{_STEP_PREFIX}{step}"
        return directory if directory.is_dir() else None

    def steps(self) -> list[int]:
        """Steps stored, ascending."""
        if not self.root.is_dir():
            return []
        found = []
        for entry in self.root.iterdir():
            if entry.is_dir() and entry.name.startswith(_STEP_PREFIX):
                with contextlib.suppress(ValueError):
                    found.append(int(entry.name[len(_STEP_PREFIX) :]))
        return sorted(found)

    async def ensure(self, checkpoint: checkpoint_pb2.Checkpoint, source: ShardSource) -> Path:
        """Verify ``checkpoint``, download what is missing, and return its directory."""
        manifest = verify_checkpoint(
            checkpoint,
            network_id=self.network_id,
            trusted_trainer_keys=self.trusted_trainer_keys,
        )
        lock = self._locks.setdefault(manifest.step, asyncio.Lock())
        async with lock:
            existing = self.path(manifest.step)
            if existing is not None:
                return existing
            final = await self._download(manifest, source)
        self.prune(protect=manifest.step)
        return final

    async def _download(
        self, manifest: checkpoint_pb2.CheckpointManifest, source: ShardSource
    ) -> Path:
        self.root.mkdir(parents=True, exist_ok=True)
        partial = self.root / f".partial-{_STEP_PREFIX}{manifest.step}"
        partial.mkdir(exist_ok=True)
        limit = asyncio.Semaphore(self.concurrency)

        async def fetch(shard: common_pb2.BlobRef) -> bytes:
            async with limit:
                data = await source.fetch_shard(shard)
            if len(data) != shard.size or blake3.blake3(data).digest() != shard.blake3:
                raise CheckpointVerificationError(
                    f"shard {shard.blake3.hex()} does not match its digest and size"
                )
            return data

        for item in manifest.files:
            target = partial / item.path
            if target.is_file() and _file_matches(target, item.content):
                continue
            shards = await asyncio.gather(*(fetch(shard) for shard in item.shards))
            content = b"".join(shards)
            if blake3.blake3(content).digest() != item.content.blake3:
                raise CheckpointVerificationError(f"{item.path}: file digest does not match")
            target.parent.mkdir(parents=True, exist_ok=True)
            _write_atomically(target, content)
        final = self.root / f"{_STEP_PREFIX}{manifest.step}"
        (partial / ".manifest.pb").write_bytes(manifest.SerializeToString())
        os.replace(partial, final)
        return final

    def prune(self, *, protect: int | None = None) -> list[int]:
        """Delete all but the newest ``keep`` steps (never ``protect``); returns deleted steps."""
        steps = self.steps()
        doomed = [s for s in steps[: max(0, len(steps) - self.keep)] if s != protect]
        for step in doomed:
            shutil.rmtree(self.root / f"{_STEP_PREFIX}{step}", ignore_errors=True)
        return doomed


def _file_matches(path: Path, ref: common_pb2.BlobRef) -> bool:
    data = path.read_bytes()
    return len(data) == ref.size and blake3.blake3(data).digest() == ref.blake3


def _write_atomically(path: Path, content: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(content)
    os.replace(tmp, path)


__all__ = [
    "CHECKPOINT_DOMAIN",
    "BlobServiceShards",
    "CheckpointStore",
    "CheckpointVerificationError",
    "ShardSource",
    "verify_checkpoint",
]
