"""The arithmetic environment: pinned prompts, correct answers, a strict parser."""

from __future__ import annotations

import numpy as np
import pytest

from rollnet.reference.envs import LEVELS, ArithmeticEnvironment, load_environment
from rollnet.reference.envs.arithmetic import score_integer_answer


def test_prompts_are_pinned() -> None:
    # The id → prompt mapping is part of the protocol: a worker and a validator on different
    # versions must agree, so any change here is a breaking change.
    level_one = ArithmeticEnvironment({})
    assert [level_one.prompt(i).prompt for i in range(8)] == [
        "2+0=", "6+5=", "1+2=", "5+7=", "4+4=", "9+6=", "1+0=", "3+0=",
    ]  # fmt: skip
    hard = ArithmeticEnvironment({"level": 6, "seed": 3})
    assert [(hard.prompt(i).prompt, hard.prompt(i).answer) for i in range(4)] == [
        ("41-19=", "22"),
        ("498*58=", "28884"),
        ("874-12=", "862"),
        ("680*28=", "19040"),
    ]
    last = hard.prompt(2**63 - 1)
    assert (last.prompt, last.answer, last.source_id) == ("74+666=", "740", "74+666")


@pytest.mark.parametrize("level", sorted(LEVELS))
def test_every_level_gives_correct_answers_within_its_bounds(level: int) -> None:
    preset = LEVELS[level]
    environment = ArithmeticEnvironment({"level": level})
    operators_seen = set()
    for prompt_id in range(300):
        problem = environment.prompt(prompt_id)
        assert problem.prompt.isascii()
        assert len(problem.prompt) <= 20
        expression = problem.prompt.removesuffix("=")
        operator = next(op for op in "+-*" if op in expression[1:])
        left, right = expression.split(operator, 1)
        operators_seen.add(operator)
        for operand in (left, right):
            assert preset.min_digits <= len(operand) <= preset.max_digits
            assert operand == str(int(operand))  # no leading zeros
        a, b = int(left), int(right)
        expected = {"+": a + b, "-": a - b, "*": a * b}[operator]
        assert problem.answer == str(expected)
        if not preset.allow_negative:
            assert expected >= 0
    assert operators_seen == set(preset.operators)


def test_nine_digit_prompts_stay_short() -> None:
    environment = ArithmeticEnvironment({"min_digits": 9, "max_digits": 9, "operators": "*"})
    problem = environment.prompt(0)
    assert len(problem.prompt) == 20
    assert int(problem.answer) == eval(problem.source_id)  # the source id is the expression


def test_seed_changes_the_prompts() -> None:
    a = ArithmeticEnvironment({"level": 6, "seed": 1})
    b = ArithmeticEnvironment({"level": 6, "seed": 2})
    assert [a.prompt(i).prompt for i in range(20)] != [b.prompt(i).prompt for i in range(20)]


def test_negative_results_appear_only_when_allowed() -> None:
    allowed = ArithmeticEnvironment({"operators": "-", "allow_negative": True})
    refused = ArithmeticEnvironment({"operators": "-", "allow_negative": False})
    assert any(allowed.prompt(i).answer.startswith("-") for i in range(100))
    assert not any(refused.prompt(i).answer.startswith("-") for i in range(100))


@pytest.mark.parametrize(
    ("completion", "answer", "reward"),
    [
        ("46", "46", 1.0),
        ("46\n", "46", 1.0),
        ("46\nand then some junk", "46", 1.0),
        ("-21", "-21", 1.0),
        ("0", "0", 1.0),
        ("", "46", 0.0),
        ("\n46", "46", 0.0),
        ("046", "46", 0.0),  # leading zero
        ("+46", "46", 0.0),
        (" 46", "46", 0.0),
        ("46 ", "46", 0.0),
        ("46\r\n", "46", 0.0),
        ("46\t", "46", 0.0),
        ("4 6", "46", 0.0),
        ("46.0", "46", 0.0),
        ("46abc", "46", 0.0),  # trailing junk on the answer line
        ("466", "46", 0.0),
        ("4", "46", 0.0),
        ("- 21", "-21", 0.0),
        ("-021", "-21", 0.0),
        ("\u221221", "-21", 0.0),  # U+2212 MINUS SIGN
        ("21", "-21", 0.0),
        ("-0", "0", 0.0),
        ("00", "0", 0.0),
        ("٤٦", "46", 0.0),  # Arabic-Indic digits: int() accepts them, the parser must not
    ],
)
def test_parser_edge_cases(completion: str, answer: str, reward: float) -> None:
    assert score_integer_answer(completion, answer) == reward


def test_reward_without_length_control() -> None:
    environment = load_environment("arithmetic", {"level": 4})
    problem = environment.prompt(11)
    right = environment.reward(problem, problem.answer + "\n", 50)
    wrong = environment.reward(problem, problem.answer + "0", 2)
    assert (right.task_reward, right.length_penalty, right.total) == (1.0, 0.0, 1.0)
    assert (wrong.task_reward, wrong.length_penalty, wrong.total) == (0.0, 0.0, 0.0)
    assert environment.num_prompts is None
    assert environment.target_lengths == ()


@pytest.mark.parametrize("prompt_id", [-1, 2**64])
def test_prompt_ids_out_of_range_are_refused(prompt_id: int) -> None:
    with pytest.raises(ValueError, match="outside"):
        ArithmeticEnvironment({}).prompt(prompt_id)


def test_numpy_prompt_ids_give_the_same_problem() -> None:
    environment = ArithmeticEnvironment({"level": 3})
    problem = environment.prompt(np.uint64(2**64 - 1))  # type: ignore[arg-type]
    assert problem == environment.prompt(2**64 - 1)
    assert type(problem.prompt_id) is int
    assert environment.reward(problem, problem.answer, np.int64(4)).total == 1.0  # type: ignore[arg-type]


def test_prompt_ids_must_be_ints() -> None:
    with pytest.raises(TypeError):
        ArithmeticEnvironment({}).prompt(True)
    with pytest.raises(TypeError):
        ArithmeticEnvironment({}).prompt(1.0)  # type: ignore[arg-type]
