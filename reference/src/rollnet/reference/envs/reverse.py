"""``reverse``: write a short string backwards, with partial credit.

Prompts are ``"reverse abcd:"``; the answer is ``"dcba"``. The reward is graded, so that a model
which gets part of it right is told so and group advantages carry signal from the first step:
``2·LCS(line, answer) / (len(line) + len(answer))`` — the longest common subsequence of the
completion's first line and the answer, as a fraction of their lengths (1.0 exactly right, 0.0
nothing in common or an empty line). Small enough for the tiny character-level model to learn by
RL in tens of steps on a CPU (prime-rl's own CI-sized check is a reverse-text task).
"""

from __future__ import annotations

from rollnet.reference.envs.base import Problem, Question, SeededEnvironment
from rollnet.reference.envs.config import ConfigReader

__all__ = ["ReverseEnvironment", "lcs_length", "reverse_similarity"]

#: Strings have at most this many characters (prompts stay short for a character tokenizer).
MAX_LENGTH = 32

_DEFAULT_ALPHABET = "abcdefghijklmnopqrstuvwxyz"


def lcs_length(a: str, b: str) -> int:
    """Length of the longest common subsequence of ``a`` and ``b`` (dynamic programming)."""
    previous = [0] * (len(b) + 1)
    for char in a:
        current = [0]
        for j, other in enumerate(b):
            current.append(previous[j] + 1 if char == other else max(previous[j + 1], current[j]))
        previous = current
    return previous[-1]


def reverse_similarity(completion_text: str, answer: str) -> float:
    """``2·LCS / (len(line) + len(answer))`` for the completion's first line (0.0 when both are
    empty cannot happen: the answer is never empty)."""
    line = completion_text.split("\n", 1)[0]
    # Exact in binary64: a ratio of small integers, rounded once.
    return 2.0 * lcs_length(line, answer) / float(len(line) + len(answer))


class ReverseEnvironment(SeededEnvironment):
    """``reverse <string>:`` with a seeded string; the answer is the string reversed.

    Configuration keys (besides ``seed`` and the length keys of
    :class:`~rollnet.reference.envs.base.LengthControl`):

    * ``min_length``, ``max_length`` — characters of the string, 1 to 32 (default 3 and 5);
    * ``alphabet`` — distinct printable ASCII letters or digits to draw from (default ``a``-``z``).

    Generation for prompt id ``i`` reads stream ``draws(i, "problem")``: the length
    ``between(min_length, max_length)``, then that many ``choice(alphabet)``.
    """

    name = "reverse"

    def configure(self, reader: ConfigReader) -> None:
        """Read ``min_length``, ``max_length`` and ``alphabet``."""
        self.min_length = reader.integer("min_length", 3, minimum=1, maximum=MAX_LENGTH)
        self.max_length = reader.integer("max_length", 5, minimum=1, maximum=MAX_LENGTH)
        if self.max_length < self.min_length:
            reader.fail("max_length", f"{self.max_length} is below min_length {self.min_length}")
        alphabet = reader.string("alphabet", _DEFAULT_ALPHABET)
        if not alphabet or len(set(alphabet)) != len(alphabet):
            reader.fail("alphabet", "expected distinct characters")
        if not all(char.isascii() and char.isalnum() for char in alphabet):
            reader.fail("alphabet", "only ASCII letters and digits")
        self.alphabet = alphabet

    @property
    def num_prompts(self) -> None:
        """Unbounded: every id in ``[0, 2**64)`` is a prompt."""
        return None

    def make_question(self, prompt_id: int) -> Question:
        """Draw the string for ``prompt_id``."""
        stream = self.draws(prompt_id, "problem")
        length = stream.between(self.min_length, self.max_length)
        word = "".join(stream.choice(self.alphabet) for _ in range(length))
        return Question(text=f"reverse {word}:", answer=word[::-1], source_id=word)

    def task_reward(self, problem: Problem, completion_text: str) -> float:
        """:func:`reverse_similarity` against ``problem.answer``."""
        return reverse_similarity(completion_text, problem.answer)
