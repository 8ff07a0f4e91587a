"""Shared fixtures for the whole test suite.

Database fixtures (stable names; other areas reuse them):

``postgres_server_url`` (session)
    ``postgresql+psycopg://postgres@127.0.0.1:5432/postgres``, the maintenance database, after
    checking the server answers. If it does not, tests that need PostgreSQL are *skipped* with the
    reason — unless the ``CI`` environment variable is set, in which case they *fail*: CI must
    never silently lose the PostgreSQL half of the suite.
``postgres_url`` (session)
    A database created for this test session with a unique name (``rollnet_test_<hex>``), empty,
    dropped (``WITH (FORCE)``) when the session ends.
``sqlite_url`` (function)
    ``sqlite+pysqlite:///<tmp_path>/rollnet.db``.
``db_url`` (function, parametrized with ids ``sqlite`` and ``postgres``)
    A fresh database for one test: the SQLite file above, or a new PostgreSQL database
    (``<session database>_<n>``) dropped after the test. It is empty — unless the test also uses
    ``migrated_engine``, in which case it is already at the migrations' head (cloned from a
    template migrated once per session, which is much faster than migrating every test). The
    ``postgres`` case carries the ``postgres`` marker (``-m "not postgres"`` deselects it).
``migrated_engine`` (function)
    A :func:`rollnet.ledger.create_engine` engine on ``db_url``, schema at head, disposed after
    the test.

Model fixture:

``tiny_model`` (session)
    A directory with the tiny reference model (:func:`rollnet.reference.model.tiny.init_tiny_model`,
    seed 0), made once per session.

Sandbox fixture:

``sandbox_host`` (session)
    Requires a host that can start the sandbox for untrusted code
    (:func:`rollnet.reference.envs.isolation.isolation_problem`: Linux with bubblewrap, which
    ``make dev`` installs). Tests using it are *skipped* with the reason elsewhere, and *fail*
    under ``CI``, like the PostgreSQL ones.
"""

from __future__ import annotations

import itertools
import os
import shutil
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from sqlalchemy.engine import Engine

POSTGRES_SERVER = "postgresql+psycopg://postgres@127.0.0.1:5432"
_LIBPQ_SERVER = "postgresql://postgres@127.0.0.1:5432"
_database_counter = itertools.count(1)


def _create_database(name: str, template: str | None = None) -> None:
    statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
    if template is not None:
        statement += sql.SQL(" TEMPLATE {}").format(sql.Identifier(template))
    with psycopg.connect(f"{_LIBPQ_SERVER}/postgres", autocommit=True, connect_timeout=5) as conn:
        conn.execute(statement)


def _drop_database(name: str) -> None:
    with psycopg.connect(f"{_LIBPQ_SERVER}/postgres", autocommit=True, connect_timeout=5) as conn:
        conn.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


def _migrate(url: str) -> None:
    from rollnet.ledger import create_engine, upgrade_to_head

    engine = create_engine(url)
    try:
        upgrade_to_head(engine)
    finally:
        engine.dispose()


def _wants_migrated(request: pytest.FixtureRequest) -> bool:
    return "migrated_engine" in request.fixturenames


@pytest.fixture(scope="session")
def postgres_server_url() -> str:
    """URL of the PostgreSQL maintenance database (skip, or fail under CI, if unreachable)."""
    try:
        with psycopg.connect(f"{_LIBPQ_SERVER}/postgres", connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError as exc:
        message = f"PostgreSQL on 127.0.0.1:5432 is unreachable: {exc}".strip()
        if os.environ.get("CI"):
            pytest.fail(f"{message} (CI is set: PostgreSQL tests must run)")
        pytest.skip(message)
    return f"{POSTGRES_SERVER}/postgres"


@pytest.fixture(scope="session")
def sandbox_host() -> None:
    """Skip (fail under CI) when this host cannot start the sandbox for untrusted code."""
    from rollnet.reference.envs.isolation import isolation_problem

    problem = isolation_problem()
    if problem is not None:
        message = f"no sandbox on this host: {problem}"
        if os.environ.get("CI"):
            pytest.fail(f"{message} (CI is set: the sandbox tests must run)")
        pytest.skip(message)


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port of 127.0.0.1 something is listening on (for a server that must refuse it)."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield int(listener.getsockname()[1])


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny reference model's directory, made once per session."""
    from rollnet.reference.model.tiny import init_tiny_model

    return init_tiny_model(tmp_path_factory.mktemp("tiny-model"), seed=0)


@pytest.fixture(scope="session")
def postgres_url(postgres_server_url: str) -> Iterator[str]:
    """A uniquely named PostgreSQL database for this session, dropped at the end."""
    name = f"rollnet_test_{uuid.uuid4().hex[:12]}"
    _create_database(name)
    try:
        yield f"{POSTGRES_SERVER}/{name}"
    finally:
        _drop_database(name)


@pytest.fixture(scope="session")
def _postgres_migrated_template(postgres_url: str) -> Iterator[str]:
    """Name of a database migrated to head once per session, cloned by ``db_url``."""
    name = f"{postgres_url.rsplit('/', 1)[1]}_template"
    _create_database(name)
    try:
        # The engine is disposed right away: CREATE DATABASE … TEMPLATE needs no other sessions.
        _migrate(f"{POSTGRES_SERVER}/{name}")
        yield name
    finally:
        _drop_database(name)


@pytest.fixture(scope="session")
def _sqlite_migrated_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated to head once per session, copied by ``sqlite_url``."""
    path = tmp_path_factory.mktemp("sqlite-template") / "rollnet.db"
    _migrate(f"sqlite+pysqlite:///{path}")
    # Fold the WAL into the main file so a plain copy carries the whole schema.
    import sqlite3

    with sqlite3.connect(path) as connection:
        connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return path


@pytest.fixture
def sqlite_url(tmp_path: Path, request: pytest.FixtureRequest) -> str:
    """URL of a SQLite database file in the test's temporary directory."""
    path = tmp_path / "rollnet.db"
    if _wants_migrated(request):
        shutil.copyfile(request.getfixturevalue("_sqlite_migrated_template"), path)
    return f"sqlite+pysqlite:///{path}"


@pytest.fixture
def fresh_postgres_url(postgres_url: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A new PostgreSQL database for one test, dropped afterwards (see ``db_url``)."""
    name = f"{postgres_url.rsplit('/', 1)[1]}_{next(_database_counter)}"
    template = (
        request.getfixturevalue("_postgres_migrated_template") if _wants_migrated(request) else None
    )
    _create_database(name, template)
    try:
        yield f"{POSTGRES_SERVER}/{name}"
    finally:
        _drop_database(name)


@pytest.fixture(
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ]
)
def db_url(request: pytest.FixtureRequest) -> str:
    """A fresh database for one test, on SQLite and on PostgreSQL (see the module docstring)."""
    if request.param == "sqlite":
        url: str = request.getfixturevalue("sqlite_url")
    else:
        url = request.getfixturevalue("fresh_postgres_url")
    return url


@pytest.fixture
def migrated_engine(db_url: str) -> Iterator[Engine]:
    """An engine on ``db_url`` with the schema at the migrations' head."""
    from rollnet.ledger import check_ready, create_engine, upgrade_to_head

    engine = create_engine(db_url)
    if not check_ready(engine).ready:  # not cloned from a template: migrate now
        upgrade_to_head(engine)
    try:
        yield engine
    finally:
        engine.dispose()
