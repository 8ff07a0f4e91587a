"""Databases for the ledger benchmarks: a fresh SQLite file or a fresh PostgreSQL database."""

from __future__ import annotations

import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
from psycopg import sql
from sqlalchemy.engine import Engine

from rollnet.ledger import create_engine, upgrade_to_head

POSTGRES_SERVER = "postgresql://postgres@127.0.0.1:5432"


def postgres_available() -> bool:
    """Whether the benchmark PostgreSQL server answers."""
    try:
        with psycopg.connect(f"{POSTGRES_SERVER}/postgres", connect_timeout=3):
            return True
    except psycopg.OperationalError:
        return False


@contextmanager
def fresh_database(engine_name: str) -> Iterator[Engine]:
    """A migrated engine on a new database (``sqlite`` or ``postgresql``), removed afterwards."""
    if engine_name == "sqlite":
        with tempfile.TemporaryDirectory(prefix="rollnet-bench-") as directory:
            engine = create_engine(f"sqlite:///{Path(directory) / 'rollnet.db'}")
            upgrade_to_head(engine)
            try:
                yield engine
            finally:
                engine.dispose()
        return
    name = f"rollnet_bench_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(f"{POSTGRES_SERVER}/postgres", autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    engine = create_engine(f"{POSTGRES_SERVER}/{name}")
    try:
        upgrade_to_head(engine)
        yield engine
    finally:
        engine.dispose()
        with psycopg.connect(f"{POSTGRES_SERVER}/postgres", autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )
