"""Every domain-separation string of the protocol, in one place.

A domain names the purpose (and version) of a hash or signature, so that bytes made for one
purpose can never be accepted for another. The values are protocol: each is specified in
``docs/protocol.md`` or ``docs/verification.md`` and pinned by ``protos/rollnet/v1/vectors.json``;
changing one breaks every other implementation. They come in the styles their rules were
written in, kept as they are:

* ``str`` domains, hashed as the first tagged field of :func:`rollnet.sdk.proofs.binding.
  domain_digest` (``rollnet/v1/...``);
* ``bytes`` prefixes, prepended to the message signed or hashed (some end in ``\\n``, some in
  ``\\x00``, some in nothing: the separator is part of the value).
"""

from __future__ import annotations

from typing import Final

# ---------------------------------------------------------------- digests of the binding encoding

COMMITMENT_DOMAIN: Final = "rollnet/v1/rollout-commitment"
"""The per-rollout commitment digest a worker signs."""
SEED_DOMAIN: Final = "rollnet/v1/task-sampling-seed"
"""The seed rule's domain. rollnet 0.1.0 derived seeds from the lease instead (domain
``rollnet/v1/sampling-seed``: network, node, task, lease id, fencing token, index), so giving a task
back re-rolled them; such seeds are now refused with ``SEED_NOT_DERIVED``."""
TOKENS_DOMAIN: Final = "rollnet/v1/rollout-tokens"
"""A rollout's token ids, inside its commitment digest."""
PROOF_DOMAIN: Final = "rollnet/v1/toploc-proof"
"""A rollout's TOPLOC proof bytes (``RolloutDigest.proof_blake3``)."""
BATCH_BINDING_DOMAIN: Final = "rollnet/v1/batch-commitment"
"""The commitment's binding digest (network, node, task, lease, token, blob)."""
CHALLENGE_DOMAIN: Final = "rollnet/v1/validation-challenge"
"""The message the coordinator signs; its signature is the challenge."""
CHALLENGE_DRAW_DOMAIN: Final = "rollnet/v1/challenge-draw"
"""Each rollout's draw key under a challenge."""

# ---------------------------------------------------------------- prefixes of signed bytes

SIGNING_DOMAIN: Final = b"rollnet-request-v1"
"""First line of every signed request's bytes."""
NODE_ID_DOMAIN: Final = b"rollnet-node-id-v1"
"""Hashed in front of the public key to derive a node id."""
RECEIPT_DOMAIN: Final = b"rollnet-receipt-v1\n"
"""Prefix of the bytes a commitment receipt's signature covers."""
CHECKPOINT_DOMAIN: Final = b"rollnet-checkpoint-v1\n"
"""Prefix of the bytes a trainer signs: ``CHECKPOINT_DOMAIN + manifest``."""
LEDGER_ENTRY_DOMAIN: Final = b"rollnet.ledger.entry"
"""Opens every canonical ledger entry."""
LEDGER_HEAD_DOMAIN: Final = b"rollnet.ledger.chain-head"
"""Opens every signed ledger chain-head message."""

# ---------------------------------------------------------------- environments

CONFIG_DIGEST_DOMAIN: Final = b"rollnet.environment-config.v1\x00"
"""Prefix of an environment config's digest."""
DRAW_DOMAIN: Final = b"rollnet.environment-draw.v1\x00"
"""Prefix of every environment draw stream."""
TASKS_DIGEST_DOMAIN: Final = b"rollnet.verifiers-tasks.v1\x00"
"""Prefix of a verifiers environment's task listing digest."""
PACKAGE_DIGEST_DOMAIN: Final = b"rollnet.verifiers-package.v1\x00"
"""Prefix of a verifiers environment's package distribution digest."""

__all__ = [
    "BATCH_BINDING_DOMAIN",
    "CHALLENGE_DOMAIN",
    "CHALLENGE_DRAW_DOMAIN",
    "CHECKPOINT_DOMAIN",
    "COMMITMENT_DOMAIN",
    "CONFIG_DIGEST_DOMAIN",
    "DRAW_DOMAIN",
    "LEDGER_ENTRY_DOMAIN",
    "LEDGER_HEAD_DOMAIN",
    "NODE_ID_DOMAIN",
    "PACKAGE_DIGEST_DOMAIN",
    "PROOF_DOMAIN",
    "RECEIPT_DOMAIN",
    "SEED_DOMAIN",
    "SIGNING_DOMAIN",
    "TASKS_DIGEST_DOMAIN",
    "TOKENS_DOMAIN",
]
