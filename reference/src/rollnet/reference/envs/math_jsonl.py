"""``math``: problems with reference answers from a JSONL file, checked with ``math-verify``.

Each non-blank line of the file is a JSON object ``{"id": ..., "problem": ..., "answer": ...}``
(other keys are allowed and ignored). Prompt id ``i`` is the ``i``-th record in file order. The
package ships a small example, used when no ``path`` is configured.
"""

from __future__ import annotations

import threading
from typing import Any

from rollnet.reference.envs.base import Problem, Question, SeededEnvironment, VerifierTimeout
from rollnet.reference.envs.config import ConfigReader
from rollnet.reference.envs.datasets import (
    DatasetError,
    DatasetFile,
    field_text,
    read_dataset,
    record_id,
)

__all__ = ["EXAMPLE_DATASET", "DatasetError", "MathEnvironment", "MathRecord"]

#: Resource path (inside ``rollnet.reference.envs``) of the packaged example problems.
EXAMPLE_DATASET = "data/math_example.jsonl"


class MathRecord:
    """One problem of the file, with the line it came from."""

    __slots__ = ("answer", "line", "problem", "source_id")

    def __init__(self, source_id: str, problem: str, answer: str, line: int) -> None:
        self.source_id = source_id
        self.problem = problem
        self.answer = answer
        self.line = line


class MathEnvironment(SeededEnvironment):
    """Math word problems with symbolic answer checking.

    Configuration keys (besides ``seed`` and the length keys of
    :class:`~rollnet.reference.envs.base.LengthControl`):

    * ``path`` — the JSONL file (relative paths resolve against the working directory); ``null``
      (the default) means the packaged example;
    * ``blake3`` — expected hex BLAKE3 of the file's bytes; normalised to the actual digest, so
      the normalised config (and its digest) pins the data, and a worker or validator holding a
      different file refuses to start;
    * ``prompt_template`` — the question text, with ``{problem}`` replaced (default
      ``"{problem}"``; no other braces are interpreted);
    * ``max_answer_chars`` — only the last this-many characters of a completion are given to
      ``math-verify`` (default 4096), which bounds the verifier's work;
    * ``verify_timeout_s`` — math-verify's per-call time limit in whole seconds (default 5; 0
      disables it). It uses ``SIGALRM``, so with a limit the reward must be computed on the main
      thread of a process; see ``docs/environments.md`` for what a limit means for determinism.
    """

    name = "math"

    def configure(self, reader: ConfigReader) -> None:
        """Read the keys above and load the file."""
        self.dataset = read_dataset(reader, EXAMPLE_DATASET)
        self.source = self.dataset.source
        self.prompt_template = reader.string("prompt_template", "{problem}")
        if self.prompt_template.count("{problem}") != 1:
            reader.fail("prompt_template", "must contain {problem} exactly once")
        self.max_answer_chars = reader.integer("max_answer_chars", 4096, minimum=1)
        self.verify_timeout_s = reader.integer("verify_timeout_s", 5, minimum=0, maximum=3600)

        self.records = _parse_records(self.dataset)
        self._gold: dict[int, list[Any]] = {}

    @property
    def sandbox_paths(self) -> tuple[str, ...]:
        """The problem file, when it is not the packaged example."""
        return self.dataset.sandbox_paths

    @property
    def num_prompts(self) -> int:
        """The number of records in the file."""
        return len(self.records)

    def make_question(self, prompt_id: int) -> Question:
        """The ``prompt_id``-th record, put into ``prompt_template``."""
        record = self.records[prompt_id]
        text = self.prompt_template.replace("{problem}", record.problem)
        return Question(text=text, answer=record.answer, source_id=record.source_id)

    def task_reward(self, problem: Problem, completion_text: str) -> float:
        """1.0 when ``math_verify.verify(gold, parse(tail))`` holds, else 0.0; raises
        :class:`~rollnet.reference.envs.VerifierTimeout` when math-verify's time limit fires.

        ``tail`` is the last ``max_answer_chars`` characters of the completion; ``parse`` uses
        math-verify's default extraction (LaTeX, ``\\boxed{}`` first, then plain expressions).
        """
        from math_verify import parse, verify
        from math_verify.errors import TimeoutException

        timeout = self._timeout()
        gold = self._gold_answer(problem.prompt_id)
        # raise_on_error so that a time limit that fired is told apart from an answer that
        # does not parse or verify (math-verify would return 0 for both): the limit raises
        # VerifierTimeout, any other error of math-verify's scores 0 as before.
        try:
            tail = completion_text[-self.max_answer_chars :]
            predicted = parse(tail, parsing_timeout=timeout, raise_on_error=True)
            if not predicted:
                return 0.0
            verified = verify(gold, predicted, timeout_seconds=timeout, raise_on_error=True)
        except TimeoutException as error:
            raise VerifierTimeout(
                f"math-verify's time limit (verify_timeout_s = {self.verify_timeout_s}) fired"
            ) from error
        except Exception:
            return 0.0
        return 1.0 if verified else 0.0

    def _gold_answer(self, prompt_id: int) -> list[Any]:
        cached = self._gold.get(prompt_id)
        if cached is not None:
            return cached
        from math_verify import parse

        record = self.records[prompt_id]
        answer = record.answer
        # Answers are written as LaTeX math content without delimiters ("\frac{1}{2}"); wrapping
        # them in $...$ makes math-verify read them as LaTeX rather than as plain expressions.
        text = answer if "$" in answer or "\\boxed" in answer else f"${answer}$"
        gold: list[Any] = parse(text, parsing_timeout=self._timeout())
        if not gold:
            raise DatasetError(self.source, record.line, f"math-verify cannot parse {answer!r}")
        self._gold[prompt_id] = gold
        return gold

    def _timeout(self) -> int | None:
        if self.verify_timeout_s == 0:
            return None
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError(
                "math environment: math-verify enforces verify_timeout_s with SIGALRM, which only "
                "works on a process's main thread; compute rewards there (for example in a "
                "process pool) or set verify_timeout_s to 0"
            )
        return self.verify_timeout_s


def _parse_records(dataset: DatasetFile) -> list[MathRecord]:
    source = dataset.source
    records: list[MathRecord] = []
    seen: dict[str, int] = {}
    for number, item in dataset:
        source_id = record_id(source, number, item, "id", seen)
        problem = field_text(source, number, item, "problem", numbers=())
        answer = field_text(source, number, item, "answer", numbers=(int, float))
        records.append(MathRecord(source_id, problem, answer, number))
    return records
