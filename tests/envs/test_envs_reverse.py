"""The ``reverse`` environment: seeded prompts and the graded reward."""

from __future__ import annotations

import pytest

from rollnet.reference.envs import EnvironmentConfigError, load_environment
from rollnet.reference.envs.reverse import lcs_length, reverse_similarity


def test_prompts_are_seeded_and_within_the_configuration() -> None:
    env = load_environment("reverse", {"min_length": 2, "max_length": 4, "alphabet": "xyz"})
    again = load_environment("reverse", {"min_length": 2, "max_length": 4, "alphabet": "xyz"})
    for prompt_id in range(50):
        problem = env.prompt(prompt_id)
        assert problem == again.prompt(prompt_id)
        word = problem.source_id
        assert problem.prompt == f"reverse {word}:"
        assert problem.answer == word[::-1]
        assert 2 <= len(word) <= 4
        assert set(word) <= set("xyz")
    other_seed = load_environment("reverse", {"seed": 1})
    default = load_environment("reverse", {})
    assert [other_seed.prompt(i).prompt for i in range(5)] != [
        default.prompt(i).prompt for i in range(5)
    ]
    assert default.config == {
        "seed": 0,
        "target_lengths": [],
        "length_penalty": 0.0003,
        "length_template": default.config["length_template"],
        "min_length": 3,
        "max_length": 5,
        "alphabet": "abcdefghijklmnopqrstuvwxyz",
    }


@pytest.mark.parametrize(
    ("a", "b", "expected"),
    [("", "abc", 0), ("abc", "abc", 3), ("abc", "cba", 1), ("abcde", "aXcYe", 3), ("ab", "ba", 1)],
)
def test_lcs_length(a: str, b: str, expected: int) -> None:
    assert lcs_length(a, b) == expected
    assert lcs_length(b, a) == expected


def test_the_reward_gives_partial_credit() -> None:
    env = load_environment("reverse", {})
    problem = env.prompt(7)
    answer = problem.answer
    assert env.reward(problem, answer, len(answer) + 1).task_reward == 1.0
    assert env.reward(problem, answer + "\nanything", 9).task_reward == 1.0
    assert env.reward(problem, "", 1).task_reward == 0.0
    assert reverse_similarity("dcXa", "dcba") == pytest.approx(2 * 3 / 8)
    assert reverse_similarity("dcbaa", "dcba") == pytest.approx(8 / 9)
    assert reverse_similarity("abcd", "dcba") == pytest.approx(2 / 8)


@pytest.mark.parametrize(
    ("config", "key"),
    [
        ({"min_length": 0}, "min_length"),
        ({"max_length": 33}, "max_length"),
        ({"min_length": 5, "max_length": 3}, "max_length"),
        ({"alphabet": "aa"}, "alphabet"),
        ({"alphabet": "a b"}, "alphabet"),
        ({"alphabet": ""}, "alphabet"),
    ],
)
def test_bad_configuration_names_the_key(config: dict[str, object], key: str) -> None:
    with pytest.raises(EnvironmentConfigError, match=key):
        load_environment("reverse", config)
