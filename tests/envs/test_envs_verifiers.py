"""The ``verifiers`` environment: an installed verifiers taskset, listed and scored in the sandbox.

The taskset (``vf_tasksets``) is installed into a temporary directory on the import path, as
``pip`` would install it, offline. Its reward function misbehaves on request, as a hostile
taskset would: each misbehaviour is contained by the reward sandbox and scores the completion
unverifiable (task reward 0.0), and the sandbox scores the next completion normally.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import vf_tasksets

from rollnet.reference.envs import (
    EnvironmentConfigError,
    Limits,
    RewardBreakdown,
    RewardSandbox,
    SandboxError,
    VerifiersEnvironment,
    canonical_json,
    load_environment,
    verifiers_env,
)

pytest.importorskip("verifiers.v1", reason="the verifiers extra is not installed")
pytestmark = pytest.mark.usefixtures("sandbox_host")

CONFIG = {"taskset": vf_tasksets.TASKSET, "prompt_format": "text"}


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    site = vf_tasksets.install(tmp_path_factory.mktemp("site"))
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(site))
        yield site


@pytest.fixture(scope="module")
def environment(site: Path) -> VerifiersEnvironment:
    loaded = load_environment("verifiers", CONFIG)
    assert isinstance(loaded, VerifiersEnvironment)
    return loaded


@pytest.fixture(scope="module")
def sandbox(site: Path) -> Iterator[RewardSandbox]:
    # 1 GiB of address space: the unbounded allocation meets it sooner.
    limits = Limits(memory_bytes=1 << 30, processes=256)
    with RewardSandbox(time_limit_s=20.0, limits=limits) as box:
        yield box


@pytest.mark.slow
def test_tasks_become_prompts_with_their_keys_and_the_config_pins_everything(
    environment: VerifiersEnvironment,
) -> None:
    config = environment.config
    assert config["package"] == vf_tasksets.NAME
    assert config["version"] == "1.0.0"
    assert len(config["package_digest"]) == 64
    assert len(config["tasks_digest"]) == 64
    assert config["verifiers"] == "0.4.0"
    assert config["taskset_config"]["count"] == 6
    assert config["max_tasks"] is None
    assert environment.num_prompts == 6
    # Listed in a sandboxed child: the taskset's module was never imported here.
    assert vf_tasksets.MODULE not in sys.modules
    problem = environment.prompt(1)
    assert problem.prompt == "Reverse the word river1."
    assert problem.messages is None  # prompt_format "text"
    assert problem.source_id == environment.task_key(1)
    assert len({environment.task_key(i) for i in range(6)}) == 6
    # The normalised configuration loads to itself (what a worker and validator get).
    again = load_environment("verifiers", config)
    assert again.digest == environment.digest
    assert [again.prompt(i) for i in range(6)] == [environment.prompt(i) for i in range(6)]


@pytest.mark.slow
def test_chat_prompts_carry_their_messages(site: Path) -> None:
    chat = load_environment(
        "verifiers", {"taskset": vf_tasksets.TASKSET, "taskset_config": {"system": "Be terse."}}
    )
    problem = chat.prompt(0)
    assert problem.messages == (("system", "Be terse."), ("user", "Reverse the word stone0."))
    assert problem.prompt == "Be terse.\n\nReverse the word stone0."
    assert chat.digest != load_environment("verifiers", CONFIG).digest


@pytest.mark.slow
def test_the_tasks_own_rewards_score_in_the_sandbox(
    environment: VerifiersEnvironment, sandbox: RewardSandbox
) -> None:
    items = [
        (environment.prompt(0), "0enots", 3),  # correct and brief: 1.0 + 0.5
        (environment.prompt(0), "wrong", 2),  # brief only: 0.5
        (environment.prompt(0), "far too long an answer", 9),  # neither
    ]
    results = sandbox.rewards(environment, items)
    assert [r.reward for r in results] == [
        RewardBreakdown(1.5, 0.0, 1.5),
        RewardBreakdown(0.5, 0.0, 0.5),
        RewardBreakdown(0.0, 0.0, 0.0),
    ]
    assert all(r.failure is None for r in results)
    assert sandbox.isolated
    # The same as running the taskset in this process (trusted code only).
    trusted = VerifiersEnvironment.load_unsandboxed(environment.config)
    assert [trusted.reward(*item) for item in items] == [r.reward for r in results]


def test_its_rewards_are_not_computed_in_this_process(
    environment: VerifiersEnvironment,
) -> None:
    with pytest.raises(RuntimeError, match="reward sandbox"):
        environment.reward(environment.prompt(0), "0enots", 3)


@pytest.mark.slow
def test_a_misbehaving_reward_is_contained_and_the_next_one_scores(
    environment: VerifiersEnvironment, sandbox: RewardSandbox, tmp_path: Path
) -> None:
    key = tmp_path / "validator.key"
    key.write_text("secret")
    key.chmod(0o644)
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[Any] = []
    threading.Thread(target=lambda: accepted.append(listener.accept()), daemon=True).start()
    escape = tmp_path / "written-by-taskset"
    problem = environment.prompt(2)
    attacks = {
        "raise": "error: TaskError",
        "hang": "time_limit",
        "allocate": None,  # MemoryError inside (an error) or the child killed (crashed)
        f"write:{escape}": "error: TaskError",
        f"read:{key}": "error: TaskError",
        f"socket:{listener.getsockname()[1]}": "error: TaskError",
        "spawn": "error: TaskError",
    }
    unverifiable = RewardBreakdown(0.0, 0.0, 0.0)
    try:
        for reply, failure in attacks.items():
            (result,) = sandbox.rewards(environment, [(problem, reply, 5)])
            assert result.reward == unverifiable, (reply, result)
            assert result.failure is not None
            if failure is not None:
                assert result.failure.startswith(failure), (reply, result.failure)
            (honest,) = sandbox.rewards(environment, [(problem, "2duolc", 4)])
            assert honest == type(honest)(RewardBreakdown(1.5, 0.0, 1.5)), reply
    finally:
        listener.close()
    assert not escape.exists()
    assert not accepted


@pytest.mark.parametrize(
    ("changes", "key", "message"),
    [
        ({"version": "0.9.0"}, "version", "1.0.0 is installed here; the task needs 0.9.0"),
        ({"package_digest": "0" * 64}, "package_digest", "hash to"),
        ({"verifiers": "0.3.9"}, "verifiers", "0.4.0 is installed here"),
        ({"tasks_digest": "0" * 64}, "tasks_digest", "yields tasks hashing to"),
        ({"taskset": "no-such-taskset"}, "package", "cannot tell which"),
        ({"taskset_config": {"count": "many"}}, "taskset_config", "ValidationError"),
        (
            {"taskset_config": {"task": {"rewards": {"x": {"fn": "os:system"}}}}},
            "taskset_config",
            "imports code named by the configuration",
        ),
        ({"taskset_config": {"task": {"judges": [{"id": "reference"}]}}}, "taskset_config", ""),
    ],
)
def test_a_host_with_anything_else_refuses_with_the_reason(
    site: Path, changes: dict[str, Any], key: str, message: str
) -> None:
    # The checks the sandboxed child makes, run here on trusted code (one child per case
    # would import verifiers each time); test_another_installed_version_is_refused goes
    # through the child.
    with pytest.raises(EnvironmentConfigError) as caught:
        VerifiersEnvironment.load_unsandboxed({**CONFIG, **changes})
    assert caught.value.key == key
    assert message in str(caught.value)


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"prompt_format": "html"}, "prompt_format"),
        ({"unknown": 1}, "unknown"),
        ({"max_tasks": 0}, "max_tasks"),
        ({"taskset_config": [1]}, "taskset_config"),
        ({"taskset": ""}, "taskset"),
    ],
)
def test_a_malformed_configuration_is_refused_before_any_child_starts(
    changes: dict[str, Any], key: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_child(config: object) -> None:
        raise AssertionError("a child was started")

    monkeypatch.setattr(verifiers_env, "_list_in_sandbox", no_child)
    with pytest.raises(EnvironmentConfigError) as caught:
        load_environment("verifiers", {**CONFIG, **changes})
    assert caught.value.key == key


@pytest.mark.slow
def test_another_installed_version_is_refused(tmp_path: Path, environment: Any) -> None:
    # A second host with version 1.0.1 of the taskset: the task's normalised configuration
    # (naming 1.0.0 and its digest) is refused there, in a fresh process with that site.
    other = vf_tasksets.install(tmp_path / "site", version="1.0.1")
    script = (
        "import json, sys\n"
        f"sys.path.insert(0, {str(other)!r})\n"
        "from rollnet.reference.envs import load_environment, EnvironmentConfigError\n"
        "try:\n"
        "    load_environment('verifiers', json.loads(sys.stdin.read()))\n"
        "except EnvironmentConfigError as error:\n"
        "    print(error.key, error)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        input=canonical_json(environment.config),
        capture_output=True,
        timeout=300,
        check=True,
    )
    out = done.stdout.decode()
    assert out.startswith("version "), out
    assert "1.0.1 is installed here; the task needs 1.0.0" in out


def test_the_package_digest_covers_its_files(tmp_path: Path, site: Path) -> None:
    from importlib import metadata

    first = verifiers_env.distribution_digest(metadata.distribution(vf_tasksets.NAME))
    changed = vf_tasksets.install(
        tmp_path / "site", source=vf_tasksets.SOURCE.replace("<= 12", "<= 13")
    )
    [other] = [
        d
        for d in metadata.distributions(path=[str(changed)])
        if d.metadata["Name"] == vf_tasksets.NAME
    ]
    assert verifiers_env.distribution_digest(other) != first
    same = vf_tasksets.install(tmp_path / "same")
    [copy] = list(metadata.distributions(path=[str(same)]))
    assert verifiers_env.distribution_digest(copy) == first


def test_listing_needs_the_sandbox(site: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rollnet.reference.envs import isolation, sandbox

    monkeypatch.setattr(verifiers_env, "_listings", {})
    for module in (isolation, sandbox):
        monkeypatch.setattr(module, "isolation_problem", lambda: "bubblewrap is not installed")
    with pytest.raises(EnvironmentConfigError, match="needs the sandbox: bubblewrap"):
        load_environment("verifiers", {**CONFIG, "max_tasks": 2})
    box = RewardSandbox()
    with pytest.raises(SandboxError, match="needs the sandbox"):
        box.check(VerifiersEnvironment.__new__(VerifiersEnvironment))


@pytest.mark.slow
def test_the_listing_child_does_not_see_the_nodes_files(
    site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A taskset whose load() reads a node's key: it is not there, so listing fails.
    key = tmp_path / "node.key"
    key.write_text("secret")
    key.chmod(0o644)
    reading = vf_tasksets.SOURCE.replace(
        "    def load(self):\n",
        f"    def load(self):\n        open({str(key)!r}).read()\n",
    )
    hostile = vf_tasksets.install(tmp_path / "hostile", version="6.6.6", source=reading)
    monkeypatch.syspath_prepend(str(hostile))
    with pytest.raises(EnvironmentConfigError) as caught:
        load_environment("verifiers", {**CONFIG, "package": vf_tasksets.NAME, "max_tasks": 3})
    assert caught.value.key == "taskset"
    assert "FileNotFoundError" in str(caught.value)
