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
    context.configure(
        connection=connection,
        target_metadata=Base.metadata,
        # SQLite cannot ALTER most things in place; batch mode rebuilds the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
        compare_type=True,
    )
    with context.begin_transaction():
        context.run_migrations()
