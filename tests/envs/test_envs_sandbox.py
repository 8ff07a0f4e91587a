"""The reward sandbox: verifiers in a child process, on its main thread, under a hard limit."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sandbox_probe import ProbeEnvironment

from rollnet.reference.envs import (
    RewardBreakdown,
    RewardSandbox,
    SandboxError,
    load_environment,
)

PROBE = "sandbox_probe:load"


def wait_for(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def exited(pid: int) -> bool:
    """The process is gone (or a zombie nobody has reaped yet)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a live process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@pytest.fixture
def sandbox() -> Iterator[RewardSandbox]:
    with RewardSandbox(loader=PROBE, time_limit_s=1.0) as box:
        yield box


def probe(**config: object) -> ProbeEnvironment:
    return ProbeEnvironment({"target_lengths": [10], **config})


def child_pid(box: RewardSandbox, environment: ProbeEnvironment) -> int:
    (result,) = box.rewards(environment, [(environment.prompt(1), "pid", 10)])
    assert result.failure is None
    return int(result.reward.task_reward)


def test_rewards_equal_the_environments_own_and_work_off_the_main_thread() -> None:
    # math-verify's time limit is a SIGALRM: called on this thread pool's thread, the math
    # environment refuses (RuntimeError); through the sandbox it scores, with the same bits.
    math = load_environment("math", {"target_lengths": [50, 100]})
    arithmetic = load_environment("arithmetic", {"target_lengths": [20]})
    cases = [
        (math, [(math.prompt(0), r"so \boxed{42}", 60), (math.prompt(3), "I don't know", 100)]),
        (arithmetic, [(arithmetic.prompt(i), f"{i}\n", 18 + i) for i in range(5)]),
    ]
    with ThreadPoolExecutor(1) as pool:
        with pytest.raises(RuntimeError, match="main thread"):
            pool.submit(math.reward, math.prompt(0), "42", 1).result()
        with RewardSandbox() as box:
            for environment, items in cases:
                results = pool.submit(box.rewards, environment, items).result()
                expected = [environment.reward(*item) for item in items]
                assert [r.reward for r in results] == expected
                assert all(r.failure is None for r in results)
            assert box.restarts == 0
    assert results[0].reward.total != 0.0  # the arithmetic prompts' penalties are real


def test_a_verifier_past_the_limit_is_killed_and_the_rest_scored(sandbox: RewardSandbox) -> None:
    environment = probe()
    first = child_pid(sandbox, environment)
    items = [
        (environment.prompt(3), "3", 10),
        (environment.prompt(4), "hang", 13),
        (environment.prompt(5), "5", 10),
    ]
    started = time.monotonic()
    results = sandbox.rewards(environment, items)
    assert time.monotonic() - started < 10
    target = environment.prompt(4).target_length
    assert target == 10
    penalty = 0.0003 * 3
    assert [r.failure for r in results] == [None, "time_limit", None]
    assert results[0].reward == RewardBreakdown(1.0, 0.0, 1.0)
    assert results[1].reward == RewardBreakdown(0.0, penalty, -penalty)
    assert results[1].reward == environment.unverifiable_reward(environment.prompt(4), 13)
    assert results[2].reward == RewardBreakdown(1.0, 0.0, 1.0)
    assert sandbox.restarts == 1
    wait_for(lambda: exited(first))
    assert child_pid(sandbox, environment) != first


def test_a_raising_verifier_scores_unverifiable_and_keeps_its_child(
    sandbox: RewardSandbox,
) -> None:
    environment = probe()
    first = child_pid(sandbox, environment)
    results = sandbox.rewards(
        environment, [(environment.prompt(2), "raise", 10), (environment.prompt(2), "2", 11)]
    )
    assert results[0].failure == "error: ValueError: the verifier cannot read this"
    assert results[0].reward == RewardBreakdown(0.0, 0.0, 0.0)
    assert results[1].failure is None
    assert results[1].reward.task_reward == 1.0
    assert sandbox.restarts == 0
    assert child_pid(sandbox, environment) == first


def test_a_crashed_child_is_replaced(sandbox: RewardSandbox) -> None:
    environment = probe()
    items = [(environment.prompt(6), "crash", 10), (environment.prompt(6), "6", 10)]
    results = sandbox.rewards(environment, items)
    assert [r.failure for r in results] == ["crashed", None]
    assert results[1].reward.task_reward == 1.0
    assert sandbox.restarts == 1


def test_the_child_must_build_the_callers_environment() -> None:
    environment = probe(variant=7)  # the probe loader builds variant 8 instead
    with RewardSandbox(loader=PROBE) as box:
        with pytest.raises(SandboxError, match="digest here is"):
            box.rewards(environment, [(environment.prompt(1), "1", 10)])
        # The child stays usable for an environment it does build.
        assert box.rewards(probe(), [(probe().prompt(1), "1", 10)])[0].failure is None
    broken = RewardSandbox(loader="sandbox_probe:broken")
    with broken, pytest.raises(SandboxError, match="the dataset is not on this host"):
        broken.rewards(probe(), [(probe().prompt(1), "1", 10)])
    missing = RewardSandbox(loader="no_such_module_here:load", load_limit_s=60)
    with missing, pytest.raises(SandboxError, match="died building it"):
        missing.rewards(probe(), [(probe().prompt(1), "1", 10)])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"time_limit_s": 0}, "must be positive"),
        ({"load_limit_s": -1}, "must be positive"),
        ({"loader": "sandbox_probe.load"}, "module:function"),
    ],
)
def test_bad_settings_are_refused(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        RewardSandbox(**kwargs)  # type: ignore[arg-type]


def test_close_stops_the_child_and_a_later_call_starts_one(sandbox: RewardSandbox) -> None:
    environment = probe()
    first = child_pid(sandbox, environment)
    sandbox.close()
    assert exited(first)
    assert child_pid(sandbox, environment) != first
    assert sandbox.restarts == 0
    assert sandbox.rewards(environment, []) == []


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
@pytest.mark.parametrize("stuck", ["hang", "cpow"])
def test_the_child_exits_when_its_parent_dies(tmp_path: Path, stuck: str) -> None:
    # A parent killed while its child is stuck in a verifier (a Python loop, or one C call that
    # holds the GIL for minutes): the child must not run on.
    script = textwrap.dedent(
        f"""
        import sys
        sys.path[:0] = {[str(Path(__file__).parent)]!r}
        from sandbox_probe import ProbeEnvironment
        from rollnet.reference.envs import RewardSandbox
        environment = ProbeEnvironment({{}})
        box = RewardSandbox(loader={PROBE!r}, time_limit_s=600)
        (result,) = box.rewards(environment, [(environment.prompt(1), "pid", 1)])
        print(int(result.reward.task_reward), flush=True)
        box.rewards(environment, [(environment.prompt(1), {stuck!r}, 1)])
        """
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=tmp_path
    )
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        # Kill the parent once the child is busy in the verifier.
        wait_for(lambda: cpu_seconds(child) > 1.0)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        wait_for(lambda: exited(child))
    finally:
        if parent.poll() is None:
            parent.kill()


def test_a_child_killed_while_idle_is_replaced_on_the_next_call(sandbox: RewardSandbox) -> None:
    # Whether the death is seen before sending or only when no "ready" comes back, the next
    # batch goes to a fresh child instead of failing.
    environment = probe()
    for _ in range(3):
        first = child_pid(sandbox, environment)
        os.kill(first, signal.SIGKILL)
        assert child_pid(sandbox, environment) != first
