"""Hash-chained append vs a plain batched insert of the same rows (SQLite and PostgreSQL).

Both sides insert identical rows into the same ``ledger_entries`` table of a fresh database in
batches of one transaction each. The chained side does everything a real append does (lock and
advance the chain tip, canonical encoding, BLAKE3 chaining); the plain side inserts the rows the
chained side produced, precomputed. Printed: entries/s of each and the ratio chained/plain
(target ≤ 1.5×; ≥ 20,000 entries/s batched on SQLite). Nothing is asserted on time.

    .venv/bin/python bench/ledger_append.py [--entries 100000] [--batch 1000]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ledger_bench_db import (
    fresh_database,
    postgres_available,
)
from sqlalchemy.engine import Engine

from rollnet.ledger import (
    EntryKind,
    NewEntry,
    NodeRole,
    append_entries,
    session_factory,
)
from rollnet.ledger.models import Base
from rollnet.ledger.nodes import register_node

NODES = 64
NOW = datetime(2026, 1, 1, tzinfo=UTC)


def _register_nodes(engine: Engine) -> list[str]:
    ids = [f"{i:032x}" for i in range(NODES)]
    with session_factory(engine).begin() as session:
        for i, node_id in enumerate(ids):
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
                now=NOW,
            )
    return ids


def _entries(nodes: list[str], count: int) -> list[NewEntry]:
    kinds = [(EntryKind.CREDIT, 1500), (EntryKind.VALIDATOR_REWARD, 15), (EntryKind.SLASH, -300)]
    return [
        NewEntry(nodes[i % len(nodes)], *kinds[i % 3], memo=f"bench entry {i}")
        for i in range(count)
    ]


def run(engine_name: str, count: int, batch: int) -> tuple[float, float, float, float]:
    """Returns entries/s (chained, plain), then entries per CPU-second of this process (same)."""
    with fresh_database(engine_name) as engine:
        nodes = _register_nodes(engine)
        entries = _entries(nodes, count)
        sessions = session_factory(engine)
        rows: list[dict[str, object]] = []
        started = time.perf_counter()
        cpu_started = time.process_time()
        for start in range(0, count, batch):
            with sessions.begin() as session:
                appended = append_entries(session, entries[start : start + batch], now=NOW)
            rows.extend(
                {
                    "sequence": entry.sequence,
                    "recorded_at": entry.recorded_at,
                    "node_id": entry.node_id,
                    "kind": entry.kind,
                    "amount": entry.amount,
                    "commitment_id": entry.commitment_id,
                    "verdict_id": entry.verdict_id,
                    "memo": entry.memo,
                    "prev_hash": entry.prev_hash,
                    "entry_hash": entry.entry_hash,
                }
                for entry in appended
            )
        chained = time.perf_counter() - started
        chained_cpu = time.process_time() - cpu_started
    table = Base.metadata.tables["ledger_entries"]
    with fresh_database(engine_name) as engine:
        _register_nodes(engine)
        started = time.perf_counter()
        cpu_started = time.process_time()
        for start in range(0, count, batch):
            with engine.begin() as connection:
                connection.execute(table.insert(), rows[start : start + batch])
        plain = time.perf_counter() - started
        plain_cpu = time.process_time() - cpu_started
    return count / chained, count / plain, count / chained_cpu, count / plain_cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--entries", type=int, default=100_000)
    parser.add_argument("--batch", type=int, default=1000)
    args = parser.parse_args()
    engines = ["sqlite"] + (["postgresql"] if postgres_available() else [])
    print(
        f"ledger append: {args.entries} entries in batches of {args.batch}"
        f" (load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)"
    )
    print(
        f"{'engine':<11}{'chained/s':>12}{'plain/s':>12}{'chained cost / plain':>23}"
        f"{'chained/CPU-s':>16}{'plain/CPU-s':>14}"
    )
    for engine_name in engines:
        chained, plain, chained_cpu, plain_cpu = run(engine_name, args.entries, args.batch)
        print(
            f"{engine_name:<11}{chained:>12,.0f}{plain:>12,.0f}{plain / chained:>22.2f}x"
            f"{chained_cpu:>16,.0f}{plain_cpu:>14,.0f}"
        )
    if "postgresql" not in engines:
        print("postgresql: server on 127.0.0.1:5432 unreachable, skipped")
    print("targets: chained cost <= 1.5x plain; >= 20,000 entries/s chained on SQLite")
    print("(CPU-s: per CPU-second of this process; the database server's CPU is not counted)")


if __name__ == "__main__":
    main()
