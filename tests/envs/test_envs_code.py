"""The ``code`` environment: SYNTHETIC-1-style problems scored by their tests in the sandbox.

The attack tests are completions a hostile worker (or a model gone wrong) could send to a
validator: each must be contained, score as failing (or unverifiable: task reward 0.0), and
leave the scoring process able to score the next completion.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
from pathlib import Path

import pytest

from rollnet.reference.envs import (
    CodeEnvironment,
    DatasetError,
    EnvironmentConfigError,
    RewardBreakdown,
    RewardSandbox,
    VerifierTimeout,
    canonical_json,
    extract_program,
    load_environment,
)

needs_sandbox = pytest.mark.usefixtures("sandbox_host")


def fenced(program: str) -> str:
    return f"Here is my solution.\n```python\n{program}\n```\nDone."


def gold(environment: CodeEnvironment, prompt_id: int) -> str:
    """The packaged record's reference solution (a completion with one code block)."""
    path = Path(environment.dataset.source)
    line = path.read_text().splitlines()[environment.records[prompt_id].line - 1]
    solution: str = json.loads(line)["gold_standard_solution"]
    return solution


@pytest.fixture(scope="module")
def code() -> CodeEnvironment:
    environment = load_environment("code", {"test_timeout_s": 3})
    assert isinstance(environment, CodeEnvironment)
    return environment


def index_of(environment: CodeEnvironment, source_id: str) -> int:
    return next(i for i, r in enumerate(environment.records) if r.source_id == source_id)


def test_the_packaged_problems_load_and_their_prompts_are_pinned(code: CodeEnvironment) -> None:
    assert code.num_prompts == 12
    first = code.prompt(0)
    assert first.source_id == "sum-two"
    assert first.prompt.startswith("Read two integers a and b on one line")
    assert first.target_length is None
    assert first.answer == ""
    kinds = {test.kind for record in code.records for test in record.tests}
    assert kinds == {"stdin_stdout", "function_call"}
    assert code.config["python"] == f"{sys.version_info.major}.{sys.version_info.minor}"
    assert code.config["scoring"] == "fraction"
    # The normalised configuration pins the data and every limit.
    assert load_environment("code", json.loads(canonical_json(code.config))).digest == code.digest


@needs_sandbox
@pytest.mark.parametrize("source_id", ["sum-two", "fizzbuzz", "two-sum", "running-sum"])
def test_reference_solutions_pass_every_test(code: CodeEnvironment, source_id: str) -> None:
    index = index_of(code, source_id)
    problem = code.prompt(index)
    assert code.reward(problem, gold(code, index), 40) == RewardBreakdown(1.0, 0.0, 1.0)


@needs_sandbox
def test_the_reward_is_the_share_of_tests_passed_or_all_of_them(code: CodeEnvironment) -> None:
    index = index_of(code, "max-of-list")
    # Right for the first two tests only (all positive numbers, or a single one).
    partial = fenced(
        "input()\nxs = list(map(int, input().split()))\n"
        "print(xs[0] if len(xs) == 1 else max(0, *xs))"
    )
    problem = code.prompt(index)
    assert code.reward(problem, partial, 10).task_reward == 2 / 3
    strict = load_environment("code", {"test_timeout_s": 3, "scoring": "all"})
    assert strict.reward(strict.prompt(index), partial, 10).task_reward == 0.0
    assert strict.reward(strict.prompt(index), gold(code, index), 10).task_reward == 1.0


def test_the_program_is_the_last_fenced_block() -> None:
    assert extract_program("no code here") is None
    assert extract_program("```python\nprint(1)\n```\ntext\n```\nprint(2)\n```") == "print(2)\n"
    assert extract_program("```py\nx = 1\n```") == "x = 1\n"


@needs_sandbox
def test_no_program_or_a_wrong_one_scores_zero(code: CodeEnvironment) -> None:
    problem = code.prompt(index_of(code, "sum-two"))
    for completion in ("The answer is 3.", fenced("print('4')"), fenced("syntax error ("), ""):
        assert code.reward(problem, completion, 5).task_reward == 0.0


ATTACKS = {
    "fork bomb": "import os\nwhile True:\n    os.fork()",
    "10 GB allocation": "x = bytearray(10 * 1024 ** 3)\nprint(3)",
    "writes outside the scratch dir": (
        "for p in [{escape!r}, '/usr/lib/x', '/etc/x', '/sandbox/solution.py', '/x']:\n"
        "    open(p, 'w').write('print(3)')\nprint(3)"
    ),
    "reads the validator's key": "print(open({key!r}).read())",
    "connects a socket": (
        "import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\nprint(3)"
    ),
    "exits 0 early": "import sys\nsys.exit(0)",
    "exits 0 early without cleanup": "import os\nos._exit(0)",
    "patches the test runner": (
        # The runner is not in here: the verdict is reached outside, from the output. Faking
        # success means printing every expected output, which the program cannot see.
        "import builtins, sys\nbuiltins.print = lambda *a, **k: None\n"
        "sys.stdout.write('PASSED\\n')\nopen('/sandbox/call.py', 'w')"
    ),
    "prints 1 GB": "import os\nwhile True:\n    os.write(1, b'3\\n' * 32768)",
}


@needs_sandbox
@pytest.mark.parametrize("attack", sorted(ATTACKS))
def test_each_attack_is_contained_and_scores_zero(
    code: CodeEnvironment, attack: str, tmp_path: Path
) -> None:
    key = tmp_path / "validator.key"
    key.write_text("3")  # would pass the first test if it could be read and printed
    key.chmod(0o644)
    listener = socket.create_server(("127.0.0.1", 0))
    accepted: list[object] = []
    threading.Thread(target=lambda: accepted.append(listener.accept()), daemon=True).start()
    escape = tmp_path / "escaped.py"
    port = listener.getsockname()[1]
    program = ATTACKS[attack].format(key=str(key), port=port, escape=str(escape))
    problem = code.prompt(index_of(code, "sum-two"))
    try:
        reward = code.reward(problem, fenced(program), 10)
    finally:
        listener.close()
    assert reward.task_reward == 0.0
    assert not accepted
    assert not escape.exists()
    assert key.read_text() == "3"
    # The scoring process is unharmed: the next completion scores as before.
    assert code.reward(problem, gold(code, index_of(code, "sum-two")), 10).task_reward == 1.0


@needs_sandbox
@pytest.mark.slow
def test_an_endless_loop_is_unverifiable_not_a_claim_to_reject(code: CodeEnvironment) -> None:
    problem = code.prompt(index_of(code, "sum-two"))
    with pytest.raises(VerifierTimeout, match="ran out of time"):
        code.reward(problem, fenced("while True:\n    pass"), 10)
    with pytest.raises(VerifierTimeout):
        code.reward(problem, fenced("import time\ntime.sleep(600)"), 10)
    # Through the reward sandbox, as the worker and validator score it: task reward 0.0.
    with RewardSandbox() as sandbox:
        (result,) = sandbox.rewards(code, [(problem, fenced("while True:\n    pass"), 10)])
    assert result.reward == RewardBreakdown(0.0, 0.0, 0.0)
    assert result.failure is not None
    assert "VerifierTimeout" in result.failure


@needs_sandbox
def test_the_sandbox_scores_it_in_the_calling_process(code: CodeEnvironment) -> None:
    index = index_of(code, "gcd")
    items = [(code.prompt(index), gold(code, index), 20), (code.prompt(index), "nothing", 1)]
    with RewardSandbox() as sandbox:
        results = sandbox.rewards(code, items)
        assert sandbox.child_pid is None  # no reward child: the tests have sandboxes of their own
    assert [r.reward.task_reward for r in results] == [1.0, 0.0]


def test_a_host_that_cannot_isolate_refuses_it(
    code: CodeEnvironment, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rollnet.reference.envs import SandboxError, sandbox

    monkeypatch.setattr(sandbox, "isolation_problem", lambda: "bubblewrap is not installed")
    with RewardSandbox() as box, pytest.raises(SandboxError, match="bubblewrap is not installed"):
        box.check(code)


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"scoring": "most"}, "scoring"),
        ({"test_timeout_s": 0}, "test_timeout_s"),
        ({"python": "2.7"}, "python"),
        ({"prompt_template": "no placeholder"}, "prompt_template"),
        ({"memory_mb": 1}, "memory_mb"),
    ],
)
def test_bad_configurations_name_the_key(changes: dict[str, object], key: str) -> None:
    with pytest.raises(EnvironmentConfigError) as caught:
        load_environment("code", changes)
    assert caught.value.key == key


@pytest.mark.parametrize(
    ("record", "message"),
    [
        ({"problem_id": "a", "prompt": "p"}, "verification_info: missing"),
        ({"problem_id": "a", "prompt": "p", "verification_info": "{"}, "not valid JSON"),
        (
            {"problem_id": "a", "prompt": "p", "verification_info": {"language": "rust"}},
            "language must be 'python'",
        ),
        (
            {
                "problem_id": "a",
                "prompt": "p",
                "verification_info": {"language": "python", "test_cases": []},
            },
            "non-empty list",
        ),
        (
            {
                "problem_id": "a",
                "prompt": "p",
                "verification_info": {
                    "language": "python",
                    "test_cases": [
                        {"type": "function_call", "fn_name": "a b", "input": [], "output": 1}
                    ],
                },
            },
            "fn_name must be a Python identifier",
        ),
    ],
)
def test_bad_records_name_the_file_and_line(
    tmp_path: Path, record: dict[str, object], message: str
) -> None:
    path = tmp_path / "problems.jsonl"
    path.write_text("\n" + json.dumps(record) + "\n")
    with pytest.raises(DatasetError, match=rf"problems\.jsonl:2: .*{message}"):
        load_environment("code", {"path": str(path)})


@needs_sandbox
def test_a_custom_file_is_readable_by_the_reward_sandbox(tmp_path: Path) -> None:
    tests = [{"type": "stdin_stdout", "input": "2\n", "output": "4\n"}]
    record = {
        "problem_id": 7,
        "prompt": "Double it.",
        "verification_info": json.dumps({"language": "python", "test_cases": tests}),
    }
    path = tmp_path / "problems.jsonl"
    path.write_text(json.dumps(record) + "\n")
    environment = load_environment("code", {"path": str(path)})
    assert environment.sandbox_paths == (str(path.resolve()),)
    assert environment.prompt(0).source_id == "7"
    completion = fenced("print(2 * int(input()))")
    assert environment.reward(environment.prompt(0), completion, 3).task_reward == 1.0
