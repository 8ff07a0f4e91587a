"""Post-commitment challenges: which rollouts of a batch a validator checks in full.

Everything in a rollout batch is fixed when the worker commits, so any check whose scope the
worker could compute in advance could be steered around (cheat only where nobody looks). A
challenge is drawn *after* the commitment is recorded, from randomness the worker cannot know:

* the coordinator signs, with its Ed25519 key (the one that signs receipts and chain heads),
  the :func:`challenge_message` of the commitment — network id, commitment id (the coordinator's
  own random id), the batch's binding digest, the batch's rollout count and how many of them
  are to be checked. Ed25519 signatures (RFC 8032) are deterministic: the same job always gets
  the same challenge, on every lease of it, yet nobody without the private key can compute
  it (its nonce is a hash of a secret half of the key and the message) — so the worker, which
  committed before the signature existed, cannot predict it, and anyone with the coordinator's
  public key can check it (:func:`verify_challenge`);
* the challenged rollouts are the ``k`` indexes whose draw keys
  ``BLAKE3(domain "rollnet/v1/challenge-draw", signature, index)`` are smallest
  (:func:`challenged_rollouts`): a uniform sample of ``k`` of ``n`` without replacement, the
  same in any language.

The signed message and the draw keys are domain-separated BLAKE3 digests in the encoding of
:mod:`rollnet.sdk.proofs.binding` (``docs/verification.md``, "Post-commitment challenges").
"""

from __future__ import annotations

from collections.abc import Callable
from math import comb

from rollnet.sdk.domains import CHALLENGE_DOMAIN, CHALLENGE_DRAW_DOMAIN
from rollnet.sdk.identity import verify_signature
from rollnet.sdk.proofs.binding import domain_digest

CHALLENGE_BYTES = 64
"""An Ed25519 signature's size: the challenge's."""


def challenge_message(
    network_id: str,
    commitment_id: str,
    binding_digest: bytes,
    rollouts: int,
    challenged: int,
) -> bytes:
    """The 32 bytes the coordinator signs: the commitment (network, id, binding digest), the
    batch's rollout count and how many rollouts the validator checks in full."""
    if not 0 <= challenged <= rollouts:
        raise ValueError(f"challenged rollouts {challenged} is not within 0..{rollouts}")
    return domain_digest(
        CHALLENGE_DOMAIN, [network_id, commitment_id, binding_digest, rollouts, challenged]
    )


def sign_challenge(
    sign: Callable[[bytes], bytes],
    network_id: str,
    commitment_id: str,
    binding_digest: bytes,
    rollouts: int,
    challenged: int,
) -> bytes:
    """The challenge of a commitment: ``sign`` (the coordinator's Ed25519 signer) of its
    :func:`challenge_message`."""
    return sign(challenge_message(network_id, commitment_id, binding_digest, rollouts, challenged))


def verify_challenge(
    coordinator_public_key: bytes,
    challenge: bytes,
    network_id: str,
    commitment_id: str,
    binding_digest: bytes,
    rollouts: int,
    challenged: int,
) -> bool:
    """Whether ``challenge`` is the coordinator's signature of this commitment's challenge."""
    if len(challenge) != CHALLENGE_BYTES or not 0 <= challenged <= rollouts:
        return False
    message = challenge_message(network_id, commitment_id, binding_digest, rollouts, challenged)
    return verify_signature(coordinator_public_key, challenge, message)


def challenged_rollouts(challenge: bytes, rollouts: int, challenged: int) -> tuple[int, ...]:
    """The indexes (ascending) of the rollouts checked in full: the ``challenged`` of
    ``range(rollouts)`` with the smallest draw keys; every index when ``challenged`` is 0 or
    at least ``rollouts``."""
    if challenged <= 0 or challenged >= rollouts:
        return tuple(range(rollouts))
    keys = sorted(
        (domain_digest(CHALLENGE_DRAW_DOMAIN, [challenge, index]), index)
        for index in range(rollouts)
    )
    return tuple(sorted(index for _, index in keys[:challenged]))


def detection_probability(
    rollouts: int, cheated: int, challenged: int, check_probability: float = 1.0
) -> float:
    """The probability that one commitment whose batch has ``cheated`` bad rollouts of
    ``rollouts`` is rejected: it is checked (``check_probability``, the spot check) and at least
    one bad rollout is among the ``challenged`` (every one when 0 or ``>= rollouts``), i.e.
    ``p * (1 - C(n - m, k) / C(n, k))`` (hypergeometric: ``k`` drawn without replacement)."""
    if not 0 <= cheated <= rollouts:
        raise ValueError(f"cheated rollouts {cheated} is not within 0..{rollouts}")
    k = rollouts if challenged <= 0 or challenged >= rollouts else challenged
    missed = comb(rollouts - cheated, k) / comb(rollouts, k)
    return check_probability * (1.0 - missed)


__all__ = [
    "CHALLENGE_BYTES",
    "CHALLENGE_DOMAIN",
    "CHALLENGE_DRAW_DOMAIN",
    "challenge_message",
    "challenged_rollouts",
    "detection_probability",
    "sign_challenge",
    "verify_challenge",
]
