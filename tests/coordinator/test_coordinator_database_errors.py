"""A call whose database connection is cut mid-statement is answered UNAVAILABLE / NOT_SERVING
(retryable), not UNKNOWN, and the same call made again succeeds.

Found by the chaos bench (docs/reliability.md): ``pg_terminate_backend`` on the coordinator's
connections turned the trainer's rollout stream into UNKNOWN, and the trainer stopped for good.
"""

from __future__ import annotations

import asyncio

import grpc
import psycopg
import pytest
from coordinator_testing import register
from sqlalchemy.engine import make_url

from rollnet.reference.coordinator.server import Coordinator
from rollnet.sdk import Identity
from rollnet.sdk.errors import ErrorReason, RollnetError
from rollnet.sdk.testing import connect, wait_until
from rollnet.v1 import common_pb2, ledger_service_pb2

_SERVER = "postgresql://postgres@127.0.0.1:5432"


def _waiting_on_lock(database: str) -> int:
    with psycopg.connect(f"{_SERVER}/{database}", autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND wait_event_type = 'Lock'"
        ).fetchone()
    return int(row[0]) if row else 0


def _terminate_waiting(database: str) -> int:
    with psycopg.connect(f"{_SERVER}/{database}", autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        ).fetchall()
    return len(rows)


@pytest.mark.parametrize(
    "db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
@pytest.mark.timeout(120)
async def test_a_call_that_loses_its_database_connection_is_unavailable(
    coordinator: Coordinator, trainer_identity: Identity, db_url: str
) -> None:
    database = make_url(db_url).database
    assert database is not None
    client = connect(coordinator.address, trainer_identity)
    try:
        await register(client, trainer_identity, common_pb2.ROLE_TRAINER)
        request = ledger_service_pb2.ListEntriesRequest(page_size=10)
        # A lock the call's read waits on: its statement is running when its connection is cut.
        with psycopg.connect(f"{_SERVER}/{database}") as holder:
            holder.execute("LOCK TABLE ledger_entries IN ACCESS EXCLUSIVE MODE")
            call = asyncio.create_task(client.ledger.list_entries(request))
            await wait_until(
                lambda: asyncio.to_thread(_waiting_on_lock, database),
                within=30,
                what="the coordinator's read waiting on the lock",
            )
            assert await asyncio.to_thread(_terminate_waiting, database) >= 1
            holder.rollback()
        with pytest.raises(RollnetError) as caught:
            await call
        assert caught.value.code == grpc.StatusCode.UNAVAILABLE, caught.value
        assert caught.value.reason == ErrorReason.NOT_SERVING, caught.value
        assert caught.value.retry_after is not None
        again = await client.ledger.list_entries(request)
        assert again.head_sequence == 0
    finally:
        await client.close()
