"""Fixtures of the fuzz tests: how many examples to run, and a real coordinator per database per
module, serving from its own thread so hypothesis drives it with plain blocking calls.

Examples per property: each test names its CI count; ``ROLLNET_FUZZ_SCALE`` multiplies them
(``ROLLNET_FUZZ_SCALE=50 pytest -n 0 tests/fuzz`` for a long run; README, "Fuzz tests").
"""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from collections.abc import Coroutine, Iterator
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest
from hypothesis import HealthCheck, settings
from psycopg import sql

T = TypeVar("T")

_LIBPQ_SERVER = "postgresql://postgres@127.0.0.1:5432"
_SQLALCHEMY_SERVER = "postgresql+psycopg://postgres@127.0.0.1:5432"


def fuzz_settings(examples: int) -> settings:
    """Hypothesis settings for ``examples`` examples in CI (times ``ROLLNET_FUZZ_SCALE``): no
    per-example deadline (a call's time depends on the machine), no example database on disk."""
    scale = float(os.environ.get("ROLLNET_FUZZ_SCALE", "1"))
    return settings(
        max_examples=max(1, round(examples * scale)),
        deadline=None,
        database=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.function_scoped_fixture,
        ],
    )


class LoopThread:
    """An event loop running in a daemon thread; :meth:`run` waits for a coroutine on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = 120.0) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        return future.result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()


@pytest.fixture(scope="module")
def loop_thread() -> Iterator[LoopThread]:
    thread = LoopThread()
    try:
        yield thread
    finally:
        thread.close()


def _postgres_admin(statement: sql.Composable) -> None:
    with psycopg.connect(f"{_LIBPQ_SERVER}/postgres", autocommit=True, connect_timeout=5) as conn:
        conn.execute(statement)


@pytest.fixture(
    scope="module",
    params=[
        pytest.param("sqlite", id="sqlite"),
        pytest.param("postgres", id="postgres", marks=pytest.mark.postgres),
    ],
)
def module_db_url(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[str]:
    """A database for one module's coordinator: a SQLite file, or a new PostgreSQL database
    (skipped, or failed under CI, when PostgreSQL does not answer) dropped afterwards."""
    if request.param == "sqlite":
        yield f"sqlite+pysqlite:///{tmp_path_factory.mktemp('fuzz-db') / 'rollnet.db'}"
        return
    request.getfixturevalue("postgres_server_url")
    name = f"rollnet_fuzz_{uuid.uuid4().hex[:12]}"
    _postgres_admin(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield f"{_SQLALCHEMY_SERVER}/{name}"
    finally:
        _postgres_admin(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
        )


@pytest.fixture(scope="module")
def module_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fuzz")
