"""Concurrent task leasing: 2 coordinator replicas × 8 workers on PostgreSQL over 10,000 tasks.

Each replica is its own process with its own engine; each worker is a thread leasing with
``lease_next_task`` (``FOR UPDATE SKIP LOCKED``) until the queue is empty. Checked: every task
leased exactly once, by the worker that reported it. Printed side by side: leases/s of one
worker alone (the baseline, same database server, same code), of the 2 × 8 swarm, and their
ratio; SQLite (one process × 8 threads, one writer) for comparison. Nothing is asserted on time.

    .venv/bin/python bench/ledger_leasing.py [--tasks 10000] [--replicas 2] [--workers 8]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _ledger_bench_db import (
    fresh_database,
    postgres_available,
)
from sqlalchemy import select
from sqlalchemy.engine import Engine

from rollnet.ledger import (
    NewTask,
    NodeRole,
    create_engine,
    lease_next_task,
    session_factory,
)
from rollnet.ledger.models import Task
from rollnet.ledger.nodes import register_node
from rollnet.ledger.tasks import enqueue_tasks

NOW = datetime(2026, 1, 1, tzinfo=UTC)
LEASE = timedelta(minutes=10)


def _prepare(engine: Engine, tasks: int, nodes: int) -> list[str]:
    ids = [f"{i:032x}" for i in range(nodes)]
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
        enqueue_tasks(
            session,
            [NewTask(f"task-{i:06d}", "arithmetic", 0, [f"p{i}"], seed=i) for i in range(tasks)],
            now=NOW + timedelta(microseconds=0),
        )
    return ids


def _lease_all(url: str, node_ids: list[str], start: Any, results: Any) -> None:
    """One replica: a thread per worker node, leasing until nothing is left."""
    engine = create_engine(url)
    sessions = session_factory(engine)
    leased: dict[str, list[str]] = {node: [] for node in node_ids}

    def worker(node_id: str) -> None:
        while True:
            with sessions.begin() as session:
                task = lease_next_task(session, node_id=node_id, now=NOW, lease_duration=LEASE)
            if task is None:
                return
            leased[node_id].append(task.task_id)

    threads = [threading.Thread(target=worker, args=(node,)) for node in node_ids]
    # Warm the pool so connection set-up is not measured.
    with engine.connect():
        pass
    start.wait()
    began = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    results.put((began, time.monotonic(), leased))
    engine.dispose()


def run(engine_name: str, tasks: int, replicas: int, workers: int) -> float:
    """Lease ``tasks`` with ``replicas`` processes × ``workers`` threads; returns leases/s."""
    with fresh_database(engine_name) as engine:
        nodes = _prepare(engine, tasks, replicas * workers)
        url = engine.url.render_as_string(hide_password=False)
        context = multiprocessing.get_context("spawn")
        start = context.Event()
        results = context.Queue()
        processes = [
            context.Process(
                target=_lease_all,
                args=(url, nodes[r * workers : (r + 1) * workers], start, results),
            )
            for r in range(replicas)
        ]
        for process in processes:
            process.start()
        start.set()
        outcomes = [results.get(timeout=600) for _ in processes]
        for process in processes:
            process.join()
        began = min(outcome[0] for outcome in outcomes)
        ended = max(outcome[1] for outcome in outcomes)
        reported = {
            task_id: node
            for outcome in outcomes
            for node, task_ids in outcome[2].items()
            for task_id in task_ids
        }
        counts = Counter(
            task_id
            for outcome in outcomes
            for task_ids in outcome[2].values()
            for task_id in task_ids
        )
        with session_factory(engine).begin() as session:
            holders = {
                row.id: row.lease_holder
                for row in session.execute(select(Task.id, Task.lease_holder))
            }
    if len(counts) != tasks or set(counts.values()) != {1} or holders != reported:
        raise SystemExit(
            f"{engine_name}: a task was leased twice or not at all: {counts.most_common(3)}"
        )
    elapsed: float = ended - began
    return tasks / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--baseline-tasks", type=int, default=2_000)
    args = parser.parse_args()
    print(
        f"task leasing: {args.tasks:,} tasks, every task leased exactly once (checked)"
        f" (load average before: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)"
    )
    if postgres_available():
        single = run("postgresql", args.baseline_tasks, 1, 1)
        swarm = run("postgresql", args.tasks, args.replicas, args.workers)
        print(
            f"  postgresql 1 replica x 1 worker ({args.baseline_tasks:,} tasks):"
            f" {single:>9,.0f} leases/s"
        )
        print(
            f"  postgresql {args.replicas} replicas x {args.workers} workers:            "
            f"{swarm:>9,.0f} leases/s  ({swarm / single:.2f}x one worker)"
        )
    else:
        print("  postgresql: server on 127.0.0.1:5432 unreachable, skipped")
    sqlite = run("sqlite", args.tasks, 1, args.workers)
    print(
        f"  sqlite 1 process x {args.workers} workers (one writer):        {sqlite:>9,.0f} leases/s"
    )


if __name__ == "__main__":
    main()
