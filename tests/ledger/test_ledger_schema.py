"""Schema, migrations and engine settings on SQLite and PostgreSQL."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime, timedelta, timezone

import pytest
from alembic import command
from sqlalchemy import inspect, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, StatementError
from sqlalchemy.orm import Session, sessionmaker

from rollnet.ledger import check_ready, create_engine, upgrade_to_head
from rollnet.ledger.engine import database_url
from rollnet.ledger.migrate import alembic_config, check_models_match, head_revision
from rollnet.ledger.models import Base, Node

T0 = datetime(2026, 1, 1, tzinfo=UTC)
AddNodes = Callable[..., list[str]]

EXPECTED_TABLES = {
    "nodes",
    "tasks",
    "blobs",
    "commitments",
    "validation_jobs",
    "verdicts",
    "checkpoints",
    "ledger_entries",
    "ledger_chain_tip",
    "ledger_signed_heads",
    "step_rewards",
    "idempotency_records",
    "request_nonces",
    "task_attempts",
    "rollout_fingerprints",
    "node_statistics",
}


def test_migrations_create_every_table_and_match_the_models(migrated_engine: Engine) -> None:
    tables = set(inspect(migrated_engine).get_table_names())
    assert tables >= EXPECTED_TABLES
    assert set(Base.metadata.tables) == EXPECTED_TABLES
    check_models_match(migrated_engine)  # alembic check: raises on any difference
    assert check_ready(migrated_engine).ready


def test_migrate_command_line_upgrades_then_checks(db_url: str) -> None:
    """Exactly the two command lines CI runs."""
    for action in ("upgrade", "check"):
        completed = subprocess.run(
            [sys.executable, "-m", "rollnet.ledger.migrate", action, "--db", db_url],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert completed.returncode == 0, completed.stderr
    assert "models match the migrations" in completed.stdout


def test_migrations_downgrade_to_base_and_upgrade_again(db_url: str) -> None:
    engine = create_engine(db_url)
    try:
        upgrade_to_head(engine)
        command.downgrade(alembic_config(engine), "base")
        assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
        upgrade_to_head(engine)
        check_models_match(engine)
        with engine.connect() as connection:
            tip = connection.execute(text("SELECT sequence FROM ledger_chain_tip")).scalar_one()
        assert tip == 0
    finally:
        engine.dispose()


def test_readiness_reports_an_unmigrated_database(db_url: str) -> None:
    engine = create_engine(db_url)
    try:
        readiness = check_ready(engine)
        assert not readiness.ready
        assert "expected" in readiness.detail
        upgrade_to_head(engine)
        readiness = check_ready(engine)
        assert readiness.ready, readiness.detail
        assert f"head revision {head_revision()}" in readiness.detail
    finally:
        engine.dispose()


def test_sqlite_default_file_is_wal_with_foreign_keys(tmp_path: object) -> None:
    from pathlib import Path

    data_dir = Path(str(tmp_path)) / "data"
    engine = create_engine(None, data_dir)
    try:
        assert database_url(None, data_dir).database == str(data_dir / "rollnet.db")
        with engine.connect() as connection:
            assert connection.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
            assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
            assert connection.exec_driver_sql("PRAGMA busy_timeout").scalar() == 30_000
        assert (data_dir / "rollnet.db").exists()
    finally:
        engine.dispose()


def test_postgresql_urls_use_psycopg() -> None:
    assert database_url("postgresql://u@h/db").drivername == "postgresql+psycopg"
    with pytest.raises(ValueError, match="unsupported database"):
        database_url("mysql://u@h/db")
    with pytest.raises(ValueError, match="data directory"):
        database_url(None, None)


def test_check_constraints_reject_bad_enum_values(
    sessions: sessionmaker[Session], add_nodes: AddNodes
) -> None:
    (node_id,) = add_nodes(1)
    with pytest.raises(IntegrityError), sessions.begin() as session:
        session.execute(text("UPDATE nodes SET state = 'zombie' WHERE id = :id"), {"id": node_id})
    with pytest.raises(IntegrityError), sessions.begin() as session:
        session.execute(text("UPDATE nodes SET trust = 1.5 WHERE id = :id"), {"id": node_id})


def test_foreign_keys_are_enforced(sessions: sessionmaker[Session]) -> None:
    with pytest.raises(IntegrityError), sessions.begin() as session:
        session.execute(
            text(
                "INSERT INTO blobs (hash, size, location, uploader_id, created_at)"
                " VALUES (:hash, 1, 'x', 'ffffffffffffffffffffffffffffffff', :at)"
            ),
            {"hash": "a" * 64, "at": "2026-01-01 00:00:00"},
        )


def test_timestamps_are_timezone_aware_and_naive_ones_refused(
    sessions: sessionmaker[Session], add_nodes: AddNodes
) -> None:
    (node_id,) = add_nodes(1)
    plus_two = timezone(timedelta(hours=2))
    with sessions.begin() as session:
        node = session.get(Node, node_id)
        assert node is not None
        node.last_heartbeat_at = datetime(2026, 1, 1, 12, 0, 0, 123456, tzinfo=plus_two)
    with sessions.begin() as session:
        node = session.get(Node, node_id, populate_existing=True)
        assert node is not None
        assert node.registered_at == T0
        assert node.last_heartbeat_at == datetime(2026, 1, 1, 10, 0, 0, 123456, tzinfo=UTC)
        assert node.last_heartbeat_at.tzinfo is not None
    with sessions.begin() as session:
        node = session.get(Node, node_id)
        assert node is not None
        node.last_heartbeat_at = datetime(2026, 1, 1)
        with pytest.raises(StatementError, match="naive datetime"):
            session.flush()
        session.rollback()


def test_an_in_memory_database_keeps_its_schema_after_migrating() -> None:
    # The migration's connection is the in-memory database's only one: it must not be
    # discarded (foreign keys go back on instead).
    engine = create_engine("sqlite://")
    try:
        upgrade_to_head(engine)
        assert "validation_jobs" in inspect(engine).get_table_names()
        with engine.connect() as connection:
            assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
    finally:
        engine.dispose()
