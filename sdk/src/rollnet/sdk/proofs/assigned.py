"""Assigned-data check: the prompt is exactly the one the coordinator assigned (no cherry-picks)."""

from __future__ import annotations

from collections.abc import Sequence

from rollnet.sdk.proofs.report import CheckName, CheckResult, Figure, Reason


def check_assigned_data(
    assigned_prompt_ids: Sequence[int], claimed_prompt_ids: Sequence[int]
) -> CheckResult:
    """The rollout's prompt is exactly the one the task assigned."""
    assigned, claimed = list(assigned_prompt_ids), list(claimed_prompt_ids)
    differing = sum(a != b for a, b in zip(assigned, claimed, strict=False))
    figures: dict[str, Figure] = {
        "assigned_tokens": len(assigned),
        "claimed_tokens": len(claimed),
        "differing_tokens": differing + abs(len(assigned) - len(claimed)),
    }
    if assigned != claimed:
        return CheckResult(
            CheckName.ASSIGNED_DATA,
            False,
            Reason.PROMPT_NOT_ASSIGNED,
            figures,
            "prompt differs from the task's assigned prompt",
        )
    return CheckResult(CheckName.ASSIGNED_DATA, True, None, figures)
