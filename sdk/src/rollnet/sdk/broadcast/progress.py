"""A one-line progress display for checkpoint downloads on a terminal."""

from __future__ import annotations

import sys
import time
from typing import TextIO

_MIB = 1024 * 1024


class TerminalProgress:
    """``CheckpointStore(progress=TerminalProgress("step 7"))``: redraws one line on ``stream``
    at most ``hz`` times a second, only when it is a terminal (logs stay clean otherwise)."""

    def __init__(self, label: str, *, stream: TextIO | None = None, hz: float = 5.0) -> None:
        self.label = label
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = self.stream.isatty()
        self._interval = 1.0 / hz
        self._started = time.monotonic()
        self._drawn = 0.0

    def __call__(self, done: int, total: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        finished = done >= total
        if not finished and now - self._drawn < self._interval:
            return
        self._drawn = now
        self.stream.write("\r" + self.line(done, total, now - self._started))
        if finished:
            self.stream.write("\n")
        self.stream.flush()

    def line(self, done: int, total: int, elapsed: float) -> str:
        """The text shown for ``done`` of ``total`` bytes after ``elapsed`` seconds."""
        share = done / total if total else 1.0
        rate = done / elapsed / _MIB if elapsed > 0 else 0.0
        bar = "#" * int(share * 20)
        return (
            f"{self.label} [{bar:<20}] {share:6.1%} "
            f"{done / _MIB:,.1f}/{total / _MIB:,.1f} MiB {rate:,.1f} MiB/s"
        )
