"""``code``: Python problems with unit tests; the reward is the share of tests a completion passes.

Problems come from a JSONL file in the form SYNTHETIC-1's code tasks use::

    {"problem_id": "p-1", "prompt": "...",
     "verification_info": {"language": "python", "test_cases": [
         {"type": "stdin_stdout", "input": "3\\n", "output": "6\\n"},
         {"type": "function_call", "fn_name": "add", "input": [1, 2], "output": 3}]}}

(``verification_info`` may also be that object as a JSON string; other keys are ignored). The
program is the completion's last fenced code block. Each test runs it in a sandbox of its own
(:mod:`rollnet.reference.envs.isolation`): no network, a read-only file system besides a small
``/tmp``, a user id of its own, rlimits on CPU time, memory, processes, file size, a wall-clock
limit and a cap on its output; nothing of it outlives the test. The verdict is reached outside
the sandbox, from what the program printed: a program cannot patch the checker, and exiting
early passes nothing. A test that runs out of time makes the whole reward unverifiable
(:class:`~rollnet.reference.envs.VerifierTimeout`): whether a program finishes in time depends
on the machine, and a validator must not reject a worker over it.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from dataclasses import dataclass
from typing import Any, Literal

from rollnet.reference.envs.base import Problem, Question, SeededEnvironment, VerifierTimeout
from rollnet.reference.envs.config import ConfigReader
from rollnet.reference.envs.datasets import (
    DatasetError,
    DatasetFile,
    field_text,
    read_dataset,
    record_id,
)
from rollnet.reference.envs.isolation import Limits, RunResult, run_isolated

__all__ = ["EXAMPLE_DATASET", "CodeEnvironment", "CodeRecord", "TestCase", "extract_program"]

#: Resource path (inside ``rollnet.reference.envs``) of the packaged example problems.
EXAMPLE_DATASET = "data/code_example.jsonl"

_FENCE = re.compile(r"```[^\n`]*\n(.*?)```", re.DOTALL)
_SOLUTION = "/sandbox/solution.py"
_HARNESS = "/sandbox/call.py"
# Runs one function_call test: the arguments arrive on stdin before the program runs; the
# program's own output goes to stderr (discarded), the result alone to the saved stdout.
_HARNESS_SOURCE = f"""\
import json, os, sys
name = sys.argv[1]
arguments = json.loads(sys.stdin.read())
result_fd = os.dup(1)
os.dup2(2, 1)
namespace = {{"__name__": "solution"}}
with open({_SOLUTION!r}) as source:
    exec(compile(source.read(), "solution.py", "exec"), namespace)
target = namespace.get(name)
if not callable(target):
    owners = [v for v in namespace.values() if isinstance(v, type) and name in v.__dict__]
    target = getattr(owners[0](), name)
data = json.dumps(target(*arguments), allow_nan=False).encode()
while data:
    data = data[os.write(result_fd, data):]
""".encode()


@dataclass(frozen=True, slots=True)
class TestCase:
    """One test: ``stdin_stdout`` (``input`` is the program's standard input, ``output`` what
    it must print) or ``function_call`` (``fn_name`` called with the ``input`` list as
    positional arguments must return ``output``)."""

    kind: Literal["stdin_stdout", "function_call"]
    input: Any
    output: Any
    fn_name: str | None = None


class CodeRecord:
    """One problem of the file, with the line it came from."""

    __slots__ = ("line", "prompt", "source_id", "tests")

    def __init__(self, source_id: str, prompt: str, tests: tuple[TestCase, ...], line: int):
        self.source_id = source_id
        self.prompt = prompt
        self.tests = tests
        self.line = line


def extract_program(completion_text: str) -> str | None:
    """The completion's last fenced code block (its language tag ignored), or ``None``."""
    blocks = _FENCE.findall(completion_text)
    return blocks[-1] if blocks else None


class CodeEnvironment(SeededEnvironment):
    """Python programming problems scored by running their unit tests in the sandbox.

    Configuration keys (besides ``seed`` and the length keys of
    :class:`~rollnet.reference.envs.base.LengthControl`):

    * ``path``, ``blake3`` — the problem file (``null``: the packaged example), pinned by its
      BLAKE3 as in the ``math`` environment;
    * ``prompt_template`` — the question, ``{prompt}`` replaced by the record's prompt;
    * ``scoring`` — ``"fraction"`` (the share of tests passed, the default) or ``"all"`` (1.0
      when every test passes, else 0.0);
    * ``program`` — where the program is: ``"last_block"`` (the completion's last fenced code
      block, the default) or ``"completion"`` (the whole completion, for a model prompted to
      write code directly);
    * ``test_timeout_s`` — wall-clock and CPU seconds of one test (default 5);
    * ``memory_mb`` — address space of each process (default 512);
    * ``max_processes`` — processes and threads of one test at once (default 16);
    * ``max_output_bytes`` — what a test may print (default 1 MiB; more fails the test);
    * ``max_program_chars`` — longer programs score 0.0 without running (default 65536);
    * ``python`` — the ``major.minor`` version of the Python that runs the programs; normalised
      to this host's, so a host with another Python refuses the configuration (a program's
      behaviour may differ between versions).
    """

    name = "code"
    isolates_itself = True

    def configure(self, reader: ConfigReader) -> None:
        """Read the keys above and load the file."""
        self.dataset = read_dataset(reader, EXAMPLE_DATASET)
        self.prompt_template = reader.string("prompt_template", "{prompt}")
        if self.prompt_template.count("{prompt}") != 1:
            reader.fail("prompt_template", "must contain {prompt} exactly once")
        scoring = reader.string("scoring", "fraction")
        if scoring not in ("fraction", "all"):
            reader.fail("scoring", f"expected 'fraction' or 'all', got {scoring!r}")
        self.scoring = scoring
        program = reader.string("program", "last_block")
        if program not in ("last_block", "completion"):
            reader.fail("program", f"expected 'last_block' or 'completion', got {program!r}")
        self.program = program
        self.test_timeout_s = reader.integer("test_timeout_s", 5, minimum=1, maximum=600)
        self.memory_mb = reader.integer("memory_mb", 512, minimum=32, maximum=65536)
        self.max_processes = reader.integer("max_processes", 16, minimum=1, maximum=4096)
        self.max_output_bytes = reader.integer(
            "max_output_bytes", 1 << 20, minimum=1, maximum=1 << 30
        )
        self.max_program_chars = reader.integer(
            "max_program_chars", 65536, minimum=1, maximum=1 << 24
        )
        here = f"{sys.version_info.major}.{sys.version_info.minor}"
        python = reader.string("python", here)
        if python != here:
            reader.fail("python", f"programs run with Python {here} here, not {python}")
        self.records = _parse_records(self.dataset)

    @property
    def num_prompts(self) -> int:
        """The number of records in the file."""
        return len(self.records)

    @property
    def sandbox_paths(self) -> tuple[str, ...]:
        """The problem file, when it is not the packaged example."""
        return self.dataset.sandbox_paths

    @property
    def limits(self) -> Limits:
        """The rlimits of one test's sandbox."""
        return Limits(
            memory_bytes=self.memory_mb << 20,
            processes=self.max_processes,
            cpu_s=self.test_timeout_s,
            file_bytes=self.max_output_bytes,
            scratch_bytes=16 << 20,
        )

    def make_question(self, prompt_id: int) -> Question:
        """The ``prompt_id``-th record's prompt, put into ``prompt_template``."""
        record = self.records[prompt_id]
        text = self.prompt_template.replace("{prompt}", record.prompt)
        return Question(text=text, answer="", source_id=record.source_id)

    def task_reward(self, problem: Problem, completion_text: str) -> float:
        """The share of tests passed (``scoring = "fraction"``) or 1.0/0.0 for all of them
        (``"all"``); raises :class:`~rollnet.reference.envs.VerifierTimeout` when a test ran
        out of time."""
        tests = self.records[problem.prompt_id].tests
        passed = self.passed_tests(problem, completion_text)
        if self.scoring == "all":
            return 1.0 if passed == len(tests) else 0.0
        return passed / len(tests)

    def passed_tests(self, problem: Problem, completion_text: str) -> int:
        """How many of the problem's tests the completion's program passes (with ``scoring =
        "all"`` the count stops at the first failure)."""
        if self.program == "completion":
            program: str | None = completion_text
        else:
            program = extract_program(completion_text)
        if program is None or len(program) > self.max_program_chars:
            return 0
        source = program.encode()
        passed = 0
        for index, test in enumerate(self.records[problem.prompt_id].tests):
            result = self._run(test, source)
            if result.timed_out or result.cpu_limited:
                raise VerifierTimeout(
                    f"test {index} ran out of time (test_timeout_s = {self.test_timeout_s})"
                )
            if _passes(test, result):
                passed += 1
            elif self.scoring == "all":
                break
        return passed

    def _run(self, test: TestCase, source: bytes) -> RunResult:
        python = os.path.realpath(sys.executable)
        readable = sorted({sys.base_prefix, sys.base_exec_prefix, os.path.dirname(python)})
        files = {_SOLUTION: source}
        if test.kind == "stdin_stdout":
            argv = [python, "-I", "-S", _SOLUTION]
            stdin = str(test.input).encode()
        else:
            assert test.fn_name is not None
            argv = [python, "-I", "-S", _HARNESS, test.fn_name]
            stdin = json.dumps(test.input).encode()
            files[_HARNESS] = _HARNESS_SOURCE
        return run_isolated(
            argv,
            self.limits,
            stdin=stdin,
            wall_s=float(self.test_timeout_s),
            max_output_bytes=self.max_output_bytes,
            readable=readable,
            files=files,
        )


def _passes(test: TestCase, result: RunResult) -> bool:
    if result.returncode != 0 or result.output_exceeded:
        return False
    if test.kind == "stdin_stdout":
        return _lines(result.stdout.decode(errors="replace")) == _lines(str(test.output))
    try:
        returned = json.loads(result.stdout)
    except ValueError:
        return False
    return _same_json(returned, test.output)


def _lines(text: str) -> list[str]:
    """Output as compared: surrounding blank space and each line's own ignored."""
    return [line.strip() for line in text.strip().split("\n")]


def _same_json(left: Any, right: Any) -> bool:
    """JSON values equal as JSON sees them: numbers by value (``1 == 1.0``), booleans apart
    from numbers, lists in order, objects by key."""
    if isinstance(left, bool) or isinstance(right, bool):
        return type(left) is type(right) and left == right
    if isinstance(left, int | float) and isinstance(right, int | float):
        return left == right
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(map(_same_json, left, right))
    if isinstance(left, dict) and isinstance(right, dict):
        return left.keys() == right.keys() and all(_same_json(left[k], right[k]) for k in left)
    return type(left) is type(right) and left == right


def _parse_records(dataset: DatasetFile) -> list[CodeRecord]:
    source = dataset.source
    records: list[CodeRecord] = []
    seen: dict[str, int] = {}
    for number, item in dataset:
        key = "problem_id" if "problem_id" in item else "id"
        source_id = record_id(source, number, item, key, seen)
        prompt = field_text(source, number, item, "prompt", numbers=())
        tests = _tests(source, number, item.get("verification_info"))
        records.append(CodeRecord(source_id, prompt, tests, number))
    return records


def _tests(source: str, line: int, info: Any) -> tuple[TestCase, ...]:
    def bad(message: str) -> DatasetError:
        return DatasetError(source, line, f"verification_info: {message}")

    if isinstance(info, str):
        try:
            info = json.loads(info)
        except ValueError:
            raise bad("not valid JSON") from None
    if not isinstance(info, dict):
        raise bad("missing, or not an object")
    if info.get("language") != "python":
        raise bad(f"language must be 'python', got {info.get('language')!r}")
    cases = info.get("test_cases")
    if not isinstance(cases, list) or not cases:
        raise bad("test_cases must be a non-empty list")
    tests = []
    for index, case in enumerate(cases):
        where = f"test_cases[{index}]"
        if not isinstance(case, dict) or "input" not in case or "output" not in case:
            raise bad(f"{where} must be an object with 'input' and 'output'")
        kind = case.get("type", "stdin_stdout")
        if kind == "stdin_stdout":
            if not isinstance(case["input"], str) or not isinstance(case["output"], str):
                raise bad(f"{where}: a stdin_stdout test's input and output are strings")
            tests.append(TestCase("stdin_stdout", case["input"], case["output"]))
        elif kind == "function_call":
            name = case.get("fn_name")
            if not isinstance(name, str) or not name.isidentifier():
                raise bad(f"{where}: fn_name must be a Python identifier")
            if not isinstance(case["input"], list):
                raise bad(f"{where}: a function_call test's input is the list of arguments")
            if not _finite_json(case["output"]):
                raise bad(f"{where}: output must be finite JSON data")
            tests.append(TestCase("function_call", case["input"], case["output"], name))
        else:
            raise bad(f"{where}: type must be 'stdin_stdout' or 'function_call', got {kind!r}")
    return tuple(tests)


def _finite_json(value: Any) -> bool:
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(map(_finite_json, value))
    if isinstance(value, dict):
        return all(map(_finite_json, value.values()))
    return True
