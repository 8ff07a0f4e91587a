"""Node identity: an Ed25519 key pair, the node id derived from it, and key files.

A key file is an unencrypted PKCS#8 PEM (``-----BEGIN PRIVATE KEY-----``), the format
``openssl genpkey -algorithm ed25519`` writes, so any language's crypto library can read it. It is
written atomically with mode 0600 and refused on load when group or others have any access.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import os
import stat
from pathlib import Path

import blake3
import nacl.bindings
import nacl.exceptions
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from rollnet.sdk.domains import NODE_ID_DOMAIN

PUBLIC_KEY_SIZE = 32
SIGNATURE_SIZE = 64
#: A PKCS#8 PEM Ed25519 key is 119 bytes; anything much larger is not one (and is not read whole).
_MAX_KEY_FILE_BYTES = 64 * 1024


class KeyFileError(Exception):
    """A key file cannot be written or loaded (missing, unsafe permissions, wrong format)."""


def node_id_from_public_key(public_key: bytes) -> str:
    """The node id of a raw 32-byte Ed25519 public key.

    Lowercase hex of the first 16 bytes of ``BLAKE3(b"rollnet-node-id-v1" || public_key)``.
    """
    if len(public_key) != PUBLIC_KEY_SIZE:
        raise ValueError(f"an Ed25519 public key is {PUBLIC_KEY_SIZE} bytes, got {len(public_key)}")
    digest: bytes = blake3.blake3(NODE_ID_DOMAIN + public_key).digest()
    return digest[:16].hex()


def verify_signature(public_key: bytes, signature: bytes, message: bytes) -> bool:
    """Whether ``signature`` is a valid Ed25519 signature of ``message`` by ``public_key``.

    Verification follows libsodium's rules, stricter than RFC 8032's minimum: besides a canonical
    ``S``, the public key must be canonical and not of small order, and so must ``R``. Without
    that, the identity point as a public key with ``R`` = identity and ``S`` = 0 "verifies" any
    message (OpenSSL accepts it), so anyone could sign as such a key. libsodium is also about
    twice as fast as OpenSSL's Ed25519 here, which matters on a server verifying every call.
    """
    if len(public_key) != PUBLIC_KEY_SIZE or len(signature) != SIGNATURE_SIZE:
        return False
    try:
        nacl.bindings.crypto_sign_open(signature + message, public_key)
    except (nacl.exceptions.BadSignatureError, nacl.exceptions.ValueError):
        return False
    return True


def b64url_encode(data: bytes) -> str:
    """Base64url without padding (RFC 4648 §5), as the signing headers use."""
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def b64url_decode(text: str) -> bytes:
    """Inverse of :func:`b64url_encode`; raises ``ValueError`` on anything else (incl. padding)."""
    if "=" in text or not text.isascii():
        raise ValueError("expected unpadded base64url")
    padded = text + "=" * (-len(text) % 4)
    data = base64.urlsafe_b64decode(padded.encode("ascii"))
    if b64url_encode(data) != text:  # rejects non-alphabet characters and non-canonical tails
        raise ValueError("not canonical base64url")
    return data


class Identity:
    """A node's Ed25519 signing key.

    Create one with :meth:`generate`, :meth:`from_seed` or :meth:`load`.
    """

    __slots__ = ("_node_id", "_private_key", "_public_key")

    def __init__(self, private_key: Ed25519PrivateKey) -> None:
        self._private_key = private_key
        self._public_key = private_key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )
        self._node_id = node_id_from_public_key(self._public_key)

    @classmethod
    def generate(cls) -> Identity:
        """A fresh random identity."""
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def from_seed(cls, seed: bytes) -> Identity:
        """The identity whose private key is the 32-byte Ed25519 seed ``seed``."""
        if len(seed) != 32:
            raise ValueError(f"an Ed25519 seed is 32 bytes, got {len(seed)}")
        return cls(Ed25519PrivateKey.from_private_bytes(seed))

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Identity:
        """Load a key file written by :meth:`save` (or ``openssl genpkey -algorithm ed25519``).

        Raises :class:`KeyFileError` when the file is missing, readable or writable by group or
        others (the message names the ``chmod`` that fixes it), or not an Ed25519 PKCS#8 key.
        """
        file = Path(path)
        try:
            # O_NONBLOCK: a FIFO given as a key file is refused below instead of blocking here.
            flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
            fd = os.open(file, flags)
        except OSError as exc:
            hint = " (create one with: rollnet keys generate --out FILE)"
            missing = exc.errno == errno.ENOENT
            raise KeyFileError(
                f"cannot open key file {file}: {exc.strerror}{hint if missing else ''}"
            ) from exc
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            # A directory opens for reading on Linux; Python's file object then fails with EISDIR.
            os.close(fd)
            what = "a directory" if stat.S_ISDIR(mode) else "not a regular file"
            raise KeyFileError(f"key file {file} is {what}: name the key file itself")
        with os.fdopen(fd, "rb") as handle:
            if os.name == "posix" and mode & 0o077:
                raise KeyFileError(
                    f"key file {file} is accessible by group or others "
                    f"(mode {stat.S_IMODE(mode):04o}); run: chmod 600 {file}"
                )
            try:
                pem = handle.read(_MAX_KEY_FILE_BYTES + 1)
            except OSError as exc:
                raise KeyFileError(f"cannot read key file {file}: {exc.strerror}") from exc
        if len(pem) > _MAX_KEY_FILE_BYTES:
            raise KeyFileError(f"key file {file} is not an unencrypted PKCS#8 PEM key (too large)")
        try:
            key = serialization.load_pem_private_key(pem, password=None)
        except (ValueError, TypeError) as exc:
            raise KeyFileError(f"key file {file} is not an unencrypted PKCS#8 PEM key") from exc
        if not isinstance(key, Ed25519PrivateKey):
            raise KeyFileError(f"key file {file} holds a {type(key).__name__}, not an Ed25519 key")
        return cls(key)

    def save(self, path: str | os.PathLike[str], *, overwrite: bool = False) -> None:
        """Write the private key to ``path`` as PKCS#8 PEM, atomically, with mode 0600.

        Refuses (``KeyFileError``) to replace an existing file unless ``overwrite`` is true.
        """
        file = Path(path)
        pem = self._private_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        tmp = file.with_name(f".{file.name}.{os.getpid()}.{os.urandom(4).hex()}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as exc:
            raise KeyFileError(f"cannot write key file {file}: {exc.strerror}") from exc
        try:
            with os.fdopen(fd, "wb") as handle:
                # The umask can only clear bits, but a pre-set ACL or odd umask must not widen them.
                os.fchmod(handle.fileno(), 0o600)
                handle.write(pem)
                handle.flush()
                os.fsync(handle.fileno())
            if overwrite:
                os.replace(tmp, file)
            else:
                # link() fails if the target exists, so two writers cannot clobber each other.
                try:
                    os.link(tmp, file)
                except FileExistsError as exc:
                    raise KeyFileError(
                        f"key file {file} already exists; refusing to overwrite it"
                    ) from exc
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)

    @property
    def public_key(self) -> bytes:
        """The raw 32-byte Ed25519 public key."""
        return self._public_key

    @property
    def node_id(self) -> str:
        """The node id derived from the public key (32 lowercase hex characters)."""
        return self._node_id

    @property
    def private_key(self) -> Ed25519PrivateKey:
        """The private key, for APIs that sign with a ``cryptography`` key (chain heads)."""
        return self._private_key

    def sign(self, message: bytes) -> bytes:
        """The 64-byte Ed25519 signature of ``message``."""
        return self._private_key.sign(message)

    def __repr__(self) -> str:
        return f"Identity(node_id={self._node_id!r})"
