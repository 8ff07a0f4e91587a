"""The outcome of verifying one rollout: every check with its figures, and a verdict."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum

Figure = int | float | str
"""A number (or short label) a check measured."""


class CheckName(StrEnum):
    """The checks, in the order :func:`~rollnet.sdk.proofs.verify.verify_rollout` runs them."""

    BINDING = "binding"
    ASSIGNED_DATA = "assigned_data"
    TERMINATION = "termination"
    TOPLOC = "toploc"
    SAMPLING = "sampling"


class Reason(StrEnum):
    """Why a check failed: stable constants for verdicts, ledgers and dashboards."""

    COMMITMENT_DIGEST_MISMATCH = "COMMITMENT_DIGEST_MISMATCH"
    SEED_NOT_DERIVED = "SEED_NOT_DERIVED"
    PROMPT_NOT_ASSIGNED = "PROMPT_NOT_ASSIGNED"
    TOO_LONG = "TOO_LONG"
    EMPTY_COMPLETION = "EMPTY_COMPLETION"
    EOS_BEFORE_END = "EOS_BEFORE_END"
    TRUNCATED = "TRUNCATED"
    FINISH_REASON_MISMATCH = "FINISH_REASON_MISMATCH"
    EOS_IMPROBABLE = "EOS_IMPROBABLE"
    PROOF_MALFORMED = "PROOF_MALFORMED"
    EXPONENT_MISMATCH = "EXPONENT_MISMATCH"
    MANTISSA_ERROR_MEAN = "MANTISSA_ERROR_MEAN"
    MANTISSA_ERROR_MEDIAN = "MANTISSA_ERROR_MEDIAN"
    SIGN_MISMATCH = "SIGN_MISMATCH"
    UNEXPLAINED_MISMATCH = "UNEXPLAINED_MISMATCH"
    TOKEN_NOT_SAMPLED = "TOKEN_NOT_SAMPLED"
    TOKEN_OUT_OF_VOCABULARY = "TOKEN_OUT_OF_VOCABULARY"


class Verdict(StrEnum):
    """Accept the rollout (every check passed) or reject it."""

    ACCEPT = "accept"
    REJECT = "reject"


@dataclass(frozen=True)
class CheckResult:
    """One check: whether it passed, why not, and the figures it measured."""

    name: CheckName
    passed: bool
    reason: Reason | None = None
    figures: Mapping[str, Figure] = field(default_factory=dict)
    detail: str = ""


@dataclass(frozen=True)
class VerificationReport:
    """Every check's result for one rollout; the verdict is ACCEPT only if all passed."""

    checks: tuple[CheckResult, ...]

    @property
    def verdict(self) -> Verdict:
        """ACCEPT when every check passed."""
        return Verdict.ACCEPT if all(c.passed for c in self.checks) else Verdict.REJECT

    @property
    def accepted(self) -> bool:
        """True when the verdict is ACCEPT."""
        return self.verdict is Verdict.ACCEPT

    @property
    def failed(self) -> tuple[CheckResult, ...]:
        """The checks that failed, in run order."""
        return tuple(c for c in self.checks if not c.passed)

    @property
    def failed_names(self) -> frozenset[CheckName]:
        """Names of the failed checks."""
        return frozenset(c.name for c in self.failed)

    @property
    def first_failure(self) -> CheckResult | None:
        """The first failed check in run order, or None if the rollout is accepted."""
        failed = self.failed
        return failed[0] if failed else None

    def check(self, name: CheckName) -> CheckResult:
        """The result of the named check."""
        for result in self.checks:
            if result.name is name:
                return result
        raise KeyError(name)

    def summary(self) -> str:
        """One line: the verdict and, for a reject, each failed check with its reason."""
        if self.accepted:
            return "accept"
        parts = [f"{c.name.value}:{c.reason.value if c.reason else '?'}" for c in self.failed]
        return "reject " + " ".join(parts)
