"""Bad input to the operator dashboard's HTTP endpoints (issue 25), on SQLite and PostgreSQL.

The dashboard listens beyond loopback, so it asks for an operator login: hypothesis sends any
method to any path, hostile query strings (``state``, ``role``, ``after``, the login link's
``key``/``expires``/``nonce``/``sig``), forged and real session cookies, huge and many headers.
The property: never a 5xx, JSON from ``/api/`` paths, a 401 without a session, and the page
still served afterwards.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest
from fuzz_testing import NETWORK, LoopThread, fuzz_settings
from http_fuzzing import METHODS, header_lines, plain_headers, request
from hypothesis import given
from hypothesis import strategies as st

from rollnet.reference.coordinator.config import load_config, with_overrides
from rollnet.reference.coordinator.dashboard_login import COOKIE, login_query
from rollnet.reference.coordinator.server import Coordinator, start_coordinator
from rollnet.sdk.identity import Identity

EXAMPLES = 15


@dataclass
class Dashboard:
    coordinator: Coordinator
    port: int
    cookie: str
    operator: Identity


@pytest.fixture(scope="module")
def dashboard(loop_thread: LoopThread, module_db_url: str, module_dir: Path) -> Iterator[Dashboard]:
    operator = Identity.generate()
    config = with_overrides(
        load_config(module_dir / "coordinator"),
        database_url=module_db_url,
        listen="127.0.0.1:0",
        dashboard_listen="0.0.0.0:0",  # beyond loopback: the login is asked for
        network_id=NETWORK,
        operators=frozenset({operator.node_id}),
    )
    coordinator = loop_thread.run(start_coordinator(config))
    assert coordinator.dashboard is not None
    port = coordinator.dashboard.port
    login = request(port, "GET", "/login?" + login_query(operator, NETWORK), [])
    assert login.status == 303, login
    cookie = login.headers["set-cookie"].split(";", 1)[0].split("=", 1)[1]
    try:
        yield Dashboard(coordinator, port, cookie, operator)
    finally:
        loop_thread.run(coordinator.stop(grace=0.5))


_TEXT = st.one_of(
    st.text(max_size=30),
    st.sampled_from(["", "active", "worker", "ACTIVE", "\x00", "9" * 5000, "é" * 20]),
    st.text(st.characters(min_codepoint=0x30, max_codepoint=0x7A), min_size=16, max_size=70),
)
PATHS = st.sampled_from(
    [
        *["/", "/api/overview", "/api/nodes", "/login", "/static/dashboard.js", "/static/"],
        *["/x", "/static/../server.py", "/static/.hidden.js", "/static/index.html"],
        "//api/nodes",
    ]
)
QUERY_KEYS = st.sampled_from(["state", "role", "after", "key", "expires", "nonce", "sig", "x"])


@fuzz_settings(EXAMPLES)
@given(
    method=st.one_of(st.just("GET"), METHODS),
    path=PATHS,
    query=st.lists(st.tuples(QUERY_KEYS, _TEXT), max_size=5),
    session=st.sampled_from(["real", "none", "forged"]),
    extra=header_lines(),
)
def test_dashboard_survives_bad_requests(
    dashboard: Dashboard,
    method: str,
    path: str,
    query: list[tuple[str, str]],
    session: str,
    extra: list[tuple[str, str]],
) -> None:
    target = path
    if query:
        target += "?" + "&".join(f"{quote(k)}={quote(v, safe='')}" for k, v in query)
    headers = list(extra)
    if session != "none":
        token = dashboard.cookie if session == "real" else "forged-" + str(len(query))
        headers.append(("Cookie", f"{COOKIE}={token}"))
    answer = request(dashboard.port, method, target, headers)
    assert answer.status != 0, "the connection closed without an answer"
    assert answer.status < 500, f"{answer.status}: {answer.body[:300]!r}"
    ordinary = method in ("GET", "HEAD") and plain_headers(extra)
    if ordinary and session != "real" and path not in ("/login", "//api/nodes"):
        assert answer.status == 401, f"{target} without a session answered {answer.status}"
    if ordinary and method == "GET" and path.startswith("/api/") and answer.status in (200, 400):
        json.loads(answer.body)
    page = request(dashboard.port, "GET", "/", [("Cookie", f"{COOKIE}={dashboard.cookie}")])
    assert page.status == 200
