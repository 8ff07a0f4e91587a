"""Wire conversion: the coordinator's rows and domain values to protobuf messages and back.

Pure functions, no session and no I/O: what a conversion needs from the database is read by
its caller and passed in. Each ``*_to_proto`` that has a way back has its ``*_from_*`` (or
``*_to_db``) here too, and ``tests/coordinator/test_serde.py`` checks the round trips.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

from google.protobuf import duration_pb2, struct_pb2, timestamp_pb2

from rollnet.ledger.chain import AppendedEntry
from rollnet.ledger.enums import EntryKind, NodeRole, NodeState, TaskState
from rollnet.ledger.models import Checkpoint, Commitment, Node, Task, Verdict
from rollnet.ledger.tasks import LeasedTask
from rollnet.sdk.dtypes import FLOAT32, compute_dtype_value
from rollnet.v1 import (
    checkpoint_pb2,
    commitment_pb2,
    common_pb2,
    ledger_pb2,
    node_pb2,
    task_pb2,
    validation_pb2,
)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def timestamp(moment: datetime) -> timestamp_pb2.Timestamp:
    """A protobuf Timestamp of a timezone-aware datetime (exact, in integer arithmetic).

    Every reply carries several; protobuf's ``FromDatetime`` costs about ten times as much.
    """
    delta = moment - _EPOCH
    return timestamp_pb2.Timestamp(
        seconds=delta.days * 86_400 + delta.seconds, nanos=delta.microseconds * 1_000
    )


def duration(delta: timedelta) -> duration_pb2.Duration:
    """A protobuf Duration of a timedelta (exact, in integer arithmetic, like :func:`timestamp`)."""
    micros = (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds
    # Protobuf's sign rule: seconds and nanos never have opposite signs.
    seconds, rest = divmod(abs(micros), 1_000_000)
    sign = -1 if micros < 0 else 1
    return duration_pb2.Duration(seconds=sign * seconds, nanos=sign * rest * 1_000)


# ---------------------------------------------------------------- nodes
ROLE_TO_DB = {
    common_pb2.ROLE_WORKER: NodeRole.WORKER,
    common_pb2.ROLE_VALIDATOR: NodeRole.VALIDATOR,
    common_pb2.ROLE_TRAINER: NodeRole.TRAINER,
    common_pb2.ROLE_OPERATOR: NodeRole.OPERATOR,
    common_pb2.ROLE_RELAY: NodeRole.RELAY,
}
ROLE_FROM_DB = {db: wire for wire, db in ROLE_TO_DB.items()}
STATE_FROM_DB = {
    NodeState.PENDING: node_pb2.Node.STATE_PENDING,
    NodeState.ACTIVE: node_pb2.Node.STATE_ACTIVE,
    NodeState.SUSPECT: node_pb2.Node.STATE_SUSPECT,
    NodeState.OFFLINE: node_pb2.Node.STATE_OFFLINE,
    NodeState.EJECTED: node_pb2.Node.STATE_EJECTED,
    NodeState.BANNED: node_pb2.Node.STATE_BANNED,
    NodeState.DEREGISTERED: node_pb2.Node.STATE_DEREGISTERED,
}
STATE_TO_DB = {wire: db for db, wire in STATE_FROM_DB.items()}


def capabilities_to_db(caps: node_pb2.Capabilities) -> list[str]:
    """Flatten capabilities into the node row's list of ``kind:value`` strings."""
    items = [f"backend:{b}" for b in caps.backends]
    items += [f"env:{e}" for e in caps.environments]
    items += [f"dtype:{d}" for d in caps.dtypes]
    if caps.max_concurrent_leases:
        items.append(f"max_leases:{caps.max_concurrent_leases}")
    return items


def capabilities_from_db(items: list[str]) -> node_pb2.Capabilities:
    """Rebuild capabilities from the node row."""
    caps = node_pb2.Capabilities()
    for item in items:
        kind, _, value = item.partition(":")
        if kind == "backend":
            caps.backends.append(value)
        elif kind == "env":
            caps.environments.append(value)
        elif kind == "dtype":
            caps.dtypes.append(value)
        elif kind == "max_leases":
            caps.max_concurrent_leases = int(value)
    return caps


def hardware_to_db(hardware: node_pb2.HardwareReport) -> dict[str, Any]:
    """The node row's JSON form of a hardware report."""
    return {
        "cpu_cores": hardware.cpu_cores,
        "memory_bytes": hardware.memory_bytes,
        "accelerators": [
            {"name": a.name, "memory_bytes": a.memory_bytes, "count": a.count}
            for a in hardware.accelerators
        ],
    }


def hardware_from_db(hardware: Mapping[str, Any]) -> node_pb2.HardwareReport:
    """Rebuild a hardware report from the node row's JSON form."""
    report = node_pb2.HardwareReport(
        cpu_cores=int(hardware.get("cpu_cores", 0)),
        memory_bytes=int(hardware.get("memory_bytes", 0)),
    )
    for acc in hardware.get("accelerators", []):
        report.accelerators.add(
            name=acc["name"], memory_bytes=acc["memory_bytes"], count=acc["count"]
        )
    return report


def node_to_proto(row: Node, reject_count: int = 0) -> node_pb2.Node:
    """The wire form of a node row."""
    major, _, minor = row.protocol_version.partition(".")
    return node_pb2.Node(
        node_id=row.id,
        public_key=row.public_key,
        role=ROLE_FROM_DB[row.role],
        state=STATE_FROM_DB[row.state],
        pool=row.pool or "",
        protocol_version=common_pb2.ProtocolVersion(major=int(major), minor=int(minor or 0)),
        software_version=row.software_version,
        capabilities=capabilities_from_db(list(row.capabilities)),
        hardware=hardware_from_db(row.hardware),
        trust_streak=row.accepted_streak,
        reject_count=reject_count,
        registered_at=timestamp(row.registered_at),
        last_heartbeat_at=timestamp(row.last_heartbeat_at),
        state_reason=row.state_reason or "",
    )


# ---------------------------------------------------------------- tasks and leases
def task_to_proto(row: Task | LeasedTask, *, state: Any, attempt: int) -> task_pb2.Task:
    """The wire form of a task."""
    spec = dict(row.sampling)
    config = struct_pb2.Struct()
    config.update(spec.get("environment_config", {}))
    task = task_pb2.Task(
        task_id=row.task_id if isinstance(row, LeasedTask) else row.id,
        environment=row.environment,
        environment_config=config,
        prompt_ids=[int(p) for p in row.prompt_ids],
        samples_per_prompt=int(spec["samples_per_prompt"]),
        sampling=common_pb2.SamplingParams(
            temperature=float(spec["temperature"]), max_new_tokens=int(spec["max_new_tokens"])
        ),
        checkpoint_step=row.checkpoint_step,
        rollout_step=int(spec["rollout_step"]),
        sampling_seed=row.seed,
        # Fixed when the task was created: a later change of the network's dtype leaves the
        # tasks already queued (and their validation) in the dtype they were made for.
        compute_dtype=compute_dtype_value(spec.get("compute_dtype", FLOAT32)),
        state=state,
        attempt=attempt,
    )
    if isinstance(row, Task):
        task.created_at.CopyFrom(timestamp(row.created_at))
    return task


def lease_to_proto(
    lease_id: str, fencing_token: int, deadline: datetime, issued_at: datetime
) -> task_pb2.Lease:
    """The wire form of a lease on a task or validation job, issued at ``issued_at``."""
    return task_pb2.Lease(
        lease_id=lease_id,
        fencing_token=fencing_token,
        deadline=timestamp(deadline),
        issued_at=timestamp(issued_at),
    )


# ---------------------------------------------------------------- commitments and verdicts
COMMITMENT_STATE = {
    TaskState.SUBMITTED: commitment_pb2.Commitment.STATE_PENDING,
    TaskState.VALIDATING: commitment_pb2.Commitment.STATE_VALIDATING,
    TaskState.ACCEPTED: commitment_pb2.Commitment.STATE_ACCEPTED,
    TaskState.REJECTED: commitment_pb2.Commitment.STATE_REJECTED,
    # A task FAILED after a commitment was made: its validation was given up.
    TaskState.FAILED: commitment_pb2.Commitment.STATE_UNVERIFIABLE,
}


def commitment_to_proto(
    row: Commitment,
    *,
    task_state: TaskState,
    checkpoint_step: int,
    verdict: Verdict | None,
    blob_size: int,
) -> commitment_pb2.Commitment:
    """The wire form of a stored commitment, its state derived from its task's state and its
    verdict. ``checkpoint_step`` (the task's) and ``blob_size`` (of its batch, 0 if unknown)
    serve only a row stored before migration 0003 kept the record."""
    if verdict is not None:
        state = (
            commitment_pb2.Commitment.STATE_ACCEPTED
            if verdict.accepted
            else commitment_pb2.Commitment.STATE_REJECTED
        )
    else:
        state = COMMITMENT_STATE.get(task_state, commitment_pb2.Commitment.STATE_PENDING)
    if row.record is not None:
        commitment = commitment_pb2.Commitment.FromString(row.record)
        claimed = commitment.claimed_work
        if claimed.prefill_tokens + claimed.decode_tokens != row.claimed_work:
            # Recorded as the node sent it (before the coordinator stored its own count): a
            # figure nobody checked is not shown.
            commitment.ClearField("claimed_work")
    else:  # stored before migration 0003: only what the row's columns hold
        commitment = commitment_pb2.Commitment(
            commitment_id=row.id,
            task_id=row.task_id,
            lease_id=row.lease_id,
            fencing_token=row.fencing_token,
            node_id=row.node_id,
            rollout_batch=common_pb2.BlobRef(
                blake3=bytes.fromhex(row.rollout_blob_hash), size=blob_size
            ),
            checkpoint_step=checkpoint_step,
            claimed_work=commitment_pb2.WorkClaim(decode_tokens=row.claimed_work),
            received_at=timestamp(row.received_at),
        )
    commitment.state = state
    commitment.validated = verdict is not None
    return commitment


def receipt_to_proto(
    commitment_id: str,
    binding_digest: bytes,
    received_at: datetime,
    coordinator_public_key: bytes,
    signature: bytes,
) -> commitment_pb2.Receipt:
    """The wire form of the coordinator's signed receipt for a commitment."""
    return commitment_pb2.Receipt(
        commitment_id=commitment_id,
        binding_digest=binding_digest,
        received_at=timestamp(received_at),
        coordinator_public_key=coordinator_public_key,
        signature=signature,
    )


def check_to_json(check: validation_pb2.CheckResult) -> dict[str, Any]:
    """The verdict row's JSON form of a validator's check result."""
    item: dict[str, Any] = {
        "check": check.check,
        "passed": check.passed,
        "reason": check.reason,
        "figures": dict(check.figures),
    }
    if check.HasField("rollout_index"):
        item["rollout_index"] = check.rollout_index
    return item


def check_from_json(item: Mapping[str, Any]) -> validation_pb2.CheckResult:
    """Rebuild a check result from the verdict row's JSON form."""
    check = validation_pb2.CheckResult(
        check=item["check"],
        passed=item["passed"],
        reason=item["reason"],
        figures=item["figures"],
    )
    if "rollout_index" in item:
        check.rollout_index = item["rollout_index"]
    return check


# ---------------------------------------------------------------- checkpoints and the ledger
def checkpoint_to_proto(row: Checkpoint) -> checkpoint_pb2.Checkpoint:
    """The wire form of a stored checkpoint."""
    return checkpoint_pb2.Checkpoint(
        manifest=row.manifest,
        signature=row.signature,
        trainer_public_key=row.signer_public_key,
        step=row.step,
        published_at=timestamp(row.published_at),
    )


KIND_TO_PROTO = {
    EntryKind.CREDIT: ledger_pb2.LedgerEntry.KIND_CREDIT,
    EntryKind.SLASH: ledger_pb2.LedgerEntry.KIND_SLASH,
    EntryKind.VALIDATOR_REWARD: ledger_pb2.LedgerEntry.KIND_VALIDATOR_REWARD,
    EntryKind.ADJUSTMENT: ledger_pb2.LedgerEntry.KIND_ADJUSTMENT,
}


def entry_to_proto(row: AppendedEntry) -> ledger_pb2.LedgerEntry:
    """The wire form of a ledger entry."""
    return ledger_pb2.LedgerEntry(
        sequence=row.sequence,
        recorded_at=timestamp(row.recorded_at),
        node_id=row.node_id,
        kind=KIND_TO_PROTO[row.kind],
        amount=row.amount,
        commitment_id=row.commitment_id or "",
        verdict_id=row.verdict_id or "",
        memo=row.memo,
        prev_hash=row.prev_hash,
        entry_hash=row.entry_hash,
    )
