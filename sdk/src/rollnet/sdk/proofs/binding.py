"""Commitment digests that bind a rollout to its node, lease and task, and the sampling seeds
that bind it to its task alone.

Every value is encoded before hashing with one unambiguous rule (documented byte for byte in
``docs/verification.md``), so a digest can be recomputed in any language:

* ``str``  -> tag ``0x01``, 4-byte big-endian byte length, UTF-8 bytes
* ``bytes`` -> tag ``0x02``, 4-byte big-endian length, the bytes
* ``int``  -> tag ``0x03``, 8-byte big-endian two's-complement (must fit in int64)

A message is a domain string (encoded as ``str``) followed by its fields in a fixed order, and the
digest is BLAKE3-256 of the concatenation. The domain names the purpose and version, so a digest
made for one purpose can never be accepted for another.
"""

from __future__ import annotations

import functools
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import blake3

from rollnet.sdk.domains import COMMITMENT_DOMAIN, PROOF_DOMAIN, TOKENS_DOMAIN
from rollnet.sdk.domains import SEED_DOMAIN as SEED_DOMAIN  # still imported from here by some
from rollnet.sdk.proofs.report import CheckName, CheckResult, Figure, Reason

_STR, _BYTES, _INT = b"\x01", b"\x02", b"\x03"


def encode_field(value: str | bytes | int) -> bytes:
    """The tagged, length-prefixed encoding of one field."""
    if isinstance(value, bool):
        raise TypeError("booleans are not binding fields; use an int")
    if isinstance(value, int):
        return _INT + struct.pack(">q", value)
    if isinstance(value, str):
        data = value.encode("utf-8")
        return _STR + struct.pack(">I", len(data)) + data
    if isinstance(value, bytes):
        return _BYTES + struct.pack(">I", len(value)) + value
    raise TypeError(f"cannot encode {type(value).__name__}")


def domain_digest(domain: str, fields: Sequence[str | bytes | int]) -> bytes:
    """BLAKE3-256 of the domain followed by the fields, each encoded by :func:`encode_field`."""
    hasher = blake3.blake3()
    hasher.update(encode_field(domain))
    for value in fields:
        hasher.update(encode_field(value))
    return bytes(hasher.digest())


@dataclass(frozen=True)
class LeaseBinding:
    """What the coordinator assigned: who works on which task under which lease attempt."""

    network_id: str
    node_id: str
    task_id: str
    lease_id: str
    fencing_token: int


def derive_sampling_seed(network_id: str, task_id: str, rollout_index: int) -> int:
    """The Gumbel seed of one rollout of a task: first 8 digest bytes, top bit cleared.

    BLAKE3-256 of the domain ``rollnet/v1/task-sampling-seed``, the network id, the task id and
    the rollout index. The seed depends on nothing a worker controls or can change by retrying:
    not the node, not the lease, not the attempt. A task given back (FailTask), or whose lease
    expired, is sampled with the same seeds by whoever leases it next, so re-leasing cannot shop
    for lucky seeds; a rollout sampled for one task or index still fails the sampling check on
    any other.
    """
    if not isinstance(rollout_index, int) or isinstance(rollout_index, bool) or rollout_index < 0:
        raise ValueError(f"rollout_index must be a non-negative int, not {rollout_index!r}")
    hasher = blake3.blake3(_task_prefix(network_id, task_id))
    hasher.update(encode_field(rollout_index))
    return int.from_bytes(hasher.digest()[:8], "big") >> 1


@functools.lru_cache(maxsize=256)
def _task_prefix(network_id: str, task_id: str) -> bytes:
    """The encoded seed domain, network and task: the same for every rollout of a task."""
    return b"".join(encode_field(value) for value in (SEED_DOMAIN, network_id, task_id))


@functools.lru_cache(maxsize=256)
def _lease_prefix(domain: str, lease: LeaseBinding) -> bytes:
    """The encoded domain and lease fields that start a commitment message: the same for every
    rollout of a lease, so a validator encodes them once per job."""
    fields = (lease.network_id, lease.node_id, lease.task_id, lease.lease_id, lease.fencing_token)
    return b"".join(encode_field(value) for value in (domain, *fields))


def _token_bytes(ids: Sequence[int]) -> bytes:
    return struct.pack(f"<{len(ids)}I", *ids)


def tokens_digest(prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> bytes:
    """BLAKE3 of a rollout's token ids (each list as little-endian uint32s, length-prefixed)."""
    return domain_digest(TOKENS_DOMAIN, [_token_bytes(prompt_ids), _token_bytes(completion_ids)])


def proof_digest(proof: bytes) -> bytes:
    """The proof digest (``RolloutDigest.proof_blake3``): the domain-tagged BLAKE3 of a rollout's
    TOPLOC proof bytes (domain ``rollnet/v1/toploc-proof``), not their plain BLAKE3."""
    return domain_digest(PROOF_DOMAIN, [proof])


def commitment_digest(
    lease: LeaseBinding,
    *,
    blob_blake3: bytes,
    rollout_index: int,
    sampling_seed: int,
    prompt_ids: Sequence[int],
    completion_ids: Sequence[int],
    proof: bytes,
) -> bytes:
    """The digest a worker signs for one rollout: binds lease, blob, index, seed, tokens, proof."""
    hasher = blake3.blake3(_lease_prefix(COMMITMENT_DOMAIN, lease))
    for value in (
        blob_blake3,
        rollout_index,
        sampling_seed,
        tokens_digest(prompt_ids, completion_ids),
        proof_digest(proof),
    ):
        hasher.update(encode_field(value))
    return bytes(hasher.digest())


def check_binding(
    lease: LeaseBinding,
    *,
    blob_blake3: bytes,
    rollout_index: int,
    claimed_seed: int,
    claimed_digest: bytes,
    prompt_ids: Sequence[int],
    completion_ids: Sequence[int],
    proof: bytes,
) -> CheckResult:
    """The commitment digest matches this lease and rollout, and the seed is the derived one
    (:func:`derive_sampling_seed` of the lease's network, its task and the rollout index)."""
    expected_seed = derive_sampling_seed(lease.network_id, lease.task_id, rollout_index)
    expected_digest = commitment_digest(
        lease,
        blob_blake3=blob_blake3,
        rollout_index=rollout_index,
        sampling_seed=claimed_seed,
        prompt_ids=prompt_ids,
        completion_ids=completion_ids,
        proof=proof,
    )
    figures: dict[str, Figure] = {
        "rollout_index": rollout_index,
        "expected_seed": expected_seed,
        "claimed_seed": claimed_seed,
    }
    if expected_digest != claimed_digest:
        return CheckResult(
            CheckName.BINDING,
            False,
            Reason.COMMITMENT_DIGEST_MISMATCH,
            figures,
            "commitment digest does not match this node, lease, task, blob and rollout",
        )
    if claimed_seed != expected_seed:
        return CheckResult(
            CheckName.BINDING,
            False,
            Reason.SEED_NOT_DERIVED,
            figures,
            f"sampling seed is not the one derived for rollout {rollout_index} of task "
            f"{lease.task_id!r}: expected BLAKE3({SEED_DOMAIN!r}, network id, task id, rollout "
            "index)[:8] >> 1 (docs/verification.md, Binding); lease-derived seeds "
            "(rollnet/v1/sampling-seed, rollnet 0.1.0) are no longer accepted",
        )
    return CheckResult(CheckName.BINDING, True, None, figures)
