"""Server-streaming handlers of both styles behind the verifier, and the rollout stream's resume."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from rollnet.sdk import (
    ConnectionConfig,
    Identity,
    KnownKey,
    RequestVerifier,
    RetryPolicy,
    RolloutClient,
    VerifierConfig,
    abort,
    current_caller,
    default_method_policy,
    open_channel,
)
from rollnet.sdk.testing import NETWORK_ID
from rollnet.v1 import (
    common_pb2,
    rollout_pb2,
    rollout_service_pb2,
    rollout_service_pb2_grpc,
)


class WriterStyleRollouts(rollout_service_pb2_grpc.RolloutServiceServicer):
    """Streams with ``context.write`` (not a generator) and drops the first stream after 2."""

    def __init__(self) -> None:
        self.requests: list[int] = []
        self.callers: list[str] = []

    async def StreamRollouts(  # type: ignore[override]  # writer style returns None
        self, request: rollout_service_pb2.StreamRolloutsRequest, context: Any
    ) -> None:
        self.requests.append(request.after_sequence)
        self.callers.append(current_caller().node_id)
        for sent, sequence in enumerate(range(request.after_sequence + 1, 6)):
            if len(self.requests) == 1 and sent == 2:
                await abort(context, grpc.StatusCode.UNAVAILABLE, "NOT_SERVING", "draining")
            await context.write(
                rollout_service_pb2.StreamRolloutsResponse(
                    rollout=rollout_pb2.AcceptedRollout(sequence=sequence)
                )
            )


async def test_rollout_stream_resumes_through_a_writer_style_handler() -> None:
    trainer = Identity.generate()

    async def resolve(public_key: bytes) -> KnownKey | None:
        if public_key == trainer.public_key:
            return KnownKey(trainer.node_id, common_pb2.ROLE_TRAINER)
        return None

    server = grpc.aio.server(
        interceptors=[RequestVerifier(VerifierConfig(NETWORK_ID, resolve, default_method_policy()))]
    )
    rollouts = WriterStyleRollouts()  # type: ignore[abstract]
    rollout_service_pb2_grpc.add_RolloutServiceServicer_to_server(rollouts, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        config = ConnectionConfig(target=f"127.0.0.1:{port}", network_id=NETWORK_ID)
        async with open_channel(config, trainer) as channel:

            async def no_wait(_: float) -> None:
                return None

            client = RolloutClient(channel, retry=RetryPolicy(max_attempts=2), sleep=no_wait)
            stream: AsyncIterator[rollout_pb2.AcceptedRollout] = client.stream(after_sequence=0)
            sequences = [rollout.sequence async for rollout in stream]
        assert sequences == [1, 2, 3, 4, 5]
        assert rollouts.requests == [0, 2]
        assert rollouts.callers == [trainer.node_id, trainer.node_id]
    finally:
        await server.stop(None)
