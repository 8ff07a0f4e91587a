"""Termination check: a rollout ends with a probable EOS or at the length limit, never truncated.

Also the protocol's two termination rules (docs/protocol.md, "End of sequence"), written once so
a worker and its validator cannot disagree: which token ids end a completion
(:func:`eos_token_ids`, :func:`checkpoint_eos_token_ids`) and which finish reason a completion
has (:func:`finish_reason`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from rollnet.sdk.proofs.report import CheckName, CheckResult, Figure, Reason
from rollnet.sdk.proofs.sampling import log_softmax
from rollnet.sdk.proofs.thresholds import Thresholds, logprob_bounds, sampling_tolerances

FINISH_EOS = "eos"
"""Finish reason: the last token is an end-of-sequence token."""
FINISH_LENGTH = "length"
"""Finish reason: the completion reached ``max_new_tokens``."""


def _eos_field(document: Mapping[str, Any], source: str) -> set[int]:
    value = document.get("eos_token_id")
    if value is None:
        return set()
    values = value if isinstance(value, list) else [value]
    for item in values:
        # JSON booleans are not token ids, nor are fractions or negative numbers.
        if isinstance(item, bool) or not isinstance(item, int) or item < 0:
            raise ValueError(
                f"{source}: eos_token_id must be a token id, a list of token ids or null, "
                f"not {value!r}"
            )
    return set(values)


def eos_token_ids(
    config: Mapping[str, Any], generation_config: Mapping[str, Any] | None = None
) -> frozenset[int]:
    """The token ids that end a completion, from a checkpoint's parsed JSON files.

    The union of the top-level ``eos_token_id`` of ``config.json`` and of
    ``generation_config.json`` (when the checkpoint has one): each a non-negative integer, a list
    of them, ``null`` or absent (nothing). Nothing else counts: not the tokenizer's
    ``eos_token``, not a nested ``text_config``, not a library's defaults for the model class.
    Chat checkpoints list their end-of-turn token in ``generation_config.json`` only. An empty
    set is allowed: every completion then runs to ``max_new_tokens``.
    Raises ``ValueError`` for any other value.
    """
    ids = _eos_field(config, "config.json")
    if generation_config is not None:
        ids |= _eos_field(generation_config, "generation_config.json")
    return frozenset(ids)


def checkpoint_eos_token_ids(directory: str | os.PathLike[str]) -> frozenset[int]:
    """:func:`eos_token_ids` of a checkpoint directory (``config.json`` must exist;
    ``generation_config.json`` may). Raises ``ValueError`` for a file that is not a JSON object."""
    documents: list[Mapping[str, Any] | None] = []
    for name, required in (("config.json", True), ("generation_config.json", False)):
        path = Path(directory) / name
        if not required and not path.is_file():
            documents.append(None)
            continue
        document = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(document, dict):
            raise ValueError(f"{path}: not a JSON object")
        documents.append(document)
    config, generation_config = documents
    assert config is not None
    return eos_token_ids(config, generation_config)


def finish_reason(
    completion_ids: Sequence[int], eos_token_ids: Collection[int], max_new_tokens: int
) -> str | None:
    """The finish reason a completion must claim, or ``None`` when no reason is right.

    ``"eos"`` when its last token is an EOS token, whatever its length (a completion of exactly
    ``max_new_tokens`` tokens that ends with EOS is ``"eos"``); ``"length"`` when it has exactly
    ``max_new_tokens`` tokens and does not end with EOS; ``None`` when it is empty, longer than
    the limit, or shorter without ending in EOS (truncated). An EOS before the last token is the
    termination check's business (``EOS_BEFORE_END``), not this function's.
    """
    if not completion_ids or len(completion_ids) > max_new_tokens:
        return None
    if completion_ids[-1] in eos_token_ids:
        return FINISH_EOS
    return FINISH_LENGTH if len(completion_ids) == max_new_tokens else None


def eos_probabilities(
    last_logits: npt.ArrayLike, eos_token_ids: Collection[int], temperature: float
) -> npt.NDArray[np.float64]:
    """Probability (at ``temperature``) of the EOS tokens under each row of logits ``[N, V]``."""
    rows = np.asarray(last_logits, dtype=np.float64)
    logprobs = log_softmax(rows / temperature)
    return np.asarray(np.exp(logprobs[..., list(eos_token_ids)]).sum(axis=-1), dtype=np.float64)


def eos_probability_bounds(
    last_logits: npt.ArrayLike,
    eos_token_ids: Collection[int],
    temperature: float,
    thresholds: Thresholds,
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Per row of logits ``[N, V]``: the EOS set's probability at ``temperature`` and the highest
    probability an honest worker's logits could have given it under the error model
    (:func:`~rollnet.sdk.proofs.thresholds.logprob_bounds`, every EOS logit raised by the
    row's tolerance against every other token)."""
    rows = np.atleast_2d(np.asarray(last_logits, dtype=np.float64))
    probability = eos_probabilities(rows, eos_token_ids, temperature)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        # L = log(P(not EOS) / P(EOS)); log1p keeps a small EOS probability exact.
        others = np.log1p(-probability) - np.log(probability)
        _, upper = logprob_bounds(others, sampling_tolerances(rows, temperature, thresholds))
    return probability, np.exp(np.minimum(upper, 0.0))


def check_termination(
    completion_ids: Sequence[int],
    *,
    finish_reason: str,
    eos_token_ids: Collection[int],
    max_new_tokens: int,
    last_logits: npt.ArrayLike,
    temperature: float,
    thresholds: Thresholds,
    eos_probability: float | None = None,
    eos_probability_upper: float | None = None,
    eos_margin: float | None = None,
    eos_tolerance: float | None = None,
) -> CheckResult:
    """The rollout ends with a probable EOS, or at exactly the length limit; no EOS before the end.

    ``last_logits`` are the validator's logits [V] at the row that chose the final token;
    ``eos_probability`` and ``eos_probability_upper``, when given, are
    :func:`eos_probability_bounds` of them, computed in advance (for many rollouts at once) and
    used instead.

    ``eos_margin`` is the final token's seeded Gumbel-max margin from the sampling check, when
    known. A final EOS that won that draw by at least its row's sampling tolerance
    (:func:`~rollnet.sdk.proofs.thresholds.sampling_tolerances`) was sampled, and honest
    sampling draws an EOS of any probability now and then: the probability floor then does not
    apply (it would reject honest rollouts at a rate of up to one per
    ``1 / min_eos_probability`` EOS draws). It applies where the sampling check cannot tell
    (the EOS won within the tolerance, or no margin is given), to the highest EOS probability
    the error model allows: an EOS the worker's logits made probable enough is not rejected
    because the validator's, within honest noise, make it less so (at a tiny temperature that
    noise moves probabilities by orders of magnitude).

    ``eos_tolerance``, when given, is that sampling tolerance of ``last_logits``, computed in
    advance (with the margins) and used instead.
    """
    length = len(completion_ids)
    figures: dict[str, Figure] = {"completion_tokens": length, "max_new_tokens": max_new_tokens}

    def fail(reason: Reason, detail: str) -> CheckResult:
        return CheckResult(CheckName.TERMINATION, False, reason, figures, detail)

    if length == 0:
        return fail(Reason.EMPTY_COMPLETION, "completion is empty")
    if length > max_new_tokens:
        return fail(Reason.TOO_LONG, "completion is longer than the limit")
    early = [i for i, t in enumerate(completion_ids[:-1]) if t in eos_token_ids]
    if early:
        figures["first_eos"] = early[0]
        return fail(Reason.EOS_BEFORE_END, "EOS inside the completion")
    ends_with_eos = completion_ids[-1] in eos_token_ids
    if ends_with_eos:
        if eos_probability is None or eos_probability_upper is None:
            low, high = eos_probability_bounds(last_logits, eos_token_ids, temperature, thresholds)
            eos_probability, eos_probability_upper = float(low[0]), float(high[0])
        figures["eos_probability"] = eos_probability
        figures["eos_probability_upper"] = eos_probability_upper
        if finish_reason != FINISH_EOS:
            return fail(Reason.FINISH_REASON_MISMATCH, "ends with EOS but claims another reason")
        tolerance = (
            float(sampling_tolerances(last_logits, temperature, thresholds))
            if eos_tolerance is None
            else eos_tolerance
        )
        # Written so that NaN fails (a margin, tolerance or probability that is not a number
        # proves nothing).
        sampled = eos_margin is not None and eos_margin >= tolerance
        if not sampled and not eos_probability_upper >= thresholds.min_eos_probability:
            return fail(Reason.EOS_IMPROBABLE, "final EOS is improbable under the model")
        return CheckResult(CheckName.TERMINATION, True, None, figures)
    if length < max_new_tokens:
        return fail(Reason.TRUNCATED, "ends without EOS before the length limit")
    if finish_reason != FINISH_LENGTH:
        return fail(Reason.FINISH_REASON_MISMATCH, "hit the length limit but claims another reason")
    return CheckResult(CheckName.TERMINATION, True, None, figures)
