"""``rollnet dashboard login-url``: a one-time link that logs an operator in to a coordinator's
dashboard served beyond loopback (see ``rollnet.reference.coordinator.dashboard_login``)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rollnet.reference.cli.errors import EXIT_OK, CliError
from rollnet.reference.cli.option_types import network_id, whole
from rollnet.sdk.node import DEFAULT_NETWORK_ID


def _login_url(args: argparse.Namespace) -> int:
    from rollnet.reference.coordinator.dashboard_login import login_query
    from rollnet.sdk import Identity

    parts = urlsplit(args.url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise CliError(f"--url {args.url!r}: give the dashboard's address, as https://HOST:PORT")
    identity = Identity.load(args.key)
    query = login_query(identity, args.network_id, lifetime=args.lifetime)
    print(f"{parts.scheme}://{parts.netloc}/login?{query}")
    return EXIT_OK


def register(subparsers: Any) -> None:
    """Add the ``dashboard`` command group."""
    parser = subparsers.add_parser(
        "dashboard",
        help="log in to a coordinator's operator dashboard",
        description=(
            "The coordinator serves a read-only dashboard with --dashboard-listen HOST:PORT. "
            "On a loopback address it needs no login; on any other, open a link made here with "
            "an operator key (on the coordinator's operators allow-list)."
        ),
    )
    commands = parser.add_subparsers(dest="dashboard_command", metavar="COMMAND", required=True)
    login = commands.add_parser(
        "login-url",
        help="print a one-time login link signed with an operator key",
        description=(
            "Print a login link for the dashboard at --url, signed with --key (the private key "
            "stays here). The link works once, until it expires; the session it opens lasts 12 "
            "hours."
        ),
    )
    login.add_argument("--key", required=True, type=Path, metavar="FILE", help="operator key")
    login.add_argument(
        "--url", required=True, metavar="URL", help="the dashboard, as https://HOST:PORT"
    )
    login.add_argument(
        "--network-id",
        type=network_id,
        default=DEFAULT_NETWORK_ID,
        help=f"the coordinator's network id (default {DEFAULT_NETWORK_ID})",
    )
    login.add_argument(
        "--lifetime",
        type=whole("seconds", minimum=10, maximum=600),
        default=300,
        help="seconds the link stays valid (default 300)",
    )
    login.set_defaults(handler=_login_url)
