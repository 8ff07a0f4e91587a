"""Verifying an export in several processes gives exactly the sequential result."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from rollnet.ledger.canonical import GENESIS_HASH, chain_hash, chain_head_message, encode_entry
from rollnet.ledger.chain import public_key_bytes
from rollnet.ledger.export_format import entry_line, header_line, signed_head_line
from rollnet.ledger.verify import ExportFormatError, _read_header, _span_bounds, verify_export
from rollnet.sdk.testing import NETWORK_ID

COUNT = 3000


def _write_export(path: Path, key: Ed25519PrivateKey) -> None:
    lines = []
    heads = []
    prev = GENESIS_HASH
    for sequence in range(1, COUNT + 1):
        fields = (
            sequence,
            1_767_225_600_000_000 + sequence,
            f"{sequence % 7:032x}",
            "credit",
            sequence,
            None,
            f"v{sequence}",
            "memo ✓" if sequence % 2 else "",
        )
        entry_hash = chain_hash(prev, encode_entry(*fields))
        lines.append(
            entry_line(
                sequence=sequence,
                time_us=fields[1],
                node_id=fields[2],
                kind="credit",
                amount=sequence,
                commitment_id=None,
                verdict_id=fields[6],
                memo=fields[7],
                prev_hash=prev,
                entry_hash=entry_hash,
            )
        )
        prev = entry_hash
        if sequence % 1000 == 0:
            heads.append(
                signed_head_line(
                    network_id=NETWORK_ID,
                    sequence=sequence,
                    head_hash=entry_hash,
                    signer_public_key=public_key_bytes(key),
                    signature=key.sign(chain_head_message(NETWORK_ID, sequence, entry_hash)),
                    signed_at="2026-01-01T00:00:00+00:00",
                )
            )
    header = header_line(exported_at="2026-01-01T00:00:00+00:00", tip_sequence=COUNT, tip_hash=prev)
    # Heads after the entries this time: verification must not depend on their position.
    path.write_text("\n".join([header, *lines, *heads]) + "\n", encoding="utf-8")


def _boundary_sequence(path: Path, spans: int) -> int:
    """Sequence of the first entry of the second span when split ``spans`` ways."""
    _, body_start = _read_header(path)
    second_start = _span_bounds(path, body_start, spans)[1][0]
    with open(path, "rb") as lines:
        lines.seek(second_start)
        sequence: int = json.loads(lines.readline())["sequence"]
    return sequence


@pytest.mark.parametrize("tamper", ["none", "amount", "boundary_link", "delete_boundary", "head"])
def test_parallel_verification_matches_sequential(tmp_path: Path, tamper: str) -> None:
    key = Ed25519PrivateKey.generate()
    path = tmp_path / "ledger.jsonl"
    _write_export(path, key)
    boundary = _boundary_sequence(path, 3)
    assert 1 < boundary < COUNT
    lines = path.read_text(encoding="utf-8").splitlines()
    expected_bad: int | None = None
    if tamper == "amount":
        record = json.loads(lines[2500])
        record["amount"] += 1
        lines[2500] = json.dumps(record)
        expected_bad = 2500
    elif tamper == "boundary_link":
        record = json.loads(lines[boundary])
        record["prev_hash"] = "11" * 32
        lines[boundary] = json.dumps(record)
        expected_bad = boundary
    elif tamper == "delete_boundary":
        del lines[boundary - 1]  # the last entry of the first span
        expected_bad = boundary - 1
    elif tamper == "head":
        record = json.loads(lines[-1])
        record["head_hash"] = "22" * 32
        lines[-1] = json.dumps(record)
        expected_bad = 3000
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")

    sequential = verify_export(path, pinned_key=public_key_bytes(key), workers=1)
    parallel = verify_export(path, pinned_key=public_key_bytes(key), workers=3)
    assert parallel == sequential
    assert sequential.first_bad_sequence == expected_bad, sequential.summary()
    assert sequential.ok is (expected_bad is None)
    if expected_bad is None:
        assert (sequential.entries_verified, sequential.heads_verified) == (COUNT, 3)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("not json", "Expecting value"),
        ("[1, 2]", "list indices"),
        ('{"type": "entry"} trailing', "data after the JSON value"),
        ('{"type": "bogus"}', "unknown line type"),
        ('{"type": "entry", "sequence": 1}', "'prev_hash'"),
    ],
)
def test_malformed_body_lines_are_format_errors(tmp_path: Path, body: str, message: str) -> None:
    path = tmp_path / "bad.jsonl"
    header = header_line(exported_at="x", tip_sequence=1, tip_hash=bytes(32))
    path.write_text(f"{header}\n{body}\n", encoding="utf-8")
    with pytest.raises(ExportFormatError, match=re.escape(message)):
        verify_export(path)
