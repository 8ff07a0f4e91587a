"""Reward throughput of each environment through the sandbox vs a bare call of the same reward.

For ``arithmetic``, ``math``, a verifiers taskset (the probe taskset of the tests, installed
into a temporary directory) and ``code``, the same completions are scored twice in one run:

* **bare** — the environment's reward function called in this process (for ``code``: each
  test's program started as a plain ``python -I -S`` subprocess, no sandbox): the limit;
* **sandboxed** — as the worker and validator score them: through
  :class:`~rollnet.reference.envs.RewardSandbox` with isolation on (the verifier in an
  isolated child; ``code`` runs each test in a sandbox of its own).

Printed per environment: completions scored per second of each, the ratio bare/sandboxed (the
sandbox's overhead), and the one-off cost of starting the isolated reward child (its
interpreter plus the environment's imports: math-verify, verifiers). Nothing is asserted on
time. Needs a host that can isolate (Linux with bubblewrap) and the verifiers extra.

    .venv/bin/python bench/environments.py [--scale 1.0]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rollnet.reference.envs import (
    CodeEnvironment,
    Environment,
    RewardItem,
    RewardSandbox,
    VerifiersEnvironment,
    load_environment,
)
from rollnet.reference.envs.code import _HARNESS_SOURCE, _SOLUTION, TestCase
from rollnet.reference.envs.isolation import RunResult, isolation_problem

ROOT = Path(__file__).resolve().parents[1]


class BareCodeEnvironment(CodeEnvironment):
    """The ``code`` environment with each test run as a plain subprocess: the same programs,
    inputs and checks, without the sandbox (only for this benchmark's trusted programs)."""

    def _run(self, test: TestCase, source: bytes) -> RunResult:
        with tempfile.TemporaryDirectory() as scratch:
            root = Path(scratch)
            (root / "solution.py").write_bytes(source)
            if test.kind == "stdin_stdout":
                argv = [sys.executable, "-I", "-S", str(root / "solution.py")]
                stdin = str(test.input).encode()
            else:
                assert test.fn_name is not None
                harness = _HARNESS_SOURCE.replace(
                    _SOLUTION.encode(), str(root / "solution.py").encode()
                )
                (root / "call.py").write_bytes(harness)
                argv = [sys.executable, "-I", "-S", str(root / "call.py"), test.fn_name]
                stdin = json.dumps(test.input).encode()
            done = subprocess.run(
                argv, input=stdin, capture_output=True, timeout=self.test_timeout_s, check=False
            )
        return RunResult(done.returncode, done.stdout[: self.max_output_bytes])


def code_items(environment: CodeEnvironment, count: int) -> list[RewardItem]:
    """Reference solutions of the packaged problems (each passes all its tests)."""
    path = Path(environment.dataset.source)
    lines = path.read_text().splitlines()
    items = []
    for index in range(count):
        prompt_id = index % environment.num_prompts
        record = json.loads(lines[environment.records[prompt_id].line - 1])
        items.append((environment.prompt(prompt_id), record["gold_standard_solution"], 50))
    return items


def prompt_count(environment: Environment) -> int:
    """How many prompt ids ``environment`` has; the bench cycles through a bounded set."""
    count = environment.num_prompts
    if count is None:
        raise SystemExit(f"{environment.name}: expected a bounded set of prompts")
    return count


def measure(
    name: str,
    bare: Callable[[Sequence[RewardItem]], list[Any]],
    environment: Environment,
    items: list[RewardItem],
    sandbox: RewardSandbox,
    repeat: int,
) -> dict[str, float]:
    """Best of ``repeat`` alternating runs of each side (the machine may be shared)."""
    # Warm both sides on one item (imports, caches, the child's start), timing the start.
    bare(items[:1])
    started = time.perf_counter()
    sandbox.rewards(environment, items[:1])
    start_s = time.perf_counter() - started
    bare_s = boxed_s = float("inf")
    for _ in range(repeat):
        started = time.perf_counter()
        expected = bare(items)
        bare_s = min(bare_s, time.perf_counter() - started)
        started = time.perf_counter()
        results = sandbox.rewards(environment, items)
        boxed_s = min(boxed_s, time.perf_counter() - started)
        assert [r.reward for r in results] == expected, f"{name}: the sandbox scored differently"
        assert all(r.failure is None for r in results), f"{name}: a verifier failed"
    return {
        "completions": len(items),
        "bare_per_s": len(items) / bare_s,
        "sandboxed_per_s": len(items) / boxed_s,
        "overhead": boxed_s / bare_s,
        "child_start_s": start_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--scale", type=float, default=1.0, help="completions multiplier")
    parser.add_argument("--repeat", type=int, default=3, help="runs per side (best is kept)")
    args = parser.parse_args()
    problem = isolation_problem()
    if problem is not None:
        raise SystemExit(f"bench/environments.py needs the sandbox: {problem}")

    def scaled(count: int) -> int:
        return max(1, int(count * args.scale))

    site = Path(tempfile.mkdtemp(prefix="rollnet-bench-site-"))
    sys.path.insert(0, str(ROOT / "tests" / "envs"))
    import vf_tasksets  # the tests' probe taskset

    vf_tasksets.install(site)
    sys.path.insert(0, str(site))
    rows: dict[str, dict[str, float]] = {}

    arithmetic = load_environment("arithmetic", {"level": 3, "target_lengths": [8, 16]})
    items = [(arithmetic.prompt(i), f"{i % 200}\n", 8 + i % 9) for i in range(scaled(3000))]
    with RewardSandbox() as sandbox:
        rows["arithmetic"] = measure(
            "arithmetic",
            lambda xs: [arithmetic.reward(*x) for x in xs],
            arithmetic,
            items,
            sandbox,
            args.repeat,
        )

    math = load_environment("math", {})
    math_prompts = prompt_count(math)
    answers = ["42", r"\frac{1}{2}", "5", r"x = 5", "I do not know", r"\boxed{9}"]
    items = [
        (math.prompt(i % math_prompts), f"so the answer is {answers[i % 6]}", 30)
        for i in range(scaled(200))
    ]
    with RewardSandbox() as sandbox:
        rows["math"] = measure(
            "math", lambda xs: [math.reward(*x) for x in xs], math, items, sandbox, args.repeat
        )

    config = {"taskset": vf_tasksets.TASKSET, "prompt_format": "text"}
    listed = time.perf_counter()
    verifiers = load_environment("verifiers", config)
    listing_s = time.perf_counter() - listed
    trusted = VerifiersEnvironment.load_unsandboxed(verifiers.config)
    verifiers_prompts = prompt_count(verifiers)
    replies = ["0enots", "wrong", "a much longer reply than twelve characters"]
    items = [
        (verifiers.prompt(i % verifiers_prompts), replies[i % 3], 5) for i in range(scaled(300))
    ]
    with RewardSandbox() as sandbox:
        rows["verifiers"] = measure(
            "verifiers",
            lambda xs: [trusted.reward(*x) for x in xs],
            verifiers,
            items,
            sandbox,
            args.repeat,
        )
    rows["verifiers"]["listing_s"] = listing_s

    code = load_environment("code", {})
    assert isinstance(code, CodeEnvironment)
    bare_code = BareCodeEnvironment(code.config)
    items = code_items(code, scaled(24))
    with RewardSandbox() as sandbox:
        rows["code"] = measure(
            "code", lambda xs: [bare_code.reward(*x) for x in xs], code, items, sandbox, args.repeat
        )
    rows["code"]["child_start_s"] = float("nan")  # no reward child: each test has its own sandbox
    tests = sum(len(code.records[p.prompt_id].tests) for p, _, _ in items)
    rows["code"]["tests_per_completion"] = tests / len(items)

    load = os.getloadavg()[0]
    print(f"reward throughput, sandboxed vs bare ({os.cpu_count()} CPUs, load {load:.1f})")
    print(
        f"{'environment':<12}{'completions':>12}{'bare/s':>12}{'sandboxed/s':>13}"
        f"{'overhead':>10}{'child start':>13}"
    )
    for name, row in rows.items():
        start = row["child_start_s"]
        started = "-" if start != start else f"{start:.2f}s"  # NaN: no reward child
        print(
            f"{name:<12}{row['completions']:>12.0f}{row['bare_per_s']:>12.1f}"
            f"{row['sandboxed_per_s']:>13.1f}{row['overhead']:>9.2f}x{started:>13}"
        )
    listing = rows["verifiers"]["listing_s"]
    tests_each = rows["code"]["tests_per_completion"]
    print(f"verifiers: listing the taskset in its sandboxed child took {listing:.2f} s")
    print(f"code: {tests_each:.1f} tests per completion, each in a sandbox of its own")


if __name__ == "__main__":
    main()
