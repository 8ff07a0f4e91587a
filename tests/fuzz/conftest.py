"""Fixtures of the fuzz tests: an event loop thread per module (servers run there, so
hypothesis drives them with plain blocking calls) and a database per module, on SQLite and
PostgreSQL."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from fuzz_testing import LoopThread
from psycopg import sql

_LIBPQ_SERVER = "postgresql://postgres@127.0.0.1:5432"
_SQLALCHEMY_SERVER = "postgresql+psycopg://postgres@127.0.0.1:5432"


@pytest.fixture(scope="module")
def loop_thread() -> Iterator[LoopThread]:
    thread = LoopThread()
    try:
        yield thread
    finally:
        thread.close()


def _postgres_admin(statement: sql.Composed) -> None:
    with psycopg.connect(f"{_LIBPQ_SERVER}/postgres", autocommit=True, connect_timeout=5) as conn:
        conn.execute(statement)


@pytest.fixture(
    scope="module",
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ],
)
def module_db_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A database for one module's coordinator: a SQLite file, or a new PostgreSQL database
    (skipped, or failed under CI, when PostgreSQL does not answer) dropped afterwards."""
    if request.param == "sqlite":
        yield f"sqlite+pysqlite:///{tmp_path_factory.mktemp('fuzz-db') / 'rollnet.db'}"
        return
    request.getfixturevalue("postgres_server_url")
    name = f"rollnet_fuzz_{uuid.uuid4().hex[:12]}"
    _postgres_admin(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield f"{_SQLALCHEMY_SERVER}/{name}"
    finally:
        _postgres_admin(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


@pytest.fixture(scope="module")
def module_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")
