"""What the operator dashboard costs the database, on a ledger of realistic size.

Builds a database of a swarm some weeks in (by default 10,000 nodes, 200,000 tasks of which a
few hundred are in flight, 200,000 commitments and verdicts, 600,000 ledger entries, 1,000
trainer steps), then times, side by side in one run:

- ``snapshot (steady)``: what each dashboard refresh costs once the view is running (at most one
  per second, whatever the number of viewers), with 100 new ledger entries since the last one;
- ``snapshot (first)``: the one-time start of the view (grouped totals over the whole ledger);
- ``nodes page``: one page of the node list;
- the baseline, ``naive refresh``: the same figures read the obvious way at every refresh
  (totals grouped over the whole ledger, tasks and verdicts counted over all rows).

    python bench/dashboard_cost.py [--scale 1.0] [--postgres]
"""

from __future__ import annotations

import argparse
import secrets
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import Engine, func, insert, select
from sqlalchemy.orm import Session

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _ledger_bench_db import fresh_database, postgres_available

from rollnet.ledger import chain
from rollnet.ledger.engine import session_factory
from rollnet.ledger.models import (
    Blob,
    Commitment,
    LedgerChainTip,
    LedgerEntry,
    Node,
    StepRewards,
    Task,
    Verdict,
    table_of,
)
from rollnet.reference.coordinator.blobstore import BlobStore
from rollnet.reference.coordinator.config import load_config
from rollnet.reference.coordinator.context import CoordinatorContext
from rollnet.reference.coordinator.dashboard_view import SwarmView
from rollnet.reference.coordinator.metrics import CoordinatorMetrics
from rollnet.sdk import Identity

BATCH = 5000


def populate(engine: Engine, scale: float) -> int:
    """Fill the database; returns the number of ledger entries."""
    nodes, tasks, open_tasks = int(10_000 * scale), int(200_000 * scale), 300
    now = datetime.now(UTC)
    node_ids = [secrets.token_hex(16) for _ in range(nodes)]
    with engine.begin() as connection:

        def put(model: type, rows: list[dict[str, object]]) -> None:
            for start in range(0, len(rows), BATCH):
                connection.execute(insert(table_of(model)), rows[start : start + BATCH])

        put(
            Node,
            [
                {
                    "id": node_id,
                    "public_key": secrets.token_bytes(32),
                    "role": "validator" if i % 100 == 0 else "worker",
                    "state": "ejected" if i % 97 == 0 else "active",
                    "trust": 1.0,
                    "accepted_streak": 10,
                    "protocol_version": "1.0",
                    "software_version": "bench",
                    "capabilities": [],
                    "hardware": {},
                    "pool": None,
                    "registered_at": now,
                    "last_heartbeat_at": now,
                    "state_changed_at": now,
                    "state_reason": "",
                    "checkpoint_step": 999 - (i % 3),
                    "rejects_forgiven": 0,
                }
                for i, node_id in enumerate(node_ids)
            ],
        )
        task_rows, blob_rows, commitment_rows, verdict_rows, entries = [], [], [], [], []
        sequence = 0
        for i in range(tasks):
            task_id = f"t{i:08d}"
            done = i >= open_tasks
            accepted = i % 50 != 0
            task_rows.append(
                {
                    "id": task_id,
                    "environment": "arithmetic",
                    "checkpoint_step": i * 1000 // tasks,
                    "prompt_ids": [i, i + 1],
                    "seed": i,
                    "sampling": {"samples_per_prompt": 4, "rollout_step": i * 1000 // tasks},
                    "state": ("accepted" if accepted else "rejected") if done else "queued",
                    "attempt": 1,
                    "fencing_token": 1,
                    "created_at": now - timedelta(seconds=tasks - i),
                    "updated_at": now,
                }
            )
            if not done:
                continue
            worker = node_ids[1 + i % (nodes - 1)]
            validator = node_ids[0]
            digest = f"{i:064x}"
            blob_rows.append({"hash": digest, "size": 1000, "location": "x", "created_at": now})
            commitment_rows.append(
                {
                    "id": f"c{i:08d}",
                    "task_id": task_id,
                    "node_id": worker,
                    "lease_id": f"l{i}",
                    "fencing_token": 1,
                    "rollout_blob_hash": digest,
                    "sampling_seed": i,
                    "claimed_work": 400,
                    "request_id": f"r{i}",
                    "signature": bytes(64),
                    "received_at": now,
                }
            )
            verdict_rows.append(
                {
                    "id": f"v{i:08d}",
                    "validation_job_id": None,
                    "commitment_id": f"c{i:08d}",
                    "validator_id": validator,
                    "accepted": accepted,
                    "reasons": [] if accepted else ["EXPONENT_MISMATCH"],
                    "check_figures": {"validated_rewards": [[1.0, 0.0, 1.0]] * 8},
                    "awarded_work": 800 if accepted else 0,
                    "decided_at": now,
                }
            )
            recorded = now - timedelta(seconds=(tasks - i) * 2)
            for node_id, kind, amount, memo in (
                (
                    worker,
                    "credit" if accepted else "slash",
                    800 if accepted else -800,
                    "" if accepted else "EXPONENT_MISMATCH",
                ),
                (validator, "validator_reward", 8, ""),
            ):
                sequence += 1
                entries.append(
                    {
                        "sequence": sequence,
                        "recorded_at": recorded,
                        "node_id": node_id,
                        "kind": kind,
                        "amount": amount,
                        "commitment_id": f"c{i:08d}",
                        "verdict_id": f"v{i:08d}",
                        "memo": memo,
                        "prev_hash": bytes(32),
                        "entry_hash": sequence.to_bytes(32, "big"),
                    }
                )
        put(Task, task_rows)
        put(Blob, blob_rows)
        put(Commitment, commitment_rows)
        _put_verdicts(connection, verdict_rows)
        put(LedgerEntry, entries)
        connection.execute(
            table_of(LedgerChainTip)
            .update()
            .values(sequence=sequence, head_hash=sequence.to_bytes(32, "big"))
        )
        put(
            StepRewards,
            [
                {
                    "rollout_step": step,
                    "rollouts": 800,
                    "task_reward_sum": 400.0 + step / 10,
                    "total_reward_sum": 400.0 + step / 10,
                    "updated_at": now,
                }
                for step in range(1000)
            ],
        )
    return sequence


def _put_verdicts(connection: object, rows: Sequence[Mapping[str, object]]) -> None:
    # Verdicts name a validation job; the bench's history has none, so the foreign key is
    # satisfied by jobs made here.
    from rollnet.ledger.models import ValidationJob

    now = datetime.now(UTC)
    jobs = [
        {
            "id": f"j{row['id']}",
            "commitment_id": row["commitment_id"],
            "state": "done",
            "attempt": 1,
            "fencing_token": 1,
            "check_probability": 1.0,
            "created_at": now,
            "updated_at": now,
        }
        for row in rows
    ]
    for start in range(0, len(rows), BATCH):
        connection.execute(insert(table_of(ValidationJob)), jobs[start : start + BATCH])  # type: ignore[attr-defined]
        batch = [
            {**row, "validation_job_id": f"j{row['id']}"} for row in rows[start : start + BATCH]
        ]
        connection.execute(insert(table_of(Verdict)), batch)  # type: ignore[attr-defined]


def append_entries(engine: Engine, count: int) -> None:
    """``count`` more ledger entries, as a running swarm appends them between refreshes."""
    with session_factory(engine).begin() as session:
        tip = chain.chain_tip(session)
        node = session.scalar(select(Node.id).limit(1))
        rows = [
            {
                "sequence": tip.sequence + k,
                "recorded_at": datetime.now(UTC),
                "node_id": node,
                "kind": "validator_reward",
                "amount": 1,
                "commitment_id": None,
                "verdict_id": None,
                "memo": "",
                "prev_hash": bytes(32),
                "entry_hash": secrets.token_bytes(32),
            }
            for k in range(1, count + 1)
        ]
        session.execute(insert(table_of(LedgerEntry)), rows)
        session.execute(table_of(LedgerChainTip).update().values(sequence=tip.sequence + count))


def naive_refresh(session: Session) -> None:
    """The baseline: every figure read over all rows, at every refresh."""
    chain.balances(session)
    session.execute(select(Task.state, func.count()).group_by(Task.state)).all()
    session.execute(select(Verdict.accepted, func.count()).group_by(Verdict.accepted)).all()
    session.execute(
        select(LedgerEntry.memo, func.count())
        .where(LedgerEntry.kind == "slash")
        .group_by(LedgerEntry.memo)
    ).all()
    session.execute(select(Node.role, Node.state, func.count()).group_by(Node.role, Node.state))


def timed(action: Callable[[], object], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        started = time.perf_counter()
        action()
        samples.append(time.perf_counter() - started)
    return statistics.median(samples)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=float, default=1.0, help="size of the history (1.0)")
    parser.add_argument("--postgres", action="store_true", help="PostgreSQL instead of SQLite")
    args = parser.parse_args()
    engine_name = "postgresql" if args.postgres else "sqlite"
    if args.postgres and not postgres_available():
        raise SystemExit("PostgreSQL is not reachable on 127.0.0.1:5432")
    with fresh_database(engine_name) as engine, tempfile.TemporaryDirectory() as directory:
        started = time.perf_counter()
        entries = populate(engine, args.scale)
        took = time.perf_counter() - started
        print(f"{engine_name}: {entries:,} ledger entries built in {took:.0f} s")
        config = load_config(Path(directory))
        ctx = CoordinatorContext(
            config=config,
            engine=engine,
            identity=Identity.generate(),
            blobs=BlobStore(Path(directory) / "blobs", max_bytes=1 << 20),
            metrics=CoordinatorMetrics(),
        )
        view = SwarmView(ctx)
        sessions = session_factory(engine)

        def snapshot() -> None:
            with sessions() as session:
                view._take(session)

        first = timed(snapshot, 1)

        def steady() -> None:
            append_entries(engine, 100)
            snapshot()

        append = timed(lambda: append_entries(engine, 100), 5)
        steady_time = timed(steady, 10) - append

        def nodes_page() -> None:
            from rollnet.ledger import overview

            with sessions() as session:
                overview.node_page(session, after_id="8", limit=51)

        page = timed(nodes_page, 20)

        def naive() -> None:
            with sessions() as session:
                naive_refresh(session)

        baseline = timed(naive, 3)
        print(f"snapshot (first, once) {first * 1000:9.1f} ms")
        print(f"snapshot (steady)      {steady_time * 1000:9.1f} ms  (one per second at most)")
        print(f"nodes page             {page * 1000:9.1f} ms")
        print(f"naive refresh          {baseline * 1000:9.1f} ms  (baseline)")
        print(f"steady / naive         {steady_time / baseline:9.3f}")
        ctx.close()


if __name__ == "__main__":
    main()
