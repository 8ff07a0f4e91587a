"""Helpers for tests that write ledger rows directly (no coordinator in between)."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy.orm import Session

from rollnet.ledger.artifacts import record_checkpoint


def record_checkpoints(session: Session, steps: range | list[int], *, now: datetime) -> None:
    """Store a checkpoint row (unsigned placeholder manifest) for each of ``steps``, published
    at ``now``: enough for the reads that only look at steps and publication times."""
    for step in steps:
        record_checkpoint(
            session,
            step=step,
            manifest=b"manifest %d" % step,
            manifest_hash=f"{step:064x}",
            signature=b"\x01" * 64,
            signer_public_key=b"\x02" * 32,
            publisher_id=None,
            now=now,
        )
