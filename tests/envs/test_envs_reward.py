"""Length targets, exact reward arithmetic, and determinism across processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from dataclasses import replace
from fractions import Fraction

import pytest

from rollnet.reference.envs import ArithmeticEnvironment, MathEnvironment, load_environment


def test_target_is_drawn_from_the_set_and_stated_in_the_prompt() -> None:
    targets = [8, 16, 32]
    environment = ArithmeticEnvironment({"target_lengths": targets})
    plain = ArithmeticEnvironment({})
    drawn: Counter[int | None] = Counter()
    for prompt_id in range(300):
        problem = environment.prompt(prompt_id)
        assert problem.target_length in targets
        drawn[problem.target_length] += 1
        question = plain.prompt(prompt_id).prompt
        # Enabling length control does not change the question itself (separate draw streams).
        assert problem.prompt == f"Think for {problem.target_length} tokens. {question}"
    assert all(count > 60 for count in drawn.values()), drawn
    assert environment.target_lengths == (8, 16, 32)


def test_math_states_the_target_as_intellect2_did() -> None:
    environment = MathEnvironment({"target_lengths": [1000, 2000]})
    problem = environment.prompt(0)
    assert problem.prompt == (
        f"What is $17 + 25$? Think for {problem.target_length} tokens before giving a response."
    )


def test_custom_template_substitutes_placeholders_once_and_nothing_else() -> None:
    environment = ArithmeticEnvironment(
        {"target_lengths": [5], "length_template": "[{target}] {prompt} {x} \\boxed{}"}
    )
    assert environment.prompt(0).prompt == "[5] 2+0= {x} \\boxed{}"


@pytest.mark.parametrize("count", [0, 1, 7, 8, 9, 100, 12345, 2**40])
@pytest.mark.parametrize("coefficient", [0.0003, 0.1, 1e-9, 0.0, 2.0])
def test_reward_is_exactly_task_minus_one_rounded_product(count: int, coefficient: float) -> None:
    environment = ArithmeticEnvironment({"target_lengths": [8], "length_penalty": coefficient})
    problem = environment.prompt(3)
    for completion, task in ((problem.answer, 1.0), ("x", 0.0)):
        breakdown = environment.reward(problem, completion, count)
        # One correctly rounded multiplication, then one correctly rounded subtraction: what any
        # IEEE-754 binary64 implementation without fused multiply-add computes.
        penalty = float(Fraction(coefficient) * abs(count - 8))
        assert breakdown.task_reward == task
        assert breakdown.length_penalty.hex() == penalty.hex()
        assert breakdown.total.hex() == float(Fraction(task) - Fraction(penalty)).hex()


def test_penalty_values_match_intellect2() -> None:
    environment = ArithmeticEnvironment({"target_lengths": [1000]})
    problem = environment.prompt(0)
    breakdown = environment.reward(problem, problem.answer, 1500)
    assert breakdown.length_penalty == 0.0003 * 500
    assert breakdown.total == 1.0 - 0.0003 * 500
    on_target = environment.reward(problem, problem.answer, 1000)
    assert (on_target.length_penalty, on_target.total) == (0.0, 1.0)


def test_reward_refuses_problems_the_environment_did_not_build() -> None:
    environment = ArithmeticEnvironment({"target_lengths": [8, 16]})
    problem = environment.prompt(0)
    other_target = 16 if problem.target_length == 8 else 8
    for forged in (
        replace(problem, target_length=other_target),
        replace(problem, target_length=None),
        replace(problem, target_length=12),
        replace(problem, answer="0"),
        replace(problem, prompt=problem.prompt + " "),
        ArithmeticEnvironment({}).prompt(0),
    ):
        with pytest.raises(ValueError, match="differs"):
            environment.reward(forged, "2", 3)


@pytest.mark.parametrize("count", [-1, 2**53, True, 3.0])
def test_reward_refuses_bad_token_counts(count: object) -> None:
    environment = ArithmeticEnvironment({})
    with pytest.raises((TypeError, ValueError)):
        environment.reward(environment.prompt(0), "2", count)  # type: ignore[arg-type]


_CHILD = """
import json, sys
from rollnet.reference.envs import load_environment
out = []
for name, config in json.loads(sys.argv[1]):
    environment = load_environment(name, config)
    for prompt_id in json.loads(sys.argv[2]):
        if environment.num_prompts is not None and prompt_id >= environment.num_prompts:
            continue
        problem = environment.prompt(prompt_id)
        reward = environment.reward(problem, problem.answer, 37)
        out.append([environment.digest, problem.prompt, problem.answer, problem.target_length,
                    reward.task_reward.hex(), reward.length_penalty.hex(), reward.total.hex()])
print(json.dumps(out))
"""


def test_prompts_and_rewards_are_identical_in_another_process() -> None:
    environments = [
        ("arithmetic", {"level": 6, "seed": 11, "target_lengths": [16, 32, 64]}),
        ("arithmetic", {}),
        ("math", {"target_lengths": [100, 200], "length_penalty": 0.001, "verify_timeout_s": 0}),
    ]
    prompt_ids = [0, 1, 2, 3, 17, 21, 999, 2**31, 2**63 - 1, 2**64 - 1]
    expected = []
    for name, config in environments:
        environment = load_environment(name, config)
        for prompt_id in prompt_ids:
            if environment.num_prompts is not None and prompt_id >= environment.num_prompts:
                continue
            problem = environment.prompt(prompt_id)
            reward = environment.reward(problem, problem.answer, 37)
            expected.append(
                [
                    environment.digest,
                    problem.prompt,
                    problem.answer,
                    problem.target_length,
                    reward.task_reward.hex(),
                    reward.length_penalty.hex(),
                    reward.total.hex(),
                ]
            )
    # A different hash seed would expose any dependence on hash() or set iteration order.
    child_env = {**os.environ, "PYTHONHASHSEED": "12345"}
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, json.dumps(environments), json.dumps(prompt_ids)],
        capture_output=True,
        text=True,
        env=child_env,
        timeout=120,
        check=True,
    )
    assert json.loads(result.stdout) == expected
    assert len(expected) == 2 * len(prompt_ids) + 6  # the math file has 22 problems
