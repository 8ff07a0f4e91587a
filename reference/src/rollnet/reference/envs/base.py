"""The environment contract: seeded prompts and a deterministic, exact verifier.

A worker and a validator each rebuild a prompt from (environment name, normalised config, prompt
id) and must get byte-identical text; the validator then recomputes the reward from the rollout's
completion and compares it with what the worker claimed. ``docs/environments.md`` states the full
contract; this module implements it.
"""

from __future__ import annotations

import math
import operator
import re
from abc import ABC, abstractmethod
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, SupportsIndex

from rollnet.reference.envs.config import MAX_SAFE_INTEGER, ConfigReader, config_digest
from rollnet.reference.envs.draws import MAX_PROMPT_ID, DrawStream

__all__ = [
    "DEFAULT_LENGTH_PENALTY",
    "Environment",
    "LengthControl",
    "Problem",
    "Question",
    "RewardBreakdown",
    "SeededEnvironment",
    "VerifierTimeout",
]

#: λ of the length penalty, as in INTELLECT-2 (``r = r_task − 0.0003·|len − target|``).
DEFAULT_LENGTH_PENALTY = 0.0003

_PLACEHOLDER = re.compile(r"\{(prompt|target)\}")


class VerifierTimeout(Exception):
    """A verifier's own time limit fired: the completion has no reward that every machine would
    agree on. The reward sandbox scores it :meth:`Environment.unverifiable_reward`, and a
    validator does not reject a claim over it."""


@dataclass(frozen=True, slots=True)
class Problem:
    """One prompt of an environment, rebuilt identically by worker and validator.

    Attributes:
        prompt_id: Index the coordinator assigned (``0 <= prompt_id < 2**64``).
        prompt: The exact text given to the model, length instruction included.
        answer: The reference answer, in the environment's own notation.
        target_length: Completion length (in tokens) the prompt asks for, or ``None`` when the
            environment has no length control.
        source_id: Stable identifier of the underlying question (a dataset id, or the question
            text for synthetic environments), for logs and offline difficulty filtering.
        messages: The prompt as chat messages, ``(role, content)`` pairs, when the model is to
            read it through its chat template (see :func:`rollnet.sdk.prompts.encode_problem`);
            ``None`` when ``prompt`` is fed as plain text.
    """

    prompt_id: int
    prompt: str
    answer: str
    target_length: int | None
    source_id: str
    messages: tuple[tuple[str, str], ...] | None = None


@dataclass(frozen=True, slots=True)
class RewardBreakdown:
    """A reward and its parts: ``total = task_reward − length_penalty`` in IEEE-754 binary64."""

    task_reward: float
    length_penalty: float
    total: float


@dataclass(frozen=True, slots=True)
class Question:
    """What a :class:`SeededEnvironment` subclass produces for one prompt id."""

    text: str
    answer: str
    source_id: str


class Environment(ABC):
    """Seeded prompts and a deterministic verifier.

    Implementations must be pure functions of their normalised configuration: :meth:`prompt` and
    :meth:`reward` may not read clocks, global random state, the network or anything else that can
    differ between a worker and a validator. Most environments should subclass
    :class:`SeededEnvironment`, which adds the seed, length targets and argument checks.
    """

    #: Registry name; must equal the name the environment is loaded under.
    name: str

    #: The environment's own code is not the operator's (a published verifiers taskset): the
    #: reward sandbox only ever runs it isolated, never in a node's own process.
    runs_untrusted_code: bool = False

    #: :meth:`reward` runs the programs it checks in sandboxes of its own (the ``code``
    #: environment), so the reward sandbox calls it in the calling process; the host must be
    #: able to isolate (:func:`rollnet.reference.envs.isolation.isolation_problem`).
    isolates_itself: bool = False

    @property
    def sandbox_paths(self) -> tuple[str, ...]:
        """Absolute paths the verifier reads besides the Python installation (a dataset file):
        the reward sandbox's child may read them."""
        return ()

    @property
    @abstractmethod
    def config(self) -> Mapping[str, Any]:
        """The normalised configuration: JSON data with every default spelled out."""

    @property
    @abstractmethod
    def num_prompts(self) -> int | None:
        """How many prompt ids are valid (``0..num_prompts-1``); ``None`` when unbounded."""

    @property
    def target_lengths(self) -> tuple[int, ...]:
        """The configured set of target lengths; empty when length control is off."""
        return ()

    @property
    def digest(self) -> str:
        """:func:`config_digest` of this environment's name and normalised configuration."""
        return config_digest(self.name, self.config)

    @abstractmethod
    def prompt(self, prompt_id: int) -> Problem:
        """Rebuild the problem for ``prompt_id``; identical in every process and on every host."""

    @abstractmethod
    def reward(
        self, problem: Problem, completion_text: str, completion_token_count: int
    ) -> RewardBreakdown:
        """Score a completion of ``problem`` exactly (see the module docs for the arithmetic)."""

    def checked_count(self, problem: Problem, completion_token_count: int) -> int:
        """``completion_token_count`` as a plain int, once ``reward``'s arguments are checked.

        Raises :class:`ValueError` when the count is out of range or ``problem`` is not exactly
        ``self.prompt(problem.prompt_id)`` (another configuration, or an edited target or
        answer): such a problem must not get a reward at all.
        """
        completion_token_count = _as_index("completion_token_count", completion_token_count)
        if not 0 <= completion_token_count <= MAX_SAFE_INTEGER:
            raise ValueError(f"completion_token_count {completion_token_count} is out of range")
        if self.prompt(problem.prompt_id) != problem:
            raise ValueError(
                f"environment {self.name!r}: problem {problem.prompt_id} differs from the one "
                "this configuration builds"
            )
        return completion_token_count

    def unverifiable_reward(self, problem: Problem, completion_token_count: int) -> RewardBreakdown:
        """The reward of a completion the verifier could not score (it ran out of time, raised
        or crashed): task reward ``0.0``. Environments with a length penalty override this to
        keep it (:class:`SeededEnvironment` does); the default has none."""
        return RewardBreakdown(task_reward=0.0, length_penalty=0.0, total=0.0)


class LengthControl:
    """Optional length targets: drawn per prompt, stated in the prompt, penalised in the reward.

    Configuration keys (shared by every :class:`SeededEnvironment`):

    * ``target_lengths`` — list of positive token counts; empty (the default) disables it all;
    * ``length_penalty`` — λ ≥ 0, default 0.0003;
    * ``length_template`` — how the instruction wraps the question; ``{prompt}`` and
      ``{target}`` are replaced in one pass (no other braces are interpreted).
    """

    def __init__(self, targets: tuple[int, ...], coefficient: float, template: str) -> None:
        self.targets = targets
        self.coefficient = coefficient
        self.template = template

    @classmethod
    def from_config(cls, reader: ConfigReader, default_template: str) -> LengthControl:
        """Read ``target_lengths``, ``length_penalty`` and ``length_template``."""
        targets = tuple(reader.integer_list("target_lengths", (), minimum=1))
        if len(set(targets)) != len(targets):
            reader.fail("target_lengths", "values must be distinct")
        coefficient = reader.number("length_penalty", DEFAULT_LENGTH_PENALTY, minimum=0.0)
        template = reader.string("length_template", default_template)
        for placeholder in ("{prompt}", "{target}"):
            if template.count(placeholder) != 1:
                reader.fail("length_template", f"must contain {placeholder} exactly once")
        return cls(targets, coefficient, template)

    @property
    def enabled(self) -> bool:
        """Whether targets are configured."""
        return bool(self.targets)

    def draw(self, environment: str, seed: int, prompt_id: int) -> int | None:
        """The target of ``prompt_id``: ``choice(targets)`` on stream label ``target_length``."""
        if not self.targets:
            return None
        return DrawStream(environment, seed, prompt_id, "target_length").choice(self.targets)

    def state(self, text: str, target: int) -> str:
        """Put the length instruction around ``text``."""
        values = {"prompt": text, "target": str(target)}
        return _PLACEHOLDER.sub(lambda match: values[match.group(1)], self.template)

    def penalty(self, completion_token_count: int, target: int | None) -> float:
        """``λ·|count − target|`` as one binary64 multiplication; ``0.0`` without a target."""
        if target is None:
            return 0.0
        # |count − target| is an exact integer below 2**53, so the product is correctly rounded
        # once and every IEEE-754 implementation gets the same bits.
        return self.coefficient * float(abs(completion_token_count - target))


class SeededEnvironment(Environment):
    """Base class handling the seed, config validation, length targets and exact rewards.

    Subclasses set :attr:`name`, read their own keys in :meth:`configure`, and implement
    :meth:`make_question` and :meth:`task_reward`. Common configuration keys: ``seed`` (integer in
    ``[0, 2**53)``, default 0) plus those of :class:`LengthControl`. Subclasses must not reuse the
    attribute names ``seed``, ``length_control`` and ``_config``.
    """

    #: Default ``length_template``; subclasses may override it.
    default_length_template = "{prompt} Think for {target} tokens before giving a response."

    def __init__(self, config: Mapping[str, Any]) -> None:
        reader = ConfigReader(self.name, config)
        self.seed = reader.integer("seed", 0, minimum=0, maximum=MAX_SAFE_INTEGER)
        self.length_control = LengthControl.from_config(reader, self.default_length_template)
        self.configure(reader)
        self._config = reader.finish()

    def configure(self, reader: ConfigReader) -> None:
        """Read this environment's own configuration keys (called once, from ``__init__``)."""

    @abstractmethod
    def make_question(self, prompt_id: int) -> Question:
        """Build the question for an already range-checked ``prompt_id``.

        Synthetic environments take their randomness from ``self.draws(prompt_id, "problem")``.
        """

    @abstractmethod
    def task_reward(self, problem: Problem, completion_text: str) -> float:
        """Score the completion's answer; a finite float (the built-ins return 0.0 or 1.0)."""

    @property
    def config(self) -> Mapping[str, Any]:
        """The normalised configuration (a copy; every default spelled out)."""
        return dict(self._config)

    @property
    def target_lengths(self) -> tuple[int, ...]:
        """The configured ``target_lengths``."""
        return self.length_control.targets

    def draws(self, prompt_id: int, label: str) -> DrawStream:
        """The deterministic draw stream of ``prompt_id`` for purpose ``label``."""
        return DrawStream(self.name, self.seed, prompt_id, label)

    def prompt(self, prompt_id: int) -> Problem:
        """Rebuild the problem for ``prompt_id`` (any integer type, e.g. ``numpy.uint64``)."""
        prompt_id = _as_index("prompt id", prompt_id)
        bound = self.num_prompts
        upper = MAX_PROMPT_ID if bound is None else bound - 1
        if not 0 <= prompt_id <= upper:
            raise ValueError(
                f"environment {self.name!r}: prompt id {prompt_id} is outside [0, {upper}]"
            )
        question = self.make_question(prompt_id)
        target = self.length_control.draw(self.name, self.seed, prompt_id)
        text = question.text if target is None else self.length_control.state(question.text, target)
        return Problem(
            prompt_id=prompt_id,
            prompt=text,
            answer=question.answer,
            target_length=target,
            source_id=question.source_id,
        )

    def reward(
        self, problem: Problem, completion_text: str, completion_token_count: int
    ) -> RewardBreakdown:
        """``total = task_reward − λ·|completion_token_count − problem.target_length|``.

        Raises :class:`ValueError` when ``problem`` is not exactly
        ``self.prompt(problem.prompt_id)`` (another configuration, or an edited target or answer).
        """
        completion_token_count = self.checked_count(problem, completion_token_count)
        target = problem.target_length
        task = self.task_reward(problem, completion_text)
        if not isinstance(task, float) or not math.isfinite(task):
            raise TypeError(f"task_reward must return a finite float, got {task!r}")
        penalty = self.length_control.penalty(completion_token_count, target)
        return RewardBreakdown(task_reward=task, length_penalty=penalty, total=task - penalty)

    def unverifiable_reward(self, problem: Problem, completion_token_count: int) -> RewardBreakdown:
        """Task reward ``0.0`` with the length penalty: ``total = −λ·|count − target|``."""
        penalty = self.length_control.penalty(completion_token_count, problem.target_length)
        return RewardBreakdown(task_reward=0.0, length_penalty=penalty, total=0.0 - penalty)


def _as_index(what: str, value: object) -> int:
    """``operator.index(value)`` as a plain int; bools and floats are refused."""
    if isinstance(value, bool) or not isinstance(value, SupportsIndex):
        raise TypeError(f"{what} must be an integer, got {type(value).__name__}")
    return operator.index(value)
