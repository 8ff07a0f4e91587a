"""``arithmetic``: synthetic integer arithmetic that a tiny model learns by RL in minutes on a CPU.

Prompts are short plain ASCII such as ``"12+34="`` (at most 20 characters without a length
instruction), suited to a character-level tokenizer. The verifier is strict: the completion's first
line must be the answer written canonically.
"""

from __future__ import annotations

from dataclasses import dataclass

from rollnet.reference.envs.base import Problem, Question, SeededEnvironment
from rollnet.reference.envs.config import ConfigReader
from rollnet.reference.envs.draws import DrawStream

__all__ = ["LEVELS", "OPERATORS", "ArithmeticEnvironment", "Level", "score_integer_answer"]

#: Supported operators, in canonical order (the order draws index into).
OPERATORS = "+-*"

#: Operands have at most this many digits, which keeps prompts at most 20 characters long.
MAX_DIGITS = 9


@dataclass(frozen=True, slots=True)
class Level:
    """A difficulty preset; explicit configuration keys override its fields."""

    min_digits: int
    max_digits: int
    operators: str
    allow_negative: bool


#: Difficulty presets, easiest first. Level 1 (one-digit additions) is where a tiny model starts.
LEVELS: dict[int, Level] = {
    1: Level(min_digits=1, max_digits=1, operators="+", allow_negative=False),
    2: Level(min_digits=1, max_digits=1, operators="+-", allow_negative=False),
    3: Level(min_digits=1, max_digits=2, operators="+-", allow_negative=False),
    4: Level(min_digits=2, max_digits=2, operators="+-", allow_negative=True),
    5: Level(min_digits=1, max_digits=2, operators="+-*", allow_negative=True),
    6: Level(min_digits=2, max_digits=3, operators="+-*", allow_negative=True),
}


def score_integer_answer(completion_text: str, answer: str) -> float:
    """1.0 when the completion's first line is exactly ``answer``, else 0.0.

    The first line is everything before the first ``"\\n"`` (the whole text if there is none);
    anything after that newline is ignored. The line must equal the canonical decimal form of the
    integer: an optional ``-`` then digits, no leading zeros, no ``+``, no ``-0``, no spaces, tabs
    or carriage returns anywhere in it. ``completion_text`` is the decoded completion without
    special tokens, so an end-of-sequence token ends it as a newline would.
    """
    first_line = completion_text.split("\n", 1)[0]
    return 1.0 if first_line == answer else 0.0


class ArithmeticEnvironment(SeededEnvironment):
    """``a op b =`` with seeded operands; the answer is the exact integer result.

    Configuration keys (besides ``seed`` and the length keys of
    :class:`~rollnet.reference.envs.base.LengthControl`):

    * ``level`` — a preset of :data:`LEVELS` (default 1);
    * ``min_digits``, ``max_digits`` — operand digit counts, 1 to 9 (default: from the level);
    * ``operators`` — a non-empty subset of ``"+-*"`` in any order, normalised to canonical order;
    * ``allow_negative`` — when false, ``a - b`` is drawn with ``a >= b``.

    Generation for prompt id ``i`` reads stream ``draws(i, "problem")`` in this order: operator
    ``choice(operators)``; for each operand, its digit count ``d = between(min_digits,
    max_digits)`` then its value ``between(0 if d == 1 else 10**(d-1), 10**d - 1)``; finally, for
    ``-`` without ``allow_negative``, the operands are swapped when ``a < b``.
    """

    name = "arithmetic"
    default_length_template = "Think for {target} tokens. {prompt}"

    def configure(self, reader: ConfigReader) -> None:
        """Read ``level``, ``min_digits``, ``max_digits``, ``operators`` and ``allow_negative``."""
        level_number = reader.integer("level", 1, minimum=min(LEVELS), maximum=max(LEVELS))
        level = LEVELS[level_number]
        self.min_digits = reader.integer(
            "min_digits", level.min_digits, minimum=1, maximum=MAX_DIGITS
        )
        self.max_digits = reader.integer(
            "max_digits", level.max_digits, minimum=1, maximum=MAX_DIGITS
        )
        if self.max_digits < self.min_digits:
            reader.fail("max_digits", f"{self.max_digits} is below min_digits {self.min_digits}")
        operators = reader.string("operators", level.operators)
        if (
            not operators
            or set(operators) - set(OPERATORS)
            or len(set(operators)) != len(operators)
        ):
            reader.fail("operators", f"expected distinct characters from {OPERATORS!r}")
        self.operators = "".join(op for op in OPERATORS if op in operators)
        reader.set_normalised("operators", self.operators)
        self.allow_negative = reader.boolean("allow_negative", level.allow_negative)

    @property
    def num_prompts(self) -> None:
        """Unbounded: every id in ``[0, 2**64)`` is a prompt."""
        return None

    def make_question(self, prompt_id: int) -> Question:
        """Draw ``a op b`` for ``prompt_id``."""
        stream = self.draws(prompt_id, "problem")
        operator = stream.choice(self.operators)
        a = self._operand(stream)
        b = self._operand(stream)
        if operator == "-" and not self.allow_negative and a < b:
            a, b = b, a
        if operator == "+":
            result = a + b
        elif operator == "-":
            result = a - b
        else:
            result = a * b
        expression = f"{a}{operator}{b}"
        return Question(text=f"{expression}=", answer=str(result), source_id=expression)

    def task_reward(self, problem: Problem, completion_text: str) -> float:
        """:func:`score_integer_answer` against ``problem.answer``."""
        return score_integer_answer(completion_text, problem.answer)

    def _operand(self, stream: DrawStream) -> int:
        digits = stream.between(self.min_digits, self.max_digits)
        low = 0 if digits == 1 else 10 ** (digits - 1)
        return stream.between(low, 10**digits - 1)
