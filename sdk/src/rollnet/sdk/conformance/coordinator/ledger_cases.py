"""The coordinator suite's cases: ledger."""

from __future__ import annotations

from rollnet.sdk.conformance.coordinator._base import case, expect, ledger_entries
from rollnet.sdk.conformance.ledger import verify_chain
from rollnet.sdk.conformance.target import CHAIN_HEAD, Target
from rollnet.v1 import ledger_service_pb2


@case("ledger.chain", "every ledger entry hashes as docs/ledger.md says; the signed head verifies")
async def ledger_chain(target: Target) -> None:
    worker = await target.shared_worker()
    key = await target.coordinator_public_key()
    head = await worker.call(
        CHAIN_HEAD,
        ledger_service_pb2.GetChainHeadRequest(fresh=True),
        ledger_service_pb2.GetChainHeadResponse,
    )
    entries = [e for e in await ledger_entries(worker) if e.sequence <= head.head.sequence]
    problem = verify_chain(entries, head.head, target.config.network_id, key)
    expect(problem is None, problem or "")
