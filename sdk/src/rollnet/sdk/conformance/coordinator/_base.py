"""What the coordinator suite's case modules share: the case registry, ``expect``, the status
codes, and reading the ledger."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import grpc
from google.protobuf import timestamp_pb2

from rollnet.sdk.conformance.suite import Case, CaseFailure
from rollnet.sdk.conformance.target import LIST_ENTRIES, Peer, Target
from rollnet.v1 import ledger_pb2, ledger_service_pb2, node_service_pb2

C = grpc.StatusCode
CASES: list[Case[Target]] = []
SUITE = "coordinator"


def case(
    name: str, summary: str, *, timeout: float = 150.0
) -> Callable[[Callable[[Target], Awaitable[None]]], Callable[[Target], Awaitable[None]]]:
    """Add the decorated function to :data:`CASES`."""

    def add(body: Callable[[Target], Awaitable[None]]) -> Callable[[Target], Awaitable[None]]:
        CASES.append(Case(name, summary, body, timeout))
        return body

    return add


def expect(condition: bool, message: str) -> None:
    """Fail the case with ``message`` unless ``condition``."""
    if not condition:
        raise CaseFailure(message)


def _get_node() -> node_service_pb2.GetNodeRequest:
    return node_service_pb2.GetNodeRequest()


def _now_ms() -> int:
    return int(time.time() * 1000)


def _seconds(value: timestamp_pb2.Timestamp) -> float:
    return float(value.seconds) + value.nanos / 1e9


async def ledger_entries(peer: Peer, node_id: str = "") -> list[ledger_pb2.LedgerEntry]:
    """Every ledger entry the target lists (of ``node_id`` alone, when given), page by page."""
    entries: list[ledger_pb2.LedgerEntry] = []
    after = 0
    while True:
        page = await peer.call(
            LIST_ENTRIES,
            ledger_service_pb2.ListEntriesRequest(
                after_sequence=after, page_size=1000, node_id=node_id
            ),
            ledger_service_pb2.ListEntriesResponse,
        )
        if not page.entries:
            return entries
        entries.extend(page.entries)
        after = page.entries[-1].sequence
