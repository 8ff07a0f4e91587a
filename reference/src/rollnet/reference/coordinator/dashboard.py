"""The operator dashboard: a read-only web page served by the coordinator process on its own
port (``--dashboard-listen``).

It shows nodes (state, role, last heartbeat, credits, checkpoint), tasks and validation jobs by
state, verdicts and rejects by reason, the reward per trainer step, throughput, checkpoint
broadcast progress, ledger totals and the signed chain head; the page polls ``/api/overview``
(and ``/api/nodes``) every two seconds. Charts use uPlot, vendored in ``dashboard_static/``
(``scripts/vendor_uplot.py`` fetches and checks it), so nothing is loaded from elsewhere.

Bound to a loopback address it is open to this machine's users, like the database file is. Bound
to any other address every page but ``/login`` needs an operator session
(:mod:`~rollnet.reference.coordinator.dashboard_login`); with the coordinator's TLS certificate
configured it is served over HTTPS.
"""

from __future__ import annotations

import json
import logging
import ssl
from dataclasses import dataclass
from importlib import resources
from typing import Any

from aiohttp import web

from rollnet.ledger.enums import NodeRole, NodeState
from rollnet.reference.addresses import is_loopback, join_host_port, split_host_port
from rollnet.reference.coordinator.config import ConfigError
from rollnet.reference.coordinator.context import CoordinatorContext
from rollnet.reference.coordinator.dashboard_login import (
    COOKIE,
    SESSION_SECONDS,
    LoginRefused,
    OperatorSessions,
)
from rollnet.reference.coordinator.dashboard_view import SwarmView

log = logging.getLogger("rollnet.coordinator.dashboard")

_STATIC = resources.files("rollnet.reference.coordinator").joinpath("dashboard_static")
_CONTENT_TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}
#: Every response: no framing by other sites, no sniffing, nothing loaded from elsewhere.
_SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; "
        "frame-ancestors 'none'"
    ),
    "Cache-Control": "no-store",
}

_NOT_LOGGED_IN = """<!doctype html><meta charset="utf-8"><title>rollnet dashboard: log in</title>
<body style="font-family: sans-serif; max-width: 40em; margin: 3em auto">
<h1>Log in as an operator</h1>
<p>This dashboard is reachable from other machines, so it needs an operator's key. On a machine
holding a key from the coordinator's <code>operators</code> allow-list, run</p>
<pre>rollnet dashboard login-url --key OPERATOR_KEY --url {url} --network-id {network}</pre>
<p>and open the link it prints (it works once, within five minutes).</p>
</body>"""


@dataclass
class Dashboard:
    """A running dashboard (see :func:`start_dashboard`)."""

    runner: web.AppRunner
    url: str
    port: int

    async def stop(self) -> None:
        """Stop serving and close open connections."""
        await self.runner.cleanup()


def build_app(ctx: CoordinatorContext, *, require_login: bool, secure: bool) -> web.Application:
    """The dashboard's aiohttp application."""
    view = SwarmView(ctx)
    sessions = OperatorSessions(ctx.config.network_id, ctx.config.operators)

    @web.middleware
    async def guard(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.method not in ("GET", "HEAD"):
            raise web.HTTPMethodNotAllowed(request.method, ["GET", "HEAD"])
        logged_in = sessions.operator(request.cookies.get(COOKIE)) is not None
        if require_login and request.path != "/login" and not logged_in:
            if request.path.startswith("/api/"):
                return _json({"error": "log in as an operator (see /)"}, status=401)
            page = _NOT_LOGGED_IN.format(
                url=f"{request.scheme}://{request.host}", network=ctx.config.network_id
            )
            return _secured(web.Response(text=page, content_type="text/html", status=401))
        return _secured(await handler(request))

    async def index(_request: web.Request) -> web.StreamResponse:
        return _static_file("index.html")

    async def static(request: web.Request) -> web.StreamResponse:
        return _static_file(request.match_info["name"])

    async def overview(_request: web.Request) -> web.StreamResponse:
        return _json(await view.snapshot())

    async def nodes(request: web.Request) -> web.StreamResponse:
        query = request.query
        try:
            state = NodeState(query["state"]) if query.get("state") else None
            role = NodeRole(query["role"]) if query.get("role") else None
        except ValueError:
            return _json({"error": "unknown state or role"}, status=400)
        after = query.get("after", "")
        if len(after) > 64:
            return _json({"error": "after: a node id"}, status=400)
        return _json(await view.nodes(after=after, state=state, role=role))

    async def login(request: web.Request) -> web.StreamResponse:
        query = request.query
        try:
            token, operator = sessions.log_in(
                query.get("key", ""),
                query.get("expires", ""),
                query.get("nonce", ""),
                query.get("sig", ""),
            )
        except LoginRefused as refused:
            log.warning("dashboard login refused", extra={"why": str(refused)})
            return web.Response(text=f"login refused: {refused}\n", status=403)
        log.info("dashboard login", extra={"operator": operator})
        response = web.Response(status=303, headers={"Location": "/"})
        response.set_cookie(
            COOKIE,
            token,
            max_age=SESSION_SECONDS,
            httponly=True,
            secure=secure,
            samesite="Strict",
            path="/",
        )
        return response

    app = web.Application(middlewares=[guard])
    app.router.add_get("/", index)
    app.router.add_get("/static/{name}", static)
    app.router.add_get("/api/overview", overview)
    app.router.add_get("/api/nodes", nodes)
    app.router.add_get("/login", login)
    return app


async def start_dashboard(ctx: CoordinatorContext, listen: str) -> Dashboard:
    """Serve the dashboard on ``listen`` (``HOST:PORT``; port 0 picks one)."""
    config = ctx.config
    host, port = split_host_port(listen, allow_port_zero=True)
    require_login = not is_loopback(host)
    context: ssl.SSLContext | None = None
    if config.tls_cert is not None and config.tls_key is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(config.tls_cert, config.tls_key)
    if require_login and not config.operators:
        raise ConfigError(
            f"dashboard_listen {listen}: beyond loopback the dashboard needs an operator login, "
            "and the operators allow-list is empty: add a key to operators = [...] or listen "
            "on 127.0.0.1"
        )
    if require_login and context is None:
        log.warning(
            "the dashboard is reachable from other machines over plain HTTP: its session "
            "cookie can be read on the way; configure --tls-cert/--tls-key"
        )
    app = build_app(ctx, require_login=require_login, secure=context is not None)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, ssl_context=context, reuse_port=False)
    try:
        await site.start()
    except OSError as error:
        await runner.cleanup()
        raise ConfigError(
            f"dashboard_listen {listen}: cannot listen there: {error.strerror or error}; "
            "choose another --dashboard-listen"
        ) from None
    bound = runner.addresses[0][1] if runner.addresses else port
    scheme = "https" if context is not None else "http"
    url = f"{scheme}://{join_host_port(host, bound)}/"
    log.info("dashboard serving", extra={"url": url, "login_required": require_login})
    return Dashboard(runner=runner, url=url, port=bound)


def _static_file(name: str) -> web.StreamResponse:
    suffix = name[name.rfind(".") :] if "." in name else ""
    if "/" in name or name.startswith(".") or suffix not in _CONTENT_TYPES:
        raise web.HTTPNotFound()
    resource = _STATIC.joinpath(name)
    if not resource.is_file():
        raise web.HTTPNotFound()
    return web.Response(
        body=resource.read_bytes(), content_type=_CONTENT_TYPES[suffix], charset="utf-8"
    )


def _json(data: Any, status: int = 200) -> web.Response:
    return web.Response(
        text=json.dumps(data, separators=(",", ":")),
        content_type="application/json",
        status=status,
    )


def _secured(response: web.StreamResponse) -> web.StreamResponse:
    for name, value in _SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    return response
