"""Environments: seeded prompts and deterministic verifiers, pluggable by entry point.

``load_environment(name, config)`` builds a built-in (``arithmetic``, ``math``, ``code``,
``verifiers``) or a third-party environment registered in the ``rollnet.environments``
entry-point group. ``docs/environments.md`` states the determinism contract every environment
must keep.
"""

from rollnet.reference.envs.arithmetic import LEVELS, ArithmeticEnvironment, score_integer_answer
from rollnet.reference.envs.base import (
    DEFAULT_LENGTH_PENALTY,
    Environment,
    LengthControl,
    Problem,
    Question,
    RewardBreakdown,
    SeededEnvironment,
    VerifierTimeout,
)
from rollnet.reference.envs.code import CodeEnvironment, extract_program
from rollnet.reference.envs.config import (
    ConfigReader,
    EnvironmentConfigError,
    canonical_json,
    config_digest,
)
from rollnet.reference.envs.datasets import DatasetError
from rollnet.reference.envs.draws import MAX_PROMPT_ID, DrawStream
from rollnet.reference.envs.isolation import IsolationUnavailable, Limits, protect_paths
from rollnet.reference.envs.math_jsonl import MathEnvironment
from rollnet.reference.envs.registry import (
    ENTRY_POINT_GROUP,
    EnvironmentRegistryError,
    UnknownEnvironmentError,
    available_environments,
    load_environment,
)
from rollnet.reference.envs.reverse import ReverseEnvironment, reverse_similarity
from rollnet.reference.envs.sandbox import (
    DEFAULT_SANDBOX_LIMITS,
    DEFAULT_TIME_LIMIT_S,
    IsolationMode,
    RewardItem,
    RewardResult,
    RewardSandbox,
    SandboxError,
)
from rollnet.reference.envs.verifiers_env import VerifiersEnvironment

__all__ = [
    "DEFAULT_LENGTH_PENALTY",
    "DEFAULT_SANDBOX_LIMITS",
    "DEFAULT_TIME_LIMIT_S",
    "ENTRY_POINT_GROUP",
    "LEVELS",
    "MAX_PROMPT_ID",
    "ArithmeticEnvironment",
    "CodeEnvironment",
    "ConfigReader",
    "DatasetError",
    "DrawStream",
    "Environment",
    "EnvironmentConfigError",
    "EnvironmentRegistryError",
    "IsolationMode",
    "IsolationUnavailable",
    "LengthControl",
    "Limits",
    "MathEnvironment",
    "Problem",
    "Question",
    "ReverseEnvironment",
    "RewardBreakdown",
    "RewardItem",
    "RewardResult",
    "RewardSandbox",
    "SandboxError",
    "SeededEnvironment",
    "UnknownEnvironmentError",
    "VerifierTimeout",
    "VerifiersEnvironment",
    "available_environments",
    "canonical_json",
    "config_digest",
    "extract_program",
    "load_environment",
    "protect_paths",
    "reverse_similarity",
    "score_integer_answer",
]
