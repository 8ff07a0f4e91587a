"""Wire conversion round trips: what goes to the wire comes back the same."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from rollnet.ledger.chain import AppendedEntry
from rollnet.ledger.enums import EntryKind, NodeRole, NodeState, TaskState
from rollnet.ledger.models import Checkpoint, Commitment, Node, Task, Verdict
from rollnet.ledger.tasks import LeasedTask
from rollnet.reference.coordinator import serde
from rollnet.v1 import (
    commitment_pb2,
    common_pb2,
    ledger_pb2,
    node_pb2,
    task_pb2,
    validation_pb2,
)

MOMENT = datetime(2026, 3, 4, 5, 6, 7, 891_011, tzinfo=UTC)
SAMPLING = {
    "samples_per_prompt": 2,
    "temperature": 0.7,
    "max_new_tokens": 64,
    "rollout_step": 3,
    "environment_config": {"difficulty": "hard", "levels": [1.0, 2.0]},
    "compute_dtype": "bfloat16",
}


@pytest.mark.parametrize(
    "moment",
    [MOMENT, datetime(1970, 1, 1, tzinfo=UTC), datetime(1969, 12, 31, 23, 59, 59, 5, UTC)],
)
def test_timestamp_round_trip(moment: datetime) -> None:
    assert serde.timestamp(moment).ToDatetime(tzinfo=UTC) == moment


@pytest.mark.parametrize(
    "delta",
    [timedelta(0), timedelta(seconds=30), timedelta(microseconds=-1), timedelta(days=-2, hours=3)],
)
def test_duration_round_trip(delta: timedelta) -> None:
    wire = serde.duration(delta)
    assert wire.ToTimedelta() == delta
    assert wire.seconds * wire.nanos >= 0  # never opposite signs


def test_every_role_and_node_state_has_one_wire_value() -> None:
    assert set(serde.ROLE_FROM_DB) == set(NodeRole)
    assert set(serde.STATE_FROM_DB) == set(NodeState)
    for role in NodeRole:
        assert serde.ROLE_TO_DB[serde.ROLE_FROM_DB[role]] is role
    for state in NodeState:
        assert serde.STATE_TO_DB[serde.STATE_FROM_DB[state]] is state
    assert len(set(serde.STATE_FROM_DB.values())) == len(NodeState)


@pytest.mark.parametrize(
    "caps",
    [
        node_pb2.Capabilities(),
        node_pb2.Capabilities(
            backends=["vllm", "hf"],
            environments=["gsm8k", "code:py"],
            dtypes=["bfloat16"],
            max_concurrent_leases=4,
        ),
    ],
)
def test_capabilities_round_trip(caps: node_pb2.Capabilities) -> None:
    assert serde.capabilities_from_db(serde.capabilities_to_db(caps)) == caps


def test_hardware_round_trip_through_json() -> None:
    report = node_pb2.HardwareReport(cpu_cores=32, memory_bytes=2**37)
    report.accelerators.add(name="H100", memory_bytes=80 * 2**30, count=8)
    stored = json.loads(json.dumps(serde.hardware_to_db(report)))
    assert serde.hardware_from_db(stored) == report
    assert serde.hardware_from_db({}) == node_pb2.HardwareReport()


def _node() -> Node:
    return Node(
        id="n" * 40,
        public_key=b"k" * 32,
        role=NodeRole.WORKER,
        state=NodeState.EJECTED,
        trust=0.0,
        accepted_streak=7,
        protocol_version="1.2",
        software_version="rollnet 0.9",
        capabilities=["backend:vllm", "env:gsm8k", "max_leases:2"],
        hardware={"cpu_cores": 8, "memory_bytes": 2**34, "accelerators": []},
        pool="public",
        registered_at=MOMENT,
        last_heartbeat_at=MOMENT + timedelta(seconds=5),
        state_reason="3 rejected commitments",
    )


def test_node_to_proto_carries_the_row() -> None:
    row = _node()
    node = serde.node_to_proto(row, reject_count=3)
    assert serde.ROLE_TO_DB[node.role] is row.role
    assert serde.STATE_TO_DB[node.state] is row.state
    assert serde.capabilities_to_db(node.capabilities) == row.capabilities
    assert serde.hardware_to_db(node.hardware) == row.hardware
    assert f"{node.protocol_version.major}.{node.protocol_version.minor}" == "1.2"
    assert (node.node_id, node.public_key, node.pool) == (row.id, row.public_key, row.pool)
    assert (node.trust_streak, node.reject_count, node.state_reason) == (7, 3, row.state_reason)
    assert node.last_heartbeat_at.ToDatetime(tzinfo=UTC) == row.last_heartbeat_at
    # Rows written before these columns existed hold NULL, which the model does not admit.
    row.pool, row.state_reason, row.protocol_version = None, None, "2"  # type: ignore[assignment]
    bare = serde.node_to_proto(row)
    assert (bare.pool, bare.state_reason, bare.reject_count) == ("", "", 0)
    assert (bare.protocol_version.major, bare.protocol_version.minor) == (2, 0)


def test_task_to_proto_of_a_row_and_of_a_lease() -> None:
    terms: dict[str, Any] = {
        "environment": "gsm8k",
        "checkpoint_step": 5,
        "prompt_ids": ["3", "9"],
        "seed": 42,
    }
    row = Task(id="t1", sampling=SAMPLING, created_at=MOMENT, **terms)
    task = serde.task_to_proto(row, state=task_pb2.Task.STATE_QUEUED, attempt=0)
    assert (task.task_id, task.environment, list(task.prompt_ids)) == ("t1", "gsm8k", [3, 9])
    assert (task.samples_per_prompt, task.rollout_step, task.sampling_seed) == (2, 3, 42)
    assert task.sampling.temperature == pytest.approx(0.7)
    assert task.sampling.max_new_tokens == 64
    assert dict(task.environment_config) == SAMPLING["environment_config"]
    assert task.compute_dtype == common_pb2.COMPUTE_DTYPE_BFLOAT16
    assert task.created_at.ToDatetime(tzinfo=UTC) == MOMENT
    leased = LeasedTask(
        task_id="t1",
        **terms,
        sampling={k: v for k, v in SAMPLING.items() if k != "compute_dtype"},
        lease_id="l1",
        fencing_token=2,
        lease_deadline=MOMENT,
    )
    wire = serde.task_to_proto(leased, state=task_pb2.Task.STATE_LEASED, attempt=2)
    assert wire.task_id == "t1"
    assert wire.attempt == 2
    assert wire.compute_dtype == common_pb2.COMPUTE_DTYPE_FLOAT32  # made before dtypes
    assert not wire.HasField("created_at")


def test_lease_to_proto() -> None:
    lease = serde.lease_to_proto("l1", 3, MOMENT + timedelta(minutes=5), MOMENT)
    assert (lease.lease_id, lease.fencing_token) == ("l1", 3)
    assert lease.deadline.ToDatetime(tzinfo=UTC) - lease.issued_at.ToDatetime(tzinfo=UTC) == (
        timedelta(minutes=5)
    )


def _record(claimed: tuple[int, int]) -> commitment_pb2.Commitment:
    return commitment_pb2.Commitment(
        commitment_id="c1",
        task_id="t1",
        lease_id="l1",
        fencing_token=1,
        node_id="n1",
        rollout_batch=common_pb2.BlobRef(blake3=b"\x01" * 32, size=100),
        checkpoint_step=5,
        claimed_work=commitment_pb2.WorkClaim(prefill_tokens=claimed[0], decode_tokens=claimed[1]),
        binding_digest=b"\x02" * 32,
        received_at=serde.timestamp(MOMENT),
    )


def _commitment(record: commitment_pb2.Commitment | None, claimed_work: int) -> Commitment:
    return Commitment(
        id="c1",
        task_id="t1",
        node_id="n1",
        lease_id="l1",
        fencing_token=1,
        rollout_blob_hash=(b"\x01" * 32).hex(),
        claimed_work=claimed_work,
        received_at=MOMENT,
        record=None if record is None else record.SerializeToString(deterministic=True),
    )


def _wire(
    row: Commitment, task_state: TaskState, verdict: Verdict | None = None, blob_size: int = 0
) -> commitment_pb2.Commitment:
    return serde.commitment_to_proto(
        row, task_state=task_state, checkpoint_step=5, verdict=verdict, blob_size=blob_size
    )


def test_a_recorded_commitment_comes_back_as_recorded() -> None:
    recorded = _record((6, 10))
    wire = _wire(_commitment(recorded, 16), TaskState.SUBMITTED)
    assert wire.state == commitment_pb2.Commitment.STATE_PENDING
    assert not wire.validated
    wire.ClearField("state")
    assert wire == recorded


def test_an_unchecked_claim_is_not_shown() -> None:
    wire = _wire(_commitment(_record((6, 10)), 17), TaskState.SUBMITTED)
    assert not wire.HasField("claimed_work")
    assert wire.commitment_id == "c1"


def test_a_commitment_stored_before_its_record_is_rebuilt_from_its_columns() -> None:
    wire = _wire(_commitment(None, 16), TaskState.ACCEPTED, blob_size=100)
    expected = _record((0, 16))
    expected.ClearField("binding_digest")
    expected.state = commitment_pb2.Commitment.STATE_ACCEPTED
    assert wire == expected


@pytest.mark.parametrize(
    ("task_state", "accepted", "state"),
    [
        (TaskState.SUBMITTED, None, commitment_pb2.Commitment.STATE_PENDING),
        (TaskState.VALIDATING, None, commitment_pb2.Commitment.STATE_VALIDATING),
        (TaskState.FAILED, None, commitment_pb2.Commitment.STATE_UNVERIFIABLE),
        (TaskState.LEASED, None, commitment_pb2.Commitment.STATE_PENDING),
        (TaskState.VALIDATING, True, commitment_pb2.Commitment.STATE_ACCEPTED),
        (TaskState.FAILED, False, commitment_pb2.Commitment.STATE_REJECTED),
    ],
)
def test_commitment_state_follows_the_verdict_then_the_task(
    task_state: TaskState, accepted: bool | None, state: int
) -> None:
    verdict = None if accepted is None else Verdict(accepted=accepted)
    wire = _wire(_commitment(_record((6, 10)), 16), task_state, verdict=verdict)
    assert wire.state == state
    assert wire.validated is (accepted is not None)


def test_receipt_to_proto() -> None:
    receipt = serde.receipt_to_proto("c1", b"\x02" * 32, MOMENT, b"k" * 32, b"s" * 64)
    assert receipt == commitment_pb2.Receipt(
        commitment_id="c1",
        binding_digest=b"\x02" * 32,
        received_at=serde.timestamp(MOMENT),
        coordinator_public_key=b"k" * 32,
        signature=b"s" * 64,
    )


@pytest.mark.parametrize(
    "check",
    [
        validation_pb2.CheckResult(check="toploc", passed=True, figures={"exp_mismatch": 2.0}),
        validation_pb2.CheckResult(
            check="reward", passed=False, reason="mismatch", rollout_index=0
        ),
    ],
)
def test_check_result_round_trip_through_json(check: validation_pb2.CheckResult) -> None:
    stored = json.loads(json.dumps(serde.check_to_json(check)))
    assert serde.check_from_json(stored) == check
    assert ("rollout_index" in stored) is check.HasField("rollout_index")


def test_checkpoint_to_proto() -> None:
    row = Checkpoint(
        step=4, manifest=b"m", signature=b"s" * 64, signer_public_key=b"k" * 32, published_at=MOMENT
    )
    wire = serde.checkpoint_to_proto(row)
    assert (wire.step, wire.manifest, wire.signature, wire.trainer_public_key) == (
        4,
        b"m",
        b"s" * 64,
        b"k" * 32,
    )
    assert wire.published_at.ToDatetime(tzinfo=UTC) == MOMENT


def test_every_entry_kind_has_one_wire_value() -> None:
    assert set(serde.KIND_TO_PROTO) == set(EntryKind)
    assert len(set(serde.KIND_TO_PROTO.values())) == len(EntryKind)


def test_entry_to_proto() -> None:
    entry = AppendedEntry(
        sequence=9,
        recorded_at=MOMENT,
        node_id="n1",
        kind=EntryKind.SLASH,
        amount=-40,
        commitment_id=None,
        verdict_id="v1",
        memo="bad proof",
        prev_hash=b"\x03" * 32,
        entry_hash=b"\x04" * 32,
    )
    wire = serde.entry_to_proto(entry)
    assert wire.kind == ledger_pb2.LedgerEntry.KIND_SLASH
    assert (wire.sequence, wire.amount, wire.commitment_id, wire.verdict_id) == (9, -40, "", "v1")
    assert (wire.memo, wire.prev_hash, wire.entry_hash) == ("bad proof", b"\x03" * 32, b"\x04" * 32)
    assert wire.recorded_at.ToDatetime(tzinfo=UTC) == MOMENT
