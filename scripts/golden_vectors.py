"""Write ``protos/rollnet/v1/vectors.json``: golden vectors computed by the SDK's own code.

Every value an implementation of the protocol must produce or check, with its inputs: node ids,
request signatures, the binding digests and sampling seeds, TOPLOC window proofs, the rollout
batch blob and its commitment, receipts, checkpoint manifests and paths, the EOS and finish
reason rules, Gumbel noise and one seeded token draw, the error details a client decodes, and
the reference environment's prompts. ``docs/protocol.md`` ("Golden vectors") tells implementers
how to read the file; ``tests/sdk/test_sdk_vectors.py`` checks the SDK against it and runs
``--check``, so a change in the SDK's bytes, or an edit of this script not written out, fails.

Usage::

    .venv/bin/python scripts/golden_vectors.py          # (re)write the file
    .venv/bin/python scripts/golden_vectors.py --check  # exit 1 if the file is not up to date
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import blake3
import grpc
import numpy as np
from google.protobuf import json_format, timestamp_pb2
from google.protobuf.message import Message

from rollnet.reference.envs import load_environment
from rollnet.reference.inference.tokenization import ChatTemplate, CheckpointTokenizer
from rollnet.reference.model.tokenizer import build_char_tokenizer
from rollnet.sdk import FieldViolation, Identity, RequestSigner, batches, build_status, signed_bytes
from rollnet.sdk.batches import batch_binding_digest
from rollnet.sdk.broadcast.delta import encode_delta
from rollnet.sdk.checkpoints import (
    CHECKPOINT_DOMAIN,
    checkpoint_path_violations,
)
from rollnet.sdk.commitments import receipt_message
from rollnet.sdk.identity import b64url_encode
from rollnet.sdk.proofs import (
    LeaseBinding,
    commitment_digest,
    derive_sampling_seed,
    eos_token_ids,
    finish_reason,
    gumbel_noise,
    noise_bits,
    proof_digest,
    sampling_margins,
    token_logprobs,
    tokens_digest,
)
from rollnet.sdk.proofs.binding import domain_digest
from rollnet.sdk.proofs.challenge import (
    CHALLENGE_DRAW_DOMAIN,
    challenge_message,
    challenged_rollouts,
    sign_challenge,
)
from rollnet.sdk.proofs.sampling import uniforms_from_bits
from rollnet.sdk.proofs.toploc import bf16_bits, build_proof, encode_windows
from rollnet.sdk.signing import body_digest
from rollnet.v1 import (
    checkpoint_pb2,
    checkpoint_service_pb2,
    common_pb2,
    node_service_pb2,
    rollout_pb2,
    task_pb2,
)

VECTORS = Path(__file__).resolve().parents[1] / "protos" / "rollnet" / "v1" / "vectors.json"

ABOUT = (
    "Golden vectors of rollnet protocol v1, computed by the Python SDK "
    "(scripts/golden_vectors.py). Bytes are lowercase hex; messages are given in the protobuf "
    "JSON mapping with the .proto field names (64-bit integers as strings, bytes as base64) "
    "and, where their bytes matter, as the hex of their deterministic serialization (fields in "
    "number order, packed repeated scalars). Sections name the spec they test. Integers, "
    "digests, bit patterns, signatures and serialized bytes must match exactly; Gumbel noise "
    "floats are -log(-log(u)) and may differ from these in the last bits of a platform's log, "
    "so compare them within 1e-12 relative (their 32-bit hashes and uniforms are exact)."
)

# Fixed keys (Ed25519 is deterministic, so signatures are fixed too).
NODE_SEED = bytes(range(32))
COORDINATOR_SEED = bytes(range(32, 64))
TRAINER_SEED = bytes(range(64, 96))
NETWORK = "rollnet-example"
HIGH_SEED = 0x6A09E667F3BCC908  # >= 2**32: the hash's high half is exercised (< 2**63)


def fixed_clock(seconds: float) -> Callable[[], float]:
    """A clock that always says ``seconds`` (signatures over a fixed timestamp)."""
    return lambda: seconds


def hexes(data: Sequence[int], width: int) -> list[str]:
    """Integers as fixed-width lowercase hex strings."""
    return [f"{int(value):0{width}x}" for value in data]


def message_json(message: Message) -> Any:
    """The protobuf JSON mapping of ``message`` with the .proto field names."""
    return json_format.MessageToDict(
        message, preserving_proto_field_name=True, always_print_fields_with_no_presence=False
    )


def stream_floats(label: str, count: int, scale: float) -> np.ndarray[Any, np.dtype[np.float32]]:
    """Deterministic pseudo-random float32 values in [-scale, scale) (BLAKE3 XOF of ``label``)."""
    raw = blake3.blake3(label.encode()).digest(length=4 * count)
    words = np.frombuffer(raw, dtype="<u4").astype(np.float64)
    return ((words / 2.0**32 - 0.5) * 2 * scale).astype(np.float32)


def identities() -> dict[str, Any]:
    cases = []
    for seed in (NODE_SEED, COORDINATOR_SEED, TRAINER_SEED):
        identity = Identity.from_seed(seed)
        cases.append(
            {
                "private_key_seed": seed.hex(),
                "public_key": identity.public_key.hex(),
                "x_rollnet_key": b64url_encode(identity.public_key),
                "node_id": identity.node_id,
            }
        )
    return {
        "spec": "docs/protocol.md, Request signing: Keys and node ids",
        "rule": "node_id = hex(BLAKE3-256(b'rollnet-node-id-v1' || public_key)[:16])",
        "cases": cases,
    }


def request_signing() -> dict[str, Any]:
    identity = Identity.from_seed(NODE_SEED)
    cases = []
    requests: list[tuple[str, Message]] = [
        (
            "/rollnet.v1.NodeService/GetNode",
            node_service_pb2.GetNodeRequest(node_id="0123456789abcdef0123456789abcdef"),
        ),
        (
            "/rollnet.v1.CheckpointService/GetLatestCheckpoint",
            checkpoint_service_pb2.GetLatestCheckpointRequest(),
        ),
    ]
    # The second request is empty: its body is the empty string (an empty message's bytes).
    stamps = (1767225600000, 1767225601234)
    nonces = (bytes(range(16)), bytes(range(16, 32)))
    for (method, request), timestamp_ms, nonce in zip(requests, stamps, nonces, strict=True):
        body = request.SerializeToString(deterministic=True)
        signer = RequestSigner(identity, NETWORK, clock=fixed_clock(timestamp_ms / 1000))
        headers = signer.sign(method, body, nonce=nonce)
        cases.append(
            {
                "private_key_seed": NODE_SEED.hex(),
                "audience": NETWORK,
                "method": method,
                "body": body.hex(),
                "x_rollnet_timestamp": headers.timestamp,
                "x_rollnet_nonce": headers.nonce,
                "x_rollnet_body_blake3": body_digest(body),
                "x_rollnet_key": headers.key,
                "signed_bytes": signed_bytes(
                    NETWORK, method, headers.timestamp, headers.nonce, headers.body_blake3
                ).hex(),
                "x_rollnet_signature": headers.signature,
            }
        )
    return {
        "spec": "docs/protocol.md, Request signing: Signed bytes",
        "cases": cases,
    }


LEASE = LeaseBinding("rollnet-main", "node-a", "task-1", "lease-1", 3)


def lease_json(lease: LeaseBinding) -> dict[str, Any]:
    return {
        "network_id": lease.network_id,
        "node_id": lease.node_id,
        "task_id": lease.task_id,
        "lease_id": lease.lease_id,
        "fencing_token": lease.fencing_token,
    }


def binding() -> dict[str, Any]:
    proof = bytes([1, 2])
    blob = bytes(range(32))
    seed = derive_sampling_seed(LEASE.network_id, LEASE.task_id, 0)
    return {
        "spec": "docs/verification.md, Binding: byte layout",
        "sampling_seeds": {
            "note": "rollnet/v1/task-sampling-seed: network id, task id, rollout index only",
            "network_id": LEASE.network_id,
            "task_id": LEASE.task_id,
            "seeds": [
                {
                    "rollout_index": index,
                    "seed": str(derive_sampling_seed(LEASE.network_id, LEASE.task_id, index)),
                }
                for index in (0, 1, 2, 63)
            ],
        },
        "tokens_digest": {
            "prompt_ids": [1, 2, 3],
            "completion_ids": [4, 5],
            "digest": tokens_digest([1, 2, 3], [4, 5]).hex(),
        },
        "proof_digest": {
            "note": "RolloutDigest.proof_blake3: domain-tagged, not BLAKE3(proof)",
            "proof": proof.hex(),
            "digest": proof_digest(proof).hex(),
            "not_this_plain_blake3": blake3.blake3(proof).hexdigest(),
        },
        "commitment_digest": {
            "lease": lease_json(LEASE),
            "blob_blake3": blob.hex(),
            "rollout_index": 0,
            "sampling_seed": str(seed),
            "prompt_ids": [1, 2, 3],
            "completion_ids": [4, 5],
            "proof": proof.hex(),
            "digest": commitment_digest(
                LEASE,
                blob_blake3=blob,
                rollout_index=0,
                sampling_seed=seed,
                prompt_ids=[1, 2, 3],
                completion_ids=[4, 5],
                proof=proof,
            ).hex(),
        },
        "batch_binding_digest": {
            "spec": "docs/protocol.md, Other signed bytes: Batch binding digest",
            "lease": lease_json(LEASE),
            "blob_blake3": blob.hex(),
            "digest": batch_binding_digest(
                LEASE.network_id,
                LEASE.node_id,
                LEASE.task_id,
                LEASE.lease_id,
                LEASE.fencing_token,
                blob,
            ).hex(),
        },
    }


def toploc() -> dict[str, Any]:
    rounding = [0x3F800000, 0x3F808000, 0x3F818000, 0x3F80C000, 0xBF7FFFFF, 0x00008000, 0x7F7FFFFF]
    as_floats = np.array(rounding, dtype=np.uint32).view(np.float32)
    windows = []
    for label, rows, hidden in (("full", 32, 8), ("exactly-k", 32, 4), ("short", 3, 8)):
        values = stream_floats(f"rollnet toploc {label}", rows * hidden, 8.0)
        bits = bf16_bits(values)
        (proof,) = encode_windows(bits.reshape(1, -1))
        windows.append(
            {
                "rows": rows,
                "hidden_size": hidden,
                "bf16": hexes(bits.tolist(), 4),
                "proof": proof.hex(),
            }
        )
    values = stream_floats("rollnet toploc rollout", 40 * 4, 8.0).reshape(40, 4)
    proof = build_proof(values)
    return {
        "spec": "docs/verification.md, TOPLOC commitments",
        "bf16_rounding": {
            "note": "float32 bit patterns to bf16 bit patterns, round to nearest, ties to even",
            "float32": hexes(rounding, 8),
            "bf16": hexes(bf16_bits(as_floats).tolist(), 4),
        },
        "windows": windows,
        "rollout": {
            "note": "a 40-token completion: windows of rows 0-31 and 32-39, concatenated",
            "completion_tokens": 40,
            "hidden_size": 4,
            "bf16": hexes(bf16_bits(values).reshape(-1).tolist(), 4),
            "proof": proof.hex(),
            "proof_digest": proof_digest(proof).hex(),
        },
    }


def gumbel() -> dict[str, Any]:
    cases = []
    for seed, position, vocab in ((42, 7, 4), (HIGH_SEED, 0, 8), (HIGH_SEED, 1000, 8)):
        bits = noise_bits(np.array([seed]), np.array([position]), vocab)[0]
        uniforms = uniforms_from_bits(bits)
        noise = gumbel_noise(np.array([seed]), np.array([position]), vocab)[0]
        cases.append(
            {
                "seed": str(seed),
                "position": position,
                "tokens": list(range(vocab)),
                "hash": hexes(bits.tolist(), 8),
                "uniform": [float(u) for u in uniforms],
                "gumbel": [float(g) for g in noise],
            }
        )
    return {
        "spec": "docs/verification.md, Exact sampling check",
        "cases": cases,
    }


def sampling_token() -> dict[str, Any]:
    vocab, temperature, position = 16, 0.7, 3
    logits = np.round(stream_floats("rollnet sampling logits", vocab, 4.0) * 64) / 64
    row = logits.astype(np.float64)
    scores = row / temperature + gumbel_noise(np.array([HIGH_SEED]), np.array([position]), vocab)[0]
    token = int(np.argmax(scores))
    margin = float(sorted(scores)[-1] - sorted(scores)[-2])
    # The SDK's own checks agree: the chosen token's margin, and its behaviour log-probability.
    padded = np.zeros((position + 1, vocab))
    padded[position] = row
    completion = [0] * position + [token]
    check = float(sampling_margins(padded, completion, HIGH_SEED, temperature)[position])
    assert abs(check - margin) < 1e-12
    logprob = float(token_logprobs(row[None, :], [token], temperature)[0])
    return {
        "spec": "docs/verification.md, Exact sampling check (token i = argmax_v logits/T + g)",
        "seed": str(HIGH_SEED),
        "position": position,
        "temperature": temperature,
        "logits": [float(v) for v in row],
        "scores": [float(s) for s in scores],
        "token": token,
        "margin": margin,
        "behaviour_logprob": logprob,
    }


def rollout_batch() -> dict[str, Any]:
    worker = Identity.from_seed(NODE_SEED)
    task = task_pb2.Task(
        task_id="task-7",
        environment="arithmetic",
        prompt_ids=[11, 12],
        samples_per_prompt=2,
        sampling=common_pb2.SamplingParams(temperature=1.0, max_new_tokens=40),
        checkpoint_step=5,
        rollout_step=5,
        compute_dtype=common_pb2.COMPUTE_DTYPE_FLOAT32,
    )
    lease = task_pb2.Lease(lease_id="lease-7", fencing_token=2)
    proof = build_proof(stream_floats("rollnet toploc rollout", 40 * 4, 8.0).reshape(40, 4))
    rollouts = []
    for index in range(4):
        prompt_index, sample = divmod(index, task.samples_per_prompt)
        completion = [40 + index] * (40 if index == 3 else 3) + ([] if index == 3 else [0])
        rollouts.append(
            rollout_pb2.Rollout(
                prompt_index=prompt_index,
                prompt_id=task.prompt_ids[prompt_index],
                sample_index=sample,
                prompt_token_ids=[21, 22, 23, 24],
                completion_token_ids=completion,
                behaviour_logprobs=[-0.5] * len(completion),
                sampling_seed=derive_sampling_seed(NETWORK, task.task_id, index),
                finish_reason=(
                    rollout_pb2.FINISH_REASON_LENGTH
                    if index == 3
                    else rollout_pb2.FINISH_REASON_EOS
                ),
                toploc_proof=proof[:258] if len(completion) <= 32 else proof,
                claimed_reward=common_pb2.Reward(task_reward=1.0, total=1.0),
            )
        )
    binding = LeaseBinding(
        network_id=NETWORK,
        node_id=worker.node_id,
        task_id=task.task_id,
        lease_id=lease.lease_id,
        fencing_token=lease.fencing_token,
    )
    sealed = batches.seal(binding, task, rollouts)
    return {
        "spec": "docs/protocol.md, A worker's life; rollout.proto RolloutBatch, commitment.proto",
        "network_id": NETWORK,
        "node_id": worker.node_id,
        "task": message_json(task),
        "lease": message_json(lease),
        "rollouts": [message_json(r) for r in rollouts],
        "batch": sealed.batch.hex(),
        "batch_blake3": blake3.blake3(sealed.batch).hexdigest(),
        "submit_commitment_request": message_json(sealed.request),
        "submit_commitment_request_bytes": sealed.request.SerializeToString(
            deterministic=True
        ).hex(),
    }


def receipt() -> dict[str, Any]:
    coordinator = Identity.from_seed(COORDINATOR_SEED)
    received_at = datetime(2026, 1, 1, 0, 0, 0, 123456, tzinfo=UTC)
    binding_digest = bytes(range(100, 132))
    message = receipt_message("c0ffee0123456789abcdef01", binding_digest, received_at)
    stamp = timestamp_pb2.Timestamp()
    stamp.FromDatetime(received_at)
    return {
        "spec": "docs/protocol.md, Other signed bytes: Receipts",
        "coordinator_private_key_seed": COORDINATOR_SEED.hex(),
        "coordinator_public_key": coordinator.public_key.hex(),
        "commitment_id": "c0ffee0123456789abcdef01",
        "binding_digest": binding_digest.hex(),
        "received_at": stamp.ToJsonString(),
        "received_at_unix_micros": str(stamp.ToMicroseconds()),
        "signed_bytes": message.hex(),
        "signature": coordinator.sign(message).hex(),
    }


def validation_challenge() -> dict[str, Any]:
    coordinator = Identity.from_seed(COORDINATOR_SEED)
    commitment_id = "c0ffee0123456789abcdef01"
    binding_digest = bytes(range(100, 132))
    rollouts, challenged = 32, 8
    message = challenge_message(NETWORK, commitment_id, binding_digest, rollouts, challenged)
    challenge = sign_challenge(
        coordinator.sign, NETWORK, commitment_id, binding_digest, rollouts, challenged
    )
    return {
        "spec": "docs/protocol.md, Post-commitment challenges",
        "coordinator_private_key_seed": COORDINATOR_SEED.hex(),
        "coordinator_public_key": coordinator.public_key.hex(),
        "network_id": NETWORK,
        "commitment_id": commitment_id,
        "binding_digest": binding_digest.hex(),
        "rollouts": rollouts,
        "challenged_rollouts": challenged,
        "signed_bytes": message.hex(),
        "challenge": challenge.hex(),
        "draw_keys": [
            domain_digest(CHALLENGE_DRAW_DOMAIN, [challenge, index]).hex()
            for index in range(rollouts)
        ],
        "challenged_indexes": list(challenged_rollouts(challenge, rollouts, challenged)),
    }


def checkpoint_manifest() -> dict[str, Any]:
    trainer = Identity.from_seed(TRAINER_SEED)
    config = b'{"model_type": "qwen2"}'
    weights = bytes(range(256)) * 3
    shards = [weights[:512], weights[512:]]
    manifest = checkpoint_pb2.CheckpointManifest(
        step=7,
        network_id=NETWORK,
        files=[
            checkpoint_pb2.CheckpointFile(
                path=path,
                content=common_pb2.BlobRef(blake3=blake3.blake3(data).digest(), size=len(data)),
                shards=[
                    common_pb2.BlobRef(blake3=blake3.blake3(s).digest(), size=len(s)) for s in parts
                ],
            )
            for path, data, parts in (
                ("config.json", config, [config]),
                ("model.safetensors", weights, shards),
            )
        ],
        flops_per_token=2_000_000,
        created_at=timestamp_pb2.Timestamp(seconds=1767225600),
    )
    data = manifest.SerializeToString(deterministic=True)
    return {
        "spec": "docs/protocol.md, Other signed bytes: Checkpoint manifests",
        "trainer_private_key_seed": TRAINER_SEED.hex(),
        "trainer_public_key": trainer.public_key.hex(),
        "manifest": message_json(manifest),
        "manifest_bytes": data.hex(),
        "signed_bytes": (CHECKPOINT_DOMAIN + data).hex(),
        "signature": trainer.sign(CHECKPOINT_DOMAIN + data).hex(),
    }


def checkpoint_delta() -> dict[str, Any]:
    """Step 8 of the manifest above as a rollnet-delta-v1 delta against step 7's weights."""
    trainer = Identity.from_seed(TRAINER_SEED)
    base = bytes(range(256)) * 3
    changed = bytearray(base)
    for position in (0, 1, 300, 767):
        changed[position] ^= 0x40
    target = bytes(changed)
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        (folder / "base").write_bytes(base)
        (folder / "target").write_bytes(target)
        encode_delta(folder / "base", folder / "target", folder / "delta")
        delta = (folder / "delta").read_bytes()

    def ref(data: bytes) -> common_pb2.BlobRef:
        return common_pb2.BlobRef(blake3=blake3.blake3(data).digest(), size=len(data))

    manifest = checkpoint_pb2.CheckpointManifest(
        step=8,
        network_id=NETWORK,
        files=[
            checkpoint_pb2.CheckpointFile(
                path="model.safetensors",
                content=ref(target),
                shards=[ref(target)],
                delta=checkpoint_pb2.CheckpointDelta(
                    base_step=7,
                    base=ref(base),
                    content=ref(delta),
                    shards=[ref(delta)],
                    encoding=checkpoint_pb2.DELTA_ENCODING_SPARSE_ZSTD_V1,
                ),
            )
        ],
        flops_per_token=2_000_000,
        created_at=timestamp_pb2.Timestamp(seconds=1767225660),
    )
    data = manifest.SerializeToString(deterministic=True)
    return {
        "spec": "docs/broadcast.md, Delta format; docs/protocol.md, Other signed bytes",
        "base": base.hex(),
        "target": target.hex(),
        "delta": delta.hex(),
        "manifest": message_json(manifest),
        "manifest_bytes": data.hex(),
        "signature": trainer.sign(CHECKPOINT_DOMAIN + data).hex(),
    }


# The path rule's cases: each list is one manifest's file paths.
PATH_CASES: list[list[str]] = [
    ["model.safetensors"],
    ["config.json", "model-00001-of-00002.safetensors", "tokenizer.json", "original/params.json"],
    ["a/b/c/d/e/f/g/h/i/j/k/l/m/n/o/p"],
    ["a" * 255],
    ["A_b-c.9"],
    [],
    [""],
    ["/model.safetensors"],
    ["model.safetensors/"],
    ["./model.safetensors"],
    ["a/./model.safetensors"],
    ["../escape.txt"],
    ["a/../b"],
    ["a//model.safetensors"],
    ["a\\model.safetensors"],
    ["a\x00b"],
    ["a b.json"],
    ["modèle.safetensors"],
    [".gitattributes"],
    ["dir/.hidden"],
    ["trailing."],
    ["..."],
    ["nul.json"],
    ["sub/COM1"],
    ["a" * 256],
    ["a/b/c/d/e/f/g/h/i/j/k/l/m/n/o/p/q"],
    ["/".join(["d" * 100] * 11) + "/f"],
    ["config.json", "config.json"],
    ["Config.json", "config.json"],
    ["a", "a/b"],
    ["A/b", "a"],
    ["weights/x.safetensors", "weights/y.safetensors", "Weights/x.safetensors"],
]


def checkpoint_paths() -> dict[str, Any]:
    cases = []
    for paths in PATH_CASES:
        violations = checkpoint_path_violations(paths)
        cases.append(
            {
                "paths": paths,
                "valid": not violations,
                "violations": [
                    {"field": v.field, "description": v.description} for v in violations
                ],
            }
        )
    many = ["f" + str(index) for index in range(4097)]
    return {
        "spec": "docs/protocol.md, Checkpoint file paths",
        "note": (
            "each case is the path list of one manifest; 'field' is relative to the manifest "
            "(a coordinator reports it under 'manifest.'); descriptions are informative"
        ),
        "cases": cases,
        "too_many_files": {
            "paths": "4097 paths f0 ... f4096",
            "violations": [
                {"field": v.field, "description": v.description}
                for v in checkpoint_path_violations(many)
            ],
        },
    }


EOS_CASES: list[tuple[Any, Any]] = [
    ({"eos_token_id": 2}, None),
    ({"eos_token_id": 2}, {"eos_token_id": 7}),
    ({"eos_token_id": 2}, {"eos_token_id": [2, 7, 9]}),
    ({"eos_token_id": [2, 3]}, {"eos_token_id": [7]}),
    ({}, {"eos_token_id": [7]}),
    ({"eos_token_id": None}, {}),
    ({"text_config": {"eos_token_id": 5}}, None),
    ({"eos_token_id": "2"}, None),
    ({"eos_token_id": [2, None]}, None),
    ({"eos_token_id": -1}, None),
    ({"eos_token_id": True}, None),
    ({"eos_token_id": 2.0}, None),
]


def eos() -> dict[str, Any]:
    cases = []
    for config, generation in EOS_CASES:
        case: dict[str, Any] = {"config_json": config, "generation_config_json": generation}
        try:
            case["eos_token_ids"] = sorted(eos_token_ids(config, generation))
        except ValueError:
            case["error"] = True
        cases.append(case)
    reasons = []
    for completion, limit in (
        ([5, 6, 0], 8),
        ([5, 6, 0], 3),
        ([5, 6, 7], 3),
        ([5, 6, 7], 8),
        ([], 8),
        ([5, 6, 7, 8], 3),
    ):
        reasons.append(
            {
                "completion_ids": completion,
                "eos_token_ids": [0],
                "max_new_tokens": limit,
                "finish_reason": finish_reason(completion, {0}, limit),
            }
        )
    return {
        "spec": "docs/protocol.md, End of sequence",
        "note": (
            "generation_config_json null: the checkpoint has no generation_config.json; "
            "'error': the checkpoint is refused; finish_reason null: no reason is right "
            "(empty, too long, or truncated)"
        ),
        "eos_token_ids": cases,
        "finish_reasons": reasons,
    }


def error_details() -> dict[str, Any]:
    status = build_status(
        grpc.StatusCode.INVALID_ARGUMENT,
        "INVALID_FIELDS",
        "manifest.files[0].path: must be relative (no leading '/')",
        field_violations=[
            FieldViolation("manifest.files[0].path", "must be relative (no leading '/')")
        ],
        retry_after=None,
        metadata={"field_count": "1"},
    )
    limited = build_status(
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        "RATE_LIMITED",
        "too many registrations from 192.0.2.1",
        retry_after=1.5,
    )
    return {
        "spec": "docs/protocol.md, Errors (trailing metadata grpc-status-details-bin)",
        "protos": (
            "google/rpc/status.proto, google/rpc/error_details.proto of googleapis "
            "(PyPI googleapis-common-protos 1.76.0; buf.build/googleapis/googleapis)"
        ),
        "cases": [
            {"status": message_json(s), "grpc_status_details_bin": s.SerializeToString().hex()}
            for s in (status, limited)
        ],
    }


def arithmetic() -> dict[str, Any]:
    cases = []
    for config in ({}, {"level": 5, "seed": 7, "target_lengths": [16, 32]}):
        environment = load_environment("arithmetic", config)
        problems = []
        for prompt_id in (0, 1, 2, 12345, 2**63 + 5):
            problem = environment.prompt(prompt_id)
            problems.append(
                {
                    "prompt_id": str(prompt_id),
                    "prompt": problem.prompt,
                    "answer": problem.answer,
                    "target_length": problem.target_length or 0,
                }
            )
        cases.append(
            {
                "config": config,
                "normalized_config": environment.config,
                "config_digest": environment.digest,
                "problems": problems,
            }
        )
    return {"spec": "docs/environments.md, Built-in: arithmetic", "cases": cases}


# A ChatML-like template over the tiny tokenizer's special tokens (Qwen's whitespace control).
CHAT_TEMPLATE = (
    "{%- for message in messages %}\n"
    "{{- bos_token + message['role'] + '\\n' + message['content'] | trim + eos_token + '\\n' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "{{- bos_token + 'assistant\\n' }}\n"
    "{%- endif %}\n"
)


def tokenization() -> dict[str, Any]:
    texts = ["12+34=", "Think for 16 tokens. 7*8="]
    config = {"bos_token": "<|bos|>", "eos_token": "<|endoftext|>", "chat_template": CHAT_TEMPLATE}
    template = ChatTemplate.from_tokenizer_config(config)
    tokenizer = CheckpointTokenizer(build_char_tokenizer(), template)
    completion = [*tokenizer.encode("46\n"), 0]  # the EOS token decodes to nothing
    messages = [("system", "You add numbers. "), ("user", "12+34=")]
    chat_text = tokenizer.render_chat(messages)
    return {
        "spec": "docs/protocol.md, Tokenization",
        "tokenizer": "the tiny model's tokenizer.json (rollnet model init-tiny)",
        "encode": [{"text": text, "ids": tokenizer.encode(text)} for text in texts],
        "decode": {"ids": completion, "text": tokenizer.decode(completion)},
        "chat": {
            "tokenizer_config": config,
            "messages": [{"role": role, "content": content} for role, content in messages],
            "text": chat_text,
            "ids": tokenizer.encode(chat_text),
        },
    }


def build() -> dict[str, Any]:
    """Every vector, from the SDK's code."""
    return {
        "about": ABOUT,
        "identities": identities(),
        "request_signing": request_signing(),
        "binding": binding(),
        "toploc": toploc(),
        "gumbel_noise": gumbel(),
        "sampling_token": sampling_token(),
        "rollout_batch": rollout_batch(),
        "receipt": receipt(),
        "validation_challenge": validation_challenge(),
        "checkpoint_manifest": checkpoint_manifest(),
        "checkpoint_delta": checkpoint_delta(),
        "checkpoint_paths": checkpoint_paths(),
        "end_of_sequence": eos(),
        "error_details": error_details(),
        "arithmetic_prompts": arithmetic(),
        "tokenization": tokenization(),
    }


def render(vectors: dict[str, Any]) -> str:
    """The file's text: two-space JSON, ASCII only, one final newline."""
    return json.dumps(vectors, indent=2, ensure_ascii=True) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail if the file is out of date")
    args = parser.parse_args(argv)
    text = render(build())
    if args.check:
        current = VECTORS.read_text(encoding="utf-8") if VECTORS.is_file() else ""
        if current != text:
            print(f"{VECTORS} is out of date: run scripts/golden_vectors.py", file=sys.stderr)
            return 1
        return 0
    VECTORS.write_text(text, encoding="utf-8")
    print(f"wrote {VECTORS}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
