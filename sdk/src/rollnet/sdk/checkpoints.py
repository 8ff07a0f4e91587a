"""Checkpoint transfer: verify a signed manifest, fetch its shards, keep a few versions on disk.

A checkpoint is a directory (Hugging Face layout) whose files are split into content-addressed
shards stored as blobs. The trainer signs ``b"rollnet-checkpoint-v1\\n" + manifest`` where
``manifest`` is the serialized :class:`~rollnet.v1.checkpoint_pb2.CheckpointManifest` carried
verbatim in ``Checkpoint.manifest``. Nothing is trusted before it is checked:

* :func:`verify_checkpoint` checks the trainer's signature, the network id, the step and that
  the file paths follow the canonical path rule (:func:`checkpoint_path_violations`, the rule the
  coordinator applies at ``PublishCheckpoint``; docs/protocol.md, "Checkpoint file paths");
* :class:`CheckpointStore` downloads each shard, checks its BLAKE3 digest and size, writes it at
  its offset, and only then renames the directory into place, so a directory it returns is always
  complete and verified. A file assembled from shards is not hashed again as a whole: the signed
  manifest lists its shards in order with their digests and sizes, and their concatenation is the
  file (docs/broadcast.md, "Threat model"). It keeps the newest ``keep`` versions
  (``async_level + 1``).
  A file whose manifest entry carries a delta against a step the store holds is rebuilt from
  that step's file and the (much smaller) delta (:mod:`rollnet.sdk.broadcast.delta`); the result
  must match the signed digest, else the full shards are fetched.

The publishing side is ``rollnet.reference.checkpoint_publishing.publish_model_dir``.
Shards come from the coordinator's ``BlobService`` (:class:`BlobServiceShards`) or from a tree
of relays (:class:`rollnet.sdk.broadcast.RelayShards`), both of them a :class:`ShardSource`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import secrets
import shutil
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import blake3
from google.protobuf.message import DecodeError

from rollnet.sdk.broadcast.delta import DeltaError, apply_delta
from rollnet.sdk.domains import CHECKPOINT_DOMAIN
from rollnet.sdk.identity import verify_signature
from rollnet.v1 import checkpoint_pb2, common_pb2, node_service_pb2

if TYPE_CHECKING:
    from rollnet.sdk.client import RollnetClient


_STEP_PREFIX = "step-"
_EMPTY_DIGEST = blake3.blake3(b"").digest()
_MANIFEST_NAME = ".manifest.pb"

log = logging.getLogger(__name__)


class CheckpointVerificationError(Exception):
    """A checkpoint's manifest, signature or content does not check out."""


class ShardSource(Protocol):
    """Where shard bytes come from (the coordinator's blob service, or a relay)."""

    async def fetch_shard(self, shard: common_pb2.BlobRef) -> bytes:
        """The shard's bytes (the store verifies them)."""


@runtime_checkable
class CheckedShardSource(Protocol):
    """A :class:`ShardSource` that checks each shard's BLAKE3 digest and size itself, in this
    process, before returning it (:class:`~rollnet.sdk.broadcast.RelayShards` hashes the bytes
    as they arrive, to know which relay served them wrong). The store then does not hash them a
    second time."""

    async def fetch_checked_shard(self, shard: common_pb2.BlobRef) -> bytes:
        """The shard's bytes, already checked against ``shard``'s digest and size; raises
        when no bytes that match could be had."""


@runtime_checkable
class _ChunkedShardSource(Protocol):
    """A :class:`CheckedShardSource` that can hand a checked shard over as the pieces it arrived
    in (their concatenation is the shard), so the store writes them with one ``pwritev`` instead
    of joining them into one buffer first (:class:`~rollnet.sdk.broadcast.RelayShards`)."""

    async def fetch_checked_chunks(self, shard: common_pb2.BlobRef) -> list[bytes]:
        """The shard's bytes in pieces, already checked against ``shard``'s digest and size."""


@runtime_checkable
class _StreamingShardSource(Protocol):
    """A :class:`CheckedShardSource` that writes a shard to its place in the file as its bytes
    arrive, checking them on the way (:meth:`~rollnet.sdk.broadcast.RelayShards.
    fetch_checked_into`): no shard is held in memory whole."""

    async def fetch_checked_into(self, shard: common_pb2.BlobRef, sink: _ShardPlace) -> None:
        """Write ``shard`` to ``sink``; returns once what was written matches its digest."""


@dataclass(frozen=True)
class _ShardPlace:
    """Where a shard goes: ``descriptor`` (a file open for writing), from ``offset``."""

    descriptor: int
    offset: int

    def write(self, position: int, data: bytes) -> None:
        """Write ``data`` at ``position`` within the shard (on the event loop: a piece is what
        one receive gave, and the page cache takes it in microseconds)."""
        written = os.pwrite(self.descriptor, data, self.offset + position)
        if written != len(data):
            _write_chunks(self.descriptor, [data[written:]], self.offset + position + written)

    def read(self, size: int) -> bytes:
        """The shard's first ``size`` bytes as written."""
        return os.pread(self.descriptor, size, self.offset)


async def write_checked(source: ShardSource, shard: common_pb2.BlobRef, place: _ShardPlace) -> None:
    """``shard`` from ``source``, checked against its digest and size, written at ``place``:
    as its bytes arrive when ``source`` can stream them, else in one ``pwritev``."""
    if isinstance(source, _StreamingShardSource):
        await source.fetch_checked_into(shard, place)
        return
    chunks = await fetch_checked_chunks(source, shard)
    await asyncio.to_thread(_write_chunks, place.descriptor, chunks, place.offset)


async def fetch_checked_chunks(source: ShardSource, shard: common_pb2.BlobRef) -> list[bytes]:
    """Like :func:`fetch_checked`, as the pieces the shard arrived in (one piece when
    ``source`` cannot give pieces)."""
    if isinstance(source, _ChunkedShardSource):
        chunks = await source.fetch_checked_chunks(shard)
        if sum(len(chunk) for chunk in chunks) != shard.size:
            raise CheckpointVerificationError(
                f"shard {shard.blake3.hex()} does not match its digest and size"
            )
        return chunks
    return [await fetch_checked(source, shard)]


async def fetch_checked(source: ShardSource, shard: common_pb2.BlobRef) -> bytes:
    """``shard`` from ``source``, checked against its digest and size exactly once (by the
    source itself when it is a :class:`CheckedShardSource`, else here, off the event loop).
    Raises :class:`CheckpointVerificationError` for bytes that do not match."""
    if isinstance(source, CheckedShardSource):
        data = await source.fetch_checked_shard(shard)
        matches = len(data) == shard.size
    else:
        data = await source.fetch_shard(shard)
        matches = len(data) == shard.size and (
            await asyncio.to_thread(_digest_of_bytes, data) == shard.blake3
        )
    if not matches:
        raise CheckpointVerificationError(
            f"shard {shard.blake3.hex()} does not match its digest and size"
        )
    return data


@runtime_checkable
class ReportsRelays(Protocol):
    """A :class:`ShardSource` that finds relays serving wrong bytes and keeps reports of them
    for the coordinator (:class:`~rollnet.sdk.broadcast.RelayShards`)."""

    def take_relay_reports(self, limit: int) -> list[node_service_pb2.RelayReport]:
        """Up to ``limit`` reports not taken before."""


@runtime_checkable
class StepHinted(Protocol):
    """A :class:`ShardSource` that likes to know which checkpoint step the next shards belong
    to (relays keep versions together by it). A hint only: nothing depends on it."""

    def hint_step(self, step: int) -> None:
        """The shards asked for next are the checkpoint of ``step``."""


@dataclass(frozen=True)
class BlobServiceShards:
    """A :class:`ShardSource` reading shards from the coordinator's ``BlobService``."""

    client: RollnetClient

    async def fetch_shard(self, shard: common_pb2.BlobRef) -> bytes:
        """Download one shard through ``GetBlob``."""
        return await self.client.blobs.download(shard.blake3)

    async def fetch_checked_shard(self, shard: common_pb2.BlobRef) -> bytes:
        """The same: the download checks the whole blob's digest (``BlobIntegrityError``), so
        the store does not hash it again (a :class:`CheckedShardSource`)."""
        return await self.client.blobs.download(shard.blake3)


@dataclass(frozen=True)
class FallbackShards:
    """A :class:`ShardSource` asking ``primary`` (relays) first and ``fallback`` (the
    coordinator's blob service) for a shard ``primary`` could not deliver. Both are checked
    by the store alike."""

    primary: ShardSource
    fallback: ShardSource

    def hint_step(self, step: int) -> None:
        """Pass the hint on to whichever source takes it."""
        for source in (self.primary, self.fallback):
            if isinstance(source, StepHinted):
                source.hint_step(step)

    async def fetch_shard(self, shard: common_pb2.BlobRef) -> bytes:
        """The shard from ``primary``, else from ``fallback`` (checked: see
        :meth:`fetch_checked_shard`)."""
        return await self.fetch_checked_shard(shard)

    async def fetch_checked_shard(self, shard: common_pb2.BlobRef) -> bytes:
        """The shard from ``primary``, else from ``fallback``; each checked once, so wrong
        bytes from ``primary`` also send the request to ``fallback``."""
        return b"".join(await self.fetch_checked_chunks(shard))

    async def fetch_checked_into(self, shard: common_pb2.BlobRef, sink: _ShardPlace) -> None:
        """The shard from ``primary``, else from ``fallback``, written to ``sink`` (bytes
        ``primary`` wrote that fail the check are written over)."""
        try:
            await write_checked(self.primary, shard, sink)
        except Exception as error:  # whatever failed among the relays, the fallback may serve
            log.warning(
                "relay_shard_fallback", extra={"blake3": shard.blake3.hex(), "error": str(error)}
            )
            await write_checked(self.fallback, shard, sink)

    async def fetch_checked_chunks(self, shard: common_pb2.BlobRef) -> list[bytes]:
        """The same, in the pieces the shard arrived in (no join: the store writes them)."""
        try:
            return await fetch_checked_chunks(self.primary, shard)
        except Exception as error:  # whatever failed among the relays, the fallback may serve
            log.warning(
                "relay_shard_fallback", extra={"blake3": shard.blake3.hex(), "error": str(error)}
            )
            return await fetch_checked_chunks(self.fallback, shard)


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
    violations = checkpoint_path_violations([item.path for item in manifest.files])
    if violations:
        raise CheckpointVerificationError(
            "manifest paths break the path rule: "
            + "; ".join(f"{v.field}: {v.description}" for v in violations[:5])
            + (f" (and {len(violations) - 5} more)" if len(violations) > 5 else "")
        )
    for item in manifest.files:
        if sum(s.size for s in item.shards) != item.content.size:
            raise CheckpointVerificationError(f"{item.path}: shard sizes do not add up")
        # The file is its shards' concatenation (the store checks each shard, not the file):
        # where that says what the file's digest is, the signed one must agree.
        if (len(item.shards) == 1 and item.shards[0] != item.content) or (
            not item.shards and item.content.blake3 != _EMPTY_DIGEST
        ):
            raise CheckpointVerificationError(f"{item.path}: file digest is not its shards'")
        if item.HasField("delta") and (
            sum(s.size for s in item.delta.shards) != item.delta.content.size
            or item.delta.base_step >= manifest.step
        ):
            raise CheckpointVerificationError(f"{item.path}: delta is inconsistent")
    return manifest


def manifest_blobs(
    manifest: checkpoint_pb2.CheckpointManifest,
) -> list[tuple[str, common_pb2.BlobRef]]:
    """Every blob a manifest refers to, as ``(where, BlobRef)``: each file's shards, then its
    delta's shards (``where`` is the file path, with `` (delta)`` for the latter). What a
    coordinator must hold before recording the manifest and must keep while it is published."""
    found: list[tuple[str, common_pb2.BlobRef]] = []
    for item in manifest.files:
        found.extend((item.path, shard) for shard in item.shards)
        if item.HasField("delta"):
            found.extend((f"{item.path} (delta)", shard) for shard in item.delta.shards)
    return found


MAX_CHECKPOINT_FILES = 4096
"""Most files a checkpoint manifest may name."""
MAX_CHECKPOINT_PATH_BYTES = 1024
"""Longest file path, in bytes."""
MAX_CHECKPOINT_COMPONENT_BYTES = 255
"""Longest path component (a file or directory name), in bytes: ``NAME_MAX`` almost everywhere."""
MAX_CHECKPOINT_PATH_DEPTH = 16
"""Most components in a path (``a/b/c`` has 3)."""

# Portable names: letters, digits, '.', '_' and '-', neither starting nor ending with '.'. A name
# that starts with '.' is hidden, and that space is the store's own (its manifest copy and
# temporary files); Windows drops a trailing '.', so 'a.' and 'a' would be one file there.
_COMPONENT = re.compile(r"[A-Za-z0-9_-](?:[A-Za-z0-9._-]*[A-Za-z0-9_-])?")
# Windows device names, reserved whatever the extension ('nul.json' opens the null device).
_RESERVED_STEMS = frozenset(
    {"con", "prn", "aux", "nul"}
    | {f"com{digit}" for digit in range(1, 10)}
    | {f"lpt{digit}" for digit in range(1, 10)}
)


@dataclass(frozen=True)
class PathViolation:
    """One way a manifest's file paths break the path rule."""

    index: int | None
    """The position of the offending path in the list; ``None`` when the list itself is wrong."""
    description: str
    """What is wrong, in words."""

    @property
    def field(self) -> str:
        """Where, relative to the manifest: ``files[3].path``, or ``files`` for the list."""
        return "files" if self.index is None else f"files[{self.index}].path"


def checkpoint_path_error(path: str) -> str | None:
    """Why ``path`` is not a canonical checkpoint file path, or ``None`` when it is one.

    The rule (docs/protocol.md, "Checkpoint file paths"): 1 to 1024 bytes; components separated
    by single ``/`` (no leading or trailing ``/``, no empty component), at most 16 of them, each
    1 to 255 characters from ``A-Z a-z 0-9 . _ -``, neither starting nor ending with ``.`` (so no
    ``.`` or ``..`` component, no hidden file), and none a Windows device name (``con``, ``nul``,
    ``com1``, ... whatever the case and extension). Backslashes, NUL, spaces and every non-ASCII
    character are outside the set. The same path then names the same file on every file system.
    """
    size = len(path.encode("utf-8", "surrogatepass"))
    if size == 0:
        return "must not be empty"
    if size > MAX_CHECKPOINT_PATH_BYTES:
        return f"is {size} bytes long; at most {MAX_CHECKPOINT_PATH_BYTES}"
    components = path.split("/")
    if len(components) > MAX_CHECKPOINT_PATH_DEPTH:
        return f"has {len(components)} components; at most {MAX_CHECKPOINT_PATH_DEPTH}"
    for position, component in enumerate(components):
        where = f"component {position + 1} ({component!r})"
        if not component:
            if position == 0:
                return "must be relative (no leading '/')"
            if position == len(components) - 1:
                return "must name a file (no trailing '/')"
            return "must not contain an empty component ('//')"
        if len(component) > MAX_CHECKPOINT_COMPONENT_BYTES:
            return f"{where} is longer than {MAX_CHECKPOINT_COMPONENT_BYTES} characters"
        if component in (".", ".."):
            return f"{where} is not allowed ('.' and '..' are not names)"
        if not _COMPONENT.fullmatch(component):
            bad = sorted({c for c in component if not _COMPONENT.fullmatch(c) and c != "."})
            if bad:
                shown = ", ".join(repr(c) for c in bad[:5])
                return f"{where} has characters outside A-Z a-z 0-9 . _ -: {shown}"
            return f"{where} must not start or end with '.'"
        if component.split(".", 1)[0].lower() in _RESERVED_STEMS:
            return f"{where} is a reserved device name on Windows"
    return None


def checkpoint_file_count_error(count: int) -> str | None:
    """Why a manifest naming ``count`` files breaks the path rule (1 to 4096), or ``None``."""
    if count == 0:
        return "must name at least one file"
    if count > MAX_CHECKPOINT_FILES:
        return f"names {count} files; at most {MAX_CHECKPOINT_FILES}"
    return None


def checkpoint_path_conflicts(paths: Sequence[str]) -> list[PathViolation]:
    """The paths, each canonical on its own, that clash with another of the same manifest: two
    equal when letters are compared without case (one file on case-insensitive file systems), or
    one lying under another that is a file (``a`` and ``a/b``). Paths that break
    :func:`checkpoint_path_error` are left out (they are refused for that)."""
    found: list[PathViolation] = []
    files: dict[str, int] = {}
    for index, path in enumerate(paths):
        if checkpoint_path_error(path) is not None:
            continue
        folded = path.lower()
        first = files.setdefault(folded, index)
        if first != index:
            same = "names the same file as" if paths[first] == path else "differs only in case from"
            found.append(PathViolation(index, f"{same} files[{first}].path"))
    kept = set(files.values())
    for index, path in enumerate(paths):
        if index not in kept:
            continue
        components = path.lower().split("/")
        for depth in range(1, len(components)):
            directory = "/".join(components[:depth])
            if directory in files:
                found.append(
                    PathViolation(
                        index, f"lies under files[{files[directory]}].path, which is a file"
                    )
                )
                break
    return found


def checkpoint_path_violations(paths: Sequence[str]) -> list[PathViolation]:
    """Every way the file paths of one manifest break the canonical path rule (empty: none).

    The list holds 1 to 4096 paths (:func:`checkpoint_file_count_error`), each must pass
    :func:`checkpoint_path_error`, and none may clash with another
    (:func:`checkpoint_path_conflicts`). Coordinators refuse a manifest that breaks it
    (``INVALID_FIELDS``, one field violation each, under ``manifest.``; the reference
    coordinator applies these three parts as the bounds of ``CheckpointManifest.files`` and
    ``CheckpointFile.path``), and workers refuse it again before writing a file.
    """
    found: list[PathViolation] = []
    count_error = checkpoint_file_count_error(len(paths))
    if count_error is not None:
        found.append(PathViolation(None, count_error))
    for index, path in enumerate(paths):
        error = checkpoint_path_error(path)
        if error is not None:
            found.append(PathViolation(index, error))
    found.extend(checkpoint_path_conflicts(paths))
    return found


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
        progress: Callable[[int, int], None] | None = None,
        relays: ShardSource | None = None,
    ) -> None:
        if keep < 1:
            raise ValueError("keep must be at least 1")
        self.root = Path(root)
        self.network_id = network_id
        self.keep = keep
        self.trusted_trainer_keys = trusted_trainer_keys
        self.concurrency = concurrency
        self.progress = progress
        """Called with (bytes done, bytes in all) as a download advances."""
        self.relays = relays
        """Asked first for every shard, the source given to :meth:`ensure` after it fails
        (:class:`FallbackShards`)."""
        self.delta_files = 0
        """Files this store built by applying a delta."""
        self.full_files = 0
        """Files this store fetched whole."""
        self.bytes_resumed = 0
        """Shard bytes an interrupted download had written, checked and kept (not fetched)."""
        self._locks: dict[int, asyncio.Lock] = {}

    def take_relay_reports(self, limit: int) -> list[node_service_pb2.RelayReport]:
        """Bad-shard reports of :attr:`relays` not yet sent to the coordinator (at most
        ``limit``, each once; none when the relays do not report): what the node's next
        heartbeat carries (``NodeReport.relay_reports``)."""
        if isinstance(self.relays, ReportsRelays):
            return self.relays.take_relay_reports(limit)
        return []

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
        """Verify ``checkpoint``, download what is missing, and return its directory.

        With ``relays`` set, shards come from them and ``source`` only for what they cannot
        deliver."""
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
            if self.relays is not None:
                source = FallbackShards(self.relays, source)
            if isinstance(source, StepHinted):
                source.hint_step(manifest.step)
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
        total = sum(item.content.size for item in manifest.files)
        self._report(0, total)
        done = 0

        def advance(size: int) -> None:
            nonlocal done
            done += size
            self._report(done, total)

        async def fetch(shard: common_pb2.BlobRef, place: _ShardPlace) -> None:
            async with limit:
                await write_checked(source, shard, place)

        async def kept(descriptor: int, index: int, shard: common_pb2.BlobRef, offset: int) -> bool:
            # A shard an earlier attempt wrote: used only if its bytes on disk still match.
            async with limit:
                data = await asyncio.to_thread(os.pread, descriptor, shard.size, offset)
                if len(data) != shard.size:
                    return False
                if await asyncio.to_thread(_digest_of_bytes, data) != shard.blake3:
                    return False
            self.bytes_resumed += len(data)
            return True

        async def assemble(
            shards: Sequence[common_pb2.BlobRef],
            path: Path,
            *,
            count: bool,
            written: Path | None = None,
        ) -> None:
            # Shards are written at their offsets as they arrive, so a file never sits in memory
            # whole. Each is checked against its signed digest and size before it is written,
            # and the signed list tiles the file (sizes add up: verify_checkpoint), so the file
            # is not hashed again. ``written``: a log of the shards already written to ``path``,
            # kept across interruptions, so the next attempt fetches only the others.
            offsets = []
            position = 0
            for shard in shards:
                offsets.append(position)
                position += shard.size
            done = _written_shards(written, len(shards)) if written is not None else set()
            flags = os.O_RDWR | os.O_CREAT | (0 if done else os.O_TRUNC)
            descriptor = os.open(path, flags, 0o644)
            log_descriptor = (
                None
                if written is None
                else os.open(written, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            )
            try:

                async def place(index: int, shard: common_pb2.BlobRef, offset: int) -> None:
                    resumed = index in done and await kept(descriptor, index, shard, offset)
                    if not resumed:
                        await fetch(shard, _ShardPlace(descriptor, offset))
                        if log_descriptor is not None:
                            os.write(log_descriptor, f"{index}\n".encode())
                    if count:
                        advance(shard.size)

                tasks = [
                    asyncio.ensure_future(place(index, shard, offset))
                    for index, (shard, offset) in enumerate(zip(shards, offsets, strict=True))
                ]
                try:
                    await asyncio.gather(*tasks)
                except BaseException:
                    # Shards still arriving write to ``descriptor``: stop them before it closes.
                    for task in tasks:
                        task.cancel()
                    await asyncio.gather(*tasks, return_exceptions=True)
                    raise
                os.ftruncate(descriptor, sum(s.size for s in shards))
            finally:
                os.close(descriptor)
                if log_descriptor is not None:
                    os.close(log_descriptor)

        async def full(item: checkpoint_pb2.CheckpointFile, target: Path) -> None:
            # Named after the file (path and content), not at random: when the download is
            # interrupted the shards written so far stay, and the next attempt fetches only the
            # rest. A digest, so the name stays short whatever the path.
            stem = "." + blake3.blake3(item.path.encode() + item.content.blake3).hexdigest()[:32]
            tmp = target.with_name(f"{stem}.part")
            written = target.with_name(f"{stem}.written")
            await assemble(item.shards, tmp, count=True, written=written)
            os.replace(tmp, target)
            written.unlink(missing_ok=True)

        async def one(item: checkpoint_pb2.CheckpointFile) -> None:
            target = partial / item.path
            if target.is_file() and await asyncio.to_thread(_file_matches, target, item.content):
                advance(item.content.size)
                return
            target.parent.mkdir(parents=True, exist_ok=True)
            base = self._delta_base(item)
            if base is not None:
                try:
                    await self._apply_delta(item, base, target, assemble)
                    self.delta_files += 1
                    advance(item.content.size)
                    return
                except (CheckpointVerificationError, DeltaError, OSError) as error:
                    # A delta that does not reproduce the signed file costs its bytes, never a
                    # wrong file: the full shards are fetched instead.
                    log.warning(
                        "checkpoint_delta_failed", extra={"path": item.path, "error": str(error)}
                    )
            await full(item, target)
            self.full_files += 1

        await asyncio.gather(*(one(item) for item in manifest.files))
        final = self.root / f"{_STEP_PREFIX}{manifest.step}"
        (partial / _MANIFEST_NAME).write_bytes(manifest.SerializeToString())
        os.replace(partial, final)
        return final

    def _report(self, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress(done, total)

    def _delta_base(self, item: checkpoint_pb2.CheckpointFile) -> Path | None:
        """The stored base file of ``item``'s delta, when there is a usable delta and base."""
        if (
            not item.HasField("delta")
            or item.delta.encoding != checkpoint_pb2.DELTA_ENCODING_SPARSE_ZSTD_V1
        ):
            return None
        directory = self.path(item.delta.base_step)
        if directory is None:
            return None
        # The stored manifest copy was written after every file of that step was verified, so
        # it says what each file's digest is without reading the file again.
        try:
            stored = checkpoint_pb2.CheckpointManifest.FromString(
                (directory / _MANIFEST_NAME).read_bytes()
            )
        except (OSError, DecodeError):
            return None
        for entry in stored.files:
            if entry.path == item.path and entry.content == item.delta.base:
                candidate = directory / item.path
                return candidate if candidate.is_file() else None
        return None

    async def _apply_delta(
        self,
        item: checkpoint_pb2.CheckpointFile,
        base: Path,
        target: Path,
        assemble: _Assemble,
    ) -> None:
        delta_file = target.with_name(f".{secrets.token_hex(8)}.delta")
        tmp = target.with_name(f".{secrets.token_hex(8)}.tmp")
        try:
            # The delta's shards are checked like a file's; what it rebuilds is checked whole
            # below (the base and the delta's instructions are not covered by the shard digests).
            await assemble(item.delta.shards, delta_file, count=False)
            await asyncio.to_thread(apply_delta, base, delta_file, tmp, size=item.content.size)
            if await asyncio.to_thread(_digest_of, tmp) != item.content.blake3:
                raise CheckpointVerificationError(
                    f"{item.path}: the delta does not reproduce the signed file"
                )
            os.replace(tmp, target)
        finally:
            delta_file.unlink(missing_ok=True)
            tmp.unlink(missing_ok=True)

    def prune(self, *, protect: int | None = None) -> list[int]:
        """Delete all but the newest ``keep`` steps (never ``protect``), and the partial
        downloads of steps older than every step kept that no download is working on (a step
        given up, never to be finished); returns deleted steps."""
        steps = self.steps()
        doomed = [s for s in steps[: max(0, len(steps) - self.keep)] if s != protect]
        for step in doomed:
            shutil.rmtree(self.root / f"{_STEP_PREFIX}{step}", ignore_errors=True)
        kept = [s for s in steps if s not in doomed]
        if kept:
            for entry in self.root.glob(f".partial-{_STEP_PREFIX}*"):
                try:
                    step = int(entry.name.removeprefix(f".partial-{_STEP_PREFIX}"))
                except ValueError:
                    continue
                lock = self._locks.get(step)
                if step < kept[0] and (lock is None or not lock.locked()):
                    shutil.rmtree(entry, ignore_errors=True)
        return doomed


class _Assemble(Protocol):
    async def __call__(
        self,
        shards: Sequence[common_pb2.BlobRef],
        path: Path,
        *,
        count: bool,
        written: Path | None = None,
    ) -> None: ...


def _written_shards(log_path: Path, shards: int) -> set[int]:
    """Indices an earlier attempt logged as written (each is checked again before use)."""
    try:
        text = log_path.read_text(encoding="ascii", errors="replace")
    except FileNotFoundError:
        return set()
    return {int(line) for line in text.split() if line.isdigit() and int(line) < shards}


def _write_chunks(descriptor: int, chunks: Sequence[bytes], offset: int) -> None:
    """Write ``chunks`` one after another at ``offset`` with ``pwritev`` (at most ``_IOV_MAX``
    pieces a call), without a copy joining them first."""
    pieces = [memoryview(chunk) for chunk in chunks if chunk]
    first = 0
    while first < len(pieces):
        written = os.pwritev(descriptor, pieces[first : first + _IOV_MAX], offset)
        if not written:
            raise OSError(f"pwritev wrote nothing at offset {offset}")
        offset += written
        # Skip what was written: usually the whole batch; a short write leaves a tail.
        while written:
            if written >= len(pieces[first]):
                written -= len(pieces[first])
                first += 1
            else:
                pieces[first] = pieces[first][written:]
                written = 0


_IOV_MAX = 1024
"""Pieces one ``pwritev`` takes at most (Linux's ``IOV_MAX``)."""


def _digest_of_bytes(data: bytes) -> bytes:
    # BLAKE3 hashes large inputs on several threads.
    threads = blake3.blake3.AUTO if len(data) >= 1 << 20 else 1
    return bytes(blake3.blake3(data, max_threads=threads).digest())


def _digest_of(path: Path) -> bytes:
    hasher = blake3.blake3(max_threads=blake3.blake3.AUTO)
    if path.stat().st_size:
        hasher.update_mmap(path)
    return hasher.digest()


def _file_matches(path: Path, ref: common_pb2.BlobRef) -> bool:
    return path.stat().st_size == ref.size and _digest_of(path) == ref.blake3


__all__ = [
    "CHECKPOINT_DOMAIN",
    "MAX_CHECKPOINT_COMPONENT_BYTES",
    "MAX_CHECKPOINT_FILES",
    "MAX_CHECKPOINT_PATH_BYTES",
    "MAX_CHECKPOINT_PATH_DEPTH",
    "BlobServiceShards",
    "CheckedShardSource",
    "CheckpointStore",
    "CheckpointVerificationError",
    "FallbackShards",
    "PathViolation",
    "ReportsRelays",
    "ShardSource",
    "StepHinted",
    "checkpoint_file_count_error",
    "checkpoint_path_conflicts",
    "checkpoint_path_error",
    "checkpoint_path_violations",
    "fetch_checked",
    "manifest_blobs",
    "verify_checkpoint",
]
