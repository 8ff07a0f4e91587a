"""Content-addressed blob storage on the local file system.

A blob lives at ``<root>/<hex[:2]>/<hex>``. Uploads stream into a temporary file in the same
directory while BLAKE3 is computed; only when the digest and size match the declared ones is the
file fsynced and atomically renamed into place. A crash mid-upload therefore leaves at most a
stray temporary file (removed on the next start), never a wrong blob under a good name. Because
names are digests, a duplicate upload is a no-op and concurrent uploads of the same content race
harmlessly.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import blake3

_TMP_SUFFIX = ".partial"


class BlobDigestMismatch(ValueError):
    """The uploaded bytes do not hash to the declared digest."""


class BlobSizeMismatch(ValueError):
    """The uploaded byte count differs from the declared size."""


class BlobTooLarge(ValueError):
    """The upload exceeds the size cap."""


@dataclass(frozen=True, slots=True)
class StoredBlob:
    """Where a verified blob lives."""

    digest: bytes
    size: int
    path: Path
    already_present: bool


class BlobStore:
    """Verified, content-addressed blobs under one directory."""

    def __init__(self, root: Path, *, max_bytes: int) -> None:
        self.root = root
        self.max_bytes = max_bytes
        root.mkdir(parents=True, exist_ok=True)

    def path_of(self, digest: bytes) -> Path:
        """The path a blob with ``digest`` is (or would be) stored at."""
        name = digest.hex()
        return self.root / name[:2] / name

    def remove_partials(self) -> int:
        """Delete temporary files left by interrupted uploads; returns how many."""
        removed = 0
        for partial in self.root.glob(f"*/*{_TMP_SUFFIX}"):
            partial.unlink(missing_ok=True)
            removed += 1
        return removed

    def exists(self, digest: bytes) -> bool:
        """Whether the blob is stored."""
        return self.path_of(digest).is_file()

    async def write(self, digest: bytes, size: int, chunks: AsyncIterator[bytes]) -> StoredBlob:
        """Store the streamed bytes if they hash to ``digest`` and total ``size``.

        Raises :class:`BlobTooLarge`, :class:`BlobSizeMismatch` or :class:`BlobDigestMismatch`;
        nothing is stored then. Content already stored is drained and not rewritten.
        """
        if size > self.max_bytes:
            raise BlobTooLarge(f"blob of {size} bytes exceeds the cap of {self.max_bytes}")
        final = self.path_of(digest)
        final.parent.mkdir(parents=True, exist_ok=True)
        temporary = final.with_name(f"{final.name}.{secrets.token_hex(8)}{_TMP_SUFFIX}")
        hasher = blake3.blake3()
        received = 0
        try:
            with open(temporary, "wb") as out:  # noqa: ASYNC230 - bounded local-disk writes
                async for chunk in chunks:
                    received += len(chunk)
                    if received > size:
                        raise BlobSizeMismatch(f"received more than the declared {size} bytes")
                    hasher.update(chunk)
                    out.write(chunk)
                if received != size:
                    raise BlobSizeMismatch(f"received {received} bytes, declared {size}")
                if hasher.digest() != digest:
                    raise BlobDigestMismatch(
                        f"content hashes to {hasher.hexdigest()}, declared {digest.hex()}"
                    )
                if final.is_file():
                    return StoredBlob(digest, size, final, already_present=True)
                # The fsync waits on the disk for milliseconds: not on the event loop.
                await asyncio.to_thread(_flush_to_disk, out)
            os.replace(temporary, final)
            return StoredBlob(digest, size, final, already_present=False)
        finally:
            temporary.unlink(missing_ok=True)

    def read_range(self, digest: bytes, offset: int, length: int) -> tuple[int, bytes]:
        """Return ``(total size, bytes[offset:offset+length])``; length 0 means to the end."""
        path = self.path_of(digest)
        with open(path, "rb") as blob:
            total = os.fstat(blob.fileno()).st_size
            blob.seek(min(offset, total))
            data = blob.read(length if length else -1)
        return total, data


def _flush_to_disk(out: BinaryIO) -> None:
    out.flush()
    os.fsync(out.fileno())
