"""What every CLI command that calls a coordinator as a signed node shares (``rollnet nodes``,
``rollnet checkpoint``, ``rollnet rollouts``): its connection options, and running an action
with a registered client."""

from __future__ import annotations

import argparse
import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path

from rollnet.reference.cli.option_types import address, network_id, readable_file, seconds
from rollnet.sdk import PROTOCOL_VERSION, ConnectionConfig, Identity, RollnetClient, TlsConfig
from rollnet.sdk.node import DEFAULT_NETWORK_ID
from rollnet.sdk.version import software_version
from rollnet.v1 import node_service_pb2

SOFTWARE_VERSION = software_version("cli")


def connection_arguments() -> argparse.ArgumentParser:
    """The options every command that talks to a coordinator shares."""
    parent = argparse.ArgumentParser(add_help=False)
    parent.add_argument(
        "--coordinator",
        required=True,
        type=address,
        metavar="HOST:PORT",
        help="coordinator address",
    )
    parent.add_argument("--key", required=True, type=Path, metavar="FILE", help="node key file")
    parent.add_argument(
        "--network-id",
        type=network_id,
        default=DEFAULT_NETWORK_ID,
        metavar="ID",
        help=f"the coordinator's network id (default {DEFAULT_NETWORK_ID})",
    )
    parent.add_argument(
        "--tls-ca",
        type=readable_file,
        metavar="FILE",
        help="PEM roots to verify the coordinator's TLS certificate (enables TLS)",
    )
    parent.add_argument(
        "--tls-server-name", metavar="NAME", help="expected TLS server name (with --tls-ca)"
    )
    parent.add_argument(
        "--timeout",
        type=seconds(0.1, 3600.0),
        default=30.0,
        metavar="SECONDS",
        help="per-call deadline (default 30)",
    )
    return parent


def connection_config(args: argparse.Namespace) -> ConnectionConfig:
    """The SDK connection described by :func:`connection_arguments`."""
    tls = None
    if args.tls_ca is not None or args.tls_server_name:
        tls = TlsConfig(root_certificates=args.tls_ca, server_name_override=args.tls_server_name)
    return ConnectionConfig(
        target=args.coordinator, network_id=args.network_id, tls=tls, timeout=args.timeout
    )


async def register_as(client: RollnetClient, identity: Identity, role: int) -> None:
    """Register ``identity`` with ``role`` (idempotent for the same key and role)."""
    await client.nodes.register_node(
        node_service_pb2.RegisterNodeRequest(
            public_key=identity.public_key,
            role=role,  # type: ignore[arg-type]
            protocol_version=PROTOCOL_VERSION,
            software_version=SOFTWARE_VERSION,
        )
    )


def run_with_client(
    args: argparse.Namespace,
    command: str,
    role: int,
    action: Callable[[RollnetClient, Identity], Awaitable[int]],
) -> int:
    """Load the key, connect, register with ``role`` and run ``action``.

    A bad key file, an unreachable coordinator (exit 2) and a refusal (exit 1) are worded by the
    CLI's error layer.
    """
    identity = Identity.load(args.key)

    async def main() -> int:
        async with RollnetClient.connect(connection_config(args), identity) as client:
            await register_as(client, identity, role)
            return await action(client, identity)

    return asyncio.run(main())


__all__ = ["connection_arguments", "connection_config", "register_as", "run_with_client"]
