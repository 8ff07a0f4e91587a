"""The chaos run's private PostgreSQL server: made, restarted with its data kept, removed."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from rollnet.reference.chaos.postgres import PrivatePostgres, private_postgres_available

pytestmark = pytest.mark.skipif(
    private_postgres_available() is not None,
    reason=f"no private PostgreSQL server here: {private_postgres_available()}",
)


def test_a_private_server_starts_restarts_with_its_data_and_is_removed(tmp_path: Path) -> None:
    server = PrivatePostgres(tmp_path / "run" / "postgres")
    try:
        server.start()
        assert server.running()
        assert server.port not in (0, 5432)
        url = server.create_database("chaos")
        assert url == f"postgresql+psycopg://postgres@127.0.0.1:{server.port}/chaos"
        database = f"{server.server_url}/chaos"
        with psycopg.connect(database, autocommit=True) as before:
            before.execute("CREATE TABLE marks (n integer)")
            before.execute("INSERT INTO marks VALUES (7)")
            server.restart(pause=0.1)
            assert server.running()
            # The restart ended every session: the one opened before it is gone.
            with pytest.raises(psycopg.OperationalError):
                before.execute("SELECT 1")
        with psycopg.connect(database) as after:
            assert after.execute("SELECT n FROM marks").fetchall() == [(7,)]
        assert (server.directory / "socket" / f".s.PGSQL.{server.port}").exists()
    finally:
        server.remove()
    assert not server.running()
    assert not server.directory.exists()
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(f"{server.server_url}/postgres", connect_timeout=2)


def test_remove_is_safe_before_start_and_twice(tmp_path: Path) -> None:
    server = PrivatePostgres(tmp_path / "never-started")
    server.remove()
    assert not server.running()
    server.start()
    server.stop()
    assert not server.running()
    server.remove()
    server.remove()
    assert not server.directory.exists()
