"""Alembic environment: runs online against the engine passed in by rollnet.ledger.migrate."""

from __future__ import annotations

from alembic import context
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
    # outside a transaction: it goes to the driver's connection before SQLAlchemy begins one.
    raw = connection.connection.driver_connection if sqlite else None
    if raw is not None:
        raw.execute("PRAGMA foreign_keys=OFF")
    try:
        context.configure(
            connection=connection,
            target_metadata=Base.metadata,
            render_as_batch=sqlite,
            compare_type=True,
        )
        with context.begin_transaction():
            context.run_migrations()
            if sqlite:
                broken = connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
                if broken:
                    raise RuntimeError(f"the migration left broken references: {broken[:5]}")
        if connection.in_transaction():
            connection.commit()
    finally:
        if raw is not None:
            # Foreign keys are off on this connection: it must not go back to the pool. A new
            # one is set up by the engine (foreign keys on).
            connection.invalidate()
