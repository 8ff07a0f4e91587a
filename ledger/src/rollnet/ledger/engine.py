"""Database engines: SQLite by default, PostgreSQL by URL.

SQLite is a file ``<data_dir>/rollnet.db`` in WAL mode with foreign keys on, a busy timeout and
``synchronous=FULL`` (a commit survives power loss, not only a killed process). Every SQLite
transaction starts with ``BEGIN IMMEDIATE``: there is exactly one writer at a time, and a
transaction that reads the chain tip or picks a task to lease cannot be overtaken by another
writer between its read and its write.

PostgreSQL URLs (``postgresql://`` or ``postgresql+psycopg://``) use psycopg 3; concurrency there
comes from row locks (``FOR UPDATE``, ``FOR UPDATE SKIP LOCKED``) taken by the repositories.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import sqlalchemy
from sqlalchemy import event
from sqlalchemy.engine import URL, Connection, Dialect, Engine, make_url
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker

#: File name of the default SQLite database inside the data directory.
SQLITE_FILENAME = "rollnet.db"
#: How long a SQLite writer waits for the write lock before failing, in milliseconds.
SQLITE_BUSY_TIMEOUT_MS = 30_000


#: What a database URL looks like, for messages about one that is not.
URL_FORMS = "sqlite:///PATH or postgresql://USER@HOST:PORT/DATABASE"


class DatabaseUrlError(ValueError):
    """A database URL that is malformed or names a database rollnet does not support."""


class DatabaseMissingError(LookupError):
    """The database a read-only tool was pointed at does not exist (nothing was created)."""


def database_url(url: str | None, data_dir: Path | str | None = None) -> URL:
    """Resolve the database URL: ``url`` when given, else the SQLite file in ``data_dir``.

    ``postgresql://`` is rewritten to ``postgresql+psycopg://`` so psycopg 3 is always the driver.
    Raises :class:`DatabaseUrlError` for anything but a SQLite or PostgreSQL URL.
    """
    if url is None:
        if data_dir is None:
            raise ValueError("either a database URL or a data directory is required")
        path = Path(data_dir) / SQLITE_FILENAME
        return URL.create("sqlite+pysqlite", database=str(path))
    try:
        parsed = make_url(url)
    except sqlalchemy.exc.ArgumentError:
        raise DatabaseUrlError(f"{url!r} is not a database URL: use {URL_FORMS}") from None
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    elif parsed.drivername == "sqlite":
        parsed = parsed.set(drivername="sqlite+pysqlite")
    if parsed.drivername not in ("sqlite+pysqlite", "postgresql+psycopg"):
        raise DatabaseUrlError(f"unsupported database {parsed.drivername}://: use {URL_FORMS}")
    return parsed


def open_existing(url: str) -> Engine:
    """An engine for a database that must already exist: for tools that only read it.

    A SQLite file that is not there is :class:`DatabaseMissingError` (connecting would create
    it, and its parent directories); a PostgreSQL database that is not there fails on connect
    like any other, which :func:`describe_database_error` words.
    """
    resolved = database_url(url)
    if resolved.get_backend_name() == "sqlite":
        path = Path(resolved.database or "")
        if not resolved.database or resolved.database == ":memory:":
            raise DatabaseMissingError(
                f"{url!r} is an empty in-memory database: use sqlite:///PATH"
            )
        if not path.is_file():
            what = "is a directory" if path.is_dir() else "does not exist"
            raise DatabaseMissingError(
                f"no ledger at {path}: the file {what} (a coordinator keeps its ledger in "
                f"DATA_DIR/{SQLITE_FILENAME}; nothing was created)"
            )
    return create_engine(url)


def describe_database_error(error: BaseException, url: str | URL | None = None) -> str:
    """One line saying why the database could not be used, and what to try.

    Reads the driver's own message (psycopg names the host, port and database; SQLite the
    file) and adds the usual remedy for the common cases: nothing listening, a database that
    was never created, credentials refused, a file that cannot be opened.
    """
    original = getattr(error, "orig", None) or error
    detail = " ".join(part.strip() for part in str(original).splitlines() if part.strip())
    where = ""
    if url is not None:
        # Never the password: the URL is echoed to terminals and logs.
        shown = make_url(url) if isinstance(url, str) else url
        where = f"{shown.render_as_string(hide_password=True)}: "
    lowered = detail.lower()
    if "does not exist" in lowered and "database" in lowered:
        hint = "create it first (createdb, or CREATE DATABASE)"
    elif "connection refused" in lowered or "could not connect" in lowered:
        hint = "is the database server running there, and is the host and port right?"
    elif "password authentication failed" in lowered or "no password supplied" in lowered:
        hint = "check the user and password in the URL"
    elif "unable to open database file" in lowered:
        hint = "check that the directory exists and is writable"
    elif "file is not a database" in lowered:
        hint = "the file is not a SQLite database: check the path"
    else:
        hint = ""
    return f"{where}{detail}" + (f" ({hint})" if hint else "")


def create_engine(
    url: str | None = None, data_dir: Path | str | None = None, *, echo: bool = False
) -> Engine:
    """Create the engine for ``url``, or for ``<data_dir>/rollnet.db`` when no URL is given.

    The data directory is created if needed. The schema is not touched: call
    :func:`rollnet.ledger.migrate.upgrade_to_head` for that.
    """
    resolved = database_url(url, data_dir)
    if resolved.get_backend_name() == "sqlite":
        database = resolved.database
        if database and database != ":memory:":
            Path(database).parent.mkdir(parents=True, exist_ok=True)
        engine = sqlalchemy.create_engine(resolved, echo=echo)
        _configure_sqlite(engine)
        return engine
    return sqlalchemy.create_engine(resolved, echo=echo, pool_pre_ping=True)


def _configure_sqlite(engine: Engine) -> None:
    _emit_savepoints_directly(engine.dialect)

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Take transaction control away from the sqlite3 module so BEGIN is ours to issue.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
            cursor.execute("PRAGMA synchronous=FULL")
        finally:
            cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Connection) -> None:
        # IMMEDIATE takes the write lock up front (waiting up to busy_timeout): one writer, and no
        # read-then-write transaction can fail half-way with SQLITE_BUSY_SNAPSHOT. Transactions
        # declared read-only (see read_only_session) take no lock: WAL readers never block.
        if connection.get_execution_options().get(READ_ONLY_OPTION):
            connection.exec_driver_sql("BEGIN DEFERRED")
        else:
            connection.exec_driver_sql("BEGIN IMMEDIATE")


def _emit_savepoints_directly(dialect: Dialect) -> None:
    """Issue SAVEPOINT, RELEASE and ROLLBACK TO on the sqlite3 connection itself.

    SQLAlchemy builds each savepoint statement as a clause and compiles it anew (every savepoint
    has a fresh name, so its compiled-statement cache never hits): 45 us of the 70 us that
    ``Session.begin_nested()`` costs, and the SQLite writer opens one savepoint per call (see
    the coordinator's group commit). The Session's and Connection's bookkeeping is unchanged;
    only the three statements skip the compiler. Names are SQLAlchemy's own (``sa_savepoint_N``).
    """

    def savepoint(_self: Dialect, connection: Connection, name: str) -> None:
        _run_raw(connection, f'SAVEPOINT "{name}"')

    def release(_self: Dialect, connection: Connection, name: str) -> None:
        _run_raw(connection, f'RELEASE SAVEPOINT "{name}"')

    def rollback_to(_self: Dialect, connection: Connection, name: str) -> None:
        _run_raw(connection, f'ROLLBACK TO SAVEPOINT "{name}"')

    dialect.do_savepoint = types.MethodType(savepoint, dialect)  # type: ignore[method-assign]
    dialect.do_release_savepoint = types.MethodType(  # type: ignore[method-assign]
        release, dialect
    )
    dialect.do_rollback_to_savepoint = types.MethodType(  # type: ignore[method-assign]
        rollback_to, dialect
    )


def _run_raw(connection: Connection, sql: str) -> None:
    driver = connection.connection.driver_connection
    assert driver is not None
    error_type = connection.dialect.loaded_dbapi.Error
    try:
        driver.execute(sql)
    except error_type as error:  # raised as SQLAlchemy's own wrapped types, as before
        raise DBAPIError.instance(sql, None, error, error_type) from error


#: Execution option marking a transaction that only reads (no write lock on SQLite).
READ_ONLY_OPTION = "rollnet_read_only"


def read_only_session(sessions: sessionmaker[Session]) -> Session:
    """A session whose transactions only read: on SQLite they take no write lock.

    Use as ``with read_only_session(sessions) as session: ...``; writing through it is a bug
    (SQLite would then fail with ``SQLITE_BUSY`` under contention instead of waiting).
    """
    session = sessions()
    session.connection(execution_options={READ_ONLY_OPTION: True})
    return session


def session_factory(engine: Engine) -> sessionmaker[Session]:
    """A session factory for ``engine``; callers own the unit of work (``with s.begin():``)."""
    return sessionmaker(engine, expire_on_commit=False)


def is_postgresql(engine_or_connection: Engine | Connection | Session) -> bool:
    """Whether the engine (or the connection/session bound to it) talks to PostgreSQL."""
    if isinstance(engine_or_connection, Session):
        bind = engine_or_connection.get_bind()
        return bind.dialect.name == "postgresql"
    return engine_or_connection.dialect.name == "postgresql"
