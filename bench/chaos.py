"""Chaos: the local swarm under seeded random faults, then the invariants (docs/reliability.md).

Runs the whole local swarm as real processes — coordinator (two replicas on PostgreSQL), trainer,
an origin and a caching relay, workers, validators — with every node behind an in-process TCP
proxy, and injects faults one at a time for ``--budget`` seconds: SIGKILL and restart of a
worker, a validator, a relay, the trainer, a coordinator; every PostgreSQL connection of the
swarm's database dropped (``pg_terminate_backend``, on a database this run creates and drops);
the PostgreSQL server restarted (``pg_ctl stop -m fast``, a pause, ``pg_ctl start``); and, at a
proxy, added delay, connection resets and a partition. Printed: faults injected and survived per
kind with the time the swarm took to make progress again and to have every process serving
again, then the invariants. Exit 1 when a fault was not survived or an invariant broke.

With ``--db postgres`` the run makes a PostgreSQL server of its own under its directory
(``initdb``; removed at the end), the default when ``initdb`` is found: the server
``restart_database`` restarts. ``--no-private-postgres`` uses the shared server on
127.0.0.1:5432 instead, which is never restarted (that kind is then left out).

    .venv/bin/python bench/chaos.py [--db sqlite|postgres|both] [--budget 240] [--seed 0]
        [--kinds restart_database,kill_coordinator] [--no-private-postgres]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import shutil
import signal
import sys
import tempfile
import uuid
from pathlib import Path

import psycopg
from psycopg import sql

from rollnet.reference.chaos import FAULT_KINDS, ChaosConfig, ChaosReport, SwarmConfig, run_chaos
from rollnet.reference.chaos.postgres import PrivatePostgres, private_postgres_available

POSTGRES_SERVER = "postgresql://postgres@127.0.0.1:5432"
#: Where in the run's directory its private PostgreSQL server lives.
PRIVATE_SERVER_DIR = "postgres-server"


def _admin(statement: sql.Composed) -> None:
    with psycopg.connect(f"{POSTGRES_SERVER}/postgres", autocommit=True, connect_timeout=5) as c:
        c.execute(statement)


async def _one(db: str, args: argparse.Namespace, root: Path) -> ChaosReport:
    name = f"rollnet_chaos_{uuid.uuid4().hex[:12]}"
    url = None
    server = None
    if db == "postgres" and args.private_postgres:
        server = PrivatePostgres(root / PRIVATE_SERVER_DIR)
    elif db == "postgres":
        _admin(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
    try:
        if server is not None:
            await asyncio.to_thread(server.start)
            url = server.create_database(name)
            print(f"private PostgreSQL server on port {server.port} in {server.directory}")
        config = ChaosConfig(
            swarm=SwarmConfig(
                data_dir=root / db,
                database_url=url,
                replicas=2 if url else 1,
                workers=args.workers,
                validators=args.validators,
                warm_start_steps=args.warm_start_steps,
                model_root=root / "models",
            ),
            budget=args.budget,
            seed=args.seed,
            kinds=tuple(filter(None, args.kinds.split(","))) or FAULT_KINDS,
            database_server=server,
        )
        return await run_chaos(config)
    finally:
        if server is not None:
            await asyncio.to_thread(server.remove)
        elif url is not None:
            _admin(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", choices=("sqlite", "postgres", "both"), default="both")
    parser.add_argument("--budget", type=float, default=240.0, help="seconds of faults per run")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--validators", type=int, default=2)
    parser.add_argument("--warm-start-steps", type=int, default=50)
    parser.add_argument("--kinds", default="", help=f"comma-separated, of {','.join(FAULT_KINDS)}")
    parser.add_argument("--keep", type=Path, default=None, help="run in this directory, kept")
    why_not_private = private_postgres_available()
    parser.add_argument(
        "--private-postgres",
        action=argparse.BooleanOptionalAction,
        default=why_not_private is None,
        help="--db postgres on a server of the run's own, which restart_database restarts "
        "(default: on when initdb is found); off: the shared server, never restarted",
    )
    args = parser.parse_args()
    if args.private_postgres and why_not_private is not None:
        parser.error(f"--private-postgres: {why_not_private}")
    unknown = sorted(set(filter(None, args.kinds.split(","))) - set(FAULT_KINDS))
    if unknown:
        parser.error(f"--kinds: unknown {', '.join(unknown)}; known: {', '.join(FAULT_KINDS)}")
    if args.budget <= 0 or args.workers < 1 or args.validators < 1 or args.warm_start_steps < 1:
        parser.error("--budget must be positive; --workers, --validators, --warm-start-steps >= 1")
    # SIGTERM (timeout, kill) unwinds like Ctrl-C: the swarm's processes are stopped, not left.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    root = args.keep or Path(tempfile.mkdtemp(prefix="rollnet-chaos-"))
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPU cores, {platform.system()}, "
        f"Python {platform.python_version()}; seed {args.seed}, {args.budget:.0f} s of faults"
    )
    ok = True
    try:
        for db in ("sqlite", "postgres") if args.db == "both" else (args.db,):
            print(f"\n## {db}\n", flush=True)
            report = asyncio.run(_one(db, args, root))
            low, high = report.steps
            print(
                f"\n{db}: {len(report.faults)} faults in {report.seconds:.0f} s; trainer "
                f"steps {low} -> {high}\n"
            )
            print(report.table(), flush=True)
            ok = ok and report.ok
    finally:
        # A second Ctrl-C can cut the run's own clean-up short: never leave the server running.
        PrivatePostgres(root / PRIVATE_SERVER_DIR).remove()
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
