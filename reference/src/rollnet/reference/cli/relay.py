"""``rollnet relay``: serve checkpoint blobs as an origin, or relay them from upstream."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
from pathlib import Path
from typing import Any

from rollnet.reference.cli.errors import CliError
from rollnet.reference.cli.option_types import (
    address,
    listen_address,
    network_id,
    readable_file,
    whole,
)
from rollnet.sdk.node import DEFAULT_NETWORK_ID


def register(subparsers: Any) -> None:
    """Add the ``relay`` command."""
    parser = subparsers.add_parser(
        "relay",
        help="serve checkpoint shards to workers and validators (origin or relay)",
        description=(
            "An HTTP pull-through cache of checkpoint blobs (GET /v1/blobs/<blake3>, Range, "
            "/metrics). --origin DIR serves the blobs a trainer wrote with "
            "'checkpoint publish --origin-dir DIR'; --upstream URL,... fetches from relays or "
            "origins, streaming each blob on while it arrives. Clients verify every byte: a "
            "relay is untrusted. docs/broadcast.md is the operator's guide."
        ),
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--origin", type=Path, metavar="DIR", help="serve DIR/blobs/ (origin)")
    source.add_argument(
        "--upstream",
        metavar="URL[,URL...]",
        help="relays or origins to fetch from, in order of preference",
    )
    parser.add_argument(
        "--listen",
        type=listen_address,
        default="127.0.0.1:7090",
        metavar="HOST:PORT",
        help="address to serve on (default 127.0.0.1:7090)",
    )
    parser.add_argument(
        "--data-dir", type=Path, metavar="DIR", help="blob cache (required with --upstream)"
    )
    parser.add_argument(
        "--keep-versions",
        type=whole("versions"),
        default=3,
        help="checkpoint steps whose blobs are kept (default 3)",
    )
    parser.add_argument(
        "--max-gib",
        type=whole("GiB", minimum=0),
        default=0,
        metavar="N",
        help="most GiB of blobs kept; least recently used blobs outside the kept versions go "
        "first (default 0: no cap)",
    )
    parser.add_argument(
        "--rate-limit",
        type=whole("requests per second", minimum=0),
        default=0,
        metavar="N",
        help="requests per second per client address (default 0: no limit)",
    )
    parser.add_argument(
        "--coordinator",
        type=address,
        default=None,
        metavar="HOST:PORT",
        help="watch this coordinator's checkpoints and prefetch each new one (with --key)",
    )
    parser.add_argument(
        "--key",
        type=Path,
        default=None,
        metavar="FILE",
        help="the relay's key for --coordinator (created, mode 0600, if missing; registered in "
        "the relay role, which may read checkpoints but not lease work: coordinators answer "
        "registered keys only)",
    )
    parser.add_argument(
        "--tls-ca", type=readable_file, default=None, help="PEM roots of --coordinator's TLS"
    )
    parser.add_argument(
        "--network-id",
        type=network_id,
        default=DEFAULT_NETWORK_ID,
        help=f"network id of --coordinator (default {DEFAULT_NETWORK_ID})",
    )
    parser.set_defaults(handler=run)


def _upstreams(text: str) -> list[str]:
    from rollnet.sdk.broadcast import relay_list

    try:
        return relay_list(text)
    except ValueError as error:
        raise CliError(f"--upstream: {error}") from None


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT or SIGTERM."""
    from rollnet.reference.logs import configure_logging
    from rollnet.reference.relay import RelayConfig, RelayServer, watch_coordinator

    configure_logging("INFO")
    upstreams = _upstreams(args.upstream) if args.upstream else []
    identity = None
    if args.coordinator is not None:
        if args.key is None:
            raise CliError("--coordinator needs --key FILE: coordinators answer registered keys")
        from rollnet.reference.cli import node_options

        identity = node_options.node_identity("relay", args.key)
        if identity is None:
            return 2
    if args.origin is not None:
        if not (args.origin / "blobs").is_dir():
            raise CliError(f"--origin {args.origin}: no blobs/ directory in it")
        data_dir = args.origin
    elif args.data_dir is None:
        raise CliError("--upstream needs --data-dir DIR for its cache")
    else:
        data_dir = args.data_dir
        try:
            data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise CliError(f"--data-dir {data_dir}: {error.strerror or error}") from None
    host, _, port = args.listen.rpartition(":")
    config = RelayConfig(
        data_dir=data_dir,
        upstreams=upstreams,
        host=host.strip("[]"),
        port=int(port),
        keep_versions=args.keep_versions,
        max_bytes=args.max_gib * 1024**3,
        rate_limit=float(args.rate_limit),
    )

    async def main() -> int:
        relay = RelayServer(config)
        try:
            await relay.start()
        except OSError as error:
            raise CliError(f"--listen {args.listen}: {error.strerror or error}") from None
        print(f"rollnet relay: serving on {relay.url}", flush=True)
        client = None
        if identity is not None:
            from rollnet.sdk import ConnectionConfig, RollnetClient, TlsConfig

            tls = None if args.tls_ca is None else TlsConfig(root_certificates=args.tls_ca)
            client = RollnetClient.connect(
                ConnectionConfig(target=args.coordinator, network_id=args.network_id, tls=tls),
                identity,
            )
            relay.background.append(
                asyncio.create_task(
                    watch_coordinator(relay.cache, client, network_id=args.network_id)
                )
            )
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, stop.set)
        try:
            await stop.wait()
        finally:
            await relay.close()
            if client is not None:
                with contextlib.suppress(Exception):
                    await client.close()
        return 0

    return asyncio.run(main())
