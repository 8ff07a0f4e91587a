"""The coordinator suite's cases: last: rate limits."""

from __future__ import annotations

from rollnet.sdk.conformance.coordinator._base import C, case, expect
from rollnet.sdk.conformance.suite import CaseFailure
from rollnet.sdk.conformance.target import REGISTER, Peer, Target, registration
from rollnet.sdk.conformance.wire import refusal
from rollnet.sdk.errors import RollnetError
from rollnet.sdk.identity import Identity
from rollnet.v1 import common_pb2, node_service_pb2


@case(
    "errors.rate_limit",
    "registrations past the per-address limit: RATE_LIMITED with a RetryInfo",
    timeout=180.0,
)
async def errors_rate_limit(target: Target) -> None:
    for _ in range(2000):
        peer = Peer(target, Identity.generate(), common_pb2.ROLE_WORKER)
        try:
            await peer.call(
                REGISTER,
                registration(peer.identity, peer.role),
                node_service_pb2.RegisterNodeResponse,
            )
        except RollnetError as error:
            refusal(error, C.RESOURCE_EXHAUSTED, "RATE_LIMITED")
            expect(error.retry_after is not None and error.retry_after > 0, "no RetryInfo delay")
            return
    raise CaseFailure("2000 registrations from one address were all admitted")
