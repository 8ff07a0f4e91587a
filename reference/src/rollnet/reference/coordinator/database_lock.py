"""One coordinator per SQLite database: a lock file held for the process's lifetime.

SQLite serializes writers, but two coordinators on one database file would each run their own
sweeps, caches, nonce memory and group-commit writer against it, and fight over its write lock.
Replicas share a PostgreSQL database instead. The lock is ``flock(2)`` on ``<database>.lock``:
the kernel releases it when the process ends, however it ends, so a crashed coordinator leaves
no stale lock behind (the file itself stays, holding the last holder's process id).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from rollnet.ledger.engine import DatabaseUrlError, database_url
from rollnet.reference.coordinator.config import ConfigError, CoordinatorConfig


class DatabaseLock:
    """An exclusive lock on a SQLite database, released by :meth:`release` or process exit."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd: int | None = fd

    def release(self) -> None:
        """Let another coordinator open the database (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)  # closing the descriptor drops its flock
            self._fd = None


def lock_database(config: CoordinatorConfig) -> DatabaseLock | None:
    """Take the lock of the configured SQLite database (``None`` for PostgreSQL, which
    replicas share, and for an in-memory database); a database another coordinator holds is a
    :class:`ConfigError` naming it and that coordinator's process id."""
    try:
        url = database_url(config.database_url, config.data_dir)
    except DatabaseUrlError:
        return None  # opening the database says what is wrong with it
    database = url.database
    if url.get_backend_name() != "sqlite" or not database or database == ":memory:":
        return None
    path = Path(f"{database}.lock")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        with contextlib.suppress(OSError):
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip()
        os.close(fd)
        who = f" (process {holder})" if holder else ""
        raise ConfigError(
            f"database {database}: another coordinator{who} is running on it; a SQLite "
            "database serves one coordinator (replicas share a PostgreSQL database): stop it, "
            "or give this one another --data-dir"
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return DatabaseLock(path, fd)
