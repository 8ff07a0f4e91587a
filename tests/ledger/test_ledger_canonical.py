"""The canonical encoding matches the byte-level specification in docs/ledger.md."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from rollnet.ledger.canonical import (
    GENESIS_HASH,
    canonical_entry_bytes,
    chain_hash,
    chain_head_message,
    datetime_to_us,
    us_to_datetime,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "ledger.md"
NODE = "0123456789abcdef0123456789abcdef"


def _documented(label: str) -> bytes:
    match = re.search(rf"^{re.escape(label)} = ([0-9a-f]+)$", DOC.read_text(), re.MULTILINE)
    assert match is not None, f"{label} not found in {DOC}"
    return bytes.fromhex(match.group(1))


def test_worked_example_in_the_docs_is_what_the_code_computes() -> None:
    first = canonical_entry_bytes(
        sequence=1,
        time_us=1_767_225_600_000_000,
        node_id=NODE,
        kind="credit",
        amount=1500,
        commitment_id="cmt-1",
        verdict_id="vrd-1",
        memo="",
    )
    assert len(first) == 115
    assert first == _documented("canonical(1)")
    assert _documented("prev_hash(1)") == GENESIS_HASH
    first_hash = chain_hash(GENESIS_HASH, first)
    assert first_hash == _documented("entry_hash(1)")
    second = canonical_entry_bytes(
        sequence=2,
        time_us=1_767_225_600_000_001,
        node_id=NODE,
        kind="slash",
        amount=-300,
        commitment_id=None,
        verdict_id="vrd-2",
        memo="rejected: toploc",
    )
    assert second == _documented("canonical(2)")
    assert _documented("prev_hash(2)") == first_hash
    second_hash = chain_hash(first_hash, second)
    assert second_hash == _documented("entry_hash(2)")

    message = chain_head_message("rollnet-demo", 2, second_hash)
    assert message == _documented("head_message")
    key = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
    public = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    assert public == _documented("public_key")
    assert key.sign(message) == _documented("signature")  # Ed25519 is deterministic


def test_absent_and_empty_strings_encode_differently() -> None:
    fields = {
        "sequence": 1,
        "time_us": 0,
        "node_id": NODE,
        "kind": "adjustment",
        "amount": 0,
        "verdict_id": None,
        "memo": "",
    }
    absent = canonical_entry_bytes(commitment_id=None, **fields)  # type: ignore[arg-type]
    empty = canonical_entry_bytes(commitment_id="", **fields)  # type: ignore[arg-type]
    assert absent != empty
    assert len(empty) == len(absent) + 4


def test_length_prefixes_prevent_field_shifting() -> None:
    """Moving bytes between adjacent strings must change the encoding."""
    one = canonical_entry_bytes(
        sequence=1,
        time_us=0,
        node_id=NODE,
        kind="credit",
        amount=1,
        commitment_id="ab",
        verdict_id="c",
        memo="",
    )
    two = canonical_entry_bytes(
        sequence=1,
        time_us=0,
        node_id=NODE,
        kind="credit",
        amount=1,
        commitment_id="a",
        verdict_id="bc",
        memo="",
    )
    assert one != two


@pytest.mark.parametrize(
    ("field", "value"), [("amount", 2**63), ("amount", -(2**63) - 1), ("sequence", -1)]
)
def test_out_of_range_numbers_are_refused(field: str, value: int) -> None:
    fields: dict[str, object] = {
        "sequence": 1,
        "time_us": 0,
        "node_id": NODE,
        "kind": "credit",
        "amount": 1,
        "commitment_id": None,
        "verdict_id": None,
        "memo": "",
    }
    fields[field] = value
    with pytest.raises(ValueError, match="out of range"):
        canonical_entry_bytes(**fields)  # type: ignore[arg-type]


def test_time_conversion_is_exact_to_the_microsecond() -> None:
    moment = us_to_datetime(1_767_225_600_123_457)
    assert datetime_to_us(moment) == 1_767_225_600_123_457
    assert moment.isoformat() == "2026-01-01T00:00:00.123457+00:00"


def test_the_export_verifier_imports_no_database_code() -> None:
    """Verifying an export must not need (or trust) the coordinator's database layer."""
    probe = (
        "import sys, rollnet.ledger.verify; "
        "loaded = [m for m in ('sqlalchemy', 'alembic', 'psycopg', 'rollnet.ledger.models')"
        " if m in sys.modules]; print(loaded)"
    )
    completed = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    assert completed.stdout.strip() == "[]", completed.stdout
