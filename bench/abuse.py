"""Abuse benchmark: hostile load against a real coordinator, with honest nodes calling alongside.

Starts ``rollnet coordinator`` as its own process (SQLite in a temporary data dir, or a fresh
PostgreSQL database with ``--postgres``) with its default limits, registers honest workers and a
few attacker keys, and runs one attack at a time for ``--seconds`` each, after a quiet baseline:

- ``register-flood``: RegisterNode from fresh keys, all from this one address;
- ``fresh-key-flood``: the same flood, with an honest node's captured heartbeat replayed all
  along (it must be refused ``NONCE_REPLAYED`` every time, however full the replay cache's
  pool of registering keys is: ``--max-registering-keys``); at the end, the cost of the replay
  cache's ``record`` with that pool and the shared pool full against an empty cache, and
  ``--flood-keys`` fresh keys straight into the cache, one shared pool (as before issue 25)
  against the partitioned one, side by side;
- ``heartbeat-storm`` and ``pull-storm``: registered attacker keys calling as fast as they can;
- ``long-polls``: attacker keys piling up PullTask long polls (``wait`` at the maximum);
- ``slowloris``: UploadBlob streams that send a header, then a byte now and then, never ending;
- ``oversized``: uploads beyond the size cap, beyond their declared size, beyond the message cap
  and beyond the node's quota;
- ``garbage-signatures``: well-formed calls with random keys and signatures;
- ``bogus-leases``: heartbeats naming as many bogus lease ids as the bound allows, and one more.

Honest workers heartbeat and pull (``wait`` 0) at a fixed ``--honest-rate`` throughout; their
p50/p99 latency is printed for the baseline and during each attack, side by side. Per attack:
the attackers' answers by code and reason, whether the limit held (calls a key had accepted
against its token bucket, registrations against the per-address window) and the coordinator's
resident memory and open files before, during and after.

    .venv/bin/python bench/abuse.py                    # about 2 minutes
    .venv/bin/python bench/abuse.py --postgres --seconds 20

Prints figures; asserts nothing about time. ``tests/test_abuse.py`` runs it briefly and checks
the invariants (limits hold, memory bounded, honest calls succeed).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import sys
import tempfile
import time
import tracemalloc
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import duration_pb2

from rollnet.sdk.node import PROTOCOL_VERSION

sys.path.insert(0, str(Path(__file__).resolve().parent))
from coordinator_load import (
    HEARTBEAT,
    NETWORK,
    REGISTER,
    Node,
    percentile,
    register_all,
    start_coordinator,
    unary,
)

from rollnet.reference.coordinator.bounds import MIN_HELD_LEASES
from rollnet.reference.coordinator.config import CoordinatorConfig
from rollnet.reference.coordinator.uploads import UPLOAD_STREAMS_PER_LEASE
from rollnet.sdk import Identity, from_rpc_error
from rollnet.sdk.identity import b64url_encode
from rollnet.sdk.nonce_cache import NonceCache, NonceCacheFull
from rollnet.sdk.signing import SIGNATURE_HEADER
from rollnet.sdk.verifier import RequestVerifier, VerifierConfig
from rollnet.v1 import (
    blob_service_pb2,
    common_pb2,
    node_pb2,
    node_service_pb2,
    task_service_pb2,
)

PULL = "/rollnet.v1.TaskService/PullTask"
REPLAY_REFUSED = "UNAUTHENTICATED/NONCE_REPLAYED"
UPLOAD = "/rollnet.v1.BlobService/UploadBlob"
POSTGRES_SERVER = "postgresql://postgres@127.0.0.1:5432"
DEFAULTS = CoordinatorConfig(data_dir=Path())
ATTACKS = (
    "register-flood",
    "fresh-key-flood",
    "heartbeat-storm",
    "pull-storm",
    "long-polls",
    "slowloris",
    "oversized",
    "garbage-signatures",
    "bogus-leases",
)


# ---------------------------------------------------------------------------- the coordinator
@dataclass
class Limits:
    """The coordinator limits the attacks run into (written to its config file)."""

    rate_per_key: float = DEFAULTS.rate_limit_per_key
    burst_per_key: int = DEFAULTS.rate_burst_per_key
    registrations_per_minute: int = DEFAULTS.registrations_per_ip_per_minute
    max_registering_keys: int = DEFAULTS.max_registering_keys
    max_leases_per_node: int = DEFAULTS.max_leases_per_node
    max_message_bytes: int = DEFAULTS.max_message_bytes
    max_blob_bytes: int = DEFAULTS.max_blob_bytes
    upload_quota_bytes: int = DEFAULTS.upload_quota_bytes
    pull_wait_max: float = DEFAULTS.pull_wait_max.total_seconds()

    def config(self, trainer: str) -> str:
        """The coordinator's TOML config."""
        return (
            f'network_id = "{NETWORK}"\n'
            f'trainers = ["{trainer}"]\n'
            f"rate_limit_per_key = {self.rate_per_key}\n"
            f"rate_burst_per_key = {self.burst_per_key}\n"
            f"registrations_per_ip_per_minute = {self.registrations_per_minute}\n"
            f"max_registering_keys = {self.max_registering_keys}\n"
            f"max_leases_per_node = {self.max_leases_per_node}\n"
            f"max_message_bytes = {self.max_message_bytes}\n"
            f"max_blob_bytes = {self.max_blob_bytes}\n"
            f"upload_quota_bytes = {self.upload_quota_bytes}\n"
            f"pull_wait_max = {self.pull_wait_max}\n"
            # Far more than any phase lasts: no honest node goes SUSPECT between its beats.
            "heartbeat_interval = 30\n"
        )

    def upload_streams(self) -> int:
        """The most uploads one node may stream at once (``uploads.py``)."""
        return UPLOAD_STREAMS_PER_LEASE * self.max_leases_per_node

    def held_lease_bound(self) -> int:
        """The most lease ids a heartbeat may name (``bounds.py``)."""
        return max(MIN_HELD_LEASES, self.max_leases_per_node)


@dataclass
class RunningCoordinator:
    """A coordinator process and its address."""

    process: Any
    address: str

    @property
    def pid(self) -> int:
        return int(self.process.pid)

    def resident_mib(self) -> float:
        """The coordinator's resident memory (VmRSS), MiB."""
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def open_files(self) -> int:
        """The coordinator's open file descriptors (sockets, database, blob files)."""
        return len(os.listdir(f"/proc/{self.pid}/fd"))

    def alive(self) -> bool:
        return self.process.poll() is None


@contextlib.contextmanager
def coordinator(
    work_dir: Path, limits: Limits, trainer: Node, postgres: bool = False
) -> Iterator[RunningCoordinator]:
    """Run ``rollnet coordinator`` with ``limits`` in a temporary data dir (and, with
    ``postgres``, a fresh PostgreSQL database dropped afterwards)."""
    work_dir.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=work_dir) as tmp, _database(postgres) as url:
        config = Path(tmp, "coordinator.toml")
        config.write_text(limits.config(trainer.identity.node_id))
        process, port = start_coordinator(
            Path(tmp, "data"), url, config, dict(os.environ) | {"PYTHONUNBUFFERED": "1"}
        )
        try:
            yield RunningCoordinator(process, f"127.0.0.1:{port}")
        finally:
            process.terminate()
            try:
                process.wait(timeout=30)
            except Exception:
                process.kill()
                process.wait()


@contextlib.contextmanager
def _database(postgres: bool) -> Iterator[str]:
    """ "" (the coordinator's SQLite file) or the URL of a fresh PostgreSQL database."""
    if not postgres:
        yield ""
        return
    import psycopg
    from psycopg import sql

    name = f"rollnet_abuse_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(f"{POSTGRES_SERVER}/postgres", autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield f"{POSTGRES_SERVER}/{name}"
    finally:
        with psycopg.connect(f"{POSTGRES_SERVER}/postgres", autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
            )


# ---------------------------------------------------------------------------- calls
def answer_of(error: grpc.aio.AioRpcError) -> str:
    """``CODE/REASON`` of a refused call (the rollnet ErrorInfo reason when it carries one),
    and the replay cache's bound when that is what refused it."""
    refusal = from_rpc_error(error)
    if not refusal.reason:
        return error.code().name
    bound = refusal.metadata.get("nonce_limit")
    return f"{error.code().name}/{refusal.reason}" + (f" ({bound})" if bound else "")


def heartbeat_body(lease_ids: int = 0) -> bytes:
    return node_service_pb2.HeartbeatRequest(
        activity=node_service_pb2.ACTIVITY_IDLE,
        held_lease_ids=[secrets.token_hex(16) for _ in range(lease_ids)],
    ).SerializeToString()


def pull_body(wait: float = 0.0) -> bytes:
    return task_service_pb2.PullTaskRequest(
        request_id=secrets.token_hex(16), wait=duration_pb2.Duration(seconds=int(wait))
    ).SerializeToString()


def register_body(identity: Identity) -> bytes:
    return node_service_pb2.RegisterNodeRequest(
        public_key=identity.public_key,
        role=common_pb2.ROLE_WORKER,
        protocol_version=PROTOCOL_VERSION,
        software_version="abuse/1",
        capabilities=node_pb2.Capabilities(environments=["arithmetic"]),
    ).SerializeToString()


def upload_header(size: int, digest: bytes | None = None) -> bytes:
    return blob_service_pb2.UploadBlobRequest(
        header=blob_service_pb2.BlobHeader(
            blob=common_pb2.BlobRef(blake3=digest or secrets.token_bytes(32), size=size),
            kind=blob_service_pb2.BLOB_KIND_ROLLOUT_BATCH,
        )
    ).SerializeToString()


def upload_chunk(data: bytes) -> bytes:
    return blob_service_pb2.UploadBlobRequest(chunk=data).SerializeToString()


class Calls:
    """The coordinator's methods on one channel, taking raw bytes and signed metadata."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.heartbeat = unary(channel, HEARTBEAT, node_service_pb2.HeartbeatResponse)
        self.pull = unary(channel, PULL, task_service_pb2.PullTaskResponse)
        self.register = unary(channel, REGISTER, node_service_pb2.RegisterNodeResponse)
        self.upload: grpc.aio.StreamUnaryMultiCallable[
            bytes, blob_service_pb2.UploadBlobResponse
        ] = channel.stream_unary(
            UPLOAD,
            request_serializer=None,
            response_deserializer=blob_service_pb2.UploadBlobResponse.FromString,
        )


# ---------------------------------------------------------------------------- honest traffic
@dataclass
class Honest:
    """Honest calls' latencies (seconds) and failures, by kind of call."""

    latencies: dict[str, list[float]] = field(default_factory=lambda: {"heartbeat": [], "pull": []})
    failures: Counter[str] = field(default_factory=Counter)

    def calls(self) -> int:
        return sum(len(found) for found in self.latencies.values())


async def honest_traffic(
    calls: Calls, nodes: list[Node], rate: float, stop: asyncio.Event, into: Honest
) -> None:
    """Honest workers alternate a heartbeat and a pull (``wait`` 0), ``rate`` calls a second in
    all, paced (not as fast as they can): what a real swarm's steady traffic looks like."""
    loops = 8
    period = loops / rate

    async def loop(first: int) -> None:
        # Staggered: the loops' calls spread evenly over each period, not all at its start.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), first * period / loops)
        i, due = first, time.perf_counter()
        while not stop.is_set():
            node = nodes[i % len(nodes)]
            kind = "heartbeat" if (i // loops) % 2 == 0 else "pull"
            method, call, body = (
                (HEARTBEAT, calls.heartbeat, heartbeat_body())
                if kind == "heartbeat"
                else (PULL, calls.pull, pull_body())
            )
            started = time.perf_counter()
            try:
                await call(body, metadata=node.metadata(method, body), timeout=30)
                into.latencies[kind].append(time.perf_counter() - started)
            except grpc.aio.AioRpcError as error:
                into.failures[f"{kind} {answer_of(error)}"] += 1
            i += loops
            # A node that fell behind does not burst to catch up: it carries on from now.
            due = max(due + period, time.perf_counter())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, due - time.perf_counter()))

    await asyncio.gather(*(loop(k) for k in range(loops)))


# ---------------------------------------------------------------------------- attacks
@dataclass
class Attack:
    """What one attack did: its calls' answers, per key where a limit is per key."""

    answers: Counter[str] = field(default_factory=Counter)
    accepted_per_key: Counter[int] = field(default_factory=Counter)
    seconds: float = 0.0
    #: The most calls of one key its bucket admits in ``seconds`` (0: no per-key check).
    per_key_allowance: float = 0.0
    #: The most calls in all the limit admits (0: no such check).
    total_allowance: float = 0.0
    #: The most calls (streams, long polls) the attackers may hold open at once (0: no check).
    held_allowance: int = 0
    #: Answers to an honest call replayed during the attack (each must be NONCE_REPLAYED).
    replays: Counter[str] = field(default_factory=Counter)
    notes: list[str] = field(default_factory=list)

    def accepted(self) -> int:
        return self.answers["OK"]

    def limit_held(self) -> bool:
        """Whether no key got more calls accepted than its limit admits."""
        if (
            self.per_key_allowance
            and self.accepted_per_key
            and max(self.accepted_per_key.values()) > self.per_key_allowance
        ):
            return False
        if self.held_allowance and self.answers["held open"] > self.held_allowance:
            return False
        if set(self.replays) - {REPLAY_REFUSED}:
            return False
        return not (self.total_allowance and self.accepted() > self.total_allowance)


AttackFn = Callable[["Context", asyncio.Event, Attack], Awaitable[None]]


@dataclass
class Context:
    """What the attacks need: the coordinator, its limits, the calls, the attacker keys."""

    coordinator: RunningCoordinator
    limits: Limits
    calls: Calls
    attackers: list[Node]
    #: The honest node whose captured call ``fresh-key-flood`` replays.
    victim: Node
    #: How many of the attackers the storms (heartbeats, pulls, bogus leases) spread over.
    storm_keys: int
    concurrency: int
    long_polls: int
    slow_streams: int
    slow_size: int


def _tally(attack: Attack, key: int, error: grpc.aio.AioRpcError | None) -> None:
    if error is None:
        attack.answers["OK"] += 1
        attack.accepted_per_key[key] += 1
    else:
        attack.answers[answer_of(error)] += 1


async def _as_fast_as_possible(
    ctx: Context,
    stop: asyncio.Event,
    attack: Attack,
    send: Callable[[int], Awaitable[Any]],
    per_key: bool = True,
) -> None:
    """``ctx.concurrency`` loops calling ``send(i)`` until ``stop``; answers tallied by the key
    ``i`` picks (``i % ctx.storm_keys``)."""
    counter = iter(range(10**12))
    if per_key:
        # A bucket starts full and refills meanwhile: burst + rate x duration.
        attack.per_key_allowance = ctx.limits.burst_per_key  # plus the rate, once timed

    async def loop() -> None:
        while not stop.is_set():
            i = next(counter)
            try:
                await send(i)
                _tally(attack, i % ctx.storm_keys, None)
            except grpc.aio.AioRpcError as error:
                _tally(attack, i % ctx.storm_keys, error)

    await asyncio.gather(*(loop() for _ in range(ctx.concurrency)))


async def register_flood(ctx: Context, stop: asyncio.Event, attack: Attack) -> None:
    attack.total_allowance = ctx.limits.registrations_per_minute

    async def send(_i: int) -> None:
        node = Node(Identity.generate())
        body = register_body(node.identity)
        await ctx.calls.register(body, metadata=node.metadata(REGISTER, body), timeout=30)

    await _as_fast_as_possible(ctx, stop, attack, send, per_key=False)
    attack.accepted_per_key.clear()


async def fresh_key_flood(ctx: Context, stop: asyncio.Event, attack: Attack) -> None:
    """``register-flood``, with an honest heartbeat (sent and served once) replayed byte for
    byte every 50 ms until the flood stops."""
    body = heartbeat_body()
    captured = ctx.victim.metadata(HEARTBEAT, body)
    await ctx.calls.heartbeat(body, metadata=captured, timeout=30)

    async def replay() -> None:
        while not stop.is_set():
            try:
                await ctx.calls.heartbeat(body, metadata=captured, timeout=30)
                attack.replays["OK"] += 1
            except grpc.aio.AioRpcError as error:
                attack.replays[answer_of(error)] += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.05)

    replaying = asyncio.ensure_future(replay())
    await register_flood(ctx, stop, attack)
    await replaying
    attack.notes.append(
        f"the captured honest heartbeat replayed {attack.replays.total():,} times: "
        + ", ".join(f"{k} {v:,}" for k, v in attack.replays.most_common())
    )


async def _no_key(_public_key: bytes) -> None:
    return None


DEFAULT_VERIFIER = VerifierConfig(NETWORK, _no_key, {})


def nonce_cache_cost(
    registering_keys: int, capacity: int = DEFAULT_VERIFIER.nonce_capacity, calls: int = 20_000
) -> str:
    """The cost of one ``record`` of the coordinator's replay cache, measured in this process:
    an empty cache against one whose registering pool and shared pool are full (the state a
    flood leaves), side by side."""
    config = VerifierConfig(
        NETWORK,
        _no_key,
        {},
        nonce_capacity=capacity,
        nonce_max_unregistered_keys=registering_keys,
    )
    full = RequestVerifier(config).nonces
    for i in range(registering_keys):
        full.record(i.to_bytes(32, "big"), "0" * 32, registered=False)
    busy = [(2**200 + i).to_bytes(32, "big") for i in range(64)]
    with contextlib.suppress(NonceCacheFull):
        for n in range(config.nonce_capacity + len(busy) * config.nonce_reserved_per_key):
            full.record(busy[n % len(busy)], f"{n:032x}")
    empty = RequestVerifier(config).nonces
    nonces = [f"{n + 10**9:032x}" for n in range(calls)]
    # Each honest key within its reserve (served however full the shared pool is); new keys
    # each round, the best of three rounds, the two caches taking turns.
    per_round = calls // config.nonce_reserved_per_key

    def per_call(cache: NonceCache, round_: int) -> float:
        keys = [(2**250 + round_ * per_round + i).to_bytes(32, "big") for i in range(per_round)]
        started = time.perf_counter()
        for n, nonce in enumerate(nonces):
            cache.record(keys[n % per_round], nonce)
        return (time.perf_counter() - started) / calls

    before = after = float("inf")
    for round_ in range(3):
        before = min(before, per_call(empty, round_))
        after = min(after, per_call(full, round_))
    return (
        f"replay cache record(): {before * 1e6:.2f} us empty, {after * 1e6:.2f} us with "
        f"{full.unregistered_keys:,} registering keys and {full.shared_in_use:,} shared nonces "
        f"live ({len(full):,} in all): {after / before:.2f}x"
    )


def flood_side_by_side(fresh_keys: int, honest_keys: int = 100) -> list[str]:
    """A fresh-key flood straight into the replay cache, in this process, two ways side by side:
    one shared pool (what the verifier did before issue 25: every key's nonces counted alike
    against 500,000, 12,000 per key) and the partitioned defaults. Honest keys call first, then
    ``fresh_keys`` keys register once each (no address share: as from many addresses), then the
    honest keys call anew and replay their first call."""
    defaults = VerifierConfig(NETWORK, _no_key, {})

    def shared_pool() -> NonceCache:
        return NonceCache(
            ttl=2 * defaults.skew,
            capacity=defaults.nonce_capacity,
            per_key_capacity=defaults.nonce_capacity_per_key,
        )

    lines = []
    for name, make, fresh_registered in (
        ("one shared pool (before)", shared_pool, True),
        ("partitioned (now)", lambda: RequestVerifier(defaults).nonces, False),
    ):
        tracemalloc.start()
        cache = make()
        honest = [(2**250 + i).to_bytes(32, "big") for i in range(honest_keys)]
        for i, key in enumerate(honest):
            cache.record(key, f"{i:032x}")
        held_before = tracemalloc.get_traced_memory()[0]
        refused = 0
        for i in range(fresh_keys):
            try:
                cache.record(i.to_bytes(32, "big"), f"{i:032x}", registered=fresh_registered)
            except NonceCacheFull:
                refused += 1
        held = (tracemalloc.get_traced_memory()[0] - held_before) / 2**20
        tracemalloc.stop()
        served = replays_refused = 0
        for i, key in enumerate(honest):
            with contextlib.suppress(NonceCacheFull):
                served += cache.record(key, f"{i + 10**9:032x}")
            replays_refused += not cache.record(key, f"{i:032x}")
        lines.append(
            f"  {name:<26} fresh keys refused {refused:>9,}, held {held:6.1f} MiB; "
            "honest new calls served "
            f"{served}/{honest_keys}, replays refused {replays_refused}/{honest_keys}"
        )
    return lines


async def heartbeat_storm(ctx: Context, stop: asyncio.Event, attack: Attack) -> None:
    body = heartbeat_body()

    async def send(i: int) -> None:
        node = ctx.attackers[i % ctx.storm_keys]
        await ctx.calls.heartbeat(body, metadata=node.metadata(HEARTBEAT, body), timeout=30)

    await _as_fast_as_possible(ctx, stop, attack, send)


async def pull_storm(ctx: Context, stop: asyncio.Event, attack: Attack) -> None:
    async def send(i: int) -> None:
        node = ctx.attackers[i % ctx.storm_keys]
        body = pull_body()
        await ctx.calls.pull(body, metadata=node.metadata(PULL, body), timeout=30)

    await _as_fast_as_possible(ctx, stop, attack, send)


async def _still_open(calls: Sequence[asyncio.Future[None]], until: float) -> int:
    """How many of ``calls`` are still open once none has ended for 3 s (refusals and quick
    answers may still be on their way on a loaded machine), or at ``until`` (perf_counter)."""
    still = sum(1 for call in calls if not call.done())
    quiet_since = time.perf_counter()
    while time.perf_counter() - quiet_since < 3 and time.perf_counter() < until:
        await asyncio.sleep(0.25)
        now_open = sum(1 for call in calls if not call.done())
        if now_open < still:
            still, quiet_since = now_open, time.perf_counter()
    return still


async def long_polls(ctx: Context, stop: asyncio.Event, attack: Attack) -> None:
    """``ctx.long_polls`` PullTask long polls at the longest wait, spread over every attacker
    key; there is no work, so a poll the coordinator lets wait returns after its wait. Held:
    the polls still open after the phase, once the others have been answered (before three
    quarters of the wait). The phase lasts until every poll has returned."""
    attack.per_key_allowance = ctx.limits.burst_per_key
    attack.held_allowance = len(ctx.attackers) * ctx.limits.max_leases_per_node
    wait = ctx.limits.pull_wait_max

    async def one(i: int) -> None:
        node = ctx.attackers[i % len(ctx.attackers)]
        body = pull_body(wait=wait)
        try:
            await ctx.calls.pull(body, metadata=node.metadata(PULL, body), timeout=wait + 60)
            _tally(attack, i % len(ctx.attackers), None)
        except grpc.aio.AioRpcError as error:
            _tally(attack, i % len(ctx.attackers), error)

    started = time.perf_counter()
    polls = [asyncio.ensure_future(one(i)) for i in range(ctx.long_polls)]
    await stop.wait()
    held = await _still_open(polls, until=started + 0.75 * wait)
    attack.answers["held open"] = held
    attack.notes.append(
        f"{held} of {ctx.long_polls} long polls of {wait:g} s held open after "
        f"{time.perf_counter() - started:.1f} s; the phase lasted until all returned"
    )
    await asyncio.gather(*polls)


async def _slow_upload(
    ctx: Context, node: Node, size: int, stop: asyncio.Event, trickle: float
) -> None:
    """An upload that sends its header, then one byte every ``trickle`` seconds until
    ``stop``, then hangs up (raises the call's error if the coordinator refuses it first)."""
    header = upload_header(size)

    async def requests() -> AsyncIterator[bytes]:
        yield header
        sent = 0
        while sent < size - 1:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), trickle)
            if stop.is_set():
                return
            yield upload_chunk(b"x")
            sent += 1

    await ctx.calls.upload(requests(), metadata=node.metadata(UPLOAD, header), timeout=3600)


async def slowloris(ctx: Context, stop: asyncio.Event, attack: Attack) -> None:
    """``ctx.slow_streams`` uploads of ``ctx.slow_size`` declared bytes trickling in, spread
    over every attacker key."""
    attack.per_key_allowance = ctx.limits.burst_per_key
    attack.held_allowance = len(ctx.attackers) * ctx.limits.upload_streams()
    release = asyncio.Event()
    opened_at = time.perf_counter()

    async def one(i: int) -> None:
        node = ctx.attackers[i % len(ctx.attackers)]
        try:
            await _slow_upload(ctx, node, ctx.slow_size, release, trickle=2.0)
            _tally(attack, i % len(ctx.attackers), None)
        except grpc.aio.AioRpcError as error:
            if not release.is_set():  # refused while it trickled (not ended by us)
                _tally(attack, i % len(ctx.attackers), error)

    streams = [asyncio.ensure_future(one(i)) for i in range(ctx.slow_streams)]
    await stop.wait()
    held = await _still_open(streams, until=time.perf_counter() + 30)
    attack.answers["held open"] = held
    attack.notes.append(
        f"{held} of {ctx.slow_streams} streams of {ctx.slow_size:,} declared bytes held open "
        f"after {time.perf_counter() - opened_at:.0f} s; coordinator open files "
        f"{ctx.coordinator.open_files()}"
    )
    release.set()
    for stream in streams:
        stream.cancel()
    await asyncio.gather(*streams, return_exceptions=True)


async def oversized(ctx: Context, stop: asyncio.Event, attack: Attack) -> None:
    """Uploads that break a size rule, each kind in turn, until ``stop``."""
    limits = ctx.limits

    async def send(node: Node, messages: list[bytes]) -> None:
        async def requests() -> AsyncIterator[bytes]:
            for message in messages:
                yield message

        await ctx.calls.upload(requests(), metadata=node.metadata(UPLOAD, messages[0]), timeout=60)

    kinds: list[tuple[str, Callable[[Node], Awaitable[None]]]] = [
        ("over the blob cap", lambda n: send(n, [upload_header(limits.max_blob_bytes + 1)])),
        (
            "more than declared",
            lambda n: send(n, [upload_header(1024), upload_chunk(secrets.token_bytes(2048))]),
        ),
        (
            "message over the cap",
            lambda n: send(
                n,
                [
                    upload_header(limits.max_message_bytes + 64),
                    upload_chunk(bytes(limits.max_message_bytes + 32)),
                ],
            ),
        ),
        (
            "over the quota",
            lambda n: _over_quota(ctx, n),
        ),
    ]
    i = 0
    while not stop.is_set():
        name, kind = kinds[i % len(kinds)]
        node = ctx.attackers[i % len(ctx.attackers)]
        try:
            await kind(node)
            attack.answers[f"{name}: OK"] += 1
        except grpc.aio.AioRpcError as error:
            attack.answers[f"{name}: {answer_of(error)}"] += 1
        i += 1


async def _over_quota(ctx: Context, node: Node) -> None:
    """Uploads of the largest size from ``node``, streaming at once, one more than its quota
    holds: the last is over the quota while the others stream. The others are then abandoned."""
    size = min(ctx.limits.max_blob_bytes, ctx.limits.upload_quota_bytes)
    release = asyncio.Event()
    held = [
        asyncio.ensure_future(_slow_upload(ctx, node, size, release, trickle=60.0))
        for _ in range(ctx.limits.upload_quota_bytes // size)
    ]
    try:
        # Their headers must be in before the last one's (no reply to wait on).
        await asyncio.sleep(0.2)
        body = upload_header(size)

        async def requests() -> AsyncIterator[bytes]:
            yield body

        await ctx.calls.upload(requests(), metadata=node.metadata(UPLOAD, body), timeout=60)
    finally:
        release.set()
        for stream in held:
            stream.cancel()
        await asyncio.gather(*held, return_exceptions=True)


async def garbage_signatures(ctx: Context, stop: asyncio.Event, attack: Attack) -> None:
    attack.total_allowance = 0.5  # none may be accepted
    body = heartbeat_body()

    async def send(_i: int) -> None:
        node = Node(Identity.generate())
        metadata = [
            (key, b64url_encode(secrets.token_bytes(64)) if key == SIGNATURE_HEADER else value)
            for key, value in node.metadata(HEARTBEAT, body)
        ]
        await ctx.calls.heartbeat(body, metadata=metadata, timeout=30)

    await _as_fast_as_possible(ctx, stop, attack, send, per_key=False)
    attack.accepted_per_key.clear()


async def bogus_leases(ctx: Context, stop: asyncio.Event, attack: Attack) -> None:
    """Heartbeats naming the bound's worth of bogus lease ids (served) and one more (refused)."""
    bound = ctx.limits.held_lease_bound()
    at_bound, over = heartbeat_body(bound), heartbeat_body(bound + 1)

    async def send(i: int) -> None:
        node = ctx.attackers[i % ctx.storm_keys]
        body = at_bound if i % 2 else over
        await ctx.calls.heartbeat(body, metadata=node.metadata(HEARTBEAT, body), timeout=30)

    await _as_fast_as_possible(ctx, stop, attack, send)
    attack.notes.append(f"half name {bound} bogus lease ids (the bound), half {bound + 1}")


ATTACK_FNS: dict[str, AttackFn] = {
    "register-flood": register_flood,
    "fresh-key-flood": fresh_key_flood,
    "heartbeat-storm": heartbeat_storm,
    "pull-storm": pull_storm,
    "long-polls": long_polls,
    "slowloris": slowloris,
    "oversized": oversized,
    "garbage-signatures": garbage_signatures,
    "bogus-leases": bogus_leases,
}


# ---------------------------------------------------------------------------- phases
@dataclass
class Phase:
    """One phase: honest traffic with (or without) an attack, and the coordinator's state."""

    name: str
    honest: Honest
    attack: Attack | None
    rss_before: float
    rss_during: float
    rss_after: float
    files_before: int
    files_during: int
    files_after: int


async def run_phase(
    ctx: Context, honest_nodes: list[Node], rate: float, seconds: float, name: str
) -> Phase:
    """``seconds`` of honest traffic, with attack ``name`` alongside ("baseline": none)."""
    running = ctx.coordinator
    rss_before, files_before = running.resident_mib(), running.open_files()
    honest, stop = Honest(), asyncio.Event()
    traffic = asyncio.ensure_future(honest_traffic(ctx.calls, honest_nodes, rate, stop, honest))
    attack = None if name == "baseline" else Attack()
    attack_stop = asyncio.Event()
    attacking = None
    started = time.perf_counter()
    if attack is not None:
        attacking = asyncio.ensure_future(ATTACK_FNS[name](ctx, attack_stop, attack))
    # Peak memory and open files, sampled while the phase runs.
    rss_during, files_during = rss_before, files_before
    deadline = started + seconds
    while (left := deadline - time.perf_counter()) > 0:
        await asyncio.sleep(min(0.5, left))
        if not running.alive():
            break
        rss_during = max(rss_during, running.resident_mib())
        files_during = max(files_during, running.open_files())
    attack_stop.set()
    if attacking is not None and attack is not None:
        await attacking
        attack.seconds = time.perf_counter() - started
        if attack.per_key_allowance:
            attack.per_key_allowance += ctx.limits.rate_per_key * attack.seconds
    stop.set()
    await traffic
    alive = running.alive()
    return Phase(
        name,
        honest,
        attack,
        rss_before,
        rss_during,
        running.resident_mib() if alive else float("nan"),
        files_before,
        files_during,
        running.open_files() if alive else -1,
    )


def _ms(values: list[float], q: float) -> str:
    return f"{percentile(values, q) * 1000:7.2f}" if values else "    n/a"


def print_phases(phases: list[Phase]) -> None:
    """The honest latencies side by side, then each attack's answers and limits."""
    print(
        f"\n{'phase':<20}{'honest':>8}{'failed':>7}{'hb p50':>9}{'hb p99':>9}"
        f"{'pull p50':>10}{'pull p99':>10}{'RSS before':>12}{'peak':>8}{'after':>8}"
        f"{'files':>7}{'peak':>6}"
    )
    for phase in phases:
        beats, pulls = phase.honest.latencies["heartbeat"], phase.honest.latencies["pull"]
        print(
            f"{phase.name:<20}{phase.honest.calls():>8}{sum(phase.honest.failures.values()):>7}"
            f"{_ms(beats, 0.5):>9}{_ms(beats, 0.99):>9}{_ms(pulls, 0.5):>10}{_ms(pulls, 0.99):>10}"
            f"{phase.rss_before:>10.1f}M{phase.rss_during:>7.1f}M{phase.rss_after:>7.1f}M"
            f"{phase.files_before:>7}{phase.files_during:>6}"
        )
    baseline = next((p for p in phases if p.name == "baseline"), None)
    if baseline is not None and baseline.honest.calls():
        base99 = percentile(
            baseline.honest.latencies["heartbeat"] + baseline.honest.latencies["pull"], 0.99
        )
        print("\nhonest p99 during each attack / baseline p99:")
        for phase in phases:
            both = phase.honest.latencies["heartbeat"] + phase.honest.latencies["pull"]
            if phase.attack is not None and both:
                print(f"  {phase.name:<20}{percentile(both, 0.99) / base99:6.2f}x")
    print("\nattackers' answers:")
    for phase in phases:
        attack = phase.attack
        if attack is None:
            continue
        answers = ", ".join(f"{k} {v:,}" for k, v in attack.answers.most_common())
        print(f"  {phase.name} ({attack.seconds:.1f} s): {answers or 'none'}")
        verdict = "held" if attack.limit_held() else "BROKEN"
        if attack.per_key_allowance and attack.accepted_per_key:
            print(
                f"    most accepted for one key: {max(attack.accepted_per_key.values()):,} "
                f"(its bucket admits {attack.per_key_allowance:,.0f}: burst + rate x "
                f"{attack.seconds:.1f} s)"
            )
        if attack.held_allowance:
            print(
                f"    held open: {attack.answers['held open']:,} (the attackers' "
                f"keys may hold {attack.held_allowance:,})"
            )
        if attack.total_allowance:
            print(f"    accepted {attack.accepted():,} (limit {attack.total_allowance:g})")
        if attack.replays:
            refused = attack.replays[REPLAY_REFUSED]
            print(f"    honest replays refused: {refused:,} of {attack.replays.total():,}")
        print(f"    -> limit {verdict}")
        for note in attack.notes:
            print(f"    {note}")
        if phase.honest.failures:
            print(f"    honest failures: {dict(phase.honest.failures)}")


async def run_attacks(
    running: RunningCoordinator,
    limits: Limits,
    trainer: Node,
    *,
    attacks: list[str],
    seconds: float,
    honest_nodes: int = 16,
    attacker_keys: int = 8,
    storm_keys: int = 1,
    honest_rate: float = 100.0,
    concurrency: int = 32,
    long_polls: int = 2000,
    slow_streams: int = 1000,
    slow_size: int = 2 << 20,
) -> list[Phase]:
    """The baseline, then each of ``attacks``, then a quiet phase after them all."""
    honest = [Node(Identity.generate()) for _ in range(honest_nodes)]
    attackers = [Node(Identity.generate()) for _ in range(attacker_keys)]
    async with grpc.aio.insecure_channel(
        running.address,
        options=[("grpc.max_send_message_length", 4 * limits.max_message_bytes)],
    ) as channel:
        # Within the per-address registration window (the flood fills it afterwards).
        await register_all(channel, [trainer], common_pb2.ROLE_TRAINER)
        await register_all(channel, honest + attackers, common_pb2.ROLE_WORKER)
        ctx = Context(
            running,
            limits,
            Calls(channel),
            attackers,
            honest[0],
            min(storm_keys, attacker_keys),
            concurrency,
            long_polls,
            slow_streams,
            slow_size,
        )
        phases = []
        for index, name in enumerate(["baseline", *attacks, "baseline"]):
            phase = await run_phase(ctx, honest, honest_rate, seconds, name)
            if index and name == "baseline":
                phase.name = "after all attacks"
            phases.append(phase)
            if not running.alive():
                print(f"the coordinator exited (code {running.process.poll()}) during {name}")
                break
    return phases


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="per phase (default 10)")
    parser.add_argument("--attacks", nargs="*", choices=ATTACKS, default=list(ATTACKS))
    parser.add_argument("--postgres", action="store_true", help="PostgreSQL at 127.0.0.1:5432")
    parser.add_argument("--honest-nodes", type=int, default=16)
    parser.add_argument("--honest-rate", type=float, default=100.0, help="honest calls/s in all")
    parser.add_argument("--attacker-keys", type=int, default=8, help="registered attacker keys")
    parser.add_argument(
        "--storm-keys", type=int, default=1, help="attacker keys the call storms come from (1)"
    )
    parser.add_argument("--concurrency", type=int, default=32, help="attack loops in flight")
    parser.add_argument("--long-polls", type=int, default=2000)
    parser.add_argument("--slow-streams", type=int, default=1000)
    parser.add_argument("--slow-size", type=int, default=2 << 20, help="declared bytes each")
    parser.add_argument("--rate-per-key", type=float, default=DEFAULTS.rate_limit_per_key)
    parser.add_argument("--burst-per-key", type=int, default=DEFAULTS.rate_burst_per_key)
    parser.add_argument(
        "--registrations-per-minute", type=int, default=DEFAULTS.registrations_per_ip_per_minute
    )
    parser.add_argument(
        "--flood-keys",
        type=int,
        default=600_000,
        help="fresh keys of fresh-key-flood's in-process side by side (0: none)",
    )
    parser.add_argument(
        "--max-registering-keys",
        type=int,
        default=DEFAULTS.max_registering_keys,
        help="the coordinator's pool of fresh keys in the replay cache",
    )
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=Path(__file__).resolve().parent.parent / ".data" / "bench",
        help="where the coordinator's temporary data dir goes (default .data/bench)",
    )
    args = parser.parse_args()
    limits = Limits(
        rate_per_key=args.rate_per_key,
        burst_per_key=args.burst_per_key,
        registrations_per_minute=args.registrations_per_minute,
        max_registering_keys=args.max_registering_keys,
    )
    trainer = Node(Identity.generate())
    with coordinator(args.work_dir, limits, trainer, args.postgres) as running:
        print(
            f"coordinator {running.address} ({'PostgreSQL' if args.postgres else 'SQLite'}, "
            f"pid {running.pid}); {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}; "
            f"limits: {limits.rate_per_key:g} calls/s per key (burst {limits.burst_per_key}), "
            f"{limits.registrations_per_minute} registrations/min per address, "
            f"{limits.max_registering_keys:,} registering keys in the replay cache; "
            f"{args.honest_nodes} honest nodes at {args.honest_rate:g} calls/s; "
            f"{args.attacker_keys} attacker keys (storms from {args.storm_keys}), "
            f"{args.concurrency} loops; {args.seconds:g} s "
            "per phase",
            flush=True,
        )
        phases = asyncio.run(
            run_attacks(
                running,
                limits,
                trainer,
                attacks=args.attacks,
                seconds=args.seconds,
                honest_nodes=args.honest_nodes,
                attacker_keys=args.attacker_keys,
                storm_keys=args.storm_keys,
                honest_rate=args.honest_rate,
                concurrency=args.concurrency,
                long_polls=args.long_polls,
                slow_streams=args.slow_streams,
                slow_size=args.slow_size,
            )
        )
        print_phases(phases)
        alive = running.alive()
    if "fresh-key-flood" in args.attacks:
        print(f"\n{nonce_cache_cost(limits.max_registering_keys)}")
        if args.flood_keys:
            print(f"\n{args.flood_keys:,} fresh keys straight into the replay cache:")
            print("\n".join(flood_side_by_side(args.flood_keys)))
    broken = [p.name for p in phases if p.attack is not None and not p.attack.limit_held()]
    first, last = phases[0], phases[-1]
    print(
        f"\ncoordinator resident memory: {first.rss_before:.1f} MiB at the start, peak "
        f"{max(p.rss_during for p in phases):.1f} MiB, {last.rss_after:.1f} MiB at the end "
        f"({last.rss_after / first.rss_before:.2f}x); open files {first.files_before} -> "
        f"{last.files_after}; {'alive' if alive else 'DEAD'}; limits broken: "
        f"{', '.join(broken) or 'none'}"
    )
    return 0 if alive and not broken else 1


if __name__ == "__main__":
    sys.exit(main())
