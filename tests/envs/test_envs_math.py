"""The math environment: JSONL loading with precise errors, and math-verify answer checking."""

from __future__ import annotations

import json
import threading
import time
from importlib import resources
from pathlib import Path

import blake3
import pytest

from rollnet.reference.envs import DatasetError, MathEnvironment, VerifierTimeout, load_environment


def _write(tmp_path: Path, lines: list[str], name: str = "problems.jsonl") -> Path:
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _record(problem_id: object, problem: object = "What is 1+1?", answer: object = "2") -> str:
    return json.dumps({"id": problem_id, "problem": problem, "answer": answer})


@pytest.fixture(scope="module")
def example() -> MathEnvironment:
    return MathEnvironment({})


def test_packaged_example_is_package_data_and_every_answer_checks(
    example: MathEnvironment,
) -> None:
    data = resources.files("rollnet.reference.envs").joinpath("data/math_example.jsonl")
    assert example.config["blake3"] == blake3.blake3(data.read_bytes()).hexdigest()
    assert example.num_prompts >= 20
    for prompt_id in range(example.num_prompts):
        problem = example.prompt(prompt_id)
        assert problem.source_id == f"example-{prompt_id + 1:02d}"
        boxed = example.reward(
            problem, f"Reasoning... so the answer is $\\boxed{{{problem.answer}}}$.", 9
        )
        assert boxed.total == 1.0, problem
        wrong = example.reward(problem, "The answer is $\\boxed{1000003}$.", 9)
        assert wrong.total == 0.0, problem


@pytest.mark.parametrize(
    ("answer", "completion", "reward"),
    [
        ("\\frac{1}{2}", "The answer is $\\boxed{0.5}$.", 1.0),
        ("0.5", "so we get \\boxed{\\frac{1}{2}}", 1.0),
        ("\\frac{1}{2}", "\\boxed{\\frac{2}{4}}", 1.0),
        ("\\frac{1}{2}", "\\boxed{1/2}", 1.0),
        ("5\\sqrt{2}", "\\boxed{\\sqrt{50}}", 1.0),
        ("9\\pi", "$\\boxed{9\\pi}$", 1.0),
        ("9\\pi", "\\boxed{28.27}", 0.0),  # numerically close is not equal
        ("1000", "\\boxed{1,000}", 1.0),
        ("-27", "\\boxed{-27}", 1.0),
        ("-27", "\\boxed{27}", 0.0),
        ("\\frac{1}{2}", "\\boxed{0.51}", 0.0),
        ("42", "I do not know.", 0.0),
        ("42", "", 0.0),
        # Several boxed answers are read together as a set, which equals no single answer.
        ("42", "First I thought \\boxed{41}, but the final answer is \\boxed{42}", 0.0),
        ("42", "$41$ at first, but in the end $42$", 1.0),
        (7, "\\boxed{7}", 1.0),  # numeric answers in the file are accepted
        (0.25, "\\boxed{\\frac{1}{4}}", 1.0),
    ],
)
def test_math_verify_equivalences(
    tmp_path: Path, answer: object, completion: str, reward: float
) -> None:
    environment = MathEnvironment({"path": str(_write(tmp_path, [_record("q", answer=answer)]))})
    problem = environment.prompt(0)
    assert environment.reward(problem, completion, 10).task_reward == reward


def test_only_the_tail_of_the_completion_is_verified(tmp_path: Path) -> None:
    path = _write(tmp_path, [_record("q", answer="42")])
    environment = MathEnvironment({"path": str(path), "max_answer_chars": 20})
    problem = environment.prompt(0)
    assert environment.reward(problem, "\\boxed{42}" + " " * 30, 40).task_reward == 0.0
    assert environment.reward(problem, " " * 30 + "\\boxed{42}", 40).task_reward == 1.0


def test_prompt_template_and_ids(tmp_path: Path) -> None:
    path = _write(tmp_path, [_record(7, problem="Add {x}."), _record("b", problem="B?")])
    environment = MathEnvironment(
        {"path": str(path), "prompt_template": "Q: {problem} Put the answer in \\boxed{}."}
    )
    first = environment.prompt(0)
    assert first.prompt == "Q: Add {x}. Put the answer in \\boxed{}."
    assert (first.source_id, first.answer) == ("7", "2")
    assert environment.num_prompts == 2
    with pytest.raises(ValueError, match=r"outside \[0, 1\]"):
        environment.prompt(2)


@pytest.mark.parametrize(
    ("lines", "line", "message"),
    [
        ([_record("a"), "{not json", _record("c")], 2, "invalid JSON"),
        ([_record("a"), "[1, 2]"], 2, "expected a JSON object"),
        ([json.dumps({"id": "a", "answer": "2"})], 1, "missing field 'problem'"),
        ([json.dumps({"id": "a", "problem": "p"})], 1, "missing field 'answer'"),
        ([json.dumps({"problem": "p", "answer": "2"})], 1, "missing field 'id'"),
        ([_record("a", answer=None)], 1, "field 'answer' must be a string or a number"),
        ([_record("a", answer=True)], 1, "field 'answer' must be a string or a number"),
        ([_record("a", problem=3)], 1, "field 'problem' must be a string"),
        ([_record(1.5)], 1, "field 'id' must be a string or a number"),
        ([_record("a", answer="  ")], 1, "field 'answer' is empty"),
        ([_record("a"), "", _record("b"), _record("a")], 4, "duplicate id 'a' (first on line 1)"),
        ([_record(1), _record("1")], 2, "duplicate id '1'"),
    ],
)
def test_bad_lines_are_reported_with_file_and_line(
    tmp_path: Path, lines: list[str], line: int, message: str
) -> None:
    path = _write(tmp_path, lines)
    with pytest.raises(DatasetError) as caught:
        load_environment("math", {"path": str(path)})
    assert (caught.value.source, caught.value.line) == (str(path), line)
    assert str(caught.value).startswith(f"{path}:{line}: ")
    assert message in str(caught.value)


def test_blank_lines_and_crlf_are_tolerated_and_lines_stay_physical(tmp_path: Path) -> None:
    path = tmp_path / "crlf.jsonl"
    path.write_bytes(b"\r\n" + _record("a").encode() + b"\r\n\r\n  \r\n" + b"{oops\r\n")
    with pytest.raises(DatasetError, match=r"crlf\.jsonl:5: invalid JSON"):
        MathEnvironment({"path": str(path)})
    path.write_bytes(b"\xef\xbb\xbf" + _record("a").encode() + b"\r\n\r\n" + _record("b").encode())
    assert MathEnvironment({"path": str(path)}).num_prompts == 2


def test_unreadable_files_are_reported(tmp_path: Path) -> None:
    missing = tmp_path / "missing.jsonl"
    with pytest.raises(DatasetError, match=r"missing\.jsonl: cannot read"):
        MathEnvironment({"path": str(missing)})
    empty = _write(tmp_path, ["", "  "], "empty.jsonl")
    with pytest.raises(DatasetError, match=r"empty\.jsonl: no problems"):
        MathEnvironment({"path": str(empty)})
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(_record("a").encode() + b"\n" + b'{"id": "\xe9"}\n')
    with pytest.raises(DatasetError, match=r"latin\.jsonl:2: not valid UTF-8"):
        MathEnvironment({"path": str(latin)})


def test_unparseable_answer_is_reported_with_its_line(tmp_path: Path) -> None:
    path = _write(tmp_path, [_record("a"), _record("b", answer="\\")])
    environment = MathEnvironment({"path": str(path)})
    problem = environment.prompt(1)
    with pytest.raises(DatasetError, match=r"problems\.jsonl:2: math-verify cannot parse"):
        environment.reward(problem, "\\boxed{1}", 3)


def test_blake3_pins_the_file(tmp_path: Path) -> None:
    path = _write(tmp_path, [_record("a")])
    digest = blake3.blake3(path.read_bytes()).hexdigest()
    pinned = MathEnvironment({"path": str(path), "blake3": digest.upper()})
    assert pinned.config["blake3"] == digest
    assert pinned.digest == MathEnvironment({"path": str(path)}).digest
    path.write_text(_record("a", answer="3") + "\n", encoding="utf-8")
    with pytest.raises(DatasetError, match=r"BLAKE3 is .* but config key 'blake3' expects"):
        MathEnvironment({"path": str(path), "blake3": digest})
    # Without a pin the normalised config (and so the digest) follows the content.
    assert MathEnvironment({"path": str(path)}).digest != pinned.digest


def test_time_limit_needs_the_main_thread(example: MathEnvironment, tmp_path: Path) -> None:
    problem = example.prompt(0)
    outcome: dict[str, object] = {}

    def score(environment: MathEnvironment) -> None:
        try:
            outcome["reward"] = environment.reward(problem, "\\boxed{42}", 5).total
        except RuntimeError as error:
            outcome["error"] = error

    thread = threading.Thread(target=score, args=(example,))
    thread.start()
    thread.join(timeout=60)
    assert "main thread" in str(outcome.pop("error"))

    unlimited = MathEnvironment({"verify_timeout_s": 0})
    thread = threading.Thread(target=score, args=(unlimited,))
    thread.start()
    thread.join(timeout=60)
    assert outcome == {"reward": 1.0}


def test_time_limit_stops_pathological_answers(tmp_path: Path) -> None:
    environment = MathEnvironment(
        {"path": str(_write(tmp_path, [_record("a", answer="3")])), "verify_timeout_s": 1}
    )
    problem = environment.prompt(0)
    started = time.monotonic()
    # Comparing 3 with 9**(9**9) makes sympy evaluate a number with 370 million digits. The
    # limit fires and says so (a 0 would be indistinguishable from a wrong answer, and
    # whether it fires depends on the machine); the reward sandbox scores it unverifiable.
    with pytest.raises(VerifierTimeout, match="verify_timeout_s = 1"):
        environment.reward(problem, "\\boxed{9^{9^{9}}}", 5)
    assert time.monotonic() - started < 30
    # Answers that do not parse or verify still score 0 (math-verify's other errors too).
    assert environment.reward(problem, "\\boxed{4}", 5).task_reward == 0.0
    assert environment.reward(problem, "no answer at all", 5).task_reward == 0.0
    assert environment.reward(problem, "\\boxed{3}", 5).task_reward == 1.0
