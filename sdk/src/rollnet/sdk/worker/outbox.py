"""The outbox: finished work that is not yet acknowledged, and the receipts of work that is.

One SQLite file (``outbox.sqlite3`` in the worker's data directory, WAL mode, ``synchronous =
FULL``) with two tables:

``pending``
    one row per finished batch, written *before* anything is uploaded: the request id, task,
    lease and fencing token, the serialized ``RolloutBatch`` (the blob) and the serialized
    ``SubmitCommitmentRequest`` (with its ``request_id``). A restarted worker resubmits exactly
    these bytes, so the coordinator recognises the request id and replays the original receipt
    instead of storing the work twice.
``receipts``
    one row per acknowledged commitment: the serialized ``SubmitCommitmentResponse`` (commitment
    and the coordinator's signed receipt). Storing a receipt and deleting its pending row happen
    in one transaction, so work is never both lost and acknowledged twice.
``dropped``
    work the coordinator refused for good (for example the lease had expired), with the reason,
    for the operator's eyes.
"""

from __future__ import annotations

import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path

from rollnet.v1 import commitment_service_pb2

_SCHEMA = """
CREATE TABLE IF NOT EXISTS pending (
    request_id TEXT PRIMARY KEY,
    task_id TEXT NOT NULL,
    lease_id TEXT NOT NULL,
    fencing_token INTEGER NOT NULL,
    created_at REAL NOT NULL,
    batch BLOB NOT NULL,
    commitment_request BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS receipts (
    commitment_id TEXT PRIMARY KEY,
    request_id TEXT NOT NULL UNIQUE,
    task_id TEXT NOT NULL,
    lease_id TEXT NOT NULL,
    stored_at REAL NOT NULL,
    response BLOB NOT NULL
);
CREATE TABLE IF NOT EXISTS dropped (
    request_id TEXT PRIMARY KEY,
    task_id TEXT NOT NULL,
    lease_id TEXT NOT NULL,
    dropped_at REAL NOT NULL,
    reason TEXT NOT NULL
);
"""

OUTBOX_FILE = "outbox.sqlite3"
"""File name of the outbox inside the worker's data directory."""


@dataclass(frozen=True, slots=True)
class PendingSubmission:
    """A finished batch waiting for its receipt."""

    request_id: str
    task_id: str
    lease_id: str
    fencing_token: int
    batch: bytes
    """The serialized ``RolloutBatch``: the blob to upload."""
    commitment_request: bytes
    """The serialized ``SubmitCommitmentRequest``, ``request_id`` included."""

    def request(self) -> commitment_service_pb2.SubmitCommitmentRequest:
        """The commitment request, parsed."""
        return commitment_service_pb2.SubmitCommitmentRequest.FromString(self.commitment_request)


class Outbox:
    """Durable store of pending submissions and receipts (single process, single thread)."""

    def __init__(self, data_dir: Path) -> None:
        data_dir = Path(data_dir)
        data_dir.mkdir(parents=True, exist_ok=True)
        self.path = data_dir / OUTBOX_FILE
        self._db = sqlite3.connect(self.path, isolation_level=None)
        self._db.execute("PRAGMA journal_mode = WAL")
        # FULL: a row we told the caller is stored survives a power cut, not only a crash.
        self._db.execute("PRAGMA synchronous = FULL")
        self._db.executescript(_SCHEMA)

    def close(self) -> None:
        """Close the database."""
        self._db.close()

    def put(self, item: PendingSubmission) -> None:
        """Store a finished batch (durably, before any upload)."""
        with self._db:
            self._db.execute(
                "INSERT OR IGNORE INTO pending VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    item.request_id,
                    item.task_id,
                    item.lease_id,
                    item.fencing_token,
                    time.time(),
                    item.batch,
                    item.commitment_request,
                ),
            )

    def pending(self) -> list[PendingSubmission]:
        """Every pending submission, oldest first."""
        rows = self._db.execute(
            "SELECT request_id, task_id, lease_id, fencing_token, batch, commitment_request "
            "FROM pending ORDER BY created_at"
        ).fetchall()
        return [PendingSubmission(r[0], r[1], r[2], int(r[3]), r[4], r[5]) for r in rows]

    def complete(
        self, item: PendingSubmission, response: commitment_service_pb2.SubmitCommitmentResponse
    ) -> None:
        """Keep the receipt and forget the pending row, in one transaction."""
        with self._db:
            self._db.execute(
                "INSERT OR REPLACE INTO receipts VALUES (?, ?, ?, ?, ?, ?)",
                (
                    response.commitment.commitment_id,
                    item.request_id,
                    item.task_id,
                    item.lease_id,
                    time.time(),
                    response.SerializeToString(),
                ),
            )
            self._db.execute("DELETE FROM pending WHERE request_id = ?", (item.request_id,))

    def drop(self, item: PendingSubmission, reason: str) -> None:
        """Give up on a submission the coordinator refused for good; remember why."""
        with self._db:
            self._db.execute(
                "INSERT OR REPLACE INTO dropped VALUES (?, ?, ?, ?, ?)",
                (item.request_id, item.task_id, item.lease_id, time.time(), reason),
            )
            self._db.execute("DELETE FROM pending WHERE request_id = ?", (item.request_id,))

    def receipts(self) -> list[commitment_service_pb2.SubmitCommitmentResponse]:
        """Every stored commitment response (with its signed receipt), oldest first."""
        rows = self._db.execute("SELECT response FROM receipts ORDER BY stored_at").fetchall()
        return [commitment_service_pb2.SubmitCommitmentResponse.FromString(r[0]) for r in rows]

    def dropped(self) -> list[tuple[str, str]]:
        """``(task_id, reason)`` of every dropped submission."""
        rows = self._db.execute("SELECT task_id, reason FROM dropped ORDER BY dropped_at")
        return [(str(r[0]), str(r[1])) for r in rows.fetchall()]
