"""Checkpoint transfer: verify a signed manifest, fetch its shards, keep a few versions on disk.

A checkpoint is a directory (Hugging Face layout) whose files are split into content-addressed
shards stored as blobs. The trainer signs ``b"rollnet-checkpoint-v1\\n" + manifest`` where
``manifest`` is the serialized :class:`~rollnet.v1.checkpoint_pb2.CheckpointManifest` carried
verbatim in ``Checkpoint.manifest``. Nothing is trusted before it is checked:

* :func:`verify_checkpoint` checks the trainer's signature, the network id, the step and that
  the file paths follow the canonical path rule (:func:`checkpoint_path_violations`, the rule the
  coordinator applies at ``PublishCheckpoint``; docs/protocol.md, "Checkpoint file paths");
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
import re
import secrets
import shutil
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path
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
    return manifest


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
    # A short name of its own: the file's name may already be as long as names may be, and one
    # starting with "." can be no manifest path's.
    tmp = path.with_name(f".{secrets.token_hex(8)}.tmp")
    tmp.write_bytes(content)
    os.replace(tmp, path)


__all__ = [
    "CHECKPOINT_DOMAIN",
    "MAX_CHECKPOINT_COMPONENT_BYTES",
    "MAX_CHECKPOINT_FILES",
    "MAX_CHECKPOINT_PATH_BYTES",
    "MAX_CHECKPOINT_PATH_DEPTH",
    "BlobServiceShards",
    "CheckpointStore",
    "CheckpointVerificationError",
    "PathViolation",
    "ShardSource",
    "checkpoint_file_count_error",
    "checkpoint_path_conflicts",
    "checkpoint_path_error",
    "checkpoint_path_violations",
    "verify_checkpoint",
]
