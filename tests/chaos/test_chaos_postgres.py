"""The chaos run's private PostgreSQL server: made, restarted with its data kept, removed; and
the swarm (two replicas on it) surviving its restart."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from rollnet.reference.chaos import ChaosConfig, SwarmConfig, run_chaos
from rollnet.reference.chaos.postgres import PrivatePostgres, private_postgres_available
from rollnet.reference.demo import _free_port

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
        assert (server.socket_directory / f".s.PGSQL.{server.port}").exists()
    finally:
        server.remove()
    assert not server.running()
    assert not server.directory.exists()
    assert not server.socket_directory.exists()
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


def test_a_port_taken_after_it_was_picked_is_given_up_for_another(
    tmp_path: Path, taken_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    picks = iter([taken_port])
    monkeypatch.setattr(
        "rollnet.reference.chaos.postgres._free_port", lambda: next(picks, None) or _free_port()
    )
    server = PrivatePostgres(tmp_path / "postgres")
    try:
        server.start()
        assert server.running()
        assert server.port != taken_port
    finally:
        server.remove()


def test_a_port_asked_for_and_taken_fails_naming_the_cause(tmp_path: Path, taken_port: int) -> None:
    server = PrivatePostgres(tmp_path / "postgres", port=taken_port)
    try:
        with pytest.raises(RuntimeError, match="could not bind IPv4 address"):
            server.start()
    finally:
        server.remove()
    assert not server.running()


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_two_replicas_survive_a_restart_of_their_database_server(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    server = PrivatePostgres(tmp_path / "postgres-server")
    try:
        server.start()
        config = ChaosConfig(
            swarm=SwarmConfig(
                data_dir=tmp_path / "swarm",
                database_url=server.create_database("chaos"),
                replicas=2,
                workers=1,
                validators=1,
                relays=False,
                model_root=tmp_path_factory.mktemp("chaos-models"),
            ),
            budget=1.0,  # one round: each kind once
            seed=3,
            kinds=("restart_database", "drop_db_connections"),
            database_server=server,
        )
        report = await run_chaos(config)
    finally:
        server.remove()
    print(report.table())
    assert [f.kind for f in report.faults].count("restart_database") == 1
    assert all(f.survived for f in report.faults), report.table()
    broken = [i for i in report.invariants if not i.holds]
    assert not broken, report.table()


def test_the_socket_moves_out_of_a_directory_whose_path_is_too_long(tmp_path: Path) -> None:
    short = PrivatePostgres(Path("/tmp/pg"))
    assert short.socket_directory == Path("/tmp/pg/socket")
    deep = PrivatePostgres(tmp_path / ("d" * 100))
    assert len(str(deep.socket_directory / ".s.PGSQL.65535")) <= 107
    assert deep.socket_directory == PrivatePostgres(tmp_path / ("d" * 100)).socket_directory
    assert deep.socket_directory != PrivatePostgres(tmp_path / ("e" * 100)).socket_directory
