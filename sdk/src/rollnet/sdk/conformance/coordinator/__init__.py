"""The coordinator suite: each case one documented behaviour of docs/protocol.md, checked over the
wire against any coordinator.

Cases run in the order listed, each with its own new worker keys, so one case's refusal does not
spoil the next. They change the target — they publish checkpoints, queue tasks, credit and slash
made-up work, eject and ban keys, and (last) exhaust the registration rate limit — so run the
suite against a deployment made for it, never against a network in use.

The cases live in one module per area (``*_cases``), imported here in the order they run.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence

from rollnet.sdk.conformance.coordinator._base import CASES, SUITE, C, case, expect
from rollnet.sdk.conformance.suite import Report, Result, run_cases, select
from rollnet.sdk.conformance.target import Target, TargetConfig
from rollnet.sdk.errors import RollnetError

AREAS = (
    "health",
    "registration",
    "auth",
    "node",
    "dispatch",
    "blob",
    "commitment",
    "validation",
    "checkpoint",
    "rollouts",
    "ledger",
    "malformed",
    # Last: it exhausts the target's registration rate limit.
    "rate_limit",
)
"""The case modules (``<area>_cases``), in the order their cases are added to :data:`CASES`
and run."""

for _area in AREAS:
    importlib.import_module(f"{__name__}.{_area}_cases")


async def unreachable(config: TargetConfig) -> str | None:
    """Why the target cannot be asked anything (no connection within ``call_timeout``), or
    ``None`` when Health/Check answers (SERVING or not: the health cases judge that)."""
    target = Target(config)
    try:
        await target.health()
    except RollnetError as error:
        if error.code in (C.UNAVAILABLE, C.DEADLINE_EXCEEDED) and error.status is None:
            return f"{error.code.name}: {error.message}"
    finally:
        await target.close()
    return None


async def run_coordinator_suite(
    config: TargetConfig,
    *,
    patterns: Sequence[str] = (),
    skip: Sequence[str] = (),
    on_result: Callable[[Result], None] | None = None,
) -> Report:
    """Run the coordinator suite (or the cases ``patterns`` select, less those ``skip`` names)
    against ``config``."""
    target = Target(config)
    try:
        return await run_cases(SUITE, select(CASES, patterns, skip), target, on_result=on_result)
    finally:
        await target.close()


__all__ = ["CASES", "SUITE", "case", "expect", "run_coordinator_suite", "unreachable"]
