"""Conformance suites: do a coordinator (or, later, a worker) speak rollnet v1 as documented?

Black-box and over the wire: the suites use the generated messages, the SDK's signing and binding
code, and the documents in ``docs/`` — never a coordinator's own code — so they check any
implementation, in any language. ``rollnet conformance coordinator`` is the command line;
:func:`run_coordinator_suite` the same from Python.
"""

from rollnet.sdk.conformance.coordinator import CASES, run_coordinator_suite, unreachable
from rollnet.sdk.conformance.suite import (
    Case,
    CaseFailure,
    Outcome,
    Report,
    Result,
    Skipped,
    format_result,
)
from rollnet.sdk.conformance.target import ROLE_NAMES, TargetConfig

__all__ = [
    "CASES",
    "ROLE_NAMES",
    "Case",
    "CaseFailure",
    "Outcome",
    "Report",
    "Result",
    "Skipped",
    "TargetConfig",
    "format_result",
    "run_coordinator_suite",
    "unreachable",
]
