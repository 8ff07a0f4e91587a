"""The machinery every conformance suite shares: cases, their outcomes, the report and JUnit XML.

A case is an ``async`` function of a context. It passes by returning, fails by raising
:class:`CaseFailure` (any other exception fails it too, named as unexpected), and is skipped by
raising :class:`Skipped` — which a case does only when the operator did not give it what it needs
(a role's key, a restart hook, a setting of the target). A skipped case is never counted as passed.
"""

from __future__ import annotations

import asyncio
import enum
import time
import traceback
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar
from xml.etree import ElementTree

C = TypeVar("C")


class CaseFailure(AssertionError):
    """The target did something the protocol forbids; the message says what and what was due."""


class Skipped(Exception):
    """The case cannot run with what the operator gave the suite (the message says what is
    missing)."""


class Outcome(enum.StrEnum):
    """How a case ended."""

    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"


@dataclass(frozen=True, slots=True)
class Case(Generic[C]):
    """One conformance case: a dotted ``name`` (``group.case``), what it checks, and its body."""

    name: str
    summary: str
    body: Callable[[C], Awaitable[None]]
    timeout: float = 60.0
    """Seconds the case may take before it fails as hung."""

    @property
    def group(self) -> str:
        """The part of the name before the first dot (``auth`` of ``auth.replay``)."""
        return self.name.split(".", 1)[0]


@dataclass(frozen=True, slots=True)
class Result:
    """What one case came to."""

    name: str
    summary: str
    outcome: Outcome
    detail: str = ""
    seconds: float = 0.0


@dataclass(slots=True)
class Report:
    """Every result of a run, in order."""

    suite: str
    results: list[Result] = field(default_factory=list)

    def count(self, outcome: Outcome) -> int:
        """How many cases ended with ``outcome``."""
        return sum(1 for result in self.results if result.outcome is outcome)

    @property
    def ok(self) -> bool:
        """Whether no case failed (skipped cases do not make a run fail, nor pass it)."""
        return self.count(Outcome.FAILED) == 0

    def summary(self) -> str:
        """The closing line: ``N passed, N failed, N skipped``."""
        return (
            f"{self.count(Outcome.PASSED)} passed, {self.count(Outcome.FAILED)} failed, "
            f"{self.count(Outcome.SKIPPED)} skipped"
        )

    def junit_xml(self) -> str:
        """The report as JUnit XML (one ``testsuite``, a ``testcase`` per case)."""
        total = sum(result.seconds for result in self.results)
        suite = ElementTree.Element(
            "testsuite",
            name=self.suite,
            tests=str(len(self.results)),
            failures=str(self.count(Outcome.FAILED)),
            errors="0",
            skipped=str(self.count(Outcome.SKIPPED)),
            time=f"{total:.3f}",
        )
        for result in self.results:
            group, _, rest = result.name.partition(".")
            case = ElementTree.SubElement(
                suite,
                "testcase",
                classname=f"{self.suite}.{group}",
                name=rest or group,
                time=f"{result.seconds:.3f}",
            )
            if result.outcome is Outcome.FAILED:
                failure = ElementTree.SubElement(case, "failure", message=result.detail)
                failure.text = f"{result.summary}\n{result.detail}"
            elif result.outcome is Outcome.SKIPPED:
                ElementTree.SubElement(case, "skipped", message=result.detail)
        ElementTree.indent(suite)
        text: str = ElementTree.tostring(suite, encoding="unicode", xml_declaration=True)
        return text + "\n"


def format_result(result: Result) -> str:
    """One line: ``PASS  auth.replay  a replayed call is refused  (0.01 s)``; the detail of a
    failure or skip follows after `` — ``, on the same line."""
    label = {Outcome.PASSED: "PASS", Outcome.FAILED: "FAIL", Outcome.SKIPPED: "SKIP"}
    line = f"{label[result.outcome]}  {result.name}  {result.summary}  ({result.seconds:.2f} s)"
    if result.detail:
        line += " — " + " ".join(result.detail.split())
    return line


def _matches(name: str, pattern: str) -> bool:
    return name == pattern or name.startswith(pattern.rstrip(".") + ".")


def select(
    cases: Iterable[Case[C]], patterns: Sequence[str], skip: Sequence[str] = ()
) -> list[Case[C]]:
    """The cases whose name equals one of ``patterns`` or starts with it and a dot (``auth``
    selects every ``auth.*`` case), all of them when ``patterns`` is empty; less those that
    ``skip`` names the same way."""
    return [
        case
        for case in cases
        if (not patterns or any(_matches(case.name, p) for p in patterns))
        and not any(_matches(case.name, p) for p in skip)
    ]


async def run_case(case: Case[C], context: C) -> Result:
    """Run one case to its result; never raises (but for cancellation of the run itself)."""
    start = time.monotonic()
    try:
        await asyncio.wait_for(case.body(context), timeout=case.timeout)
    except Skipped as skipped:
        outcome, detail = Outcome.SKIPPED, str(skipped)
    except CaseFailure as failure:
        outcome, detail = Outcome.FAILED, str(failure) or "failed"
    except TimeoutError:
        outcome, detail = Outcome.FAILED, f"did not finish within {case.timeout:g} s"
    except Exception as error:  # the target broke the case in a way it did not foresee
        where = traceback.extract_tb(error.__traceback__)[-1]
        outcome, detail = (
            Outcome.FAILED,
            f"unexpected {type(error).__name__}: {error} (at {where.name}:{where.lineno})",
        )
    else:
        outcome, detail = Outcome.PASSED, ""
    return Result(case.name, case.summary, outcome, detail, time.monotonic() - start)


async def run_cases(
    suite: str,
    cases: Sequence[Case[C]],
    context: C,
    *,
    on_result: Callable[[Result], None] | None = None,
) -> Report:
    """Run ``cases`` one after another against ``context``; ``on_result`` sees each result as it
    comes (the command line prints it)."""
    report = Report(suite)
    for case in cases:
        result = await run_case(case, context)
        report.results.append(result)
        if on_result is not None:
            on_result(result)
    return report
