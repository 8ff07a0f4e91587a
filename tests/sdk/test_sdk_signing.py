"""The signed byte string and the worked example of docs/protocol.md, against a fixed key."""

from __future__ import annotations

from pathlib import Path

from rollnet.sdk import Identity, RequestSigner, body_digest, signed_bytes, verify_signature
from rollnet.sdk.identity import b64url_decode, b64url_encode
from rollnet.v1 import node_service_pb2

DOC = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"

SEED = bytes(range(32))
PUBLIC_KEY_HEX = "03a107bff3ce10be1d70dd18e74bc09967e4d6309ba50d5f1ddc8664125531b8"
KEY_HEADER = "A6EHv_POEL4dcN0Y50vAmWfk1jCbpQ1fHdyGZBJVMbg"
NODE_ID = "9219621af7d0b16b28678f5eec285c5f"
AUDIENCE = "rollnet-example"
METHOD = "/rollnet.v1.NodeService/GetNode"
BODY_HEX = "0a203031323334353637383961626364656630313233343536373839616263646566"
TIMESTAMP = "1767225600000"
NONCE = "000102030405060708090a0b0c0d0e0f"
DIGEST = "f30c85bcb2b34d191f0800ca8039b25ee21671c587eeeecf8e62b6c7aa4af31e"
SIGNED = (
    b"rollnet-request-v1\nrollnet-example\n/rollnet.v1.NodeService/GetNode\n1767225600000\n"
    b"000102030405060708090a0b0c0d0e0f\n"
    b"f30c85bcb2b34d191f0800ca8039b25ee21671c587eeeecf8e62b6c7aa4af31e"
)
SIGNATURE = "fMq11DVs-Je4FwjV63PktO9srTGcWhfi_G4vKUcrKLKrHwJM5duoBB_P9mu4mu0G1Ec_kdeyP2l4BmRfll36Cg"


def test_worked_example_matches_the_sdk() -> None:
    identity = Identity.from_seed(SEED)
    assert identity.public_key.hex() == PUBLIC_KEY_HEX
    assert identity.node_id == NODE_ID
    body = node_service_pb2.GetNodeRequest(
        node_id="0123456789abcdef0123456789abcdef"
    ).SerializeToString(deterministic=True)
    assert body.hex() == BODY_HEX
    assert body_digest(body) == DIGEST
    assert signed_bytes(AUDIENCE, METHOD, TIMESTAMP, NONCE, DIGEST) == SIGNED

    headers = RequestSigner(identity, AUDIENCE, clock=lambda: 1767225600.0).sign(
        METHOD, body, nonce=bytes.fromhex(NONCE)
    )
    assert headers.key == KEY_HEADER
    assert headers.timestamp == TIMESTAMP
    assert headers.body_blake3 == DIGEST
    assert headers.signature == SIGNATURE
    assert verify_signature(identity.public_key, b64url_decode(SIGNATURE), SIGNED)
    assert not verify_signature(identity.public_key, b64url_decode(SIGNATURE), SIGNED + b"\n")


def test_worked_example_is_what_the_protocol_doc_says() -> None:
    text = DOC.read_text()
    for value in (PUBLIC_KEY_HEX, KEY_HEADER, NODE_ID, BODY_HEX, DIGEST, SIGNATURE):
        assert value in text
    assert repr(SIGNED) in text
    assert b64url_decode(SIGNATURE).hex() in text


def test_base64url_is_unpadded_and_canonical() -> None:
    assert b64url_encode(b"\xff\xfe") == "__4"
    assert b64url_decode("__4") == b"\xff\xfe"
    for bad in ("__4=", "__5", "a+b/", "é"):
        try:
            b64url_decode(bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad!r} was accepted")


def test_each_signature_uses_a_fresh_nonce() -> None:
    signer = RequestSigner(Identity.generate(), AUDIENCE)
    first, second = signer.sign(METHOD, b""), signer.sign(METHOD, b"")
    assert first.nonce != second.nonce
    assert first.signature != second.signature
    assert len(first.nonce) == 32


def test_clock_offset_shifts_the_timestamp() -> None:
    signer = RequestSigner(Identity.generate(), AUDIENCE, clock=lambda: 1000.0, clock_offset=2.5)
    assert signer.sign(METHOD, b"").timestamp == "1002500"


# The order of the Ed25519 base point; S must be below it.
GROUP_ORDER = 2**252 + 27742317777372353535851937790883648493


def test_a_small_order_key_universal_signature_is_refused() -> None:
    # The identity point as the key, R = identity and S = 0 satisfy the verification equation
    # for every message; a lenient verifier (OpenSSL's) accepts it. Ours must not.
    identity_point = bytes([1]) + bytes(31)
    universal = identity_point + bytes(32)
    for message in (SIGNED, b"", b"any other message"):
        assert not verify_signature(identity_point, universal, message)


def test_a_non_canonical_s_is_refused() -> None:
    identity = Identity.from_seed(SEED)
    signature = b64url_decode(SIGNATURE)
    s = int.from_bytes(signature[32:], "little")
    # S + L is the same scalar mod L: a malleated copy of a valid signature.
    malleated = signature[:32] + (s + GROUP_ORDER).to_bytes(32, "little")
    assert verify_signature(identity.public_key, signature, SIGNED)
    assert not verify_signature(identity.public_key, malleated, SIGNED)


def test_wrong_sizes_are_refused_not_raised() -> None:
    identity = Identity.from_seed(SEED)
    signature = b64url_decode(SIGNATURE)
    assert not verify_signature(identity.public_key[:31], signature, SIGNED)
    assert not verify_signature(identity.public_key, signature[:63], SIGNED)
    assert not verify_signature(bytes(32), signature, SIGNED)
