"""Hot-path statements run straight on the database driver's cursor.

A :class:`Prepared` wraps a Core statement. It is compiled once per database (SQLite,
PostgreSQL), with the bind and result processors SQLAlchemy itself applies (UTC datetimes,
JSON, enum strings), and each call runs on the session's own driver connection (``sqlite3``,
``psycopg``), inside the session's transaction. That skips SQLAlchemy's per-execution work
(cache key, execution context, result object, events): about ten times what SQLite itself
spends on the small statements of the work path, and about half of the client's CPU per
statement on PostgreSQL. Any other database runs the statement through ``session.execute``.

Expanding (``IN``) parameters are rendered per tuple of list lengths (an empty list is left to
SQLAlchemy). Pending ORM changes are flushed first, as ``session.execute`` would.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Table, bindparam, insert
from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.exc import DBAPIError, InvalidRequestError
from sqlalchemy.orm import Session
from sqlalchemy.sql import Executable
from sqlalchemy.sql.compiler import SQLCompiler
from sqlalchemy.sql.elements import BindParameter
from sqlalchemy.types import NullType

_REQUIRED = object()
#: Databases whose driver runs prepared statements directly; others go through SQLAlchemy.
_DIRECT = frozenset({"sqlite", "postgresql"})
_MAX_RENDERED = 256


@dataclass(slots=True)
class _Compiled:
    sql: str
    #: Per position: the parameter's name, its literal value (or _REQUIRED) and its processor.
    binds: tuple[tuple[str, Any, Callable[[Any], Any] | None], ...]
    #: Per result column: its processor, or None.
    results: tuple[Callable[[Any], Any] | None, ...]
    #: The expanding (``IN``) parameters with their literal lists (or _REQUIRED), and the SQL
    #: rendered per tuple of their lengths.
    expanding: dict[str, Any]
    rendered: dict[tuple[int, ...], str]
    #: Named (``%(name)s``, psycopg) rather than positional (``?``, sqlite3) parameters.
    named: bool
    #: The driver's base exception class, wrapped into SQLAlchemy's types.
    error: type[Exception]

    def render(self, params: Mapping[str, Any]) -> str | None:
        """The SQL for these parameters; ``None`` for an empty ``IN`` list (left to SQLAlchemy,
        which renders an always-false expression for it)."""
        if not self.expanding:
            return self.sql
        lengths = tuple(
            len(params[name] if literal is _REQUIRED else params.get(name, literal))
            for name, literal in self.expanding.items()
        )
        if 0 in lengths:
            return None
        sql = self.rendered.get(lengths)
        if sql is None:
            sql = self.sql
            for name, length in zip(self.expanding, lengths, strict=True):
                marks = (
                    [f"%({name}__{i})s" for i in range(length)] if self.named else ["?"] * length
                )
                sql = sql.replace(f"__[POSTCOMPILE_{name}]", ", ".join(marks))
            if len(self.rendered) >= _MAX_RENDERED:
                self.rendered.clear()  # many list lengths (heartbeat batches): start over
            self.rendered[lengths] = sql
        return sql


class Prepared:
    """A Core statement, compiled once for SQLite and run on the raw connection there."""

    def __init__(self, statement: Executable) -> None:
        self.statement = statement
        self._by_dialect: dict[str, _Compiled] = {}

    def rows(self, session: Session, params: Mapping[str, Any]) -> list[tuple[Any, ...]]:
        """All result rows, converted to Python values (empty for a statement without any)."""
        connection = session.connection()
        compiled = self._compiled(connection)
        sql = None if compiled is None else compiled.render(params)
        if compiled is None or sql is None:
            return [tuple(row) for row in session.execute(self.statement, dict(params))]
        cursor = self._cursor(session, connection, compiled, sql, params)
        try:
            fetched: list[tuple[Any, ...]] = cursor.fetchall()
        except compiled.error as error:
            raise DBAPIError.instance(sql, None, error, compiled.error) from error
        processors = compiled.results
        if not fetched or not any(processors):
            return fetched
        return [
            tuple(
                value if process is None or value is None else process(value)
                for value, process in zip(row, processors, strict=True)
            )
            for row in fetched
        ]

    def rowcount(self, session: Session, params: Mapping[str, Any]) -> int:
        """Run a statement without results; how many rows it changed."""
        connection = session.connection()
        compiled = self._compiled(connection)
        sql = None if compiled is None else compiled.render(params)
        if compiled is None or sql is None:
            result: Any = session.execute(self.statement, dict(params))
            return int(result.rowcount)
        changed: int = self._cursor(session, connection, compiled, sql, params).rowcount
        return changed

    def run(self, session: Session, params: Mapping[str, Any]) -> None:
        """Run a statement for its effect alone (an INSERT)."""
        self.rowcount(session, params)

    def _compiled(self, connection: Connection) -> _Compiled | None:
        dialect = connection.dialect
        compiled = self._by_dialect.get(dialect.name)
        if compiled is None and dialect.name in _DIRECT:
            compiled = self._by_dialect[dialect.name] = self._compile(dialect)
        return compiled

    @staticmethod
    def _cursor(
        session: Session,
        connection: Connection,
        compiled: _Compiled,
        sql: str,
        params: Mapping[str, Any],
    ) -> Any:
        if session.new or session.dirty or session.deleted:
            session.flush()
        values: list[Any] = []
        named: dict[str, Any] = {}
        for name, literal, process in compiled.binds:
            if literal is not _REQUIRED:
                value = params.get(name, literal)
            elif name in params:
                value = params[name]
            else:
                raise InvalidRequestError(f"A value is required for bind parameter {name!r}")
            if name in compiled.expanding:
                items = [item if process is None else process(item) for item in value]
                if compiled.named:
                    named.update((f"{name}__{i}", item) for i, item in enumerate(items))
                else:
                    values.extend(items)
            else:
                value = value if process is None or value is None else process(value)
                if compiled.named:
                    named[name] = value
                else:
                    values.append(value)
        raw = connection.connection.driver_connection
        assert raw is not None
        bound: Any = named if compiled.named else values
        try:
            return raw.execute(sql, bound)
        except compiled.error as error:
            # The same exception types as session.execute raises (IntegrityError and so on).
            raise DBAPIError.instance(sql, bound, error, compiled.error) from error

    def one_or_none(self, session: Session, params: Mapping[str, Any]) -> tuple[Any, ...] | None:
        """The single result row, or ``None``; more than one row is a bug in the caller."""
        found = self.rows(session, params)
        if len(found) > 1:
            raise AssertionError(f"expected at most one row, got {len(found)}")
        return found[0] if found else None

    def scalar(self, session: Session, params: Mapping[str, Any]) -> Any:
        """The first column of the first row, or ``None``."""
        found = self.rows(session, params)
        return found[0][0] if found else None

    def _compile(self, dialect: Dialect) -> _Compiled:
        compiled = self.statement.compile(dialect=dialect)  # type: ignore[attr-defined]
        assert isinstance(compiled, SQLCompiler)
        # Positional drivers need every occurrence in order; named ones each name once.
        names: Sequence[str] = (
            compiled.positiontup or () if compiled.positional else list(compiled.binds)
        )
        # The converters SQLAlchemy itself applies, by parameter name. A name bound in several
        # places has one converter, from the place that gives it a type: the bind object kept in
        # compiled.binds may be an untyped occurrence (say, inside a CASE).
        chosen: Mapping[str, Any] | None = getattr(compiled, "_bind_processors", None)
        binds = []
        expanding: dict[str, Any] = {}
        for name in names:
            bind: BindParameter[Any] = compiled.binds[name]
            literal = _REQUIRED if bind.required else bind.value
            if bind.expanding:
                expanding[name] = literal
            if chosen is not None:
                process = chosen.get(name)
            elif names.count(name) > 1 and isinstance(bind.type, NullType):
                raise ValueError(f"{name}: bound more than once; give it a type")
            else:
                process = bind.type.dialect_impl(dialect).bind_processor(dialect)
            binds.append((name, literal, process))
        columns = getattr(self.statement, "selected_columns", None)
        if columns is None:
            described = getattr(self.statement, "returning_column_descriptions", None) or []
            types = [item["type"] for item in described]
        else:
            types = [column.type for column in columns]
        results = tuple(
            kind.dialect_impl(dialect).result_processor(dialect, None) for kind in types
        )
        dbapi = dialect.loaded_dbapi
        return _Compiled(
            compiled.string,
            tuple(binds),
            results,
            expanding,
            {},
            named=not compiled.positional,
            error=dbapi.Error,
        )


def prepared_insert(table: Table, columns: Sequence[str] | None = None) -> Prepared:
    """An INSERT of ``columns`` (default: every column of ``table``), bound by their names.

    Python-side column defaults are not applied on the raw path: name every column that has one.
    A column named here but missing from a call's parameters is an error, not a NULL.
    """
    names = [column.name for column in table.columns] if columns is None else columns
    return Prepared(insert(table).values({name: bindparam(name) for name in names}))
