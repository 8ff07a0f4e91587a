"""Verification speed of the ledger on 1,000,000 entries (target ≥ 200,000 entries/s).

The entries are generated in-process straight into the JSON Lines export format (through the
same canonical encoding the coordinator uses), then verified with ``verify_export`` — exactly
what ``rollnet ledger verify --export FILE`` runs. Printed side by side: the baseline of merely
reading and JSON-parsing every line, the full verification, and their ratio. A tampered copy
(one amount changed near the end) is verified too, to show the failure is found at the same
speed. Nothing is asserted on time.

    .venv/bin/python bench/ledger_verify.py [--entries 1000000]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import tempfile
import time
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from rollnet.ledger.canonical import (
    GENESIS_HASH,
    canonical_entry_bytes,
    chain_hash,
    chain_head_message,
)
from rollnet.ledger.chain import public_key_bytes
from rollnet.ledger.export_format import entry_line, header_line, signed_head_line
from rollnet.ledger.verify import verify_export

NETWORK = "rollnet-bench"
T0_US = 1_767_225_600_000_000


def generate(path: Path, count: int, key: Ed25519PrivateKey) -> None:
    """Write a valid export of ``count`` entries with a signed head every 100,000 entries."""
    kinds = [("credit", 1500), ("validator_reward", 15), ("slash", -300), ("adjustment", 7)]
    nodes = [f"{i:032x}" for i in range(256)]
    public_key = public_key_bytes(key)
    heads: list[str] = []
    entries: list[str] = []
    prev = GENESIS_HASH
    for sequence in range(1, count + 1):
        kind, amount = kinds[sequence % 4]
        fields = {
            "sequence": sequence,
            "time_us": T0_US + sequence * 1000,
            "node_id": nodes[sequence % 256],
            "kind": kind,
            "amount": amount,
            "commitment_id": f"c{sequence}" if kind in ("credit", "slash") else None,
            "verdict_id": f"v{sequence}" if kind != "adjustment" else None,
            "memo": "",
        }
        entry_hash = chain_hash(prev, canonical_entry_bytes(**fields))  # type: ignore[arg-type]
        entries.append(entry_line(**fields, prev_hash=prev, entry_hash=entry_hash))  # type: ignore[arg-type]
        prev = entry_hash
        if sequence % 100_000 == 0 or sequence == count:
            heads.append(
                signed_head_line(
                    network_id=NETWORK,
                    sequence=sequence,
                    head_hash=entry_hash,
                    signer_public_key=public_key,
                    signature=key.sign(chain_head_message(NETWORK, sequence, entry_hash)),
                    signed_at="2026-01-01T00:00:00+00:00",
                )
            )
    with open(path, "w", encoding="utf-8") as sink:
        sink.write(
            header_line(exported_at="2026-01-01T00:00:00+00:00", tip_sequence=count, tip_hash=prev)
        )
        sink.write("\n")
        for line in heads:
            sink.write(line + "\n")
        for line in entries:
            sink.write(line + "\n")


def _cpu_seconds() -> float:
    """CPU time of this process and its finished children: on a busy machine wall-clock rates
    are depressed by waiting for a core, CPU-second rates much less so."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def parse_only(path: Path) -> int:
    """Baseline: read and JSON-parse every line, nothing else."""
    count = 0
    loads = json.loads
    with open(path, encoding="utf-8") as lines:
        for line in lines:
            loads(line)
            count += 1
    return count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument(
        "--db-entries", type=int, default=200_000, help="also verify a SQLite ledger (0: skip)"
    )
    args = parser.parse_args()
    key = Ed25519PrivateKey.generate()
    with tempfile.TemporaryDirectory(prefix="rollnet-bench-") as directory:
        path = Path(directory) / "ledger.jsonl"
        started = time.perf_counter()
        generate(path, args.entries, key)
        generated = time.perf_counter() - started
        size_mb = path.stat().st_size / 1e6
        print(
            f"ledger verify: {args.entries:,} entries, {size_mb:,.0f} MB export"
            f" (load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)"
        )
        print(
            f"  generate (append-side hashing + JSON): {args.entries / generated:>12,.0f} entries/s"
        )

        started = time.perf_counter()
        cpu_started = _cpu_seconds()
        parse_only(path)
        parse_s = time.perf_counter() - started
        parse_cpu_s = _cpu_seconds() - cpu_started
        print(
            f"  baseline: read + json.loads only:      {args.entries / parse_s:>12,.0f} entries/s"
            f"  ({args.entries / parse_cpu_s:,.0f} entries per CPU-second)"
        )

        for workers in (1, None):
            started = time.perf_counter()
            cpu_started = _cpu_seconds()
            report = verify_export(path, pinned_key=public_key_bytes(key), workers=workers)
            verify_s = time.perf_counter() - started
            cpu_s = _cpu_seconds() - cpu_started
            assert report.ok, report.summary()
            label = "1 process" if workers == 1 else f"{os.cpu_count()} processes"
            print(
                f"  verify_export, {label:<11} (pinned key): {args.entries / verify_s:>10,.0f}"
                f" entries/s  ({verify_s / parse_s:.2f}x the parse-only baseline;"
                f" {args.entries / cpu_s:,.0f} entries per CPU-second;"
                f" {report.heads_verified} heads)"
            )

        lines = path.read_text(encoding="utf-8").splitlines()
        victim = len(lines) - 10
        record = json.loads(lines[victim])
        record["amount"] += 1
        lines[victim] = json.dumps(record)
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        del lines
        started = time.perf_counter()
        tampered = verify_export(path, pinned_key=public_key_bytes(key))
        tampered_s = time.perf_counter() - started
        print(
            f"  verify_export (tampered at {tampered.first_bad_sequence:,}): "
            f"{(tampered.entries_verified) / tampered_s:>10,.0f} entries/s, ok={tampered.ok}"
        )
        print("  target: >= 200,000 entries/s")
    if args.db_entries:
        database_figures(args.db_entries)


def database_figures(count: int) -> None:
    """``verify_database`` on a SQLite ledger written by ``append_entries`` (the --db path)."""
    from datetime import UTC, datetime

    from rollnet.ledger import EntryKind, NewEntry, NodeRole, append_entries, session_factory
    from rollnet.ledger import create_engine as make_engine
    from rollnet.ledger.export import verify_database
    from rollnet.ledger.migrate import upgrade_to_head
    from rollnet.ledger.nodes import register_node

    now = datetime(2026, 1, 1, tzinfo=UTC)
    with tempfile.TemporaryDirectory(prefix="rollnet-bench-") as directory:
        engine = make_engine(None, directory)
        upgrade_to_head(engine)
        sessions = session_factory(engine)
        nodes = [f"{i:032x}" for i in range(64)]
        with sessions.begin() as session:
            for i, node_id in enumerate(nodes):
                register_node(
                    session,
                    node_id=node_id,
                    public_key=i.to_bytes(32, "big"),
                    role=NodeRole.WORKER,
                    protocol_version="1.0",
                    software_version="bench",
                    capabilities=[],
                    hardware={},
                    pool=None,
                    now=now,
                )
        batch = 5_000
        for start in range(0, count, batch):
            with sessions.begin() as session:
                append_entries(
                    session,
                    [
                        NewEntry(nodes[i % 64], EntryKind.CREDIT, 1500)
                        for i in range(start, min(start + batch, count))
                    ],
                    now=now,
                )
        started = time.perf_counter()
        report = verify_database(engine)
        elapsed = time.perf_counter() - started
        engine.dispose()
    assert report.ok, report.summary()
    print(
        f"  verify_database, SQLite, {count:,} entries:     {count / elapsed:>10,.0f} entries/s"
        " (rows streamed through SQLAlchemy; one process)"
    )


if __name__ == "__main__":
    main()
