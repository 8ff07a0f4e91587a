"""Every field of every request is bounded at the edge, once, before any handler or SQL sees it.

A NUL in any string, a string too long, a number SQL cannot hold, an unknown enum value, a
Duration out of range, a list or map too long: each is refused with INVALID_ARGUMENT /
``INVALID_FIELDS`` and a field violation naming its path, for every RPC, on SQLite and on
PostgreSQL (where a NUL used to fail the call, or a whole batch of heartbeats, with UNKNOWN).
The hostile requests are generated from the descriptors, one per field and kind of bad value;
the issue's own examples are spelled out by hand as well.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import blake3
import grpc
import pytest
from coordinator_testing import raw_upload, register, upload_chunk, upload_header
from google.protobuf import descriptor_pool, duration_pb2
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

from rollnet.reference.coordinator import bounds
from rollnet.reference.coordinator.bounds import (
    CheckpointPath,
    Choice,
    Each,
    Embedded,
    MessageCheck,
    Nested,
    Pairs,
    Raw,
    Real,
    RequestBounds,
    Rule,
    Span,
    Text,
    Whole,
    markdown_table,
    request_types,
)
from rollnet.reference.coordinator.config import CoordinatorConfig, with_overrides
from rollnet.reference.coordinator.server import Coordinator, start_coordinator
from rollnet.sdk import Identity, RollnetClient, RollnetError, from_rpc_error
from rollnet.sdk.checkpoints import MAX_CHECKPOINT_PATH_BYTES
from rollnet.sdk.errors import ErrorReason
from rollnet.sdk.methods import default_method_policy
from rollnet.sdk.testing import connect
from rollnet.v1 import (
    blob_service_pb2,
    checkpoint_service_pb2,
    common_pb2,
    ledger_service_pb2,
    node_pb2,
    node_service_pb2,
    task_service_pb2,
    validation_pb2,
    validation_service_pb2,
)

DOCS = Path(__file__).resolve().parents[2] / "docs" / "protocol.md"
_TYPE_MAX = {
    FieldDescriptor.TYPE_UINT32: 2**32 - 1,
    FieldDescriptor.TYPE_UINT64: 2**64 - 1,
    FieldDescriptor.TYPE_INT64: 2**63 - 1,
}


# ----------------------------------------------------------------------- hostile requests
@dataclass(frozen=True)
class Hostile:
    """A request with one bad value, and the field path the refusal must name."""

    method: str
    kind: str
    field: str
    request: bytes


Mutation = Callable[[Message], None]


def _leaf_values(descriptor: FieldDescriptor, rule: Rule) -> Iterator[tuple[str, object]]:
    """(kind, bad value) for one singular scalar field under ``rule``."""
    if isinstance(rule, Text):
        yield "nul", "a\x00b"
        yield "long", "a" * (rule.max_len + 1)
    elif isinstance(rule, Whole) and rule.high < _TYPE_MAX.get(descriptor.type, rule.high):
        yield "range", rule.high + 1
    elif isinstance(rule, Real):
        yield "nan", math.nan
        yield "inf", -math.inf
        if rule.high is not None:
            yield "range", rule.high + 1
    elif isinstance(rule, CheckpointPath):
        yield "nul", "a\x00b"
        yield "long", "a" * (MAX_CHECKPOINT_PATH_BYTES + 1)
    elif isinstance(rule, Choice):
        yield "enum", 99
    elif isinstance(rule, Raw) and rule.sizes:
        yield "size", b"\x01" * (max(rule.sizes) + 1)


def _variants(
    bounds_: RequestBounds, check: MessageCheck, depth: int
) -> Iterator[tuple[str, str, Mutation]]:
    """(kind, path, mutation) for each bad value of each field of ``check``'s message type."""
    fields = check.descriptor.fields_by_name
    for name, rule in check.fields:
        descriptor = fields[name]
        yield from _field_variants(bounds_, name, descriptor, rule, depth)


def _field_variants(
    bounds_: RequestBounds, name: str, descriptor: FieldDescriptor, rule: Rule, depth: int
) -> Iterator[tuple[str, str, Mutation]]:
    if isinstance(rule, Each):
        yield "count", name, _fill(name, descriptor, rule.max_items + 1)
        item = rule.item
        if isinstance(item, Nested) and depth < 3:
            for kind, path, mutate in _variants(bounds_, bounds_.messages[item.name], depth + 1):
                yield kind, f"{name}[0].{path}", _in_list(name, mutate)
        elif not isinstance(item, Nested):
            for kind, value in _leaf_values(descriptor, item):
                yield kind, f"{name}[0]", _append(name, value)
    elif isinstance(rule, Pairs):
        yield "count", name, _fill(name, descriptor, rule.max_items + 1)
        yield "nul", f'{name}["a\\u0000b"]', _put(name, "a\x00b", None)
        entry_type = descriptor.message_type
        assert entry_type is not None, name
        value_field = entry_type.fields_by_name["value"]
        if isinstance(rule.value, Nested):
            if depth < 3:
                nested = bounds_.messages[rule.value.name]
                for kind, path, mutate in _variants(bounds_, nested, depth + 1):
                    yield kind, f'{name}["k"].{path}', _in_map(name, mutate)
        else:
            for kind, value in _leaf_values(value_field, rule.value):
                yield kind, f'{name}["k"]', _put(name, "k", value)
    elif isinstance(rule, Span):
        yield "range", name, _duration(name, 2**62)
        yield "negative", name, _duration(name, -1)
    elif isinstance(rule, Nested):
        if depth < 3:
            for kind, path, mutate in _variants(bounds_, bounds_.messages[rule.name], depth + 1):
                yield kind, f"{name}.{path}", _in_child(name, mutate)
    elif isinstance(rule, Embedded):
        inner = bounds_.messages[rule.name]
        for kind, path, mutate in _variants(bounds_, inner, depth + 1):
            yield kind, f"{name}.{path}", _embedded(name, inner, mutate)
    else:
        for kind, value in _leaf_values(descriptor, rule):
            yield kind, name, _assign(name, value)


def _assign(name: str, value: object) -> Mutation:
    return lambda message: setattr(message, name, value)


def _append(name: str, value: object) -> Mutation:
    return lambda message: getattr(message, name).append(value)


def _put(name: str, key: str, value: object) -> Mutation:
    """Set ``key`` to ``value`` in a map; ``None``: a fine value (0, or an empty message)."""

    def mutate(message: Message) -> None:
        entries = getattr(message, name)
        entry_type = message.DESCRIPTOR.fields_by_name[name].message_type
        assert entry_type is not None, name
        value_type = entry_type.fields_by_name["value"]
        if value is not None:
            entries[key] = value
        elif value_type.message_type is None:
            entries[key] = 0
        else:
            entries[key]

    return mutate


def _fill(name: str, descriptor: FieldDescriptor, count: int) -> Mutation:
    def mutate(message: Message) -> None:
        entries = getattr(message, name)
        entry_type = descriptor.message_type
        if entry_type is not None and entry_type.GetOptions().map_entry:
            for index in range(count):
                key = f"k{index}"
                if entry_type.fields_by_name["value"].message_type is None:
                    entries[key] = 0
                else:
                    entries[key]
        elif entry_type is not None:
            for _ in range(count):
                entries.add()
        elif descriptor.type == FieldDescriptor.TYPE_STRING:
            entries.extend(f"x{index}" for index in range(count))
        else:
            entries.extend([0] * count)

    return mutate


def _duration(name: str, seconds: int) -> Mutation:
    return lambda message: getattr(message, name).CopyFrom(duration_pb2.Duration(seconds=seconds))


def _in_child(name: str, mutate: Mutation) -> Mutation:
    return lambda message: mutate(getattr(message, name))


def _in_list(name: str, mutate: Mutation) -> Mutation:
    return lambda message: mutate(getattr(message, name).add())


def _in_map(name: str, mutate: Mutation) -> Mutation:
    return lambda message: mutate(getattr(message, name)["k"])


def _embedded(name: str, inner: MessageCheck, mutate: Mutation) -> Mutation:
    def build(message: Message) -> None:
        embedded = inner.message_class()
        mutate(embedded)
        setattr(message, name, embedded.SerializeToString())

    return build


def hostile_requests(config: CoordinatorConfig) -> list[Hostile]:
    """One hostile request per field and kind of bad value, for every protocol v1 method."""
    compiled = RequestBounds(config)
    found = []
    for method, descriptor in request_types().items():
        check = compiled.messages[descriptor.full_name]
        for kind, path, mutate in _variants(compiled, check, 0):
            request = check.message_class()
            mutate(request)
            found.append(Hostile(method, kind, path, request.SerializeToString()))
    return found


# --------------------------------------------------------------------------- calling raw
async def call_raw(client: RollnetClient, method: str, body: bytes) -> RollnetError | None:
    """Send ``body`` as ``method``'s request (signed), whatever its shape; the refusal, if any."""
    service, _, rpc = method.strip("/").partition("/")
    shape = descriptor_pool.Default().FindServiceByName(service).methods_by_name[rpc]
    channel = client.channel
    try:
        if shape.client_streaming:

            async def one() -> AsyncIterator[bytes]:
                yield body

            upload: grpc.aio.StreamUnaryMultiCallable[bytes, bytes]
            upload = channel.stream_unary(method, request_serializer=None)
            await upload(one(), timeout=10)
        elif shape.server_streaming:
            listen: grpc.aio.UnaryStreamMultiCallable[bytes, bytes]
            listen = channel.unary_stream(method, request_serializer=None)
            async for _ in listen(body, timeout=10):
                break
        else:
            call: grpc.aio.UnaryUnaryMultiCallable[bytes, bytes]
            call = channel.unary_unary(method, request_serializer=None)
            await call(body, timeout=10)
    except grpc.aio.AioRpcError as error:
        return from_rpc_error(error)
    return None


@pytest.fixture
async def lenient(coordinator_config: CoordinatorConfig) -> AsyncIterator[Coordinator]:
    """A coordinator whose per-key rate limit lets a few hundred refused calls through."""
    config = with_overrides(coordinator_config, rate_limit_per_key=1e6, rate_burst_per_key=10**6)
    running = await start_coordinator(config)
    try:
        yield running
    finally:
        await running.stop(grace=0.5)


async def _clients_by_role(
    coordinator: Coordinator, identities: dict[int, Identity]
) -> dict[int, RollnetClient]:
    clients = {}
    for role, identity in identities.items():
        clients[role] = connect(coordinator.address, identity)
        await register(clients[role], identity, role)
    return clients


async def test_every_field_of_every_request_is_bounded_at_the_edge(
    lenient: Coordinator,
    trainer_identity: Identity,
    validator_identity: Identity,
    operator_identity: Identity,
) -> None:
    """For every RPC: a NUL or an over-long value in each string field, a number out of range,
    NaN and infinity, an unknown enum value, a Duration of 2^62 s or negative, a byte string of
    the wrong size, one item or entry too many in each list and map — INVALID_ARGUMENT naming
    the field, never UNKNOWN, never accepted."""
    clients = await _clients_by_role(
        lenient,
        {
            common_pb2.ROLE_WORKER: Identity.generate(),
            common_pb2.ROLE_VALIDATOR: validator_identity,
            common_pb2.ROLE_TRAINER: trainer_identity,
            common_pb2.ROLE_OPERATOR: operator_identity,
        },
    )
    policy = default_method_policy()
    cases = hostile_requests(lenient.ctx.config)
    assert {case.method for case in cases} == set(request_types()) - {
        # No fields: nothing to get wrong.
        "/rollnet.v1.CheckpointService/GetLatestCheckpoint",
        "/rollnet.v1.LedgerService/GetChainHead",
    }
    assert {case.kind for case in cases} >= {"nul", "long", "range", "enum", "count", "negative"}
    wrong = []
    try:
        for case in cases:
            role = min(policy[case.method])
            refused = await call_raw(clients[role], case.method, case.request)
            fields = [] if refused is None else [v.field for v in refused.field_violations]
            if (
                refused is None
                or (refused.code, refused.reason)
                != (grpc.StatusCode.INVALID_ARGUMENT, ErrorReason.INVALID_FIELDS)
                or case.field not in fields
            ):
                answer = "accepted" if refused is None else f"{refused.code.name} {refused}"
                wrong.append(f"{case.method} {case.kind} {case.field}: {answer} {fields}")
    finally:
        for client in clients.values():
            await client.close()
    assert not wrong, f"{len(wrong)} of {len(cases)} hostile requests got through:\n" + "\n".join(
        wrong[:40]
    )


async def test_the_reported_examples_are_refused_naming_their_field(
    lenient: Coordinator, operator_identity: Identity, validator_identity: Identity
) -> None:
    """The outside review's own examples, each answered UNKNOWN or accepted before."""
    worker = Identity.generate()
    client = connect(lenient.address, worker)
    operator = connect(lenient.address, operator_identity)
    validator = connect(lenient.address, validator_identity)
    huge = duration_pb2.Duration(seconds=2**62)
    try:
        await register(client, worker, common_pb2.ROLE_WORKER)
        await register(operator, operator_identity, common_pb2.ROLE_OPERATOR)
        await register(validator, validator_identity, common_pb2.ROLE_VALIDATOR)
        examples = [
            (
                operator.nodes.list_nodes(node_service_pb2.ListNodesRequest(state=99)),  # type: ignore[arg-type]
                "state",
            ),
            (
                operator.nodes.eject_node(node_service_pb2.EjectNodeRequest(node_id="\x00")),
                "node_id",
            ),
            (client.nodes.get_node(node_service_pb2.GetNodeRequest(node_id="\x00")), "node_id"),
            (
                client.nodes.heartbeat(node_service_pb2.HeartbeatRequest(held_lease_ids=["\x00"])),
                "held_lease_ids[0]",
            ),
            (
                client.tasks.fail_task(task_service_pb2.FailTaskRequest(lease_id="a\x00")),
                "lease_id",
            ),
            (
                client.ledger.get_balance(ledger_service_pb2.GetBalanceRequest(node_id="\x00")),
                "node_id",
            ),
            (
                client.ledger.list_entries(
                    ledger_service_pb2.ListEntriesRequest(after_sequence=2**64 - 1)
                ),
                "after_sequence",
            ),
            (
                client.checkpoints.get_checkpoint(
                    checkpoint_service_pb2.GetCheckpointRequest(step=2**63)
                ),
                "step",
            ),
            (
                client.nodes.heartbeat(node_service_pb2.HeartbeatRequest(requested_interval=huge)),
                "requested_interval",
            ),
            (
                client.nodes.heartbeat(
                    node_service_pb2.HeartbeatRequest(
                        requested_interval=duration_pb2.Duration(seconds=-(2**62))
                    )
                ),
                "requested_interval",
            ),
            (client.tasks.pull_task(task_service_pb2.PullTaskRequest(wait=huge)), "wait"),
            (
                validator.validation.pull_validation_job(
                    validation_service_pb2.PullValidationJobRequest(wait=huge)
                ),
                "wait",
            ),
            (
                client.nodes.heartbeat(node_service_pb2.HeartbeatRequest(activity=99)),  # type: ignore[arg-type]
                "activity",
            ),
            (
                client.nodes.heartbeat(
                    node_service_pb2.HeartbeatRequest(
                        metrics={f"gauge_{i}": float(i) for i in range(100_000)}
                    )
                ),
                "metrics",
            ),
            (
                client.nodes.heartbeat(
                    node_service_pb2.HeartbeatRequest(
                        held_lease_ids=[f"{i:032x}" for i in range(1024)]
                    )
                ),
                "held_lease_ids",
            ),
        ]
        for call, field in examples:
            with pytest.raises(RollnetError) as refused:
                await call
            assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT, (field, refused.value)
            assert refused.value.reason == ErrorReason.INVALID_FIELDS
            assert [v.field for v in refused.value.field_violations] == [field]
    finally:
        for each in (client, operator, validator):
            await each.close()


async def test_a_refusal_lists_every_violation_up_to_a_bound(lenient: Coordinator) -> None:
    """Several bad fields are named together; a request bad in thousands of places is refused
    with the first few (the details travel in trailers, which gRPC caps at 8 KiB)."""
    worker = Identity.generate()
    client = connect(lenient.address, worker)
    try:
        with pytest.raises(RollnetError) as refused:
            await client.nodes.register_node(
                node_service_pb2.RegisterNodeRequest(
                    public_key=b"short",
                    software_version="v\x00",
                    pool="no spaces please",
                    capabilities=node_pb2.Capabilities(backends=["torch", "a:b"]),
                )
            )
        assert {v.field for v in refused.value.field_violations} == {
            "public_key",
            "software_version",
            "pool",
            "capabilities.backends[1]",
            "role",
            "protocol_version",
        }
        accelerators = [node_pb2.Accelerator(name="\x00" * 1000) for _ in range(16)]
        with pytest.raises(RollnetError) as refused:
            await register(
                client,
                worker,
                common_pb2.ROLE_WORKER,
                hardware=node_pb2.HardwareReport(accelerators=accelerators),
                capabilities=node_pb2.Capabilities(dtypes=["\x00"] * 64),
            )
        violations = refused.value.field_violations
        assert refused.value.reason == ErrorReason.INVALID_FIELDS
        assert len(violations) == bounds.MAX_REPORTED
        assert all(re.fullmatch(r"[a-z_.]+\[\d+\](\.name)?", v.field) for v in violations)
        assert "more" in refused.value.message
    finally:
        await client.close()


# ------------------------------------------------------------------------ batch isolation
postgres_only = pytest.mark.parametrize(
    "db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)


@postgres_only
async def test_a_hostile_heartbeat_fails_alone_among_honest_ones(
    coordinator: Coordinator,
) -> None:
    """A registered worker's heartbeats naming a lease id with a NUL, sent with 40 honest
    heartbeats at once (the coordinator batches them): every honest one is answered, the
    hostile ones are refused. On PostgreSQL the NUL used to fail the whole batch."""
    honest = [Identity.generate() for _ in range(40)]
    hostile = Identity.generate()
    clients = {node.node_id: connect(coordinator.address, node) for node in [*honest, hostile]}
    try:
        for node in [*honest, hostile]:
            await register(clients[node.node_id], node, common_pb2.ROLE_WORKER)

        async def beat(node: Identity, lease_ids: list[str]) -> object:
            try:
                return await clients[node.node_id].nodes.heartbeat(
                    node_service_pb2.HeartbeatRequest(held_lease_ids=lease_ids)
                )
            except RollnetError as error:
                return error

        for _ in range(3):
            answers = await asyncio.gather(
                *(beat(hostile, ["lease\x00"]) for _ in range(3)),
                *(beat(node, ["0" * 32]) for node in honest),
            )
            refusals, answered = answers[:3], answers[3:]
            assert all(
                isinstance(r, RollnetError) and r.reason == ErrorReason.INVALID_FIELDS
                for r in refusals
            ), refusals
            assert all(
                isinstance(a, node_service_pb2.HeartbeatResponse)
                and a.state == node_pb2.Node.STATE_ACTIVE
                for a in answered
            ), [a for a in answered if not isinstance(a, node_service_pb2.HeartbeatResponse)]
    finally:
        for client in clients.values():
            await client.close()


@postgres_only
async def test_the_heartbeat_batcher_isolates_a_heartbeat_the_database_refuses(
    coordinator: Coordinator,
) -> None:
    """Behind the edge as well: a heartbeat the database cannot store, in a batch with honest
    ones, fails alone; the batch is committed in halves down to it."""
    honest = [Identity.generate() for _ in range(16)]
    clients = [connect(coordinator.address, node) for node in honest]
    try:
        for client, node in zip(clients, honest, strict=True):
            await register(client, node, common_pb2.ROLE_WORKER)
        batcher = coordinator.registry.heartbeats
        interval = timedelta(seconds=10)
        results = await asyncio.gather(
            *(batcher.submit(node.node_id, ("0" * 32,), interval) for node in honest[:8]),
            batcher.submit(honest[8].node_id, ("bad\x00",), interval),
            *(batcher.submit(node.node_id, (), interval) for node in honest[9:]),
            return_exceptions=True,
        )
    finally:
        for client in clients:
            await client.close()
    failed = [i for i, result in enumerate(results) if isinstance(result, BaseException)]
    assert failed == [8], results
    assert all(result.known for result in results if not isinstance(result, BaseException))


# --------------------------------------------------------------------------- size cap
@pytest.fixture
async def small_cap(coordinator_config: CoordinatorConfig) -> AsyncIterator[Coordinator]:
    running = await start_coordinator(with_overrides(coordinator_config, max_message_bytes=65_536))
    try:
        yield running
    finally:
        await running.stop(grace=0.5)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
async def test_a_message_over_the_cap_is_refused_with_message_too_large(
    small_cap: Coordinator,
) -> None:
    """RESOURCE_EXHAUSTED with ErrorInfo MESSAGE_TOO_LARGE (naming the cap), for a unary call
    and for one chunk of an upload stream; up to twice the cap. Beyond that gRPC itself cuts
    the message off, without details, as docs/protocol.md says."""
    cap = 65_536
    worker = Identity.generate()
    client = connect(small_cap.address, worker)
    try:
        await register(client, worker, common_pb2.ROLE_WORKER)
        method = "/rollnet.v1.NodeService/DeregisterNode"

        def body(size: int) -> bytes:
            # A reason field padded so the whole message is ``size`` bytes (tag + 3-byte length).
            return node_service_pb2.DeregisterNodeRequest(
                reason="x" * (size - 4)
            ).SerializeToString()

        assert len(body(cap + 1)) == cap + 1
        refused = await call_raw(client, method, body(cap + 1))
        assert refused is not None
        assert (refused.code, refused.reason) == (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            ErrorReason.MESSAGE_TOO_LARGE,
        )
        assert refused.metadata == {"max_message_bytes": str(cap), "message_bytes": str(cap + 1)}
        assert refused.retry_after is None  # a size cap does not pass with time
        # At the cap the message is read (and refused for what it says, not for its size).
        at_cap = await call_raw(client, method, body(cap))
        assert at_cap is not None
        assert at_cap.reason == ErrorReason.INVALID_FIELDS
        # Beyond twice the cap: gRPC's own refusal, before any handler runs.
        beyond = await call_raw(client, method, body(2 * cap + 16))
        assert beyond is not None
        assert beyond.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert beyond.reason == ""

        # An upload: the header is small, one chunk is over the cap.
        data = b"\x02" * (cap + 5000)  # its second chunk is over the cap
        digest = blake3.blake3(data).digest()
        refused = await raw_upload(
            client,
            [
                upload_header(digest, len(data)),
                upload_chunk(data[:1000]),
                upload_chunk(data[1000:]),
            ],
        )
        assert (refused.code, refused.reason) == (
            grpc.StatusCode.RESOURCE_EXHAUSTED,
            ErrorReason.MESSAGE_TOO_LARGE,
        )
        assert refused.metadata["max_message_bytes"] == str(cap)
        # The same bytes in chunks under the cap are stored.
        stored = await client.blobs.upload(
            data, blob_service_pb2.BLOB_KIND_ROLLOUT_BATCH, chunk_size=cap // 2
        )
        assert stored.blob.size == len(data)
    finally:
        await client.close()


# ------------------------------------------------------------------------- the table itself
def test_every_field_has_a_rule_of_its_own() -> None:
    """A field added to a request (or to a message it carries) must get a considered rule in
    bounds.field_rules; until then it is bounded by its type alone, and this test says so."""
    compiled = RequestBounds(CoordinatorConfig(data_dir=Path()))
    defaulted = {
        f"{name}.{field}": check.defaulted
        for name, check in compiled.messages.items()
        for field in check.defaulted
    }
    assert not defaulted, f"fields without a rule in bounds.field_rules: {sorted(defaulted)}"


def test_the_protocol_document_lists_the_table() -> None:
    """docs/protocol.md's "Bounds on every field" table is bounds.markdown_table() verbatim
    (regenerate: python -m rollnet.reference.coordinator.bounds)."""
    text = DOCS.read_text()
    section = text.split("## Bounds on every field", 1)[1].split("\n## ", 1)[0]
    start = section.index("| Message | Field | Rule |")
    table = section[start:].split("\n\n", 1)[0].rstrip("\n") + "\n"
    assert table == markdown_table()


def test_descriptor_walk_reaches_the_embedded_manifest() -> None:
    compiled = RequestBounds(CoordinatorConfig(data_dir=Path()))
    reached = set(compiled.messages)
    assert {"rollnet.v1.CheckpointManifest", "rollnet.v1.CheckpointFile"} <= reached
    assert {"google.protobuf.Struct", "google.protobuf.Value", "google.protobuf.ListValue"} <= (
        reached
    )


def test_long_lists_of_log_probabilities_are_checked_value_by_value() -> None:
    """A verdict's validated log-probabilities run to thousands of values, checked in one pass
    each (the fast path of a long list): one value that is not finite or is above 0, anywhere,
    is found and named; 0 itself is a log-probability."""
    check = RequestBounds(CoordinatorConfig(data_dir=Path())).checker(
        "/rollnet.v1.ValidationService/SubmitVerdict"
    )
    assert check is not None

    def verdict(second: list[float]) -> validation_service_pb2.SubmitVerdictRequest:
        return validation_service_pb2.SubmitVerdictRequest(
            job_id="job",
            lease_id="lease",
            decision=validation_pb2.Verdict.DECISION_ACCEPT,
            validated_logprobs=[
                validation_pb2.ValidatedLogprobs(logprobs=[-0.5] * 1000),
                validation_pb2.ValidatedLogprobs(logprobs=second),
            ],
        )

    assert check(verdict([-0.5] * 999 + [0.0])) == []
    for index, bad in [(0, 0.25), (517, math.nan), (999, -math.inf), (300, 1e-30)]:
        values = [-0.5] * 1000
        values[index] = bad
        violations = check(verdict(values))
        assert [v.field for v in violations] == [f"validated_logprobs[1].logprobs[{index}]"]
        assert "is not finite, at most 0" in violations[0].description
