"""The reward sandbox: verifiers in a child process, on its main thread, under a hard limit."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from process_testing import cpu_seconds, exited, tree
from sandbox_probe import ProbeEnvironment

from rollnet.reference.envs import (
    RewardBreakdown,
    RewardSandbox,
    SandboxError,
    load_environment,
)
from rollnet.sdk.testing import wait_until_blocking

PROBE = "sandbox_probe:load"


@pytest.fixture
def sandbox() -> Iterator[RewardSandbox]:
    with RewardSandbox(loader=PROBE, time_limit_s=1.0) as box:
        yield box


def probe(**config: object) -> ProbeEnvironment:
    return ProbeEnvironment({"target_lengths": [10], **config})


def child_pid(box: RewardSandbox, environment: ProbeEnvironment) -> int:
    """The running child's process id, after it scored once (its own token checked)."""
    (result,) = box.rewards(environment, [(environment.prompt(1), "pid", 10)])
    assert result.failure is None
    assert result.reward.task_reward > 0
    pid = box.child_pid
    assert pid is not None
    return pid


@pytest.mark.slow
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
    wait_until_blocking(lambda: exited(first), within=20.0)
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


@pytest.mark.slow
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
@pytest.mark.slow
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
        box.rewards(environment, [(environment.prompt(1), "pid", 1)])
        print(box.child_pid, flush=True)
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
        wait_until_blocking(lambda: cpu_seconds(child) > 1.0, within=20.0)
        members = tree(child)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        wait_until_blocking(lambda: all(exited(member) for member in members), within=20.0)
    finally:
        if parent.poll() is None:
            parent.kill()


@pytest.mark.slow
def test_a_child_killed_while_idle_is_replaced_on_the_next_call(sandbox: RewardSandbox) -> None:
    # Whether the death is seen before sending or only when no "ready" comes back, the next
    # batch goes to a fresh child instead of failing.
    environment = probe()
    for _ in range(3):
        first = child_pid(sandbox, environment)
        # The verifier's process itself (below its sandbox's bwrap when isolated), as the
        # kernel's out-of-memory killer would pick it.
        os.kill(tree(first)[-1], signal.SIGKILL)
        assert child_pid(sandbox, environment) != first


@pytest.mark.usefixtures("sandbox_host")
def test_the_child_is_isolated_unless_isolation_is_off() -> None:
    environment = probe()
    item = [(environment.prompt(1), "net", 10)]
    with RewardSandbox(loader=PROBE) as isolated:
        assert isolated.isolated
        assert isolated.rewards(environment, item)[0].reward.task_reward == 0.0
    with RewardSandbox(loader=PROBE, isolation="off") as plain:
        assert not plain.isolated
        assert plain.rewards(environment, item)[0].reward.task_reward == 1.0


@pytest.mark.usefixtures("sandbox_host")
def test_processes_a_verifier_leaves_behind_are_gone_before_the_next_item(
    sandbox: RewardSandbox,
) -> None:
    environment = probe()
    prompt = environment.prompt(1)
    results = sandbox.rewards(environment, [(prompt, "orphan", 10), (prompt, "others", 10)])
    assert [r.reward.task_reward for r in results] == [1.0, 0.0]


def test_required_isolation_refuses_where_the_host_cannot_isolate(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rollnet.reference.envs import sandbox as sandbox_module

    monkeypatch.setattr(sandbox_module, "isolation_problem", lambda: "bubblewrap is missing")
    environment = probe()
    refused = pytest.raises(SandboxError, match="needs the sandbox, but bubblewrap is missing")
    with RewardSandbox(loader=PROBE, isolation="required") as box, refused:
        box.rewards(environment, [(environment.prompt(1), "1", 10)])
    # auto: a trusted environment is still scored, in a plain child.
    with RewardSandbox(loader=PROBE) as box:
        assert not box.isolated
        assert box.rewards(environment, [(environment.prompt(1), "1", 10)])[0].failure is None


def test_a_verifier_that_writes_without_end_cannot_flood_the_log(
    sandbox: RewardSandbox, caplog: pytest.LogCaptureFixture
) -> None:
    environment = probe()
    prompt = environment.prompt(1)
    with caplog.at_level(logging.WARNING, logger="rollnet.reference.envs.sandbox"):
        for _ in range(3):
            assert sandbox.rewards(environment, [(prompt, "shout", 10)])[0].failure is None
        sandbox.close()  # the child's stderr closes: everything it wrote has been read
        wait_until_blocking(
            lambda: any(r.msg == "reward_sandbox_stderr_truncated" for r in caplog.records),
            within=20.0,
        )
    passed = sum(
        len(r.__dict__["line"]) + 1 for r in caplog.records if r.msg == "reward_sandbox_stderr"
    )
    assert 64 << 10 >= passed > 32 << 10  # of the 3 MiB written
