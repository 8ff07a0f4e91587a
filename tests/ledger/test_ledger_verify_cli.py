"""``rollnet ledger verify|export|balances`` against intact and tampered ledgers.

Tampering is done with raw SQL (or by editing the export file), the way an attacker with database
access would; the verifier must name the first bad sequence number and exit 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from rollnet.ledger import EntryKind, NewEntry, append_entries, sign_chain_head
from rollnet.ledger.canonical import (
    canonical_entry_bytes,
    chain_hash,
    chain_head_message,
    datetime_to_us,
)
from rollnet.ledger.chain import public_key_bytes
from rollnet.reference.cli import main
from rollnet.sdk.testing import NETWORK_ID

T0 = datetime(2026, 1, 1, tzinfo=UTC)
ENTRIES = 60
AddNodes = Callable[..., list[str]]


@dataclass
class Ledger:
    """A populated ledger: 60 entries, heads signed at 20 and 60 by the coordinator key."""

    url: str
    engine: Engine
    coordinator_key: Ed25519PrivateKey
    nodes: list[str]

    @property
    def key_hex(self) -> str:
        return public_key_bytes(self.coordinator_key).hex()

    def sql(self, statement: str, **params: object) -> None:
        with self.engine.begin() as connection:
            connection.execute(text(statement), params)


@pytest.fixture
def ledger(
    db_url: str, migrated_engine: Engine, sessions: sessionmaker[Session], add_nodes: AddNodes
) -> Ledger:
    nodes = add_nodes(3)
    key = Ed25519PrivateKey.generate()
    kinds = [
        (EntryKind.CREDIT, 100),
        (EntryKind.SLASH, -40),
        (EntryKind.VALIDATOR_REWARD, 7),
        (EntryKind.ADJUSTMENT, -3),
    ]
    for batch in range(3):
        with sessions.begin() as session:
            append_entries(
                session,
                [
                    NewEntry(nodes[i % 3], *kinds[i % 4], memo=f"entry {batch * 20 + i + 1}")
                    for i in range(20)
                ],
                now=T0,
            )
            if batch in (0, 2):
                sign_chain_head(session, key, NETWORK_ID, now=T0)
    return Ledger(url=db_url, engine=migrated_engine, coordinator_key=key, nodes=nodes)


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def assert_first_bad(code: int, output: str, sequence: int) -> None:
    assert code == 1, output
    assert f"FAIL: first bad sequence {sequence}:" in output, output


def test_intact_ledger_verifies_from_db_and_export(
    ledger: Ledger, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, output = run_cli(capsys, "ledger", "verify", "--db", ledger.url)
    assert code == 0, output
    assert f"OK: {ENTRIES} entries verified" in output
    assert "2 signed heads checked" in output
    assert "stored with the heads" in output

    out = tmp_path / "ledger.jsonl"
    code, output = run_cli(capsys, "ledger", "export", "--db", ledger.url, "--out", str(out))
    assert code == 0, output
    lines = out.read_text().splitlines()
    assert len(lines) == 1 + 2 + ENTRIES
    assert json.loads(lines[0])["tip_sequence"] == ENTRIES

    code, output = run_cli(
        capsys, "ledger", "verify", "--export", str(out), "--coordinator-key", ledger.key_hex
    )
    assert code == 0, output
    assert "pinned coordinator key" in output
    code, parallel_output = run_cli(capsys, "ledger", "verify", "--export", str(out), "--jobs", "2")
    assert code == 0, parallel_output
    assert f"OK: {ENTRIES} entries verified" in parallel_output


def test_balances_prints_per_node_totals(
    ledger: Ledger, capsys: pytest.CaptureFixture[str]
) -> None:
    code, output = run_cli(capsys, "ledger", "balances", "--db", ledger.url)
    assert code == 0, output
    totals: dict[str, int] = dict.fromkeys(ledger.nodes, 0)
    amounts = [100, -40, 7, -3]
    for i in range(ENTRIES):
        totals[ledger.nodes[(i % 20) % 3]] += amounts[(i % 20) % 4]
    for node, total in totals.items():
        assert any(line.split() == [node, str(total)] for line in output.splitlines()), output
    assert f"{sum(totals.values())} work units in total" in output


def test_changed_amount_is_caught(ledger: Ledger, capsys: pytest.CaptureFixture[str]) -> None:
    ledger.sql("UPDATE ledger_entries SET amount = amount + 1000 WHERE sequence = 17")
    assert_first_bad(*run_cli(capsys, "ledger", "verify", "--db", ledger.url), 17)


def test_deleted_row_is_caught(ledger: Ledger, capsys: pytest.CaptureFixture[str]) -> None:
    ledger.sql("DELETE FROM ledger_entries WHERE sequence = 23")
    assert_first_bad(*run_cli(capsys, "ledger", "verify", "--db", ledger.url), 23)


def test_deleted_tail_is_caught(ledger: Ledger, capsys: pytest.CaptureFixture[str]) -> None:
    ledger.sql("DELETE FROM ledger_entries WHERE sequence > 55")
    assert_first_bad(*run_cli(capsys, "ledger", "verify", "--db", ledger.url), 56)


def test_garbage_written_past_dropped_constraints_is_caught(
    ledger: Ledger, capsys: pytest.CaptureFixture[str]
) -> None:
    """An attacker with DDL rights drops the CHECK constraints and writes values the models
    cannot even read: the verifier still names the entry instead of crashing."""
    if ledger.engine.dialect.name == "postgresql":
        for constraint in ("ck_ledger_entries_kind_valid", "ck_ledger_entries_amount_sign"):
            ledger.sql(f"ALTER TABLE ledger_entries DROP CONSTRAINT {constraint}")
        ledger.sql("UPDATE ledger_entries SET kind = 'bonus' WHERE sequence = 44")
    else:
        with ledger.engine.connect() as connection:
            connection.exec_driver_sql("PRAGMA ignore_check_constraints = ON")
            connection.exec_driver_sql(
                "UPDATE ledger_entries SET kind = 'bonus' WHERE sequence = 44"
            )
            connection.exec_driver_sql(
                "UPDATE ledger_entries SET recorded_at = 'yesterday' WHERE sequence = 45"
            )
            connection.commit()
    assert_first_bad(*run_cli(capsys, "ledger", "verify", "--db", ledger.url), 44)


def test_reordered_rows_are_caught(ledger: Ledger, capsys: pytest.CaptureFixture[str]) -> None:
    ledger.sql("UPDATE ledger_entries SET sequence = 1000000 WHERE sequence = 30")
    ledger.sql("UPDATE ledger_entries SET sequence = 30 WHERE sequence = 31")
    ledger.sql("UPDATE ledger_entries SET sequence = 31 WHERE sequence = 1000000")
    assert_first_bad(*run_cli(capsys, "ledger", "verify", "--db", ledger.url), 30)


def test_rewritten_and_rehashed_chain_is_caught_by_the_signed_head(
    ledger: Ledger, capsys: pytest.CaptureFixture[str]
) -> None:
    """An attacker changes entry 41 and recomputes every later hash: only the head at 60 knows."""
    rows = []
    with ledger.engine.connect() as connection:
        rows = list(
            connection.execute(
                text("SELECT * FROM ledger_entries WHERE sequence >= 40 ORDER BY sequence")
            ).mappings()
        )
    prev = bytes(rows[0]["entry_hash"])
    for row in rows[1:]:
        amount = row["amount"] + (500 if row["sequence"] == 41 else 0)
        recorded_at = row["recorded_at"]  # SQLite hands back text, PostgreSQL a datetime
        if isinstance(recorded_at, str):
            recorded_at = datetime.fromisoformat(recorded_at).replace(tzinfo=UTC)
        time_us = datetime_to_us(recorded_at)
        canonical = canonical_entry_bytes(
            sequence=row["sequence"],
            time_us=time_us,
            node_id=row["node_id"],
            kind=row["kind"],
            amount=amount,
            commitment_id=row["commitment_id"],
            verdict_id=row["verdict_id"],
            memo=row["memo"],
        )
        new_hash = chain_hash(prev, canonical)
        ledger.sql(
            "UPDATE ledger_entries SET amount = :amount, prev_hash = :prev, entry_hash = :hash"
            " WHERE sequence = :sequence",
            amount=amount,
            prev=prev,
            hash=new_hash,
            sequence=row["sequence"],
        )
        prev = new_hash
    ledger.sql("UPDATE ledger_chain_tip SET head_hash = :hash", hash=prev)
    assert_first_bad(*run_cli(capsys, "ledger", "verify", "--db", ledger.url), 60)


def test_forged_head_is_caught(ledger: Ledger, capsys: pytest.CaptureFixture[str]) -> None:
    """A head signed by another key passes only if nobody pins the coordinator key."""
    forger = Ed25519PrivateKey.generate()
    with ledger.engine.connect() as connection:
        head_hash = connection.execute(
            text("SELECT entry_hash FROM ledger_entries WHERE sequence = 40")
        ).scalar_one()
    ledger.sql(
        "INSERT INTO ledger_signed_heads"
        " (network_id, sequence, head_hash, signer_public_key, signature, signed_at)"
        " VALUES (:network, 40, :hash, :key, :signature, :at)",
        network=NETWORK_ID,
        hash=head_hash,
        key=public_key_bytes(forger),
        signature=forger.sign(chain_head_message(NETWORK_ID, 40, bytes(head_hash))),
        at=T0,
    )
    code, output = run_cli(capsys, "ledger", "verify", "--db", ledger.url)
    assert code == 0, output  # self-consistent without a pinned key, and the output says so
    assert "no coordinator key pinned" in output
    assert_first_bad(
        *run_cli(
            capsys, "ledger", "verify", "--db", ledger.url, "--coordinator-key", ledger.key_hex
        ),
        40,
    )


def test_corrupted_head_signature_is_caught_without_a_pinned_key(
    ledger: Ledger, capsys: pytest.CaptureFixture[str]
) -> None:
    with ledger.engine.connect() as connection:
        signature = bytes(
            connection.execute(
                text("SELECT signature FROM ledger_signed_heads WHERE sequence = 20")
            ).scalar_one()
        )
    forged = bytes([signature[0] ^ 1]) + signature[1:]
    ledger.sql(
        "UPDATE ledger_signed_heads SET signature = :signature WHERE sequence = 20",
        signature=forged,
    )
    assert_first_bad(*run_cli(capsys, "ledger", "verify", "--db", ledger.url), 20)


@pytest.mark.parametrize("tamper", ["amount", "delete", "swap", "head"])
def test_tampered_export_is_caught(
    ledger: Ledger, tmp_path: Path, capsys: pytest.CaptureFixture[str], tamper: str
) -> None:
    out = tmp_path / "ledger.jsonl"
    assert run_cli(capsys, "ledger", "export", "--db", ledger.url, "--out", str(out))[0] == 0
    lines = out.read_text().splitlines()
    # Line 0 is the header, lines 1-2 the heads, line 2 + n entry n.
    if tamper == "amount":
        record = json.loads(lines[2 + 9])
        record["amount"] += 1
        lines[2 + 9] = json.dumps(record)
        expected = 9
    elif tamper == "delete":
        del lines[2 + 12]
        expected = 12
    elif tamper == "swap":
        lines[2 + 5], lines[2 + 6] = lines[2 + 6], lines[2 + 5]
        expected = 5
    else:
        record = json.loads(lines[1])
        assert record["type"] == "signed_head"
        record["head_hash"] = "00" * 32
        lines[1] = json.dumps(record)
        expected = record["sequence"]
    out.write_text("\n".join(lines) + "\n")
    assert_first_bad(*run_cli(capsys, "ledger", "verify", "--export", str(out)), expected)


def test_unreadable_inputs_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing.jsonl"
    assert run_cli(capsys, "ledger", "verify", "--export", str(missing))[0] == 2
    garbage = tmp_path / "garbage.jsonl"
    garbage.write_text("not json\n")
    code, output = run_cli(capsys, "ledger", "verify", "--export", str(garbage))
    assert code == 2
    assert "not JSON" in output
    code, output = run_cli(
        capsys, "ledger", "verify", "--export", str(garbage), "--coordinator-key", "abc"
    )
    assert code == 2
    assert "64 hex" in output


@pytest.mark.slow
def test_verify_as_a_subprocess(ledger: Ledger) -> None:
    """The real entry point, in its own process: exit codes reach the shell."""
    command = [
        sys.executable,
        "-c",
        "import sys; from rollnet.reference.cli import main; sys.exit(main(sys.argv[1:]))",
        "ledger",
        "verify",
        "--db",
        ledger.url,
    ]
    env = dict(os.environ)
    intact = subprocess.run(
        command, capture_output=True, text=True, timeout=120, env=env, check=False
    )
    assert intact.returncode == 0, intact.stderr
    ledger.sql("UPDATE ledger_entries SET memo = 'edited' WHERE sequence = 3")
    tampered = subprocess.run(
        command, capture_output=True, text=True, timeout=120, env=env, check=False
    )
    assert tampered.returncode == 1, tampered.stderr
    assert "FAIL: first bad sequence 3:" in tampered.stdout
