"""Publishing a Hugging Face model directory as a rollnet checkpoint.

The publisher walks the directory (``config.json``, tokenizer files, ``*.safetensors``), cuts
every file into fixed-size shards, uploads each shard as a ``BLOB_KIND_CHECKPOINT_SHARD`` blob,
builds a ``CheckpointManifest`` (per file: relative path, whole-file BLAKE3 and size, shard digests
in order; ``flops_per_token``) and signs ``b"rollnet-checkpoint-v1\\n" || manifest`` with the
trainer key before calling ``PublishCheckpoint`` (docs/protocol.md, "Other signed bytes"). The
trainer publishes through the same function; ``rollnet checkpoint publish`` is its command line.

``flops_per_token`` is ``2 x parameter count`` (one multiply and one add per weight in a forward
pass), counted from the safetensors headers alone, so publishing never loads torch.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import struct
import tempfile
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import blake3
from google.protobuf import timestamp_pb2
from google.protobuf.message import DecodeError

from rollnet.sdk import Identity, RollnetClient
from rollnet.sdk.broadcast.delta import encode_delta
from rollnet.sdk.checkpoints import checkpoint_path_violations, manifest_blobs
from rollnet.sdk.domains import CHECKPOINT_DOMAIN
from rollnet.v1 import blob_service_pb2, checkpoint_pb2, checkpoint_service_pb2, common_pb2

"""Domain prefix of the trainer's signature over the manifest bytes."""

DEFAULT_SHARD_SIZE = 64 * 1024 * 1024
"""Bytes per shard unless the caller chooses otherwise."""

# What a Hugging Face model directory holds that a worker needs: configuration, tokenizer and
# safetensors weights. Other formats (pickled *.bin, *.pt) are never shipped: unpickling is code
# execution on every worker.
PUBLISHED_SUFFIXES = frozenset({".json", ".safetensors", ".txt", ".model", ".jinja", ".tiktoken"})

_SAFETENSORS_HEADER_CAP = 100 * 1024 * 1024


class CheckpointDirError(ValueError):
    """The model directory cannot be published (missing files, unreadable safetensors)."""


@dataclass(frozen=True, slots=True)
class ShardPlan:
    """One shard of one file: where its bytes are."""

    path: Path
    offset: int
    size: int


@dataclass(frozen=True, slots=True)
class PublishedCheckpoint:
    """What :func:`publish_model_dir` did."""

    checkpoint: checkpoint_pb2.Checkpoint
    """The checkpoint as the coordinator recorded it."""
    manifest: checkpoint_pb2.CheckpointManifest
    """The manifest that was signed (``checkpoint.manifest`` is its serialization)."""
    shards_uploaded: int
    """Shards sent (including ones the coordinator already had)."""
    shards_already_present: int
    """Shards the coordinator already stored (duplicate uploads cost nothing there)."""
    bytes_uploaded: int


def model_files(model_dir: Path) -> list[Path]:
    """The files of ``model_dir`` that a checkpoint carries, sorted by relative path.

    Raises :class:`CheckpointDirError` when there is no ``config.json``, no ``*.safetensors`` or
    no ``tokenizer.json``, or when a path breaks the checkpoint path rule.
    """
    if not model_dir.is_dir():
        raise CheckpointDirError(f"{model_dir} is not a directory")
    files = sorted(
        (
            path
            for path in model_dir.rglob("*")
            if path.is_file()
            and path.suffix in PUBLISHED_SUFFIXES
            and not any(part.startswith(".") for part in path.relative_to(model_dir).parts)
        ),
        key=lambda path: path.relative_to(model_dir).as_posix(),
    )
    relative = [path.relative_to(model_dir).as_posix() for path in files]
    names = set(relative)
    if "config.json" not in names:
        raise CheckpointDirError(f"{model_dir} has no config.json")
    if not any(name.endswith(".safetensors") for name in names):
        raise CheckpointDirError(f"{model_dir} has no *.safetensors weights")
    if "tokenizer.json" not in names:
        # Workers and validators tokenize with it (docs/protocol.md, "Tokenization").
        raise CheckpointDirError(f"{model_dir} has no tokenizer.json")
    # Refused here, before any upload, rather than by the coordinator after the last shard.
    for violation in checkpoint_path_violations(relative):
        where = model_dir if violation.index is None else model_dir / relative[violation.index]
        raise CheckpointDirError(f"{where}: {violation.description} (checkpoint path rule)")
    return files


def safetensors_parameter_count(path: Path) -> int:
    """The number of parameters in a safetensors file, read from its header only."""
    with open(path, "rb") as handle:
        prefix = handle.read(8)
        if len(prefix) != 8:
            raise CheckpointDirError(f"{path}: too short for a safetensors header")
        (length,) = struct.unpack("<Q", prefix)
        if length > _SAFETENSORS_HEADER_CAP:
            raise CheckpointDirError(f"{path}: safetensors header of {length} bytes is implausible")
        raw = handle.read(length)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CheckpointDirError(f"{path}: safetensors header is not JSON: {error}") from error
    if not isinstance(header, dict):
        raise CheckpointDirError(f"{path}: safetensors header is not an object")
    total = 0
    for name, tensor in header.items():
        if name == "__metadata__":
            continue
        shape = tensor.get("shape") if isinstance(tensor, dict) else None
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise CheckpointDirError(f"{path}: tensor {name!r} has no valid shape")
        total += math.prod(shape)
    return total


def flops_per_token(files: list[Path]) -> int:
    """Forward FLOPs per token: twice the parameters in the safetensors files."""
    return 2 * sum(safetensors_parameter_count(p) for p in files if p.suffix == ".safetensors")


def plan_shards(path: Path, shard_size: int) -> list[ShardPlan]:
    """Cut a file into ``shard_size`` pieces (the last one shorter; an empty file has none)."""
    if shard_size < 1:
        raise ValueError("shard_size must be positive")
    size = path.stat().st_size
    return [
        ShardPlan(path, offset, min(shard_size, size - offset))
        for offset in range(0, size, shard_size)
    ]


def read_shard(shard: ShardPlan) -> bytes:
    """The bytes of one shard."""
    with open(shard.path, "rb") as handle:
        handle.seek(shard.offset)
        data = handle.read(shard.size)
    if len(data) != shard.size:
        raise CheckpointDirError(f"{shard.path} changed while it was being published")
    return data


def sign_manifest(identity: Identity, manifest: bytes) -> bytes:
    """The trainer's signature over ``"rollnet-checkpoint-v1\\n" || manifest``."""
    return identity.sign(CHECKPOINT_DOMAIN + manifest)


@dataclass(frozen=True, slots=True)
class DeltaBase:
    """The previous published step's model directory: files are also shipped as deltas
    against it (:mod:`rollnet.sdk.broadcast.delta`)."""

    step: int
    model_dir: Path


def origin_blob_path(origin_dir: Path, digest: bytes) -> Path:
    """Where an origin directory keeps a blob (``rollnet relay --origin DIR`` serves it)."""
    return origin_dir / "blobs" / digest.hex()


def write_origin_blob(origin_dir: Path, data: bytes, digest: bytes | None = None) -> bytes:
    """Store ``data`` in an origin directory under its BLAKE3 digest (``digest`` when the
    caller has it already); returns the digest."""
    if digest is None:
        digest = blob_digest(data)
    path = origin_blob_path(origin_dir, digest)
    if path.is_file() and path.stat().st_size == len(data):
        return digest
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{digest.hex()}.tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return digest


def origin_checkpoint_path(origin_dir: Path, step: int) -> Path:
    """Where an origin directory keeps the signed checkpoint of ``step`` (what its blobs belong
    to: :func:`prune_origin` goes by it)."""
    return origin_dir / "checkpoints" / f"step-{step}.pb"


def write_origin_checkpoint(origin_dir: Path, checkpoint: checkpoint_pb2.Checkpoint) -> Path:
    """Record ``checkpoint`` (signed manifest) in an origin directory, beside its blobs."""
    path = origin_checkpoint_path(origin_dir, checkpoint.step)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(checkpoint.SerializeToString(deterministic=True))
    os.replace(tmp, path)
    return path


def prune_origin(origin_dir: Path, keep: int) -> list[int]:
    """Delete the blobs of all but the newest ``keep`` checkpoints recorded in ``origin_dir``
    (:func:`write_origin_checkpoint`), except blobs a kept checkpoint names too, and then their
    records; returns the steps pruned. Blobs no record names (a publish in progress) are left
    alone. An origin the trainer writes every step would otherwise grow by a checkpoint a step."""
    if keep < 1:
        raise ValueError("keep must be at least 1")
    records: list[tuple[int, Path]] = []
    for path in (origin_dir / "checkpoints").glob("step-*.pb"):
        with suppress(ValueError):
            records.append((int(path.name.removeprefix("step-").removesuffix(".pb")), path))
    records.sort()
    if len(records) <= keep:
        return []

    def digests(path: Path) -> set[str] | None:
        try:
            checkpoint = checkpoint_pb2.Checkpoint.FromString(path.read_bytes())
            manifest = checkpoint_pb2.CheckpointManifest.FromString(checkpoint.manifest)
        except (OSError, DecodeError):
            return None
        return {ref.blake3.hex() for _, ref in manifest_blobs(manifest)}

    kept: set[str] = set()
    for _, path in records[-keep:]:
        kept |= digests(path) or set()
    pruned = []
    for step, path in records[:-keep]:
        named = digests(path)
        if named is None:
            continue  # unreadable: leave it (and its blobs) to the operator
        for digest in named - kept:
            with suppress(FileNotFoundError):
                (origin_dir / "blobs" / digest).unlink()
        path.unlink(missing_ok=True)  # after the blobs: an interrupted prune is done again
        pruned.append(step)
    return pruned


BlobSink = Callable[[bytes, bytes], Awaitable[bool]]
"""Stores one blob (a shard), given with its BLAKE3 digest; returns whether it was already
stored."""


def blob_digest(data: bytes) -> bytes:
    """BLAKE3 of a blob (several threads for a large one)."""
    threads = blake3.blake3.AUTO if len(data) >= 1 << 20 else 1
    return bytes(blake3.blake3(data, max_threads=threads).digest())


async def build_manifest(
    model_dir: Path,
    step: int,
    network_id: str,
    sink: BlobSink,
    *,
    shard_size: int = DEFAULT_SHARD_SIZE,
    created_at: datetime | None = None,
    delta_base: DeltaBase | None = None,
) -> tuple[checkpoint_pb2.CheckpointManifest, PublishCounts]:
    """Cut ``model_dir`` into shards, hand each to ``sink``, and describe them in a manifest
    (unsigned). ``delta_base``: the previous step's directory; each file it has too is also
    described as a delta against it (``CheckpointFile.delta``) when the delta is less than half
    the file. ``created_at`` defaults to the newest modification time of the files."""
    if delta_base is not None and delta_base.step >= step:
        raise CheckpointDirError(f"delta base step {delta_base.step} is not before step {step}")
    files = model_files(model_dir)
    manifest = checkpoint_pb2.CheckpointManifest(
        step=step, network_id=network_id, flops_per_token=flops_per_token(files)
    )
    stamp = timestamp_pb2.Timestamp()
    if created_at is None:
        newest = max(path.stat().st_mtime_ns for path in files)
        created_at = datetime.fromtimestamp(newest // 1000 / 1e6, tz=UTC)
    stamp.FromDatetime(created_at)
    manifest.created_at.CopyFrom(stamp)
    counts = PublishCounts()

    async def store(path: Path) -> tuple[list[common_pb2.BlobRef], common_pb2.BlobRef]:
        return await _store_file(path, shard_size, sink, counts)

    for path in files:
        relative = path.relative_to(model_dir).as_posix()
        shards, content = await store(path)
        entry = checkpoint_pb2.CheckpointFile(path=relative, content=content, shards=shards)
        if delta_base is not None:
            delta = await _delta_entry(delta_base, relative, path, store)
            if delta is not None:
                entry.delta.CopyFrom(delta)
                counts.delta_bytes += delta.content.size
        manifest.files.append(entry)
    return manifest, counts


@dataclass(slots=True)
class PublishCounts:
    """What :func:`build_manifest` handed to its sink."""

    shards: int = 0
    already_present: int = 0
    bytes: int = 0
    delta_bytes: int = 0
    """Bytes of the deltas among them."""


_SINKS_IN_FLIGHT = 2
"""Shards handed to the sink and not yet stored, while the next one is read and hashed."""


async def _store_file(
    path: Path, shard_size: int, sink: BlobSink, counts: PublishCounts
) -> tuple[list[common_pb2.BlobRef], common_pb2.BlobRef]:
    """One pass over ``path``: each shard is read once and hashed (its own digest, and the
    file's) while the shards before it are being stored by ``sink``, so reading, hashing and
    storing overlap instead of taking turns. A file of one shard is hashed once: its digest is
    the shard's."""
    plan = plan_shards(path, shard_size)
    whole = blake3.blake3(max_threads=blake3.blake3.AUTO) if len(plan) > 1 else None
    refs: list[common_pb2.BlobRef] = []
    in_flight: list[asyncio.Future[bool]] = []

    async def settle(keep: int) -> None:
        while len(in_flight) > keep:
            already = await in_flight.pop(0)
            counts.already_present += int(already)

    try:
        for shard in plan:
            data, digest = await asyncio.to_thread(_read_and_hash, shard, whole)
            refs.append(common_pb2.BlobRef(blake3=digest, size=shard.size))
            await settle(_SINKS_IN_FLIGHT - 1)
            in_flight.append(asyncio.ensure_future(sink(data, digest)))
            counts.shards += 1
            counts.bytes += shard.size
        await settle(0)
    finally:
        for task in in_flight:
            task.cancel()
    if whole is not None:
        content = whole.digest()
    elif refs:
        content = refs[0].blake3
    else:
        content = blake3.blake3().digest()
    return refs, common_pb2.BlobRef(blake3=bytes(content), size=sum(r.size for r in refs))


def _read_and_hash(shard: ShardPlan, whole: blake3.blake3 | None) -> tuple[bytes, bytes]:
    """A shard's bytes and digest, also added to its file's digest (a thread: BLAKE3 lets go
    of the GIL)."""
    data = read_shard(shard)
    if whole is not None:
        whole.update(data)
    return data, blob_digest(data)


def signed_checkpoint(
    identity: Identity, manifest: checkpoint_pb2.CheckpointManifest
) -> checkpoint_pb2.Checkpoint:
    """``manifest`` serialized and signed by the trainer ``identity`` (not yet published)."""
    data = manifest.SerializeToString(deterministic=True)
    return checkpoint_pb2.Checkpoint(
        manifest=data,
        signature=sign_manifest(identity, data),
        trainer_public_key=identity.public_key,
        step=manifest.step,
    )


async def publish_model_dir(
    client: RollnetClient,
    identity: Identity,
    model_dir: Path,
    step: int,
    network_id: str,
    *,
    shard_size: int = DEFAULT_SHARD_SIZE,
    created_at: datetime | None = None,
    delta_base: DeltaBase | None = None,
    origin_dir: Path | None = None,
) -> PublishedCheckpoint:
    """Upload ``model_dir`` shard by shard and publish it as the checkpoint of ``step``.

    ``client`` must be signed by ``identity``, registered with the trainer role. At most three
    shards are held in memory at a time (one being hashed, two being stored). ``created_at``
    defaults to the newest modification time of the files, so republishing an unchanged
    directory at the same step builds the identical manifest, which the coordinator accepts
    again (its shards are already stored). ``delta_base``: see
    :func:`build_manifest`. ``origin_dir``: also write every blob there, for
    ``rollnet relay --origin DIR``, and the signed checkpoint once the coordinator took it
    (:func:`write_origin_checkpoint`; :func:`prune_origin` drops old ones).
    """

    async def sink(data: bytes, digest: bytes) -> bool:
        # Hashed as it was read: the upload does not hash it again.
        upload = client.blobs.upload(
            data, blob_service_pb2.BLOB_KIND_CHECKPOINT_SHARD, digest=digest
        )
        if origin_dir is None:
            stored = await upload
        else:  # the coordinator and the origin directory take the shard at the same time
            stored, _ = await asyncio.gather(
                upload, asyncio.to_thread(write_origin_blob, origin_dir, data, digest)
            )
        return bool(stored.already_present)

    manifest, counts = await build_manifest(
        model_dir,
        step,
        network_id,
        sink,
        shard_size=shard_size,
        created_at=created_at,
        delta_base=delta_base,
    )
    manifest_bytes = manifest.SerializeToString(deterministic=True)
    published = await client.checkpoints.publish_checkpoint(
        checkpoint_service_pb2.PublishCheckpointRequest(
            manifest=manifest_bytes, signature=sign_manifest(identity, manifest_bytes)
        )
    )
    if origin_dir is not None:
        await asyncio.to_thread(write_origin_checkpoint, origin_dir, published.checkpoint)
    return PublishedCheckpoint(
        checkpoint=published.checkpoint,
        manifest=manifest,
        shards_uploaded=counts.shards,
        shards_already_present=counts.already_present,
        bytes_uploaded=counts.bytes,
    )


async def _delta_entry(
    base: DeltaBase,
    relative: str,
    path: Path,
    store: Callable[[Path], Awaitable[tuple[list[common_pb2.BlobRef], common_pb2.BlobRef]]],
) -> checkpoint_pb2.CheckpointDelta | None:
    """The delta of one file against its namesake in ``base``, if it is worth shipping."""
    base_file = base.model_dir / relative
    if not base_file.is_file():
        return None
    with tempfile.TemporaryDirectory(prefix="rollnet-delta-") as scratch:
        delta_file = Path(scratch) / "delta"
        stats = await asyncio.to_thread(encode_delta, base_file, path, delta_file)
        if stats.delta_bytes * 2 > stats.size:
            return None
        shards, content = await store(delta_file)
    base_digest = blake3.blake3(max_threads=blake3.blake3.AUTO)
    if base_file.stat().st_size:
        base_digest.update_mmap(base_file)
    return checkpoint_pb2.CheckpointDelta(
        base_step=base.step,
        base=common_pb2.BlobRef(blake3=base_digest.digest(), size=base_file.stat().st_size),
        content=content,
        shards=shards,
        encoding=checkpoint_pb2.DELTA_ENCODING_SPARSE_ZSTD_V1,
    )
