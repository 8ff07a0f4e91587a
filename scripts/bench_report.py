"""Run the benchmarks of bench/ and write one markdown report: ``make bench``.

Each benchmark runs as its own process with the arguments of :data:`PLAN` (chosen to keep the
whole run around half an hour on a small machine), its standard output captured into a section
of the report, after a description of the machine (CPU model, cores, memory, load, Python, torch,
GPU, commit). A benchmark that fails or runs past ``--timeout`` is marked so in the report (with
the tail of its error output) and the run goes on. A summary table at the top lists each one's
outcome, duration and the lines of its output that carry ratios (``1.23x``).

    .venv/bin/python scripts/bench_report.py                          # everything in PLAN
    .venv/bin/python scripts/bench_report.py --only request_bounds abuse
    .venv/bin/python scripts/bench_report.py --set abuse="--seconds 20 --postgres"
    .venv/bin/python scripts/bench_report.py --only soak --update     # re-run one, keep the rest

``--update`` keeps, from the report already at ``--output``, every benchmark not run this time:
its summary row and its section, each marked with the commit and date of the run that measured
it, so that a report stays whole when one benchmark is re-run after a change.

Benchmarks found in bench/ but missing from :data:`PLAN` run with their defaults, and are listed
as such. Exits 1 when any benchmark failed (the report is written all the same).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
DEFAULT_OUTPUT = ROOT / "docs" / "bench" / "latest.md"

#: Each benchmark's arguments in a ``make bench`` run, in the order they run: scaled down from
#: their defaults where those take long (each script's docstring gives the full-size run).
PLAN: dict[str, list[str]] = {
    "request_bounds": [],
    "coordinator_load": ["--seconds", "5", "--swarm", "2000", "--swarm-seconds", "20"],
    "abuse": ["--seconds", "5"],
    "ledger_append": ["--entries", "20000"],
    "ledger_leasing": ["--tasks", "2000", "--baseline-tasks", "500"],
    "ledger_verify": ["--entries", "100000"],
    "copy_index_cost": ["--indexed", "50000", "--rounds", "3"],
    "dashboard_cost": ["--scale", "0.25"],
    "proofs_benchmark": ["--batch", "1", "8", "--tokens", "128"],
    "fused_logit_pass": [],
    "precision_line": ["--rollouts", "16"],
    "worker_decode": ["--batch", "8", "--tokens", "32", "--repeats", "3"],
    "validator_throughput": ["--jobs", "4", "--repeats", "2"],
    "trainer": ["--parts", "step,async", "--repeats", "3"],
    "broadcast": ["--mib", "512", "--clients", "8"],
    "environments": ["--scale", "0.25"],
    "calibrate_proofs": ["--scale", "0.25"],
    "calibrate_temperature": ["--scale", "0.25"],
    "node_statistics": ["--scale", "0.25"],
    "honest_repeats": ["--prompts", "16", "--warm-start-steps", "100"],
    "chaos": ["--db", "both", "--budget", "120"],
    "soak": ["--minutes", "5", "--interval", "5"],
}

#: Seconds a benchmark past its timeout has to stop (its servers, its swarm) after SIGTERM.
STOP_GRACE = 120.0

#: A line of output that carries a ratio: a number followed by "x" (``2.31x``, ``0.5x``).
RATIO = re.compile(r"\b\d+(?:\.\d+)?x\b")


@dataclass
class Outcome:
    """One benchmark's run."""

    name: str
    command: list[str]
    status: str  # "ok", "failed (exit N)", "timed out after N s", "not found"
    seconds: float
    stdout: str
    stderr: str
    planned: bool
    carried: str = ""
    """Set for a benchmark kept from an earlier report (``--update``): that run's commit and
    date; its section is then ``stdout``, verbatim."""

    @property
    def ok(self) -> bool:
        return self.status == "ok"


def discovered() -> list[str]:
    """The benchmark scripts in bench/ (helpers start with ``_``; this module lives apart)."""
    return sorted(p.stem for p in BENCH.glob("*.py") if not p.name.startswith("_"))


def machine() -> list[tuple[str, str]]:
    """What the figures were measured on."""
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = f"{int(line.split()[1]) / 1024**2:.1f} GiB"
                break
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    return [
        ("date", datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")),
        ("commit", _run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"]) or "unknown"),
        ("CPU", cpu),
        ("cores", str(os.cpu_count())),
        ("memory", memory),
        ("load average (1, 5, 15 min) at the start", load),
        ("OS", platform.platform()),
        ("Python", platform.python_version()),
        ("torch", _torch()),
    ]


def _torch() -> str:
    """torch's version and the GPU it sees, asked in a child process (importing it here would
    cost every benchmark's run nothing but this one's memory)."""
    found = _run(
        [
            sys.executable,
            "-c",
            "import torch; print(torch.__version__, '|', torch.cuda.get_device_name(0) "
            "if torch.cuda.is_available() else 'no GPU')",
        ]
    )
    return found.replace(" | ", ", ") if found else "not installed"


def _run(command: list[str]) -> str:
    try:
        return subprocess.run(
            command, capture_output=True, text=True, timeout=120, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def run_bench(name: str, args: list[str], timeout: float, planned: bool) -> Outcome:
    """Run ``bench/<name>.py args``, capturing its output; never raises for the bench's sake."""
    script = BENCH / f"{name}.py"
    command = [_shown(Path(sys.executable)), str(script.relative_to(ROOT)), *args]
    if not script.exists():
        return Outcome(name, command, "not found", 0.0, "", "", planned)
    print(f"bench: {shlex.join(command)}", flush=True)
    started = time.monotonic()
    process = subprocess.Popen(
        command,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ) | {"PYTHONUNBUFFERED": "1"},
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
        code = process.returncode
        status = "ok" if code == 0 else f"failed (exit {code})"
    except subprocess.TimeoutExpired:
        # SIGTERM first: a benchmark that started servers (or a swarm) stops them.
        process.terminate()
        try:
            stdout, stderr = process.communicate(timeout=STOP_GRACE)
        except subprocess.TimeoutExpired:
            process.kill()
            stdout, stderr = process.communicate()
        status = f"timed out after {timeout:g} s"
    seconds = time.monotonic() - started
    print(f"bench: {name}: {status} in {seconds:.0f} s", flush=True)
    return Outcome(name, command, status, seconds, stdout, stderr, planned)


def _shown(python: Path) -> str:
    """The interpreter as the report shows it: relative to the repository when inside it."""
    return str(python.relative_to(ROOT)) if python.is_relative_to(ROOT) else str(python)


def ratio_lines(text: str, most: int = 6) -> list[str]:
    """The first ``most`` lines of ``text`` that carry a ratio, their runs of spaces as one."""
    return [" ".join(line.split()) for line in text.splitlines() if RATIO.search(line)][:most]


def render(
    description: list[tuple[str, str]],
    outcomes: list[Outcome],
    load_end: str,
    left_out: list[str],
) -> str:
    """The markdown report (``left_out``: benchmarks of bench/ not run this time)."""
    lines = [
        "# Benchmark report",
        "",
        "Written by `make bench` (`scripts/bench_report.py`): every benchmark of `bench/`, each "
        "with the arguments shown, its standard output below. Figures are machine-dependent; "
        "ratios are measured against a baseline in the same run.",
        "",
        "## Machine",
        "",
        "| | |",
        "|---|---|",
        *(f"| {key} | {value} |" for key, value in description),
        f"| load average at the end | {load_end} |",
        "",
        "## Summary",
        "",
        "| benchmark | outcome | seconds | ratios (first lines that carry one) |",
        "|---|---|---:|---|",
    ]
    for outcome in outcomes:
        ratios = "<br>".join(_cell(line) for line in ratio_lines(outcome.stdout)) or ""
        status = outcome.status if outcome.ok else f"**{outcome.status}**"
        if outcome.carried:
            status += f" (kept from {outcome.carried})"
        lines.append(
            f"| [{outcome.name}](#{outcome.name}) | {status} | {outcome.seconds:.0f} | {ratios} |"
        )
    total = sum(o.seconds for o in outcomes)
    lines += ["", f"Total: {total / 60:.1f} min.", ""]
    if left_out:
        lines += [f"Not run this time (`--only`, `--skip`): {', '.join(left_out)}.", ""]
    unplanned = [o.name for o in outcomes if not o.planned]
    if unplanned:
        lines += [
            f"Not in the plan of `scripts/bench_report.py`, run with their defaults: "
            f"{', '.join(unplanned)}.",
            "",
        ]
    for outcome in outcomes:
        if outcome.carried:
            lines += [f"## {outcome.name}", "", f"Kept from the run of {outcome.carried}.", ""]
            lines += [outcome.stdout.rstrip(), ""]
            continue
        lines += [
            f"## {outcome.name}",
            "",
            f"`{shlex.join(outcome.command)}`: {outcome.status}, {outcome.seconds:.0f} s",
            "",
            "```text",
            outcome.stdout.rstrip() or "(no output)",
            "```",
            "",
        ]
        if not outcome.ok and outcome.stderr.strip():
            tail = "\n".join(outcome.stderr.rstrip().splitlines()[-30:])
            lines += ["Its error output, last lines:", "", "```text", tail, "```", ""]
    return "\n".join(lines)


def _cell(text: str) -> str:
    """``text`` safe in a markdown table cell."""
    return text.replace("|", "\\|").replace("`", "'")


SUMMARY_ROW = re.compile(
    r"^\| \[(?P<name>[\w-]+)\]\(#[\w-]+\) \| (?P<status>[^|]*?) \| (?P<seconds>\d+) \|"
)
KEPT = re.compile(r" \(kept from (?P<carried>[^)]*)\)$")


def earlier(report: str) -> dict[str, Outcome]:
    """The benchmarks of an earlier report (:func:`render`'s output), each with its section."""
    machine_row = {
        cells[1].strip(): cells[2].strip()
        for cells in (line.split("|") for line in report.splitlines())
        if len(cells) == 4
    }
    this_run = f"{machine_row.get('commit', 'an unknown commit')}, {machine_row.get('date', '')}"
    rows: dict[str, tuple[str, float, str]] = {}
    for line in report.splitlines():
        match = SUMMARY_ROW.match(line)
        if match:
            status = match["status"].strip("*")
            kept = KEPT.search(status)
            carried = kept["carried"] if kept else this_run
            status = KEPT.sub("", status).strip("*")
            rows[match["name"]] = (status, float(match["seconds"]), carried)
    sections = re.split(r"^## ", report, flags=re.MULTILINE)
    found: dict[str, Outcome] = {}
    for section in sections[1:]:
        name, _, body = section.partition("\n")
        if name not in rows:
            continue
        status, seconds, carried = rows[name]
        body = re.sub(r"^\s*Kept from the run of [^\n]*\n", "", body)
        found[name] = Outcome(name, [], status, seconds, body.strip("\n"), "", True, carried)
    return found


def parse_set(values: list[str]) -> dict[str, list[str]]:
    """``NAME="ARGS"`` pairs (``--set``) as argument lists."""
    found: dict[str, list[str]] = {}
    for value in values:
        name, sep, args = value.partition("=")
        if not sep or not name:
            raise SystemExit(f"--set {value!r}: expected NAME=ARGS, e.g. abuse='--seconds 20'")
        found[name] = shlex.split(args)
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="+", default=None, help="run these benchmarks only")
    parser.add_argument("--skip", nargs="+", default=[], help="leave these out")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=ARGS",
        help="run benchmark NAME with ARGS instead of the plan's (repeatable)",
    )
    parser.add_argument(
        "--timeout", type=float, default=900.0, help="seconds one benchmark may run (900)"
    )
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="the report's path")
    parser.add_argument(
        "--update",
        action="store_true",
        help="keep the report's benchmarks that are not run this time (marked with their run)",
    )
    args = parser.parse_args()
    overrides = parse_set(args.set)
    known = discovered()
    order = [name for name in PLAN if name in known] + [n for n in known if n not in PLAN]
    unknown = sorted(set(args.only or []) | set(args.skip) | set(overrides))
    missing = [name for name in unknown if name not in known]
    if missing:
        parser.error(
            f"no such benchmark in bench/: {', '.join(missing)} (there: {', '.join(known)})"
        )
    if args.only:
        order = [name for name in order if name in args.only]
    order = [name for name in order if name not in args.skip]
    description = machine()
    outcomes = [
        run_bench(name, overrides.get(name, PLAN.get(name, [])), args.timeout, name in PLAN)
        for name in order
    ]
    load_end = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    args.output.parent.mkdir(parents=True, exist_ok=True)
    partial = args.output.with_suffix(".md.partial")
    ran = {o.name: o for o in outcomes}
    if args.update and args.output.exists():
        kept = earlier(args.output.read_text())
        full = [name for name in PLAN if name in known] + [n for n in known if n not in PLAN]
        outcomes = [
            ran[name] if name in ran else kept[name] for name in full if name in ran or name in kept
        ]
    left_out = [name for name in known if name not in {o.name for o in outcomes}]
    partial.write_text(render(description, outcomes, load_end, left_out))
    partial.replace(args.output)
    failed = [o.name for o in outcomes if not o.ok]
    print(
        f"bench: report written to {args.output}; {len(outcomes) - len(failed)} ok"
        + (f", failed: {', '.join(failed)}" if failed else "")
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
