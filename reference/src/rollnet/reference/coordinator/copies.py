"""Copies: a commitment whose rollouts repeat, token for token, completions already committed.

Sampling seeds derive from the network, the task and the rollout index, so two honest samples
of one prompt coincide only as often as the model makes that completion likely. A match is a
copy when the completion is improbable: its log-probability (the sum of the rollout's behaviour
log-probabilities) is at most :data:`COPY_LOGPROB_MAX`, so an honest repeat of it has a chance
below ``exp(COPY_LOGPROB_MAX)`` per earlier sample. Short or confident completions (a lone EOS,
the one right answer of a trained model) repeat honestly all the time and are never flagged.

For the same prompt (tokens digest) the original's claimed log-probability counts too (the
lower of the two): a copier cannot make a copy look likely by shading its own claims. For the
same completion under another prompt only the new rollout's own claim can say how likely it is
there. A worker that inflates its claims is the validator's to catch (``LOGPROBS_MISMATCH``).

Figures behind the threshold: ``docs/verification.md``, "Copies across identities".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.orm import Session

from rollnet.ledger import fingerprints as index
from rollnet.ledger.fingerprints import Fingerprint, Original
from rollnet.sdk.proofs import tokens_digest
from rollnet.v1 import rollout_pb2

#: A repeated completion this improbable (natural log; e^-20 ~ 2.1e-9) is a copy.
COPY_LOGPROB_MAX = -20.0
#: Stands in for the log-probability of a rollout whose behaviour log-probs are missing or
#: malformed: nothing says it is likely, so a repeat of it is a copy.
_UNKNOWN_LOGPROB = -1e9
#: Originals read from the copy index per rollout of a commitment, at most. Each one read makes
#: its rollout a copy, so this bounds only how many the refusal can name and count.
ORIGINALS_PER_ROLLOUT = 4


@dataclass(frozen=True, slots=True)
class Copy:
    """A rollout of the new commitment that repeats an improbable completion."""

    rollout_index: int
    #: What it repeats, for the refusal message: "rollout 3 of commitment c1 (node ...)".
    original: str
    logprob_sum: float


def fingerprint(index: int, rollout: rollout_pb2.Rollout) -> Fingerprint:
    """The digests and claimed log-probability of one rollout."""
    completion = rollout.completion_token_ids
    logprobs = rollout.behaviour_logprobs
    total = math.fsum(logprobs) if len(logprobs) == len(completion) else _UNKNOWN_LOGPROB
    if not math.isfinite(total) or total > 0:
        total = _UNKNOWN_LOGPROB
    return Fingerprint(
        rollout_index=index,
        tokens_blake3=tokens_digest(rollout.prompt_token_ids, completion),
        completion_blake3=tokens_digest((), completion),
        logprob_sum=max(total, _UNKNOWN_LOGPROB),
    )


def fingerprints(batch: rollout_pb2.RolloutBatch) -> list[Fingerprint]:
    """The fingerprint of every rollout of ``batch``, in order."""
    return [fingerprint(index, rollout) for index, rollout in enumerate(batch.rollouts)]


def originals(session: Session, prints: Sequence[Fingerprint]) -> list[Original]:
    """The indexed rollouts that ``prints`` repeat improbably (what :func:`find_copies` needs)."""
    return index.find_originals(
        session,
        prints,
        improbable=COPY_LOGPROB_MAX,
        limit=ORIGINALS_PER_ROLLOUT * max(len(prints), 1),
    )


def find_copies(prints: Sequence[Fingerprint], originals: Sequence[Original]) -> list[Copy]:
    """The rollouts of ``prints`` that are copies of ``originals`` or of an earlier rollout of
    the same batch, in rollout order (at most one finding per rollout)."""
    by_tokens: dict[bytes, list[tuple[str, float]]] = {}
    by_completion: dict[bytes, list[str]] = {}
    for o in originals:
        name = f"rollout {o.rollout_index} of commitment {o.commitment_id} (node {o.node_id})"
        by_tokens.setdefault(o.tokens_blake3, []).append((name, o.logprob_sum))
        by_completion.setdefault(o.completion_blake3, []).append(name)
    copies: list[Copy] = []
    for p in prints:
        found = _match(p, by_tokens, by_completion)
        if found is not None:
            copies.append(Copy(p.rollout_index, found, p.logprob_sum))
        # Later rollouts of this batch are checked against this one too (sample reuse).
        name = f"rollout {p.rollout_index} of this batch"
        by_tokens.setdefault(p.tokens_blake3, []).append((name, p.logprob_sum))
        by_completion.setdefault(p.completion_blake3, []).append(name)
    return copies


def _match(
    p: Fingerprint,
    by_tokens: dict[bytes, list[tuple[str, float]]],
    by_completion: dict[bytes, list[str]],
) -> str | None:
    for name, logprob_sum in by_tokens.get(p.tokens_blake3, ()):
        if min(p.logprob_sum, logprob_sum) <= COPY_LOGPROB_MAX:
            return name
    if p.logprob_sum <= COPY_LOGPROB_MAX:
        for name in by_completion.get(p.completion_blake3, ()):
            return name
    return None


def refusal_message(copies: Sequence[Copy]) -> str:
    """One line naming the copied rollouts (at most three) and what they repeat."""
    first = copies[0]
    more = f" (and {len(copies) - 1} more rollouts)" if len(copies) > 1 else ""
    return (
        f"rollouts[{first.rollout_index}] repeats {first.original} token for token, a "
        f"completion of log-probability {first.logprob_sum:.1f} (an honest repeat is below "
        f"e^{COPY_LOGPROB_MAX:.0f}): a copy{more}; the lease is taken back"
    )
