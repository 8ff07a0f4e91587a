"""Coordinator load benchmark: simulated nodes vs. the coordinator and vs. a bare echo server.

Three processes: a bare grpc.aio echo server, the coordinator (``rollnet coordinator``, SQLite in a
temporary data dir), and this load generator, which simulates many nodes and signs every request
for real. Heartbeats and lease cycles (pull, small upload, commit) are measured against the
coordinator; the same number of signed, same-sized unary calls against the echo server gives the
baseline in the same run. Then honest heartbeats are measured while a quarter of the nodes send
heartbeats naming ``--hostile-ids`` bogus lease ids. Finally ``--swarm`` nodes heartbeat on a
``--interval`` schedule with jitter and the run counts false SUSPECT/OFFLINE transitions.

    .venv/bin/python bench/coordinator_load.py                  # defaults: about 2 minutes
    .venv/bin/python bench/coordinator_load.py --swarm 10000 --interval 10 --swarm-seconds 45

Prints figures and ratios; asserts nothing about time.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import duration_pb2

from rollnet.sdk import Identity, RequestSigner, batches
from rollnet.sdk.domains import CHECKPOINT_DOMAIN
from rollnet.sdk.node import PROTOCOL_VERSION
from rollnet.sdk.proofs.binding import LeaseBinding, derive_sampling_seed
from rollnet.v1 import (
    blob_service_pb2,
    checkpoint_pb2,
    checkpoint_service_pb2,
    commitment_service_pb2,
    common_pb2,
    node_pb2,
    node_service_pb2,
    rollout_pb2,
    rollout_service_pb2,
    task_service_pb2,
)

NETWORK = "rollnet-bench"
ECHO_METHOD = "/bench.Echo/Echo"
ECHO_STREAM_METHOD = "/bench.Echo/EchoStream"
HEARTBEAT = "/rollnet.v1.NodeService/Heartbeat"
REGISTER = "/rollnet.v1.NodeService/RegisterNode"


# ---------------------------------------------------------------------------- echo server
async def serve_echo() -> None:
    """A bare grpc.aio server answering every call with its request bytes."""

    async def echo(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        return request

    async def echo_stream(requests: Any, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        last = b""
        async for request in requests:
            last = request
        return last

    handler = grpc.method_handlers_generic_handler(
        "bench.Echo",
        {
            "Echo": grpc.unary_unary_rpc_method_handler(echo),
            "EchoStream": grpc.stream_unary_rpc_method_handler(echo_stream),
        },
    )
    server = grpc.aio.server()
    server.add_generic_rpc_handlers([handler])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    print(f"PORT {port}", flush=True)
    await server.wait_for_termination()


# ---------------------------------------------------------------------------- helpers
COORDINATOR_PID = 0
ECHO_PID = 0


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process ``pid`` has used so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def profile(phase: str, seconds: float) -> None:
    """With ROLLNET_BENCH_PYSPY=path/to/py-spy, sample the coordinator during ``phase``."""
    py_spy = os.environ.get("ROLLNET_BENCH_PYSPY")
    if py_spy and COORDINATOR_PID:
        subprocess.Popen(
            [
                py_spy,
                "record",
                "-p",
                str(COORDINATOR_PID),
                "-o",
                f"/tmp/coordinator-{phase}.txt",
                "-f",
                "raw",
                "-d",
                str(int(seconds)),
                "-r",
                "200",
                # Only the thread holding the GIL (where Python CPU time goes), unless told.
                *([] if os.environ.get("ROLLNET_BENCH_PYSPY_ALL_THREADS") else ["--gil"]),
                *os.environ.get("ROLLNET_BENCH_PYSPY_ARGS", "").split(),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )


class Node:
    """A simulated node: a key and a signer; calls go over a shared unsigned channel."""

    def __init__(self, identity: Identity) -> None:
        self.identity = identity
        self.signer = RequestSigner(identity, NETWORK)

    def metadata(self, method: str, body: bytes) -> tuple[tuple[str, str], ...]:
        return self.signer.sign(method, body).as_metadata()


def unary(channel: grpc.aio.Channel, method: str, response_type: Any) -> Any:
    return channel.unary_unary(
        method, request_serializer=None, response_deserializer=response_type.FromString
    )


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


class Run:
    """One measured phase: calls completed, their latencies, and the server's CPU time."""

    def __init__(
        self, count: int, latencies: list[float], cpu: float, client_cpu: float, seconds: float
    ) -> None:
        self.count, self.latencies, self.cpu = count, latencies, cpu
        self.client_cpu, self.seconds = client_cpu, seconds

    def cpu_per_call(self) -> float:
        return self.cpu / max(1, self.count)


def thread_cpu(pid: int) -> Counter[str]:
    """CPU clock ticks used so far by each thread of ``pid``, summed by thread name."""
    used: Counter[str] = Counter()
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name, _, rest = task.joinpath("stat").read_text().partition(") ")
        except FileNotFoundError:
            continue  # the thread ended meanwhile
        fields = rest.split()
        name = name.partition("(")[2]
        if name == "python":  # Python threads are not named for the OS: tell the loop's apart
            name = "main" if task.name == str(pid) else "python threads"
        used[name] += int(fields[11]) + int(fields[12])
    return used


async def measure(
    pid: int, seconds: float, concurrency: int, call: Callable[[int], Awaitable[None]]
) -> Run:
    """:func:`drive`, also counting the CPU time the server process ``pid`` spent meanwhile.

    With ROLLNET_BENCH_THREADS=1 the server's CPU time per call is also printed by thread.
    """
    before, threads = cpu_seconds(pid), thread_cpu(pid)
    own_before, started = cpu_seconds(os.getpid()), time.perf_counter()
    count, latencies = await drive(seconds, concurrency, call)
    own, elapsed = cpu_seconds(os.getpid()) - own_before, time.perf_counter() - started
    if os.environ.get("ROLLNET_BENCH_THREADS"):
        used = thread_cpu(pid)
        used.subtract(threads)
        print(
            "    server CPU by thread, us/call: "
            + ", ".join(
                f"{k} {v / os.sysconf('SC_CLK_TCK') / max(1, count) * 1e6:.0f}"
                for k, v in used.most_common(6)
            )
        )
    return Run(count, latencies, cpu_seconds(pid) - before, own, elapsed)


async def drive(
    seconds: float, concurrency: int, call: Callable[[int], Awaitable[None]]
) -> tuple[int, list[float]]:
    """Run ``call(i)`` from ``concurrency`` loops for ``seconds``; return count and latencies."""
    latencies: list[float] = []
    stop_at = time.perf_counter() + seconds
    counter = iter(range(10**12))

    async def loop() -> None:
        while time.perf_counter() < stop_at:
            i = next(counter)
            started = time.perf_counter()
            await call(i)
            latencies.append(time.perf_counter() - started)

    await asyncio.gather(*(loop() for _ in range(concurrency)))
    return len(latencies), latencies


def report(name: str, run: Run, seconds: float) -> Run:
    rate = run.count / seconds
    print(
        f"  {name:<34} {rate:>9,.0f}/s   p50 {percentile(run.latencies, 0.5) * 1000:7.2f} ms"
        f"   p99 {percentile(run.latencies, 0.99) * 1000:7.2f} ms"
        f"   server CPU {run.cpu_per_call() * 1e6:6.0f} us/call"
        f" ({100 * run.cpu / run.seconds:3.0f}% of a core; load generator"
        f" {100 * run.client_cpu / run.seconds:3.0f}%)"
    )
    return run


def ratios(name: str, run: Run, echo: Run, target: float) -> None:
    """Throughput ratio, and the same ratio counted in server CPU per call."""
    print(
        f"  ratio {name} / echo: {run.count / max(1, echo.count):.2f}x   (target >= {target}x);"
        f" by server CPU per call: {echo.cpu_per_call() / run.cpu_per_call():.2f}x"
    )


async def register_all(
    channel: grpc.aio.Channel, nodes: list[Node], role: common_pb2.Role.ValueType
) -> None:
    register = unary(channel, REGISTER, node_service_pb2.RegisterNodeResponse)
    semaphore = asyncio.Semaphore(64)

    async def one(node: Node) -> None:
        request = node_service_pb2.RegisterNodeRequest(
            public_key=node.identity.public_key,
            role=role,
            protocol_version=PROTOCOL_VERSION,
            software_version="bench/1",
            capabilities=node_pb2.Capabilities(environments=["arithmetic"]),
        ).SerializeToString()
        async with semaphore:
            await register(request, metadata=node.metadata(REGISTER, request), timeout=60)

    await asyncio.gather(*(one(n) for n in nodes))


# ---------------------------------------------------------------------------- phases
async def bench_heartbeats(
    coordinator: str, echo: str, nodes: list[Node], seconds: float, concurrency: int
) -> tuple[Run, Run]:
    async with (
        grpc.aio.insecure_channel(coordinator) as channel,
        grpc.aio.insecure_channel(echo) as echo_channel,
    ):
        heartbeat = unary(channel, HEARTBEAT, node_service_pb2.HeartbeatResponse)
        echo_call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = echo_channel.unary_unary(
            ECHO_METHOD
        )
        body = node_service_pb2.HeartbeatRequest(
            activity=node_service_pb2.ACTIVITY_IDLE
        ).SerializeToString()

        async def beat(i: int) -> None:
            node = nodes[i % len(nodes)]
            await heartbeat(body, metadata=node.metadata(HEARTBEAT, body), timeout=30)

        async def echo_once(i: int) -> None:
            node = nodes[i % len(nodes)]
            await echo_call(body, metadata=node.metadata(HEARTBEAT, body), timeout=30)

        await drive(1.0, concurrency, echo_once)  # warm-up
        echo_run = report(
            "echo (signed, same bytes)",
            await measure(ECHO_PID, seconds, concurrency, echo_once),
            seconds,
        )
        await drive(1.0, concurrency, beat)
        profile("heartbeat", seconds)
        beat_run = report(
            "heartbeat", await measure(COORDINATOR_PID, seconds, concurrency, beat), seconds
        )
    return echo_run, beat_run


async def bench_hostile_heartbeats(
    coordinator: str, nodes: list[Node], seconds: float, concurrency: int, lease_counts: list[int]
) -> None:
    """Honest heartbeats alone, then while a quarter of the nodes send heartbeats naming many
    bogus lease ids: what one such node costs everybody else (issue 17: 300 heartbeats naming
    1,024 each pushed honest p99 to 300-500 ms). Above the bound on ``held_lease_ids`` they are
    refused at the edge; at the bound they are served."""
    hostile, honest = nodes[: len(nodes) // 4], nodes[len(nodes) // 4 :]
    async with grpc.aio.insecure_channel(coordinator) as channel:
        heartbeat = unary(channel, HEARTBEAT, node_service_pb2.HeartbeatResponse)
        body = node_service_pb2.HeartbeatRequest(held_lease_ids=["0" * 32]).SerializeToString()

        async def beat(i: int) -> None:
            node = honest[i % len(honest)]
            await heartbeat(body, metadata=node.metadata(HEARTBEAT, body), timeout=30)

        alone = report(
            "honest heartbeats alone",
            await measure(COORDINATOR_PID, seconds, concurrency, beat),
            seconds,
        )
        for count in lease_counts:
            bogus = node_service_pb2.HeartbeatRequest(
                held_lease_ids=[f"{i:032x}" for i in range(count)]
            ).SerializeToString()
            answers: Counter[str] = Counter()
            stop = asyncio.Event()
            attackers = [
                asyncio.create_task(
                    _attack(heartbeat, hostile[i % len(hostile)], bogus, stop, answers)
                )
                for i in range(concurrency // 4)
            ]
            run = report(
                f"honest, hostile naming {count:,}",
                await measure(COORDINATOR_PID, seconds, concurrency, beat),
                seconds,
            )
            stop.set()
            await asyncio.gather(*attackers)
            print(
                f"    hostile heartbeats answered: {dict(answers)}; honest throughput "
                f"{run.count / max(1, alone.count):.2f}x of alone, p99 "
                f"{percentile(run.latencies, 0.99) / percentile(alone.latencies, 0.99):.2f}x"
            )


async def _attack(
    heartbeat: Any, node: Node, body: bytes, stop: asyncio.Event, answers: Counter[str]
) -> None:
    """Send ``body`` as ``node``'s heartbeat until ``stop``, counting the answers by code."""
    while not stop.is_set():
        try:
            await heartbeat(body, metadata=node.metadata(HEARTBEAT, body), timeout=30)
            answers["OK"] += 1
        except grpc.aio.AioRpcError as error:
            answers[error.code().name] += 1


async def keep_alive(channel: grpc.aio.Channel, nodes: list[Node], interval: float) -> None:
    """Heartbeat every node once per ``interval``, spread over the interval."""
    heartbeat = unary(channel, HEARTBEAT, node_service_pb2.HeartbeatResponse)
    body = node_service_pb2.HeartbeatRequest().SerializeToString()
    semaphore = asyncio.Semaphore(16)

    async def beat(node: Node) -> None:
        async with semaphore:
            await heartbeat(body, metadata=node.metadata(HEARTBEAT, body), timeout=30)

    while True:
        started = time.perf_counter()
        await asyncio.gather(*(beat(node) for node in nodes))
        await asyncio.sleep(max(0.0, interval - (time.perf_counter() - started)))


async def bench_lease_cycles(
    coordinator: str,
    echo: str,
    workers: list[Node],
    trainer: Node,
    seconds: float,
    concurrency: int,
    interval: float,
) -> tuple[Run, Run, Run]:
    async with (
        grpc.aio.insecure_channel(coordinator) as channel,
        grpc.aio.insecure_channel(echo) as echo_channel,
    ):
        await register_all(channel, [trainer], common_pb2.ROLE_TRAINER)
        upload: grpc.aio.StreamUnaryMultiCallable[bytes, blob_service_pb2.UploadBlobResponse] = (
            channel.stream_unary(
                "/rollnet.v1.BlobService/UploadBlob",
                request_serializer=None,
                response_deserializer=blob_service_pb2.UploadBlobResponse.FromString,
            )
        )
        # A checkpoint, then more demand than the run can consume.
        shard = b"bench weights"
        await _upload(upload, trainer, shard, blob_service_pb2.BLOB_KIND_CHECKPOINT_SHARD)
        from blake3 import blake3

        ref = common_pb2.BlobRef(blake3=blake3(shard).digest(), size=len(shard))
        manifest = checkpoint_pb2.CheckpointManifest(
            step=1,
            network_id=NETWORK,
            files=[checkpoint_pb2.CheckpointFile(path="w", content=ref, shards=[ref])],
            flops_per_token=1_000_000,
        ).SerializeToString()
        publish = unary(
            channel,
            "/rollnet.v1.CheckpointService/PublishCheckpoint",
            checkpoint_service_pb2.PublishCheckpointResponse,
        )
        body = checkpoint_service_pb2.PublishCheckpointRequest(
            manifest=manifest, signature=trainer.identity.sign(CHECKPOINT_DOMAIN + manifest)
        ).SerializeToString()
        await publish(
            body, metadata=trainer.metadata("/rollnet.v1.CheckpointService/PublishCheckpoint", body)
        )
        demand = unary(
            channel,
            "/rollnet.v1.RolloutService/RequestRollouts",
            rollout_service_pb2.RequestRolloutsResponse,
        )
        wanted = int(seconds * 1000) + 2000
        for part in range(0, wanted, 5000):
            body = rollout_service_pb2.RequestRolloutsRequest(
                request_id=f"bench-demand-{part}",
                rollout_step=1,
                environment="arithmetic",
                prompt_count=min(5000, wanted - part),
                samples_per_prompt=1,
                sampling=common_pb2.SamplingParams(temperature=1.0, max_new_tokens=4),
                prompts_per_task=1,
            ).SerializeToString()
            await demand(
                body,
                metadata=trainer.metadata("/rollnet.v1.RolloutService/RequestRollouts", body),
                timeout=120,
            )
        pull = unary(channel, "/rollnet.v1.TaskService/PullTask", task_service_pb2.PullTaskResponse)
        submit = unary(
            channel,
            "/rollnet.v1.CommitmentService/SubmitCommitment",
            commitment_service_pb2.SubmitCommitmentResponse,
        )
        echo_call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes] = echo_channel.unary_unary(
            ECHO_METHOD
        )

        def pull_request(i: int) -> bytes:
            # As the SDK sends it: a mutating request carries a request id (32 hex digits).
            return task_service_pb2.PullTaskRequest(
                request_id=f"{i:032x}", wait=duration_pb2.Duration(seconds=0)
            ).SerializeToString()

        async def cycle(i: int) -> None:
            node = workers[i % len(workers)]
            pull_body = pull_request(i)
            pulled = task_service_pb2.PullTaskResponse.FromString(
                (
                    await pull(
                        pull_body,
                        metadata=node.metadata("/rollnet.v1.TaskService/PullTask", pull_body),
                        timeout=30,
                    )
                ).SerializeToString()
            )
            if not pulled.HasField("task"):
                return
            task, lease = pulled.task, pulled.lease
            header, chunk, body = _cycle_messages(
                node,
                task_id=task.task_id,
                lease_id=lease.lease_id,
                fencing_token=lease.fencing_token,
                checkpoint_step=task.checkpoint_step,
                prompt_id=task.prompt_ids[0],
                request_id=f"{i:032x}",
            )
            await upload(
                iter([header, chunk]),
                metadata=node.metadata("/rollnet.v1.BlobService/UploadBlob", header),
                timeout=30,
            )
            await submit(
                body,
                metadata=node.metadata("/rollnet.v1.CommitmentService/SubmitCommitment", body),
                timeout=30,
            )

        async def echo_unary_cycle(i: int) -> None:
            # Three signed unary round trips of a pull's size (the baseline of earlier runs).
            node = workers[i % len(workers)]
            pull_body = pull_request(i)
            for _ in range(3):
                await echo_call(pull_body, metadata=node.metadata(ECHO_METHOD, pull_body))

        # The echo cycle's messages: a real cycle's, with ids of the real lengths.
        header, chunk, commit = _cycle_messages(
            workers[0],
            task_id="0" * 24,
            lease_id="0" * 32,
            fencing_token=1,
            checkpoint_step=1,
            prompt_id=123456789,
            request_id="0" * 32,
        )
        echo_stream: grpc.aio.StreamUnaryMultiCallable[bytes, bytes] = echo_channel.stream_unary(
            ECHO_STREAM_METHOD
        )

        async def echo_cycle(i: int) -> None:
            # The cycle's own calls, signed, with its messages' sizes: a unary pull, a
            # two-message client stream (upload header, then the batch), a unary commit.
            node = workers[i % len(workers)]
            pull_body = pull_request(i)
            await echo_call(pull_body, metadata=node.metadata(ECHO_METHOD, pull_body))
            await echo_stream(
                iter([header, chunk]), metadata=node.metadata(ECHO_STREAM_METHOD, header)
            )
            await echo_call(commit, metadata=node.metadata(ECHO_METHOD, commit))

        unary_run = report(
            "echo (3 signed unary round trips)",
            await measure(ECHO_PID, seconds, concurrency, echo_unary_cycle),
            seconds,
        )
        echo_run = report(
            "echo (the cycle's calls and sizes)",
            await measure(ECHO_PID, seconds, concurrency, echo_cycle),
            seconds,
        )
        profile("lease-cycle", seconds)
        # The workers stay alive as real ones do: heartbeats at the configured interval, so
        # none goes OFFLINE (which would revoke its leases) while it is busy.
        keepalive = asyncio.create_task(keep_alive(channel, workers, interval))
        try:
            cycle_run = await measure(COORDINATOR_PID, seconds, concurrency, cycle)
        finally:
            keepalive.cancel()
        report("lease cycle (pull+upload+commit)", cycle_run, seconds)
    return echo_run, unary_run, cycle_run


def _cycle_messages(
    node: Node,
    *,
    task_id: str,
    lease_id: str,
    fencing_token: int,
    checkpoint_step: int,
    prompt_id: int,
    request_id: str,
) -> tuple[bytes, bytes, bytes]:
    """A lease cycle's upload header and chunk (a one-rollout batch) and its commit request."""
    binding = LeaseBinding(
        network_id=NETWORK,
        node_id=node.identity.node_id,
        task_id=task_id,
        lease_id=lease_id,
        fencing_token=fencing_token,
    )
    rollouts = [
        rollout_pb2.Rollout(
            prompt_index=0,
            prompt_id=prompt_id,
            prompt_token_ids=[1, 2, 3],
            completion_token_ids=[4, 5],
            behaviour_logprobs=[-0.5, -0.5],
            sampling_seed=derive_sampling_seed(NETWORK, task_id, 0),
            finish_reason=rollout_pb2.FINISH_REASON_EOS,
        )
    ]
    batch = batches.encode_batch(binding, checkpoint_step, rollouts)
    digest, header, chunk = _upload_messages(batch, blob_service_pb2.BLOB_KIND_ROLLOUT_BATCH)
    blob = common_pb2.BlobRef(blake3=digest, size=len(batch))
    commit = batches.commitment_request(binding, blob, rollouts)
    commit.request_id = request_id
    return header, chunk, commit.SerializeToString()


def _upload_messages(data: bytes, kind: Any) -> tuple[bytes, bytes, bytes]:
    """``data``'s BLAKE3 digest, and the two UploadBlob messages that carry it."""
    from blake3 import blake3

    digest = blake3(data).digest()
    header = blob_service_pb2.UploadBlobRequest(
        header=blob_service_pb2.BlobHeader(
            blob=common_pb2.BlobRef(blake3=digest, size=len(data)), kind=kind
        )
    ).SerializeToString()
    chunk = blob_service_pb2.UploadBlobRequest(chunk=data).SerializeToString()
    return digest, header, chunk


async def _upload(upload: Any, node: Node, data: bytes, kind: Any) -> bytes:
    digest, header, chunk = _upload_messages(data, kind)
    await upload(
        iter([header, chunk]),
        metadata=node.metadata("/rollnet.v1.BlobService/UploadBlob", header),
        timeout=30,
    )
    return digest


async def bench_swarm(
    coordinator: str, nodes: list[Node], interval: float, seconds: float, db: Path
) -> None:
    async with grpc.aio.insecure_channel(coordinator) as channel:
        heartbeat = unary(channel, HEARTBEAT, node_service_pb2.HeartbeatResponse)
        body = node_service_pb2.HeartbeatRequest(
            requested_interval=duration_pb2.Duration(seconds=int(interval))
        ).SerializeToString()
        stop_at = time.perf_counter() + seconds
        ids = frozenset(n.identity.node_id for n in nodes)
        latencies: list[float] = []
        errors = 0
        error_codes: Counter[str] = Counter()
        worst_suspect = at_end = 0
        granted_intervals: Counter[float] = Counter()

        async def node_loop(node: Node) -> None:
            nonlocal errors
            await asyncio.sleep(random.uniform(0, interval))
            granted = interval
            while time.perf_counter() < stop_at:
                started = time.perf_counter()
                try:
                    reply = await heartbeat(
                        body, metadata=node.metadata(HEARTBEAT, body), timeout=30
                    )
                    # As real nodes do: follow the interval the coordinator grants (its
                    # back-off hint), with jitter.
                    granted = reply.heartbeat_interval.ToTimedelta().total_seconds()
                except grpc.aio.AioRpcError as error:
                    if time.perf_counter() >= stop_at:
                        break  # cancelled by the end of the run, not refused
                    errors += 1
                    error_codes[error.code().name] += 1
                latencies.append(time.perf_counter() - started)
                granted_intervals[round(granted, 1)] += 1
                pause = granted * random.uniform(0.9, 1.0)
                if time.perf_counter() + pause >= stop_at:
                    break  # the run ends before the next beat is due
                await asyncio.sleep(pause)

        async def watch() -> None:
            nonlocal worst_suspect, at_end
            while (left := stop_at - time.perf_counter()) > 0:
                await asyncio.sleep(min(2.0, left))
                worst_suspect = max(worst_suspect, count_stale(db, ids))
            # Taken when the run ends, while every node is still within its interval.
            at_end = count_stale(db, ids)

        started = time.perf_counter()
        server_cpu, own_cpu = cpu_seconds(COORDINATOR_PID), cpu_seconds(os.getpid())
        await asyncio.gather(watch(), *(node_loop(n) for n in nodes))
        elapsed = time.perf_counter() - started
        server_cpu = cpu_seconds(COORDINATOR_PID) - server_cpu
        own_cpu = cpu_seconds(os.getpid()) - own_cpu
        print(
            f"  {len(nodes):,} nodes @ {interval:g} s: {len(latencies) / elapsed:,.0f} heartbeats/s"
            f", p50 {percentile(latencies, 0.5) * 1000:.2f} ms, p99 "
            f"{percentile(latencies, 0.99) * 1000:.2f} ms, errors {errors}, "
            f"most SUSPECT/OFFLINE at once {worst_suspect}, at the end {at_end}"
        )
        # Which side is the limit: a core is 100%; the two share two cores.
        print(
            f"  CPU: coordinator {100 * server_cpu / elapsed:.0f}% of a core "
            f"({1e6 * server_cpu / max(1, len(latencies)):.0f} us per heartbeat), "
            f"load generator {100 * own_cpu / elapsed:.0f}%"
        )
        granted = ", ".join(f"{k:g} s: {v:,}" for k, v in sorted(granted_intervals.items()))
        print(f"  intervals granted (the coordinator's back-off hint): {granted}")
        if error_codes:
            print(f"  errors by code: {dict(error_codes)}")


def count_stale(db: Path, node_ids: frozenset[str]) -> int:
    """How many of ``node_ids`` the coordinator holds SUSPECT or OFFLINE right now."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=30) as connection:
        rows = connection.execute(
            "SELECT id FROM nodes WHERE state IN ('suspect', 'offline')"
        ).fetchall()
    return sum(1 for (node_id,) in rows if node_id in node_ids)


# ---------------------------------------------------------------------------- orchestration
def _drain(stream: Any) -> None:
    for _line in stream:
        pass


def start_process(args: list[str], pattern: str, env: dict[str, str]) -> tuple[Any, int]:
    process = subprocess.Popen(
        args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env
    )
    assert process.stdout is not None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if not line:
            raise RuntimeError(f"{args[0]} exited early")
        match = re.search(pattern, line)
        if match:
            # Keep draining the pipe, or a chatty child blocks once the buffer fills.
            threading.Thread(target=_drain, args=(process.stdout,), daemon=True).start()
            return process, int(match.group(1))
    raise RuntimeError(f"{args} did not report its port")


async def main_async(args: argparse.Namespace, coordinator: str, echo: str, db: Path) -> None:
    nodes = [Node(Identity.generate()) for _ in range(args.nodes)]
    async with grpc.aio.insecure_channel(coordinator) as channel:
        await register_all(channel, nodes, common_pb2.ROLE_WORKER)
    print(f"heartbeat path ({args.nodes} nodes, {args.concurrency} in flight, {args.seconds} s):")
    echo_run, beat_run = await bench_heartbeats(
        coordinator, echo, nodes, args.seconds, args.concurrency
    )
    ratios("heartbeat", beat_run, echo_run, 0.5)
    if args.hostile_ids:
        print(f"hostile heartbeats ({args.concurrency // 4} hostile loops, {args.seconds} s each):")
        await bench_hostile_heartbeats(
            coordinator, nodes, args.seconds, args.concurrency, args.hostile_ids
        )
    print(f"lease cycle ({args.concurrency} in flight, {args.seconds} s):")
    trainer = args.trainer
    echo_run, unary_run, cycle_run = await bench_lease_cycles(
        coordinator, echo, nodes, trainer, args.seconds, args.concurrency, args.interval
    )
    ratios("lease cycle", cycle_run, echo_run, 0.2)
    print(
        f"  (to 3 unary echo round trips, the baseline of earlier runs: "
        f"{cycle_run.count / max(1, unary_run.count):.2f}x)"
    )
    if args.swarm:
        swarm = [Node(Identity.generate()) for _ in range(args.swarm)]
        started = time.perf_counter()
        async with grpc.aio.insecure_channel(coordinator) as channel:
            await register_all(channel, swarm, common_pb2.ROLE_WORKER)
        print(
            f"swarm: registered {args.swarm:,} nodes in {time.perf_counter() - started:.1f} s; "
            f"heartbeating for {args.swarm_seconds} s"
        )
        await bench_swarm(coordinator, swarm, args.interval, args.swarm_seconds, db)


def start_coordinator(
    data_dir: Path, db: str | None, config: Path, env: dict[str, str]
) -> tuple[Any, int]:
    """``rollnet coordinator`` as a process on a free port of 127.0.0.1 (``db``: a database URL,
    or ``None`` for SQLite under ``data_dir``); the process and its port."""
    return start_process(
        [
            sys.executable,
            "-m",
            "rollnet.reference.cli",
            "coordinator",
            "--data-dir",
            str(data_dir),
            *(["--db", db] if db else []),
            "--config",
            str(config),
            "--listen",
            "127.0.0.1:0",
            "--log-level",
            "WARNING",
        ],
        r"listening on [^:]+:(\d+)",
        env,
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=500)
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--swarm", type=int, default=10_000)
    parser.add_argument("--interval", type=float, default=10.0)
    parser.add_argument("--swarm-seconds", type=float, default=45.0)
    parser.add_argument(
        "--hostile-ids",
        type=int,
        nargs="*",
        default=[1024, 16],
        help="bogus lease ids per hostile heartbeat, one phase each (none: skip the phase)",
    )
    parser.add_argument(
        "--db", default=None, help="coordinator database URL (default: SQLite in a temp dir)"
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=Path(__file__).resolve().parent.parent / ".data" / "bench",
        help="where the coordinator's temporary data dir goes (default: .data/bench in the "
        "repository, on the same disk an operator's data dir would be; /tmp is a tmpfs on many "
        "systems, where fsync costs nothing, and on others a slow place to create files)",
    )
    parser.add_argument("--serve-echo", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve_echo:
        asyncio.run(serve_echo())
        return 0
    env = dict(os.environ)
    args.work_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=args.work_dir) as tmp:
        trainer = Node(Identity.generate())
        config = Path(tmp, "coordinator.toml")
        config.write_text(
            f'network_id = "{NETWORK}"\n'
            f'trainers = ["{trainer.identity.node_id}"]\n'
            "registrations_per_ip_per_minute = 1000000\n"
            "rate_limit_per_key = 100000.0\n"
            "rate_burst_per_key = 100000\n"
            f"heartbeat_interval = {args.interval}\n"
            f"lease_duration = {max(120.0, args.interval * 3)}\n"
            "trusted_streak = 1000000\n"
        )
        echo_process, echo_port = start_process(
            [sys.executable, __file__, "--serve-echo"], r"PORT (\d+)", env
        )
        coordinator_process, port = start_coordinator(
            Path(tmp, "data"), args.db, config, env | {"PYTHONUNBUFFERED": "1"}
        )
        global COORDINATOR_PID, ECHO_PID
        COORDINATOR_PID, ECHO_PID = coordinator_process.pid, echo_process.pid
        try:
            args.trainer = trainer
            print(
                f"coordinator 127.0.0.1:{port} "
                f"({'PostgreSQL' if args.db else 'SQLite'}, pid {coordinator_process.pid}), "
                f"echo 127.0.0.1:{echo_port}; load generator pid {os.getpid()}; "
                f"{os.cpu_count()} cores; data dir under {args.work_dir}"
            )
            asyncio.run(
                main_async(
                    args,
                    f"127.0.0.1:{port}",
                    f"127.0.0.1:{echo_port}",
                    Path(tmp, "data", "rollnet.db"),
                )
            )
        finally:
            for process in (coordinator_process, echo_process):
                process.terminate()
                process.wait(timeout=30)
    _ = statistics
    return 0


if __name__ == "__main__":
    sys.exit(main())
