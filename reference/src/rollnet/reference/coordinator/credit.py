"""The credit rule: what finished work earns, what a rejected commitment costs, and when a
node is ejected. Pure functions of their inputs: no session, no I/O (the verdict desk reads
the inputs and writes the decisions, :mod:`rollnet.reference.coordinator.verdicts`)."""

from __future__ import annotations

import hashlib
import math
import struct
from dataclasses import dataclass
from fractions import Fraction

from rollnet.ledger.enums import NodeState

# Work units are MFLOPs: tokens x forward FLOPs per token / 10^6.
FLOPS_PER_WORK_UNIT = 1_000_000

#: A validator earns this fraction of the work it judged (at least one unit).
VALIDATOR_REWARD_DIVISOR = 100

#: States from which a node is not ejected again (banned is for good; ejected already is).
_NOT_EJECTABLE = frozenset({NodeState.BANNED, NodeState.EJECTED})


def work_units(prefill_tokens: int, decode_tokens: int, flops_per_token: int) -> int:
    """Integer work units (MFLOPs) for a number of processed tokens."""
    return (prefill_tokens + decode_tokens) * flops_per_token // FLOPS_PER_WORK_UNIT


def spot_check_probability(streak: int, trusted_streak: int, min_rate: float) -> float:
    """BOINC-style adaptive replication: validate everything until trusted, then thin out."""
    if streak < trusted_streak:
        return 1.0
    return max(min_rate, trusted_streak / max(streak, 1))


def spot_check_draw(seed: int, commitment_id: str) -> float:
    """A reproducible uniform draw in [0, 1) for one commitment."""
    digest = hashlib.blake2b(f"{seed}:{commitment_id}".encode(), digest_size=8).digest()
    value: int = struct.unpack(">Q", digest)[0]
    return value / 2**64


def slash_amount(units: int, check_probability: float) -> int:
    """What a rejected commitment costs its node: the claimed work divided by the probability
    with which it was chosen for checking, rounded up.

    Unchecked commitments are credited, so with a slash of the work alone, cheating on work
    checked one time in ten would pay nine times over. Divided by p, a cheat's expected value is
    at most zero: (1 - p) x W credited, p x W / p slashed.
    """
    if not 0 < check_probability <= 1:
        raise ValueError(f"check probability {check_probability} is not in (0, 1]")
    # Exact rational arithmetic: no rounding of p (a tiny p, after a long streak with
    # min_validation_rate = 0, must neither divide by zero nor shrink the slash).
    return math.ceil(Fraction(units) / Fraction(check_probability))


def judged_units(
    accepted: bool, validated_tokens: int, batch_tokens: int, flops_per_token: int
) -> int:
    """Work units of the work a verdict judged: the tokens (prefill + decode) the validator
    vouched for on an accept, the tokens the commitment's batch holds on a reject."""
    return work_units(validated_tokens if accepted else batch_tokens, 0, flops_per_token)


@dataclass(frozen=True, slots=True)
class Judgement:
    """What a verdict settles on: the decision and the facts the credit rule weighs."""

    #: Whether the validator accepted the commitment.
    accepted: bool
    #: Work units of the judged work (:func:`judged_units`).
    units: int
    #: The probability with which the commitment was chosen for checking, in (0, 1].
    check_probability: float
    #: The worker's state when the verdict arrived.
    worker_state: NodeState
    #: The worker's rejected commitments, this one included when it is a reject.
    rejects: int = 0
    #: Rejects an operator forgave by reinstating the worker.
    rejects_forgiven: int = 0
    #: Whether a per-node statistics test flagged the worker with this (accepted) evidence.
    flagged: bool = False


@dataclass(frozen=True, slots=True)
class Settlement:
    """The credit rule's decisions on one verdict."""

    #: The worker's ledger amount: the units credited on an accept, the slash (negative) on
    #: a reject.
    worker_amount: int
    #: The validator's reward for judging the work.
    validator_reward: int
    #: Whether the worker is to be ejected.
    eject: bool


def settle(judgement: Judgement, *, eject_after_rejects: int) -> Settlement:
    """Credit or slash, the validator's reward, and ejection, for one verdict.

    An accept credits the judged work; it ejects only when a statistics test flagged the worker
    (the judged work stays credited). A reject slashes the judged work divided by the check
    probability (:func:`slash_amount`) and ejects once the rejects not forgiven reach
    ``eject_after_rejects``. A node already ejected or banned is not ejected again.
    """
    j = judgement
    if j.accepted:
        amount, eject = j.units, j.flagged
    else:
        amount = -slash_amount(j.units, j.check_probability)
        eject = j.rejects - j.rejects_forgiven >= eject_after_rejects
    return Settlement(
        worker_amount=amount,
        validator_reward=max(1, j.units // VALIDATOR_REWARD_DIVISOR),
        eject=eject and j.worker_state not in _NOT_EJECTABLE,
    )
