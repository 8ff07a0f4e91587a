"""Opt-in memory tracing for long runs: where a process's memory goes, written to a file.

A server started with :data:`MEMORY_TRACE_ENV` naming a file (``rollnet coordinator`` reads it;
``bench/soak.py --trace-memory`` sets it) starts :mod:`tracemalloc` and, every
:data:`MEMORY_TRACE_INTERVAL_ENV` seconds, appends a report to that file: the process's resident
memory, what tracemalloc traces in all, the source lines whose traced memory grew most since the
first report (the baseline, taken once start-up is over) and since the previous one, and the
object counts by type that changed most. A structure that grows without bound shows as the same
lines and types climbing report after report; one that fills to a bound climbs, then stays.
With :data:`MEMORY_TRACE_COLLECT_ENV` set, a full collection runs before each report, so that
cyclic garbage the collector has not reached yet is not mistaken for a leak.

Tracing costs CPU (every allocation records its traceback) and memory (the traces): for finding
a leak, not for production.
"""

from __future__ import annotations

import asyncio
import gc
import linecache
import time
import tracemalloc
from collections import Counter
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

N = TypeVar("N", int, float)

#: Path of the report file; unset or empty: no tracing.
MEMORY_TRACE_ENV = "ROLLNET_MEMORY_TRACE"
#: Seconds between reports (default :data:`DEFAULT_INTERVAL`).
MEMORY_TRACE_INTERVAL_ENV = "ROLLNET_MEMORY_TRACE_INTERVAL"
#: Frames kept per allocation (default 1: grouped by source line; more shows who called it).
MEMORY_TRACE_FRAMES_ENV = "ROLLNET_MEMORY_TRACE_FRAMES"
#: Set (to anything but 0 or empty) to run a full garbage collection before each report: what
#: is still there is reachable, not cyclic garbage the collector has yet to reach.
MEMORY_TRACE_COLLECT_ENV = "ROLLNET_MEMORY_TRACE_COLLECT"
DEFAULT_INTERVAL = 60.0
#: Lines (or object types) listed per comparison.
TOP = 20

#: Allocations of the tracing itself and of the import machinery say nothing about a leak.
_IGNORED = (
    tracemalloc.Filter(False, tracemalloc.__file__),
    tracemalloc.Filter(False, __file__),  # the totals kept between reports
    tracemalloc.Filter(False, linecache.__file__),
    tracemalloc.Filter(False, "<frozen importlib._bootstrap>"),
    tracemalloc.Filter(False, "<frozen importlib._bootstrap_external>"),
    tracemalloc.Filter(False, "<unknown>"),
)


@dataclass(frozen=True)
class MemoryTraceSettings:
    """Where the reports go, how often, and how many frames each allocation keeps."""

    path: Path
    interval: float = DEFAULT_INTERVAL
    frames: int = 1
    collect: bool = False

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> MemoryTraceSettings | None:
        """The settings :data:`MEMORY_TRACE_ENV` and its companions ask for; None when unset.

        Raises ValueError, naming the variable, for an interval or frame count out of range.
        """
        path = environ.get(MEMORY_TRACE_ENV, "")
        if not path:
            return None
        interval = _number(environ, MEMORY_TRACE_INTERVAL_ENV, DEFAULT_INTERVAL, float)
        if not 0 < interval <= 86_400:
            raise ValueError(f"{MEMORY_TRACE_INTERVAL_ENV}: seconds in (0, 86400], not {interval}")
        frames = _number(environ, MEMORY_TRACE_FRAMES_ENV, 1, int)
        if not 1 <= frames <= 64:
            raise ValueError(f"{MEMORY_TRACE_FRAMES_ENV}: 1 to 64 frames, not {frames}")
        collect = environ.get(MEMORY_TRACE_COLLECT_ENV, "") not in ("", "0")
        return cls(Path(path), interval, frames, collect)


def _number(environ: Mapping[str, str], name: str, default: N, kind: type[N]) -> N:
    text = environ.get(name, "")
    if not text:
        return default
    try:
        return kind(text)
    except ValueError:
        raise ValueError(f"{name}: a number, not {text!r}") from None


def resident_mib() -> float:
    """This process's resident memory (VmRSS) in MiB; 0 where /proc is not there."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        return 0.0
    for line in status.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def object_counts() -> Counter[str]:
    """Live objects the collector tracks (frozen ones included), by type name."""
    return Counter(type(o).__qualname__ for o in gc.get_objects())


#: Traced memory by source line (or traceback): bytes and blocks.
Sizes = dict[tracemalloc.Traceback, tuple[int, int]]


@dataclass
class MemoryTrace:
    """Takes the snapshots and writes the reports (see the module's docstring).

    Only each snapshot's totals by source line are kept between reports, not the snapshot: a
    snapshot holds a tuple per live allocation, which would add to the very memory and object
    counts being reported.
    """

    settings: MemoryTraceSettings
    baseline: Sizes | None = None
    previous: Sizes = field(default_factory=dict)
    baseline_objects: Counter[str] = field(default_factory=Counter)
    previous_objects: Counter[str] = field(default_factory=Counter)
    started: float = field(default_factory=time.monotonic)
    reports: int = 0

    def start(self) -> None:
        """Start tracing (allocations made before this are not traced)."""
        if not tracemalloc.is_tracing():
            tracemalloc.start(self.settings.frames)
        self.started = time.monotonic()

    def sizes(self) -> Sizes:
        """Traced memory now, by source line (or traceback, with more than one frame)."""
        key = "lineno" if self.settings.frames == 1 else "traceback"
        snapshot = tracemalloc.take_snapshot().filter_traces(_IGNORED)
        return {s.traceback: (s.size, s.count) for s in snapshot.statistics(key)}

    def report(self) -> str:
        """Take a snapshot and write (and return) the next report; the first is the baseline."""
        collected = gc.collect() if self.settings.collect else None
        objects = object_counts()  # first: the snapshot's own tuples are not counted
        sizes = self.sizes()
        traced, peak = tracemalloc.get_traced_memory()
        lines = [
            f"== report {self.reports} at {time.monotonic() - self.started:.0f} s: "
            f"RSS {resident_mib():.1f} MiB, traced {traced / 2**20:.1f} MiB "
            f"(peak {peak / 2**20:.1f}; tracing itself "
            f"{tracemalloc.get_tracemalloc_memory() / 2**20:.1f}), "
            f"{sum(objects.values())} objects, gc counts {gc.get_count()}, "
            f"frozen {gc.get_freeze_count()}"
            + ("" if collected is None else f", {collected} unreachable collected first")
        ]
        if self.baseline is None:
            self.baseline, self.baseline_objects = sizes, objects
            lines.append("(baseline: later reports compare with this one)")
        else:
            for title, before, objects_before in (
                ("since the baseline", self.baseline, self.baseline_objects),
                ("since the previous report", self.previous, self.previous_objects),
            ):
                lines.append(f"-- traced memory {title}, largest growth first:")
                lines.extend(_growth_lines(sizes, before))
                lines.append(f"-- object counts {title}, largest change first:")
                change = Counter(objects)
                change.subtract(objects_before)
                ranked = sorted(change.items(), key=lambda item: abs(item[1]), reverse=True)
                for name, diff in ranked[:TOP]:
                    if diff:
                        lines.append(f"  {diff:+9d} {name} (now {objects[name]})")
        self.previous, self.previous_objects = sizes, objects
        self.reports += 1
        text = "\n".join(lines) + "\n"
        with open(self.settings.path, "a", encoding="utf-8") as out:
            out.write(text)
        return text

    async def run(self) -> None:
        """Report every interval until cancelled (the snapshot runs on the loop: it is brief
        next to an interval, and a thread would see the heap change under it)."""
        while True:
            await asyncio.sleep(self.settings.interval)
            self.report()


def _growth_lines(now: Sizes, before: Sizes) -> list[str]:
    growth = []
    for where in now.keys() | before.keys():
        size, count = now.get(where, (0, 0))
        size_before, count_before = before.get(where, (0, 0))
        growth.append((size - size_before, count - count_before, size, where))
    growth.sort(key=lambda item: item[0], reverse=True)
    lines = []
    for size_diff, count_diff, size, where in growth[:TOP]:
        frames = [f"{f.filename}:{f.lineno}" for f in reversed(where)]  # the allocation first
        head = (
            f"  {size_diff / 1024:+10.1f} KiB {count_diff:+8d} blocks  (now {size / 1024:.1f} KiB)"
        )
        lines.append(f"{head} {frames[0] if frames else '?'}")
        lines.extend(f"{'':>40}<- {frame}" for frame in frames[1:])
    return lines


async def traced(main: Coroutine[Any, Any, None], settings: MemoryTraceSettings) -> None:
    """Run ``main`` with tracing started first and a report every interval (the first, the
    baseline, one interval in), and a last one when ``main`` ends."""
    trace = MemoryTrace(settings)
    trace.start()
    reporting = asyncio.create_task(trace.run())
    try:
        await main
    finally:
        reporting.cancel()
        trace.report()
