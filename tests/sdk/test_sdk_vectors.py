"""The SDK against the golden vectors (``protos/rollnet/v1/vectors.json``).

Each test recomputes one section from the file's inputs with the SDK and compares with the
file's expected values, the way an implementation in another language is told to
(docs/protocol.md, "Golden vectors"). ``test_the_file_is_what_the_script_writes`` catches the
other drift: the script changed (or the SDK's bytes did) and the file was not rewritten.
"""

from __future__ import annotations

import base64
import functools
import json
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import blake3
import numpy as np
import pytest
from google.protobuf import json_format
from google.rpc import error_details_pb2, status_pb2

from rollnet.sdk import (
    Identity,
    RequestSigner,
    body_digest,
    checkpoint_path_violations,
    seal_batch,
    signed_bytes,
    verify_signature,
)
from rollnet.sdk.broadcast.delta import apply_delta
from rollnet.sdk.checkpoints import CHECKPOINT_DOMAIN, verify_checkpoint
from rollnet.sdk.commitments import batch_binding_digest, receipt_message, verify_receipt
from rollnet.sdk.identity import b64url_decode
from rollnet.sdk.proofs import (
    LeaseBinding,
    commitment_digest,
    derive_sampling_seed,
    eos_token_ids,
    finish_reason,
    gumbel_noise,
    noise_bits,
    parse_proof,
    proof_digest,
    sampling_margins,
    token_logprobs,
    tokens_digest,
    verify_proof,
)
from rollnet.sdk.proofs.binding import domain_digest
from rollnet.sdk.proofs.challenge import (
    CHALLENGE_DRAW_DOMAIN,
    challenge_message,
    challenged_rollouts,
    sign_challenge,
    verify_challenge,
)
from rollnet.sdk.proofs.sampling import uniforms_from_bits
from rollnet.sdk.proofs.toploc import bf16_bits, build_proof, encode_windows
from rollnet.v1 import (
    checkpoint_pb2,
    commitment_pb2,
    commitment_service_pb2,
    rollout_pb2,
    task_pb2,
)

ROOT = Path(__file__).resolve().parents[2]
VECTORS_PATH = ROOT / "protos" / "rollnet" / "v1" / "vectors.json"
SCRIPT = ROOT / "scripts" / "golden_vectors.py"


@pytest.fixture(scope="module")
def vectors() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(VECTORS_PATH.read_text(encoding="utf-8"))
    return loaded


def lease_of(data: dict[str, Any]) -> LeaseBinding:
    return LeaseBinding(
        data["network_id"],
        data["node_id"],
        data["task_id"],
        data["lease_id"],
        int(data["fencing_token"]),
    )


def bf16_array(values: list[str], rows: int, hidden: int) -> np.ndarray[Any, Any]:
    return np.array([int(v, 16) for v in values], dtype=np.uint16).reshape(rows, hidden)


@pytest.mark.slow
def test_the_file_is_what_the_script_writes() -> None:
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr


def test_identities(vectors: dict[str, Any]) -> None:
    for case in vectors["identities"]["cases"]:
        identity = Identity.from_seed(bytes.fromhex(case["private_key_seed"]))
        assert identity.public_key.hex() == case["public_key"]
        assert identity.node_id == case["node_id"]
        digest = blake3.blake3(b"rollnet-node-id-v1" + identity.public_key).digest()
        assert digest[:16].hex() == case["node_id"]
        assert (
            base64.urlsafe_b64encode(identity.public_key).rstrip(b"=").decode()
            == (case["x_rollnet_key"])
        )


def test_request_signing(vectors: dict[str, Any]) -> None:
    cases = vectors["request_signing"]["cases"]
    assert any(case["body"] == "" for case in cases), "an empty body is covered"
    for case in cases:
        identity = Identity.from_seed(bytes.fromhex(case["private_key_seed"]))
        body = bytes.fromhex(case["body"])
        assert body_digest(body) == case["x_rollnet_body_blake3"]
        expected = bytes.fromhex(case["signed_bytes"])
        assert (
            signed_bytes(
                case["audience"],
                case["method"],
                case["x_rollnet_timestamp"],
                case["x_rollnet_nonce"],
                case["x_rollnet_body_blake3"],
            )
            == expected
        )
        seconds = int(case["x_rollnet_timestamp"]) / 1000
        headers = RequestSigner(
            identity, case["audience"], clock=functools.partial(float, seconds)
        ).sign(case["method"], body, nonce=bytes.fromhex(case["x_rollnet_nonce"]))
        assert headers.key == case["x_rollnet_key"]
        assert headers.signature == case["x_rollnet_signature"]
        signature = b64url_decode(case["x_rollnet_signature"])
        assert verify_signature(identity.public_key, signature, expected)


def test_binding_digests_and_seeds(vectors: dict[str, Any]) -> None:
    section = vectors["binding"]
    seeds = section["sampling_seeds"]
    for item in seeds["seeds"]:
        seed = derive_sampling_seed(seeds["network_id"], seeds["task_id"], item["rollout_index"])
        assert str(seed) == item["seed"]
        assert seed < 2**63
    tokens = section["tokens_digest"]
    assert tokens_digest(tokens["prompt_ids"], tokens["completion_ids"]).hex() == tokens["digest"]
    proof = section["proof_digest"]
    assert proof_digest(bytes.fromhex(proof["proof"])).hex() == proof["digest"]
    assert proof["digest"] != proof["not_this_plain_blake3"]
    commitment = section["commitment_digest"]
    assert (
        commitment_digest(
            lease_of(commitment["lease"]),
            blob_blake3=bytes.fromhex(commitment["blob_blake3"]),
            rollout_index=commitment["rollout_index"],
            sampling_seed=int(commitment["sampling_seed"]),
            prompt_ids=commitment["prompt_ids"],
            completion_ids=commitment["completion_ids"],
            proof=bytes.fromhex(commitment["proof"]),
        ).hex()
        == commitment["digest"]
    )
    batch = section["batch_binding_digest"]
    bound = lease_of(batch["lease"])
    digest = batch_binding_digest(
        bound.network_id,
        bound.node_id,
        bound.task_id,
        bound.lease_id,
        bound.fencing_token,
        bytes.fromhex(batch["blob_blake3"]),
    )
    assert digest.hex() == batch["digest"]


def test_toploc_proofs(vectors: dict[str, Any]) -> None:
    section = vectors["toploc"]
    rounding = section["bf16_rounding"]
    floats = np.array([int(v, 16) for v in rounding["float32"]], dtype=np.uint32).view(np.float32)
    assert [f"{b:04x}" for b in bf16_bits(floats).tolist()] == rounding["bf16"]
    sizes = set()
    for window in section["windows"]:
        bits = bf16_array(window["bf16"], window["rows"], window["hidden_size"])
        sizes.add(bits.size)
        (proof,) = encode_windows(bits.reshape(1, -1))
        assert proof.hex() == window["proof"]
        assert len(proof) == 258
        # And the verifier's side: the committed values check out against themselves.
        (stats,) = verify_proof(proof, bits)
        assert stats.exp_mismatches == 0
        assert stats.mant_err_mean == 0
    assert min(sizes) < 128 == sorted(sizes)[1] < max(sizes), "fewer than, exactly and more than k"
    rollout = section["rollout"]
    hidden = bf16_array(rollout["bf16"], rollout["completion_tokens"], rollout["hidden_size"])
    proof = build_proof(hidden)
    assert proof.hex() == rollout["proof"]
    assert proof_digest(proof).hex() == rollout["proof_digest"]
    moduli, _ = parse_proof(proof)
    assert len(moduli) == 2


def test_gumbel_noise(vectors: dict[str, Any]) -> None:
    cases = vectors["gumbel_noise"]["cases"]
    assert any(int(case["seed"]) >= 2**32 for case in cases), "the hash's high half is covered"
    for case in cases:
        seed, position, vocab = int(case["seed"]), case["position"], len(case["tokens"])
        bits = noise_bits(np.array([seed]), np.array([position]), vocab)[0]
        assert [f"{b:08x}" for b in bits.tolist()] == case["hash"]
        assert uniforms_from_bits(bits).tolist() == case["uniform"]
        noise = gumbel_noise(np.array([seed]), np.array([position]), vocab)[0]
        np.testing.assert_allclose(noise, case["gumbel"], rtol=1e-12, atol=0)


def test_a_seeded_token_draw(vectors: dict[str, Any]) -> None:
    case = vectors["sampling_token"]
    seed, position, temperature = int(case["seed"]), case["position"], case["temperature"]
    logits = np.array(case["logits"], dtype=np.float64)
    noise = gumbel_noise(np.array([seed]), np.array([position]), logits.size)[0]
    scores = logits / temperature + noise
    np.testing.assert_allclose(scores, case["scores"], rtol=1e-12, atol=0)
    assert int(np.argmax(scores)) == case["token"]
    rows = np.zeros((position + 1, logits.size))
    rows[position] = logits
    completion = [0] * position + [case["token"]]
    margin = sampling_margins(rows, completion, seed, temperature)[position]
    assert margin == pytest.approx(case["margin"], rel=1e-12)
    assert margin > 0
    logprob = token_logprobs(logits[None, :], [case["token"]], temperature)[0]
    assert logprob == pytest.approx(case["behaviour_logprob"], rel=1e-12)


def test_the_rollout_batch_blob_and_its_commitment(vectors: dict[str, Any]) -> None:
    case = vectors["rollout_batch"]
    task = json_format.ParseDict(case["task"], task_pb2.Task())
    lease = json_format.ParseDict(case["lease"], task_pb2.Lease())
    rollouts = [json_format.ParseDict(r, rollout_pb2.Rollout()) for r in case["rollouts"]]
    sealed = seal_batch(
        network_id=case["network_id"],
        node_id=case["node_id"],
        task=task,
        lease=lease,
        rollouts=rollouts,
    )
    assert sealed.batch.hex() == case["batch"]
    assert blake3.blake3(sealed.batch).hexdigest() == case["batch_blake3"]
    expected = json_format.ParseDict(
        case["submit_commitment_request"], commitment_service_pb2.SubmitCommitmentRequest()
    )
    assert sealed.request == expected
    assert (
        sealed.request.SerializeToString(deterministic=True).hex()
        == (case["submit_commitment_request_bytes"])
    )
    # The blob decodes back to the rollouts, in order.
    batch = rollout_pb2.RolloutBatch.FromString(bytes.fromhex(case["batch"]))
    assert list(batch.rollouts) == rollouts
    assert expected.rollout_batch.size == len(sealed.batch)


def test_validation_challenge(vectors: dict[str, Any]) -> None:
    case = vectors["validation_challenge"]
    coordinator = Identity.from_seed(bytes.fromhex(case["coordinator_private_key_seed"]))
    assert coordinator.public_key.hex() == case["coordinator_public_key"]
    fields = (
        case["network_id"],
        case["commitment_id"],
        bytes.fromhex(case["binding_digest"]),
        case["rollouts"],
        case["challenged_rollouts"],
    )
    assert challenge_message(*fields).hex() == case["signed_bytes"]
    challenge = bytes.fromhex(case["challenge"])
    assert sign_challenge(coordinator.sign, *fields) == challenge
    assert verify_challenge(coordinator.public_key, challenge, *fields)
    assert [
        domain_digest(CHALLENGE_DRAW_DOMAIN, [challenge, index]).hex()
        for index in range(case["rollouts"])
    ] == case["draw_keys"]
    drawn = challenged_rollouts(challenge, case["rollouts"], case["challenged_rollouts"])
    assert list(drawn) == case["challenged_indexes"]
    # The rule in words: the indexes of the smallest draw keys, ascending.
    smallest = sorted(range(case["rollouts"]), key=lambda i: case["draw_keys"][i])
    assert sorted(smallest[: case["challenged_rollouts"]]) == case["challenged_indexes"]


def test_receipts(vectors: dict[str, Any]) -> None:
    case = vectors["receipt"]
    coordinator = Identity.from_seed(bytes.fromhex(case["coordinator_private_key_seed"]))
    micros = int(case["received_at_unix_micros"])
    received_at = datetime.fromtimestamp(micros // 10**6, tz=UTC).replace(
        microsecond=micros % 10**6
    )
    message = receipt_message(
        case["commitment_id"], bytes.fromhex(case["binding_digest"]), received_at
    )
    assert message.hex() == case["signed_bytes"]
    assert coordinator.sign(message).hex() == case["signature"]
    receipt = commitment_pb2.Receipt(
        commitment_id=case["commitment_id"],
        binding_digest=bytes.fromhex(case["binding_digest"]),
        coordinator_public_key=bytes.fromhex(case["coordinator_public_key"]),
        signature=bytes.fromhex(case["signature"]),
    )
    receipt.received_at.FromJsonString(case["received_at"])
    assert verify_receipt(receipt, coordinator.public_key)


def test_checkpoint_manifest_signature(vectors: dict[str, Any]) -> None:
    case = vectors["checkpoint_manifest"]
    manifest = json_format.ParseDict(case["manifest"], checkpoint_pb2.CheckpointManifest())
    data = manifest.SerializeToString(deterministic=True)
    assert data.hex() == case["manifest_bytes"]
    assert (CHECKPOINT_DOMAIN + data).hex() == case["signed_bytes"]
    trainer = Identity.from_seed(bytes.fromhex(case["trainer_private_key_seed"]))
    assert trainer.sign(CHECKPOINT_DOMAIN + data).hex() == case["signature"]
    checkpoint = checkpoint_pb2.Checkpoint(
        manifest=data,
        signature=bytes.fromhex(case["signature"]),
        trainer_public_key=bytes.fromhex(case["trainer_public_key"]),
        step=manifest.step,
    )
    assert verify_checkpoint(checkpoint, network_id=manifest.network_id) == manifest


def test_checkpoint_paths(vectors: dict[str, Any]) -> None:
    section = vectors["checkpoint_paths"]
    for case in section["cases"]:
        found = [(v.field, v.description) for v in checkpoint_path_violations(case["paths"])]
        assert found == [(v["field"], v["description"]) for v in case["violations"]], case
        assert case["valid"] == (not found)
    many = [f"f{index}" for index in range(4097)]
    found = [(v.field, v.description) for v in checkpoint_path_violations(many)]
    expected = section["too_many_files"]["violations"]
    assert found == [(v["field"], v["description"]) for v in expected]


def test_end_of_sequence_rules(vectors: dict[str, Any]) -> None:
    section = vectors["end_of_sequence"]
    for case in section["eos_token_ids"]:
        config, generation = case["config_json"], case["generation_config_json"]
        if case.get("error"):
            with pytest.raises(ValueError, match="eos_token_id"):
                eos_token_ids(config, generation)
        else:
            assert sorted(eos_token_ids(config, generation)) == case["eos_token_ids"]
    for case in section["finish_reasons"]:
        reason = finish_reason(
            case["completion_ids"], set(case["eos_token_ids"]), case["max_new_tokens"]
        )
        assert reason == case["finish_reason"]
    assert any(
        case["finish_reason"] == "eos" and len(case["completion_ids"]) == case["max_new_tokens"]
        for case in section["finish_reasons"]
    ), "EOS on the last allowed token is covered"


def test_error_details_decode(vectors: dict[str, Any]) -> None:
    for case in vectors["error_details"]["cases"]:
        status = status_pb2.Status.FromString(bytes.fromhex(case["grpc_status_details_bin"]))
        assert json_format.MessageToDict(status, preserving_proto_field_name=True) == case["status"]
        info = error_details_pb2.ErrorInfo()
        assert status.details[0].Unpack(info)
        assert info.domain == "rollnet"
        assert info.reason == case["status"]["details"][0]["reason"]


def test_checkpoint_delta(vectors: dict[str, Any], tmp_path: Path) -> None:
    """The delta vector rebuilds step 8's file from step 7's, and its manifest signs it."""
    case = vectors["checkpoint_delta"]
    manifest = json_format.ParseDict(case["manifest"], checkpoint_pb2.CheckpointManifest())
    data = manifest.SerializeToString(deterministic=True)
    assert data.hex() == case["manifest_bytes"]
    trainer = Identity.from_seed(
        bytes.fromhex(vectors["checkpoint_manifest"]["trainer_private_key_seed"])
    )
    checkpoint = checkpoint_pb2.Checkpoint(
        manifest=data,
        signature=bytes.fromhex(case["signature"]),
        trainer_public_key=trainer.public_key,
        step=manifest.step,
    )
    entry = verify_checkpoint(checkpoint, network_id=manifest.network_id).files[0]
    base, delta = tmp_path / "base", tmp_path / "delta"
    base.write_bytes(bytes.fromhex(case["base"]))
    delta.write_bytes(bytes.fromhex(case["delta"]))
    assert blake3.blake3(base.read_bytes()).digest() == entry.delta.base.blake3
    assert blake3.blake3(delta.read_bytes()).digest() == entry.delta.content.blake3
    apply_delta(base, delta, tmp_path / "out", size=entry.content.size)
    rebuilt = (tmp_path / "out").read_bytes()
    assert rebuilt.hex() == case["target"]
    assert blake3.blake3(rebuilt).digest() == entry.content.blake3
