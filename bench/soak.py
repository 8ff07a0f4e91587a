"""Soak: the demo swarm for a long run, with the memory and open files of every process sampled.

Starts ``rollnet demo`` (coordinator, trainer, workers, validators, a cheater; enough steps not to
finish on its own) in a fresh data directory, and every ``--interval`` seconds reads, from
/proc, the resident memory (VmRSS), open file descriptors and threads of the demo and of every
process below it. After ``--minutes`` it stops the demo (SIGTERM, as Ctrl-C does) and prints,
per process, the first third of the run against the last third (after ``--warmup``) and the
least-squares slope per minute. Exits 1 when a process grew beyond the thresholds:

- resident memory: last third's mean above the first third's by more than ``--max-rss-growth``
  (a fraction) *and* by more than ``--max-rss-growth-mib`` (so small processes may wobble),
  *and* still rising in the last third: at the last third's own slope, a run as long as the
  measured window would grow by more than those thresholds again. Memory that rose and then
  levelled off (a cache filling to its bound) is reported as a plateau, with the level it
  reached and when, not as growth;
- open file descriptors: last third's highest above the first third's highest by more than
  ``--max-fd-growth``.

``--trace-memory FILE`` has the coordinator append tracemalloc reports to FILE every
``--trace-interval`` seconds (``rollnet.reference.memory_trace``): the source lines and object
types that grew since the first report and since the previous one.

    .venv/bin/python bench/soak.py                          # 30 minutes
    .venv/bin/python bench/soak.py --minutes 10 --interval 5
    .venv/bin/python bench/soak.py --minutes 10 --trace-memory .data/soak/coordinator-memory.txt

Linux only (/proc). Measures; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from rollnet.reference.memory_trace import (
    MEMORY_TRACE_COLLECT_ENV,
    MEMORY_TRACE_ENV,
    MEMORY_TRACE_FRAMES_ENV,
    MEMORY_TRACE_INTERVAL_ENV,
)

ROLES = ("coordinator", "trainer", "worker", "validator", "relay", "adversary", "demo")


@dataclass
class Sample:
    """One reading of one process."""

    at: float  # seconds since the soak started
    rss_mib: float
    fds: int
    threads: int


@dataclass
class Track:
    """Every reading of one process (a pid; a restarted process is a new track)."""

    pid: int
    label: str
    samples: list[Sample] = field(default_factory=list)


def children_of(root: int) -> list[int]:
    """``root`` and every process below it, read from /proc (ppid links)."""
    parents: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue  # ended meanwhile
        ppid = int(stat.rpartition(")")[2].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [root]
    while todo:
        pid = todo.pop()
        found.append(pid)
        todo.extend(parents.get(pid, ()))
    return found


def label_of(pid: int) -> str:
    """A short name for ``pid``: its rollnet role when its command line names one."""
    try:
        argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return f"? {pid}"
    words = [a.decode(errors="replace") for a in argv if a]
    if len(words) > 1 and words[1] == "-c":  # a child started with code on its command line
        return f"{'sandbox child' if 'sandbox' in words[2] else 'python -c'} {pid}"
    role = next((w for w in words if w in ROLES), "")
    if not role:
        role = next((Path(w).name for w in words[1:] if not w.startswith("-")), "")
        role = role or (Path(words[0]).name if words else "?")
    if role in ("worker", "adversary") and "--cheat" in words:
        role = f"cheater:{words[words.index('--cheat') + 1]}"
    return f"{role} {pid}"


def read(pid: int, at: float) -> Sample | None:
    """``pid``'s resident memory, descriptors and threads now; None once it has ended."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    if fields.get("State", "").strip().startswith("Z"):
        return None
    rss_kib = int(fields.get("VmRSS", "0 kB").split()[0])
    return Sample(at, rss_kib / 1024, fds, int(fields.get("Threads", "0")))


def slope_per_minute(points: list[tuple[float, float]]) -> float:
    """Least-squares slope of ``(seconds, value)`` points, per minute (0 for fewer than 2)."""
    if len(points) < 2:
        return 0.0
    xs = [x for x, _ in points]
    if max(xs) == min(xs):
        return 0.0
    return statistics.linear_regression(xs, [y for _, y in points]).slope * 60


@dataclass
class Verdict:
    """A process's growth between the first and last thirds of the measured window."""

    track: Track
    rss_first: float
    rss_last: float
    rss_slope: float
    #: Least-squares slopes (MiB per minute) within the first and the last third.
    rss_slope_first: float
    rss_slope_last: float
    #: Set when memory grew beyond the thresholds and then levelled off: (the last third's
    #: highest RSS, seconds since the soak started when it first came within reach of it).
    plateau: tuple[float, float] | None
    fds_first: int
    fds_last: int
    fds_slope: float
    threads_first: int
    threads_last: int
    problems: list[str]


def judge(track: Track, start: float, end: float, args: argparse.Namespace) -> Verdict | None:
    """Compare ``track``'s first and last thirds of ``[start, end]``, or of its own warm-up's
    end to ``end`` if it started later (the demo starts the swarm after its warm-start); None
    without samples in both (a process that came or went in the middle)."""
    start = max(start, min(track.samples[0].at + args.warmup, start + (end - start) / 3))
    window = [s for s in track.samples if start <= s.at <= end]
    third = (end - start) / 3
    first = [s for s in window if s.at < start + third]
    last = [s for s in window if s.at >= end - third]
    if not first or not last:
        return None
    rss_first = statistics.fmean(s.rss_mib for s in first)
    rss_last = statistics.fmean(s.rss_mib for s in last)
    fds_first, fds_last = max(s.fds for s in first), max(s.fds for s in last)
    problems = []
    grown = rss_last - rss_first
    slope_first = slope_per_minute([(s.at, s.rss_mib) for s in first])
    slope_last = slope_per_minute([(s.at, s.rss_mib) for s in last])
    plateau = None
    if grown > args.max_rss_growth * rss_first and grown > args.max_rss_growth_mib:
        # Still rising at the end, or risen to a level it keeps? At the last third's own rate, a
        # run as long as this window would grow beyond the thresholds again: still rising.
        still = slope_last * (end - start) / 60
        if still > args.max_rss_growth * rss_last and still > args.max_rss_growth_mib:
            problems.append(
                f"memory +{grown:.1f} MiB ({100 * grown / rss_first:.0f}%), still "
                f"{slope_last:+.2f} MiB/min in the last third"
            )
        else:
            level = max(s.rss_mib for s in last)
            reach = level - max(args.max_rss_growth_mib / 4, 0.02 * level)
            reached = next(s.at for s in window if s.rss_mib >= reach)
            plateau = (level, reached)
    if fds_last - fds_first > args.max_fd_growth:
        problems.append(f"file descriptors +{fds_last - fds_first}")
    return Verdict(
        track,
        rss_first,
        rss_last,
        slope_per_minute([(s.at, s.rss_mib) for s in window]),
        slope_first,
        slope_last,
        plateau,
        fds_first,
        fds_last,
        slope_per_minute([(s.at, float(s.fds)) for s in window]),
        max(s.threads for s in first),
        max(s.threads for s in last),
        problems,
    )


def blob_cache_mib(metrics_port: int) -> tuple[float, float] | None:
    """The coordinator's blob cache, (held, bound) in MiB, from its metrics; None if unread."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    figures = dict(line.partition(" ")[::2] for line in text.splitlines() if line[:1] != "#")
    try:
        held = float(figures["rollnet_blob_cache_bytes"])
        bound = float(figures["rollnet_blob_cache_limit_bytes"])
    except (KeyError, ValueError):
        return None
    return held / 2**20, bound / 2**20


def sample_swarm(
    demo: subprocess.Popen[bytes], args: argparse.Namespace, blob_cache: list[tuple[float, float]]
) -> dict[int, Track]:
    """Sample ``demo`` and its descendants every ``args.interval`` s for ``args.minutes``; the
    coordinator's blob cache (held, bound, MiB) is appended to ``blob_cache`` each minute."""
    tracks: dict[int, Track] = {}
    started = time.monotonic()
    stop_at = started + args.minutes * 60
    next_report = started + 60
    while time.monotonic() < stop_at and demo.poll() is None:
        at = time.monotonic() - started
        for pid in children_of(demo.pid):
            sample = read(pid, at)
            if sample is None:
                continue
            track = tracks.get(pid)
            if track is None:
                track = tracks[pid] = Track(pid, label_of(pid))
            track.samples.append(sample)
        if time.monotonic() >= next_report:
            next_report += 60
            live = [t for t in tracks.values() if t.samples[-1].at == at]
            cache = blob_cache_mib(args.metrics_port)
            if cache is not None:
                blob_cache.append(cache)
            print(
                f"  {at / 60:5.1f} min: {len(live)} processes, "
                f"{sum(t.samples[-1].rss_mib for t in live):,.0f} MiB resident, "
                f"{sum(t.samples[-1].fds for t in live)} open files"
                + (f", coordinator blob cache {cache[0]:.1f} MiB" if cache else ""),
                flush=True,
            )
        time.sleep(max(0.0, args.interval - (time.monotonic() - started - at)))
    return tracks


def summarize(tracks: dict[int, Track], args: argparse.Namespace, ran: float) -> int:
    """Print every process's growth; 1 when any grew beyond the thresholds."""
    start, end = min(args.warmup, ran / 3), ran
    print(
        f"\nper process, after {args.warmup:.0f} s of its own warm-up: first third vs last "
        f"third of what is left of the {end / 60:.1f} min (RSS means, highest open-file "
        "counts), least-squares slope per minute over the window and within its first and "
        "last thirds"
    )
    print(
        f"{'process':<28}{'samples':>8}{'RSS first':>11}{'RSS last':>10}{'MiB/min':>9}"
        f"{'1st/3rd':>15}{'fds first':>11}{'fds last':>10}{'fds/min':>9}{'threads':>10}  verdict"
    )
    failed = 0
    skipped = []
    for track in sorted(tracks.values(), key=lambda t: t.label):
        verdict = judge(track, start, end, args)
        if verdict is None:
            skipped.append(f"{track.label} ({len(track.samples)} samples)")
            continue
        failed += bool(verdict.problems)
        if verdict.problems:
            said = "GROWS: " + "; ".join(verdict.problems)
        elif verdict.plateau is not None:
            level, reached = verdict.plateau
            said = (
                f"ok, levels off: {level:.1f} MiB from {reached / 60:.1f} min "
                f"(+{verdict.rss_last - verdict.rss_first:.1f} MiB first third to last)"
            )
        else:
            said = "ok"
        thirds = f"{verdict.rss_slope_first:+.2f}/{verdict.rss_slope_last:+.2f}"
        print(
            f"{track.label:<28}{len(track.samples):>8}{verdict.rss_first:>10.1f}M"
            f"{verdict.rss_last:>9.1f}M{verdict.rss_slope:>+9.2f}{thirds:>15}"
            f"{verdict.fds_first:>11}{verdict.fds_last:>10}{verdict.fds_slope:>+9.2f}"
            f"{f'{verdict.threads_first}->{verdict.threads_last}':>10}  {said}"
        )
    if skipped:
        print(f"not judged (not alive in both thirds): {', '.join(skipped)}")
    print(
        f"thresholds: memory +{100 * args.max_rss_growth:.0f}% and +{args.max_rss_growth_mib:g}"
        f" MiB and still rising in the last third, open files +{args.max_fd_growth}; "
        f"{failed} process(es) over them"
    )
    return 1 if failed else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="how long (default 30)")
    parser.add_argument("--interval", type=float, default=10.0, help="seconds between samples")
    parser.add_argument(
        "--warmup",
        type=float,
        default=120.0,
        help="seconds left out at the start (model load, first checkpoints; default 120, at "
        "most a third of the run)",
    )
    parser.add_argument("--max-rss-growth", type=float, default=0.2, help="fraction (0.2)")
    parser.add_argument("--max-rss-growth-mib", type=float, default=32.0, help="MiB (32)")
    parser.add_argument("--max-fd-growth", type=int, default=16, help="descriptors (16)")
    parser.add_argument(
        "--trace-memory",
        type=Path,
        metavar="FILE",
        help="have the coordinator append tracemalloc reports to FILE (costs it CPU)",
    )
    parser.add_argument(
        "--trace-interval", type=float, default=60.0, help="seconds between those reports (60)"
    )
    parser.add_argument(
        "--trace-frames", type=int, default=1, help="frames kept per traced allocation (1)"
    )
    parser.add_argument(
        "--trace-collect",
        action="store_true",
        help="a full garbage collection before each report (what is left is reachable)",
    )
    parser.add_argument("--workers", type=int, default=2, help="the demo's honest workers")
    parser.add_argument("--validators", type=int, default=1, help="the demo's validators")
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=Path(__file__).resolve().parent.parent / ".data" / "soak",
        help="where the demo's temporary data directory goes (default .data/soak)",
    )
    args = parser.parse_args()
    if args.minutes <= 0 or args.interval <= 0 or args.trace_interval <= 0:
        parser.error("--minutes, --interval and --trace-interval must be positive")
    # The coordinator's metrics (its blob cache's fill and bound), on a port of our choosing.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        args.metrics_port = probe.getsockname()[1]
    environ = {**os.environ, "ROLLNET_COORDINATOR_METRICS_LISTEN": f"127.0.0.1:{args.metrics_port}"}
    if args.trace_memory is not None:
        # Inherited by every process of the demo; only the coordinator reads it.
        args.trace_memory = args.trace_memory.resolve()
        args.trace_memory.parent.mkdir(parents=True, exist_ok=True)
        args.trace_memory.write_text("")
        environ[MEMORY_TRACE_ENV] = str(args.trace_memory)
        environ[MEMORY_TRACE_INTERVAL_ENV] = f"{args.trace_interval:g}"
        environ[MEMORY_TRACE_FRAMES_ENV] = str(args.trace_frames)
        environ[MEMORY_TRACE_COLLECT_ENV] = "1" if args.trace_collect else ""
    args.work_dir.mkdir(parents=True, exist_ok=True)
    # SIGTERM (``make bench``'s timeout, a job that runs it in the background where SIGINT is
    # ignored) ends the soak as Ctrl-C does: through the finally below, which stops the demo.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    rollnet = Path(sys.executable).with_name("rollnet")
    with tempfile.TemporaryDirectory(dir=args.work_dir) as tmp:
        command = [
            str(rollnet) if rollnet.exists() else sys.executable,
            *([] if rollnet.exists() else ["-m", "rollnet.reference.cli"]),
            "demo",
            "--data-dir",
            str(Path(tmp, "demo")),
            "--workers",
            str(args.workers),
            "--validators",
            str(args.validators),
            "--steps",
            "1000000",  # never finishes on its own: the soak stops it
        ]
        print(
            f"soak: {' '.join(command[-8:])} for {args.minutes:g} min, sampling every "
            f"{args.interval:g} s; {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
        log = Path(tmp, "demo.out")
        with open(log, "wb") as out:
            demo = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=environ)
        started = time.monotonic()
        blob_cache: list[tuple[float, float]] = []
        try:
            tracks = sample_swarm(demo, args, blob_cache)
        finally:
            ran = time.monotonic() - started
            if demo.poll() is None:
                demo.send_signal(signal.SIGTERM)
                try:
                    demo.wait(timeout=120)
                except subprocess.TimeoutExpired:
                    demo.kill()
                    demo.wait()
        if ran < args.minutes * 60 - 2 * args.interval:
            print(f"the demo ended after {ran / 60:.1f} min (exit {demo.returncode}); its output:")
            print(log.read_text(errors="replace")[-3000:])
            return 1
        said = [
            line.strip()
            for line in log.read_text(errors="replace").splitlines()
            if line.startswith(("reward:", "trainer:", "ledger"))
        ]
        print("the demo's summary: " + ("; ".join(said) if said else "none (see its logs)"))
        if blob_cache:
            held, bound = blob_cache[-1]
            print(
                f"the coordinator's blob cache (recent rollout batches in memory): {held:.1f} MiB "
                f"at the end, the most seen {max(h for h, _ in blob_cache):.1f} MiB, bound "
                f"{bound:.0f} MiB"
            )
        if args.trace_memory is not None:
            print(f"the coordinator's tracemalloc reports: {args.trace_memory}")
        return summarize(tracks, args, ran)


if __name__ == "__main__":
    sys.exit(main())
