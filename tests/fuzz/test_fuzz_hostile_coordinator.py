"""Hostile coordinator answers to the worker and the validator (issue 25).

A fake coordinator (a real gRPC server on port 0 that knows nothing of the protocol's rules)
answers each RPC from a script hypothesis draws: response messages written byte by byte from
the response's descriptor (edge values, huge lists, cut short, wrong wire types), or refusals
with any status code and garbage details; once a method's script is spent it answers an empty
message. The property: the node never dies of it (ending with the documented fatal error is
allowed: a coordinator may refuse a node for good), keeps pulling once the script is spent (no
stall), and stops when asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections import Counter, deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import grpc
import pytest
from coordinator_fuzzing import methods
from fuzz_testing import NETWORK, LoopThread, fuzz_settings
from google.protobuf.descriptor import MethodDescriptor
from hypothesis import given
from hypothesis import strategies as st
from wire_strategies import Pools, mangled, message

from rollnet.reference.validator import Validator, ValidatorConfig
from rollnet.sdk.client import ConnectionConfig, RollnetClient
from rollnet.sdk.errors import RollnetError
from rollnet.sdk.identity import Identity
from rollnet.sdk.node import NodeFatalError
from rollnet.sdk.retry import Backoff
from rollnet.sdk.testing import wait_until
from rollnet.sdk.worker import LeaseContext, RolloutGenerator, Worker, WorkerConfig
from rollnet.v1 import node_service_pb2, rollout_pb2, task_pb2

EXAMPLES = 2
#: Answers scripted per RPC; after them every call gets an empty message.
SCRIPTED = 3
#: Longest a node may take to pull again, or to stop: far beyond its back-off (50 ms).
PATIENCE = 60.0
_POOLS = Pools(
    strings=["lease-1", "task-1", "job-1", NETWORK, "arithmetic"],
    blobs=[bytes(32), os.urandom(32)],
    numbers=[0, 1, 2, 3],
)
_CODES = [code for code in grpc.StatusCode if code is not grpc.StatusCode.OK]


class Refusal:
    """A scripted refusal: a status code, a message and trailing details bytes."""

    def __init__(self, code: grpc.StatusCode, message: str, details: bytes) -> None:
        self.code, self.message, self.details = code, message, details


Answer = bytes | Refusal


def answers(method: MethodDescriptor) -> st.SearchStrategy[Answer]:
    """One scripted answer to ``method``: a hostile response, or a refusal."""
    response = method.output_type
    refusal = st.builds(
        Refusal,
        st.sampled_from(_CODES),
        st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40),
        st.binary(max_size=60),
    )
    body = mangled(response, message(response, _POOLS), oversize=1 << 16)
    return st.one_of(body, body, refusal)


class HostileCoordinator:
    """A gRPC server answering every rollnet RPC from its script (see the module docs)."""

    def __init__(self, scripts: dict[str, list[Answer]]) -> None:
        self.scripts = {path: deque(script) for path, script in scripts.items()}
        self.calls: Counter[str] = Counter()

    async def start(self) -> str:
        """Serve (on the running loop); the address to dial."""
        self.server = grpc.aio.server()
        self.server.add_generic_rpc_handlers([_Handler(self)])
        port = self.server.add_insecure_port("127.0.0.1:0")
        await self.server.start()
        return f"127.0.0.1:{port}"

    def next_answer(self, path: str) -> Answer:
        self.calls[path] += 1
        script = self.scripts.get(path)
        return script.popleft() if script else b""


async def _answer(answer: Answer, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
    if isinstance(answer, Refusal):
        context.set_trailing_metadata((("grpc-status-details-bin", answer.details),))
        await context.abort(answer.code, answer.message)
    return answer


class _Handler(grpc.GenericRpcHandler):
    def __init__(self, fake: HostileCoordinator) -> None:
        self.fake = fake
        self.methods = methods()

    def service(self, details: grpc.HandlerCallDetails) -> Any:
        path = details.method
        method = self.methods.get(path)
        if method is None:
            return None
        fake = self.fake

        if method.server_streaming:

            async def stream(_request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
                for _ in range(2):
                    yield await _answer(fake.next_answer(path), context)

            return grpc.unary_stream_rpc_method_handler(stream)
        if method.client_streaming:

            async def upload(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
                async for _ in requests:
                    pass
                return await _answer(fake.next_answer(path), context)

            return grpc.stream_unary_rpc_method_handler(upload)

        async def unary(_request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
            return await _answer(fake.next_answer(path), context)

        return grpc.unary_unary_rpc_method_handler(unary)


class FixedGenerator(RolloutGenerator):
    """Well-formed rollouts for whatever task it is handed (no model: the answers are under
    test, not the rollouts)."""

    async def generate(
        self, task: task_pb2.Task, lease: LeaseContext
    ) -> Sequence[rollout_pb2.Rollout]:
        return [
            rollout_pb2.Rollout(
                prompt_index=index // max(task.samples_per_prompt, 1),
                sample_index=index % max(task.samples_per_prompt, 1),
                completion_token_ids=[1],
                behaviour_logprobs=[-0.5],
                sampling_seed=lease.sampling_seed(index),
                finish_reason=rollout_pb2.FINISH_REASON_EOS,
            )
            for index in range(min(lease.rollout_count, 64))
        ]


_FAST = Backoff(initial=0.01, maximum=0.05)
_SCRIPTED_METHODS = sorted(methods())


def scripts() -> st.SearchStrategy[dict[str, list[Answer]]]:
    every = methods()
    return st.fixed_dictionaries(
        {path: st.lists(answers(every[path]), max_size=SCRIPTED) for path in _SCRIPTED_METHODS}
    )


async def _survives(
    make_node: Callable[[str], Worker | Validator], script: dict[str, list[Answer]], pull: str
) -> None:
    fake = HostileCoordinator(script)
    node = make_node(await fake.start())
    running = asyncio.ensure_future(node.run())
    try:
        scripted = len(fake.scripts[pull])
        # Past its script the node must pull again: nothing it was told stalls it.
        await wait_until(
            lambda: fake.calls[pull] > scripted + 1 or running.done(),
            within=PATIENCE,
            what=f"{pull} called past its script (a stalled node stops calling)",
            poll=0.02,
        )
        node.request_stop()
        # A coordinator may refuse a node for good: NodeFatalError is the documented way out.
        with contextlib.suppress(NodeFatalError):
            await asyncio.wait_for(asyncio.shield(running), PATIENCE)
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await fake.server.stop(0)


@pytest.fixture(scope="module")
def loop(loop_thread: LoopThread) -> LoopThread:
    return loop_thread


@fuzz_settings(EXAMPLES)
@given(script=scripts())
def test_worker_survives_hostile_answers(
    loop: LoopThread, tmp_path: Path, script: dict[str, list[Answer]]
) -> None:
    def worker(address: str) -> Worker:
        config = WorkerConfig(
            target=address,
            data_dir=tmp_path / f"worker-{os.urandom(4).hex()}",
            network_id=NETWORK,
            pull_wait=0.1,
            call_timeout=5.0,
            backoff=_FAST,
            drain_timeout=2.0,
            deregister_timeout=2.0,
        )
        return Worker(config, Identity.generate(), FixedGenerator())

    loop.run(_survives(worker, script, "/rollnet.v1.TaskService/PullTask"), timeout=3 * PATIENCE)


@fuzz_settings(EXAMPLES)
@given(script=scripts())
def test_validator_survives_hostile_answers(
    loop: LoopThread, tmp_path: Path, script: dict[str, list[Answer]]
) -> None:
    def validator(address: str) -> Validator:
        config = ValidatorConfig(
            target=address,
            data_dir=tmp_path / f"validator-{os.urandom(4).hex()}",
            network_id=NETWORK,
            pull_wait=0.1,
            call_timeout=5.0,
            backoff=_FAST,
            drain_timeout=2.0,
            deregister_timeout=2.0,
        )
        return Validator(config, Identity.generate())

    pull = "/rollnet.v1.ValidationService/PullValidationJob"
    loop.run(_survives(validator, script, pull), timeout=3 * PATIENCE)


def test_a_malformed_answer_is_a_refusal(loop: LoopThread) -> None:
    # Regression: grpc.aio hands back None for an answer that does not parse; the SDK returned
    # it, and the worker died of AttributeError on registration's None.network_id.
    register = "/rollnet.v1.NodeService/RegisterNode"
    watch = "/rollnet.v1.CheckpointService/WatchCheckpoints"
    cut_short = b"\x0a\x05ab"  # a length past the message's end

    async def ask() -> list[RollnetError]:
        fake = HostileCoordinator({register: [cut_short], watch: [cut_short]})
        config = ConnectionConfig(target=await fake.start(), network_id=NETWORK)
        refused = []
        try:
            async with RollnetClient.connect(config, Identity.generate()) as client:
                for call in (
                    client.nodes.register_node(node_service_pb2.RegisterNodeRequest()),
                    _first(client.checkpoints.watch(0)),
                ):
                    with pytest.raises(RollnetError) as caught:
                        await call
                    refused.append(caught.value)
        finally:
            await fake.server.stop(0)
        return refused

    for error in loop.run(ask()):
        assert error.code is grpc.StatusCode.INTERNAL
        assert "is not a rollnet.v1." in error.message


async def _first(stream: Any) -> Any:
    async for item in stream:
        return item
    return None
