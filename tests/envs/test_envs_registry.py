"""Finding environments by name, built-in and through the ``rollnet.environments`` entry points."""

from __future__ import annotations

import logging
import sys
import textwrap
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from rollnet.reference.envs import (
    ENTRY_POINT_GROUP,
    ArithmeticEnvironment,
    CodeEnvironment,
    EnvironmentConfigError,
    EnvironmentRegistryError,
    MathEnvironment,
    ReverseEnvironment,
    SeededEnvironment,
    UnknownEnvironmentError,
    VerifiersEnvironment,
    available_environments,
    load_environment,
)

_PLUGIN_MODULE = "rollnet_test_plugin_envs"

_PLUGIN_SOURCE = textwrap.dedent(
    '''
    """A third-party environment package, as an outside author would write it."""

    from rollnet.reference.envs import ConfigReader, Problem, Question, SeededEnvironment


    class EchoEnvironment(SeededEnvironment):
        name = "echo"

        def configure(self, reader: ConfigReader) -> None:
            self.words = reader.integer("words", 1, minimum=1)

        @property
        def num_prompts(self) -> int:
            return 100

        def make_question(self, prompt_id: int) -> Question:
            stream = self.draws(prompt_id, "problem")
            word = " ".join(stream.choice(["ab", "cd", "ef"]) for _ in range(self.words))
            return Question(text=f"Repeat: {word}\\n", answer=word, source_id=word)

        def task_reward(self, problem: Problem, completion_text: str) -> float:
            return 1.0 if completion_text.strip() == problem.answer else 0.0


    class MisnamedEnvironment(EchoEnvironment):
        name = "something-else"


    def not_an_environment(config):
        return {"config": config}


    NOT_CALLABLE = 3
    '''
)


def _install_distribution(root: Path, dist_name: str, entry_points: dict[str, str]) -> None:
    """Lay out an installed distribution (dist-info with METADATA and entry_points.txt)."""
    dist_info = root / f"{dist_name.replace('-', '_')}-0.1.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {dist_name}\nVersion: 0.1\n", encoding="utf-8"
    )
    lines = [f"[{ENTRY_POINT_GROUP}]"] + [
        f"{name} = {target}" for name, target in entry_points.items()
    ]
    (dist_info / "entry_points.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")


@pytest.fixture
def plugin_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    (tmp_path / f"{_PLUGIN_MODULE}.py").write_text(_PLUGIN_SOURCE, encoding="utf-8")
    _install_distribution(
        tmp_path,
        "rollnet-test-plugin-envs",
        {
            "echo": f"{_PLUGIN_MODULE}:EchoEnvironment",
            "misnamed": f"{_PLUGIN_MODULE}:MisnamedEnvironment",
            "not-an-env": f"{_PLUGIN_MODULE}:not_an_environment",
            "not-callable": f"{_PLUGIN_MODULE}:NOT_CALLABLE",
            "missing": f"{_PLUGIN_MODULE}:DoesNotExist",
            "arithmetic": f"{_PLUGIN_MODULE}:EchoEnvironment",  # tries to shadow a built-in
        },
    )
    # A second distribution declaring the very same target is harmless (not ambiguous).
    _install_distribution(
        tmp_path, "rollnet-test-rival-envs", {"echo": f"{_PLUGIN_MODULE}:EchoEnvironment"}
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    sys.modules.pop(_PLUGIN_MODULE, None)


def test_builtins_are_declared_in_the_entry_point_group() -> None:
    declared = {
        entry_point.name: entry_point
        for entry_point in metadata.entry_points(group=ENTRY_POINT_GROUP)
    }
    assert declared["arithmetic"].dist is not None
    assert declared["arithmetic"].dist.name == "rollnet-reference"
    assert declared["arithmetic"].load() is ArithmeticEnvironment
    assert declared["math"].load() is MathEnvironment
    assert declared["code"].load() is CodeEnvironment
    assert declared["verifiers"].load() is VerifiersEnvironment
    assert declared["reverse"].load() is ReverseEnvironment
    assert available_environments() == {
        "arithmetic": "rollnet.reference.envs.arithmetic:ArithmeticEnvironment",
        "code": "rollnet.reference.envs.code:CodeEnvironment",
        "math": "rollnet.reference.envs.math_jsonl:MathEnvironment",
        "reverse": "rollnet.reference.envs.reverse:ReverseEnvironment",
        "verifiers": "rollnet.reference.envs.verifiers_env:VerifiersEnvironment",
    }


def test_builtins_load_by_name() -> None:
    arithmetic = load_environment("arithmetic", {"level": 2})
    assert isinstance(arithmetic, ArithmeticEnvironment)
    assert arithmetic.name == "arithmetic"
    assert isinstance(load_environment("math", {}), MathEnvironment)


def test_unknown_name_lists_the_available_ones() -> None:
    with pytest.raises(UnknownEnvironmentError) as caught:
        load_environment("chess", {})
    assert caught.value.available == ["arithmetic", "code", "math", "reverse", "verifiers"]
    assert str(caught.value) == (
        "unknown environment 'chess' (available: arithmetic, code, math, reverse, verifiers)"
    )


def test_bad_config_names_the_key() -> None:
    with pytest.raises(EnvironmentConfigError, match="config key 'levle'"):
        load_environment("arithmetic", {"levle": 2})


def test_third_party_distribution_is_discovered_and_loaded(plugin_path: Path) -> None:
    available = available_environments()
    assert available["echo"] == f"{_PLUGIN_MODULE}:EchoEnvironment"
    environment = load_environment("echo", {"words": 3, "target_lengths": [4]})
    problem = environment.prompt(5)
    assert problem.prompt.endswith("Think for 4 tokens before giving a response.")
    assert environment.reward(problem, problem.answer, 4).total == 1.0
    assert environment.config["words"] == 3
    with pytest.raises(EnvironmentConfigError, match="config key 'words'"):
        load_environment("echo", {"words": 0})
    # The unknown-name error lists plugins too.
    with pytest.raises(UnknownEnvironmentError) as caught:
        load_environment("chess", {})
    assert "echo" in caught.value.available


def test_builtins_cannot_be_shadowed(plugin_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, logger="rollnet.reference.envs.registry"):
        assert available_environments()["arithmetic"].endswith(":ArithmeticEnvironment")
    assert "environment_entry_point_shadowed" in caplog.text
    assert isinstance(load_environment("arithmetic", {}), ArithmeticEnvironment)


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("misnamed", "built an environment named 'something-else'"),
        ("not-an-env", "returned dict, not an Environment"),
        ("not-callable", "is not callable"),
        ("missing", "cannot load entry point"),
    ],
)
def test_broken_plugins_are_reported(plugin_path: Path, name: str, message: str) -> None:
    with pytest.raises(EnvironmentRegistryError, match=message):
        load_environment(name, {})


def test_ambiguous_names_are_refused(plugin_path: Path) -> None:
    _install_distribution(plugin_path, "rollnet-test-third-envs", {"echo": "elsewhere:Echo"})
    with pytest.raises(EnvironmentRegistryError, match="several entry points"):
        load_environment("echo", {})


def test_documented_example_environment_works() -> None:
    # The example in docs/environments.md is what third-party authors copy: it must run.
    guide = Path(__file__).parents[2] / "docs" / "environments.md"
    section = guide.read_text(encoding="utf-8").split("## Writing and registering", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    namespace: dict[str, Any] = {}
    exec(compile(code, str(guide), "exec"), namespace)
    environment = namespace["SortWordEnvironment"]({"word_length": 4, "target_lengths": [6]})
    assert isinstance(environment, SeededEnvironment)
    problem = environment.prompt(3)
    assert (
        problem.prompt == f"sort {problem.source_id}: Think for 6 tokens before giving a response."
    )
    assert problem.answer == "".join(sorted(problem.source_id))
    assert environment.reward(problem, problem.answer + "\n", 6).total == 1.0
    assert environment.reward(problem, "zzzz", 6).total == 0.0
    with pytest.raises(EnvironmentConfigError, match="'word_length'"):
        namespace["SortWordEnvironment"]({"word_length": 13})


def test_public_exports_are_snapshotted() -> None:
    # Third-party environments import these names; removing or renaming one breaks them.
    import rollnet.reference.envs as envs

    assert sorted(envs.__all__) == [
        "ArithmeticEnvironment", "CodeEnvironment", "ConfigReader", "DEFAULT_LENGTH_PENALTY",
        "DEFAULT_SANDBOX_LIMITS", "DEFAULT_TIME_LIMIT_S", "DatasetError", "DrawStream",
        "ENTRY_POINT_GROUP", "Environment", "EnvironmentConfigError", "EnvironmentRegistryError",
        "IsolationMode", "IsolationUnavailable", "LEVELS", "LengthControl", "Limits",
        "MAX_PROMPT_ID", "MathEnvironment", "Problem", "Question", "ReverseEnvironment",
        "RewardBreakdown", "RewardItem", "RewardResult", "RewardSandbox", "SandboxError",
        "SeededEnvironment",
        "UnknownEnvironmentError", "VerifierTimeout", "VerifiersEnvironment",
        "available_environments", "canonical_json", "config_digest", "extract_program",
        "load_environment", "protect_paths", "reverse_similarity", "score_integer_answer",
    ]  # fmt: skip
    assert all(hasattr(envs, name) for name in envs.__all__)
