"""``rollnet nodes``: operator commands against a running coordinator (``list``, ``show``,
``eject``, ``reinstate``, ``ban``).

Every command signs its calls with an operator key (``--key``) whose node id or public key is on
the coordinator's ``operators`` allow-list. The key is registered with the operator role first,
which is idempotent, so the commands work on a fresh coordinator and on one that has seen the key.
Exit codes: 0 done, 1 the coordinator refused (the reason is printed), 2 an error (key file,
arguments, a coordinator that cannot be reached).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from datetime import UTC
from typing import Any

from google.protobuf import json_format

from rollnet.reference.cli.connection import connection_arguments, run_with_client
from rollnet.reference.cli.errors import EXIT_ERROR, EXIT_OK, EXIT_REFUSED
from rollnet.sdk import Identity, RollnetClient
from rollnet.v1 import common_pb2, node_pb2, node_service_pb2

EXIT_USAGE = EXIT_ERROR
__all__ = ["EXIT_OK", "EXIT_REFUSED", "EXIT_USAGE"]

_STATES = {
    name.removeprefix("STATE_").lower(): value
    for name, value in node_pb2.Node.State.items()
    if value != node_pb2.Node.STATE_UNSPECIFIED
}
_ROLES = {
    name.removeprefix("ROLE_").lower(): value
    for name, value in common_pb2.Role.items()
    if value != common_pb2.ROLE_UNSPECIFIED
}


def state_name(state: int) -> str:
    """``active`` for ``STATE_ACTIVE`` (and so on)."""
    return node_pb2.Node.State.Name(state).removeprefix("STATE_").lower()  # type: ignore[arg-type]


def role_name(role: int) -> str:
    """``worker`` for ``ROLE_WORKER`` (and so on)."""
    return common_pb2.Role.Name(role).removeprefix("ROLE_").lower()  # type: ignore[arg-type]


def node_to_dict(node: node_pb2.Node) -> dict[str, Any]:
    """A node as JSON-ready data (proto field names; enums and timestamps as strings)."""
    data: dict[str, Any] = json_format.MessageToDict(
        node, preserving_proto_field_name=True, always_print_fields_with_no_presence=True
    )
    data["public_key"] = node.public_key.hex()
    data["state"] = state_name(node.state)
    data["role"] = role_name(node.role)
    return data


def _when(stamp: Any, has: bool) -> str:
    if not has:
        return "-"
    moment = stamp.ToDatetime(tzinfo=UTC)
    return str(moment.strftime("%Y-%m-%d %H:%M:%S"))


def format_table(nodes: Sequence[node_pb2.Node]) -> str:
    """Nodes as an aligned text table, one line per node."""
    header = ("NODE", "ROLE", "STATE", "POOL", "STREAK", "REJECTS", "LAST HEARTBEAT (UTC)")
    rows = [
        (
            node.node_id,
            role_name(node.role),
            state_name(node.state),
            node.pool or "-",
            str(node.trust_streak),
            str(node.reject_count),
            _when(node.last_heartbeat_at, node.HasField("last_heartbeat_at")),
        )
        for node in nodes
    ]
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)) for row in rows]
    title = "  ".join(cell.ljust(w) for cell, w in zip(header, widths, strict=True))
    return "\n".join(line.rstrip() for line in [title, *lines])


def format_node(node: node_pb2.Node) -> str:
    """One node as ``key: value`` lines."""
    hardware = node.hardware
    accelerators = ", ".join(
        f"{a.count}x {a.name} ({a.memory_bytes // 2**30} GiB)" for a in hardware.accelerators
    )
    caps = node.capabilities
    lines = [
        ("node_id", node.node_id),
        ("public_key", node.public_key.hex()),
        ("role", role_name(node.role)),
        ("state", state_name(node.state)),
        ("state_reason", node.state_reason or "-"),
        ("pool", node.pool or "-"),
        ("protocol", f"{node.protocol_version.major}.{node.protocol_version.minor}"),
        ("software", node.software_version or "-"),
        ("trust_streak", str(node.trust_streak)),
        ("reject_count", str(node.reject_count)),
        ("registered_at", _when(node.registered_at, node.HasField("registered_at"))),
        ("last_heartbeat", _when(node.last_heartbeat_at, node.HasField("last_heartbeat_at"))),
        ("environments", ", ".join(caps.environments) or "-"),
        ("backends", ", ".join(caps.backends) or "-"),
        ("cpu_cores", str(hardware.cpu_cores)),
        ("memory", f"{hardware.memory_bytes / 2**30:.1f} GiB"),
        ("accelerators", accelerators or "-"),
    ]
    width = max(len(key) for key, _ in lines)
    return "\n".join(f"{key.ljust(width)}  {value}" for key, value in lines)


def _print_nodes(nodes: Sequence[node_pb2.Node], as_json: bool) -> None:
    if as_json:
        print(json.dumps([node_to_dict(n) for n in nodes], indent=2))
    else:
        print(format_table(nodes))


def _list(args: argparse.Namespace) -> int:
    async def action(client: RollnetClient, _identity: Identity) -> int:
        nodes: list[node_pb2.Node] = []
        token = ""
        while True:
            page = await client.nodes.list_nodes(
                node_service_pb2.ListNodesRequest(
                    page_size=500,
                    page_token=token,
                    state=_STATES.get(args.state or "", 0),  # type: ignore[arg-type]
                    role=_ROLES.get(args.role or "", 0),  # type: ignore[arg-type]
                )
            )
            nodes.extend(page.nodes)
            token = page.next_page_token
            if not token:
                break
        _print_nodes(nodes, args.json)
        return EXIT_OK

    return run_with_client(args, "nodes list", common_pb2.ROLE_OPERATOR, action)


def _show(args: argparse.Namespace) -> int:
    async def action(client: RollnetClient, _identity: Identity) -> int:
        response = await client.nodes.get_node(node_service_pb2.GetNodeRequest(node_id=args.node))
        if args.json:
            print(json.dumps(node_to_dict(response.node), indent=2))
        else:
            print(format_node(response.node))
        return EXIT_OK

    return run_with_client(args, "nodes show", common_pb2.ROLE_OPERATOR, action)


def _eject(args: argparse.Namespace) -> int:
    async def action(client: RollnetClient, _identity: Identity) -> int:
        response = await client.nodes.eject_node(
            node_service_pb2.EjectNodeRequest(node_id=args.node, reason=args.reason)
        )
        _report_removal(response.node, args.json)
        return EXIT_OK

    return run_with_client(args, "nodes eject", common_pb2.ROLE_OPERATOR, action)


def _ban(args: argparse.Namespace) -> int:
    async def action(client: RollnetClient, _identity: Identity) -> int:
        response = await client.nodes.ban_node(
            node_service_pb2.BanNodeRequest(node_id=args.node, reason=args.reason)
        )
        _report_removal(response.node, args.json)
        return EXIT_OK

    return run_with_client(args, "nodes ban", common_pb2.ROLE_OPERATOR, action)


def _reinstate(args: argparse.Namespace) -> int:
    async def action(client: RollnetClient, _identity: Identity) -> int:
        response = await client.nodes.reinstate_node(
            node_service_pb2.ReinstateNodeRequest(node_id=args.node, reason=args.reason)
        )
        _report_removal(response.node, args.json)
        return EXIT_OK

    return run_with_client(args, "nodes reinstate", common_pb2.ROLE_OPERATOR, action)


def _report_removal(node: node_pb2.Node, as_json: bool) -> None:
    if as_json:
        print(json.dumps(node_to_dict(node), indent=2))
    else:
        print(f"{node.node_id}: {state_name(node.state)} ({node.state_reason})")


def register(subparsers: Any) -> None:
    """Add the ``nodes`` command group."""
    parser = subparsers.add_parser(
        "nodes",
        help="list, inspect, eject, reinstate and ban nodes (operator key)",
        description=(
            "Operator commands against a running coordinator. --key must be a key on the "
            "coordinator's operators allow-list; it is registered with the operator role first "
            "(idempotent). An operator cannot eject or ban itself."
        ),
    )
    commands = parser.add_subparsers(dest="nodes_command", metavar="COMMAND", required=True)
    parent = connection_arguments()
    output = argparse.ArgumentParser(add_help=False)
    output.add_argument("--json", action="store_true", help="print JSON instead of text")

    listing = commands.add_parser(
        "list", parents=[parent, output], help="list nodes (all pages) as a table"
    )
    listing.add_argument("--state", choices=sorted(_STATES), help="only nodes in this state")
    listing.add_argument("--role", choices=sorted(_ROLES), help="only nodes with this role")
    listing.set_defaults(handler=_list)

    show = commands.add_parser("show", parents=[parent, output], help="show one node in full")
    show.add_argument("node", metavar="NODE", help="node id (32 hex characters)")
    show.set_defaults(handler=_show)

    eject = commands.add_parser(
        "eject",
        parents=[parent, output],
        help="eject a node: its leases are revoked and it may take no more work",
    )
    eject.add_argument("node", metavar="NODE", help="node id")
    eject.add_argument("--reason", required=True, help="why (recorded on the node)")
    eject.set_defaults(handler=_eject)

    reinstate = commands.add_parser(
        "reinstate",
        parents=[parent, output],
        help="undo an ejection: the node may work again, trust and rejects starting afresh",
    )
    reinstate.add_argument("node", metavar="NODE", help="node id")
    reinstate.add_argument("--reason", required=True, help="why (recorded on the node)")
    reinstate.set_defaults(handler=_reinstate)

    ban = commands.add_parser(
        "ban", parents=[parent, output], help="ban a node's key for good (terminal)"
    )
    ban.add_argument("node", metavar="NODE", help="node id")
    ban.add_argument("--reason", required=True, help="why (recorded on the node)")
    ban.set_defaults(handler=_ban)
