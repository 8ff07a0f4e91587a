"""Alembic environment: runs online against the engine passed in by rollnet.ledger.migrate."""

from __future__ import annotations

from alembic import context
from alembic.runtime.migration import MigrationContext
from sqlalchemy.engine import Engine

from rollnet.ledger.models import Base

config = context.config
engine = config.attributes.get("engine")
if not isinstance(engine, Engine):
    raise RuntimeError("run migrations through rollnet.ledger.migrate, which supplies the engine")
if context.is_offline_mode():
    raise RuntimeError("offline (SQL script) migrations are not supported")

with engine.connect() as connection:
    sqlite = connection.dialect.name == "sqlite"
    # SQLite cannot ALTER most things in place; batch mode rebuilds the table instead (create a
    # copy, move the rows, drop the original, rename). Dropping a table that other tables'
    # rows reference fails while foreign keys are enforced, so enforcement is off for the
    # migration and every reference is checked before it commits. The pragma only takes effect
    # outside a transaction: it goes to the driver's connection before SQLAlchemy begins one,
    # and back on after the commit. The engine issues BEGIN itself, so SQLite's DDL runs in the
    # one transaction (alembic assumes it does not), and a failed check rolls all of it back.
    raw = connection.connection.driver_connection if sqlite else None
    if raw is not None:
        raw.execute("PRAGMA foreign_keys=OFF")
    try:
        before = MigrationContext.configure(connection).get_current_revision()
        if connection.in_transaction():
            connection.commit()  # the read above began one; the pragma must precede BEGIN
        context.configure(
            connection=connection,
            target_metadata=Base.metadata,
            render_as_batch=sqlite,
            transactional_ddl=True,
            compare_type=True,
        )
        with context.begin_transaction():
            context.run_migrations()
            migrated = context.get_context().get_current_revision() != before
            if sqlite and migrated:
                broken = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
                if broken:
                    raise RuntimeError(f"the migration left broken references: {broken[:5]}")
        if connection.in_transaction():
            connection.commit()
    finally:
        if raw is not None:
            if connection.in_transaction():
                connection.rollback()
            raw.execute("PRAGMA foreign_keys=ON")
