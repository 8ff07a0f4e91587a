"""The validator's recomputed log-probabilities on a verdict: what the coordinator accepts.

An ACCEPT verdict may carry, per rollout in batch order, the log-probability of each completion
token that the validator's own prefill computed (``SubmitVerdictRequest.validated_logprobs``).
They reach the trainer (``AcceptedRollout.validated_logprobs``) in place of the worker's
``behaviour_logprobs``, which a worker can shade by anything under the validator's tolerance, so
the coordinator takes them only in the exact shape the batch has: one entry per rollout, one value
per completion token, each finite and at most 0. Anything else is INVALID_FIELDS, naming the
entry. The values themselves and the counts are bounds of the fields (``bounds.field_rules``,
checked before any handler); this module checks what relates them to the decision and the batch.
"""

from __future__ import annotations

from collections.abc import Sequence

from rollnet.reference.coordinator.refusal import Violations, invalid
from rollnet.v1 import validation_pb2

FIELD = "validated_logprobs"

VERDICT_BYTES_PER_ROLLOUT = 4096
"""What :func:`max_verdict_bytes` allows per rollout for its checks' results, its reward and the
framing of its log-probabilities (the reference validator's come to ~0.9 KiB)."""


def max_verdict_bytes(rollouts: int, max_new_tokens: int) -> int:
    """The largest ``SubmitVerdictRequest`` an ACCEPT of a task may need: 4 bytes (a float32)
    per completion token for the validated log-probabilities, plus
    :data:`VERDICT_BYTES_PER_ROLLOUT` per rollout. RequestRollouts refuses a task whose verdict
    could not fit in one message (``max_message_bytes``): it could never be recorded."""
    return rollouts * (4 * max_new_tokens + VERDICT_BYTES_PER_ROLLOUT)


def check_decision(
    entries: Sequence[validation_pb2.ValidatedLogprobs], accepted: bool, v: Violations
) -> None:
    """Only an ACCEPT carries them: a REJECT's would mean nothing, so it is refused rather than
    silently dropped. (Each value being finite and at most 0, and the counts, are bounds of the
    fields themselves, checked at the edge: ``bounds.field_rules``.)"""
    v.require(accepted or not entries, FIELD, "only an ACCEPT carries validated log-probabilities")


def check_shape(
    entries: Sequence[validation_pb2.ValidatedLogprobs], completion_tokens: Sequence[int]
) -> None:
    """One entry per rollout of the batch, with one value per completion token of that rollout
    or none (a rollout the job's challenge did not draw, which the validator did not prefill);
    raises INVALID_FIELDS naming every entry that is off."""
    if not entries:
        return
    if len(entries) != len(completion_tokens):
        raise invalid(
            (
                FIELD,
                f"length {len(entries)}, but the batch has {len(completion_tokens)} rollouts: "
                "one entry per rollout, in batch order",
            )
        )
    v = Violations()
    for index, (entry, tokens) in enumerate(zip(entries, completion_tokens, strict=True)):
        v.require(
            len(entry.logprobs) in (0, tokens),
            f"{FIELD}[{index}].logprobs",
            f"length {len(entry.logprobs)}, but rollout {index} has {tokens} completion "
            "tokens: one value per token (none for a rollout the challenge did not draw)",
        )
    v.raise_if_any()


__all__ = [
    "FIELD",
    "VERDICT_BYTES_PER_ROLLOUT",
    "check_decision",
    "check_shape",
    "max_verdict_bytes",
]
