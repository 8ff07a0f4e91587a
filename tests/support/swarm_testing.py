"""Helpers shared by the tests that run a swarm: a trainer, its demand, and read-only probes of
the coordinator's database.

Importable from every test directory (``tests/support`` is on pytest's ``pythonpath``).
Clients, the network id and waiting are :mod:`rollnet.sdk.testing`'s.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, func, select

from rollnet.ledger.enums import EntryKind, NodeState, TaskState, ValidationJobState
from rollnet.ledger.models import Commitment, LedgerEntry, Node, Task, ValidationJob, Verdict
from rollnet.reference.checkpoint_publishing import publish_model_dir
from rollnet.sdk import Identity, RollnetClient
from rollnet.sdk.node import PROTOCOL_VERSION
from rollnet.sdk.testing import NETWORK_ID, connect
from rollnet.v1 import common_pb2, node_pb2, node_service_pb2, rollout_service_pb2


async def start_trainer(
    address: str, trainer: Identity, model_dir: Path, *, shard_size: int = 256 * 1024
) -> RollnetClient:
    """Register the trainer and publish the tiny model as checkpoint 1 (small shards)."""
    client = connect(address, trainer)
    await client.nodes.register_node(
        node_service_pb2.RegisterNodeRequest(
            public_key=trainer.public_key,
            role=common_pb2.ROLE_TRAINER,
            protocol_version=PROTOCOL_VERSION,
            hardware=node_pb2.HardwareReport(cpu_cores=2, memory_bytes=1 << 30),
        )
    )
    await publish_model_dir(client, trainer, model_dir, 1, NETWORK_ID, shard_size=shard_size)
    return client


async def request_tasks(
    trainer: RollnetClient,
    tasks: int,
    *,
    prompts_per_task: int = 1,
    samples: int = 2,
    max_new_tokens: int = 32,
) -> list[str]:
    """Ask for ``tasks`` tasks of the arithmetic environment; returns their ids."""
    response = await trainer.rollouts.request_rollouts(
        rollout_service_pb2.RequestRolloutsRequest(
            rollout_step=1,
            environment="arithmetic",
            prompt_count=tasks * prompts_per_task,
            samples_per_prompt=samples,
            sampling=common_pb2.SamplingParams(temperature=1.0, max_new_tokens=max_new_tokens),
            prompts_per_task=prompts_per_task,
        )
    )
    return list(response.task_ids)


class Ledger:
    """Read-only probes of a coordinator's database (tasks, commitments, verdicts, nodes,
    balances), for tests of nodes that run against it."""

    def __init__(self, url: str) -> None:
        self.engine = create_engine(url)

    def close(self) -> None:
        self.engine.dispose()

    def node_state(self, node_id: str) -> NodeState | None:
        with self.engine.connect() as conn:
            return conn.execute(select(Node.state).where(Node.id == node_id)).scalar_one_or_none()

    def verdicts_by_node(self) -> dict[str, list[tuple[bool, tuple[str, ...], Any]]]:
        """Per worker node: (accepted, reasons, check figures) of each verdict."""
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(Commitment.node_id, Verdict.accepted, Verdict.reasons, Verdict.check_figures)
                .join(Verdict, Verdict.commitment_id == Commitment.id)
                .order_by(Verdict.decided_at)
            ).all()
        out: dict[str, list[tuple[bool, tuple[str, ...], Any]]] = {}
        for node_id, accepted, reasons, figures in rows:
            out.setdefault(node_id, []).append((accepted, tuple(reasons or ()), figures))
        return out

    def verdicts_by_validator(self) -> dict[str, list[tuple[bool, tuple[str, ...]]]]:
        """Per validator node: (accepted, reasons) of each verdict it gave."""
        with self.engine.connect() as conn:
            rows = conn.execute(select(Verdict.validator_id, Verdict.accepted, Verdict.reasons))
            out: dict[str, list[tuple[bool, tuple[str, ...]]]] = {}
            for validator_id, accepted, reasons in rows:
                out.setdefault(validator_id, []).append((accepted, tuple(reasons or ())))
        return out

    def verdicts_per_commitment(self) -> dict[str, int]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(Verdict.commitment_id)).scalars().all()
        counts: dict[str, int] = {}
        for commitment_id in rows:
            counts[commitment_id] = counts.get(commitment_id, 0) + 1
        return counts

    def commitment_ids(self) -> list[str]:
        with self.engine.connect() as conn:
            return list(conn.execute(select(Commitment.id)).scalars().all())

    def balance(self, node_id: str, kind: str) -> int:
        with self.engine.connect() as conn:
            rows = conn.execute(
                select(LedgerEntry.amount).where(
                    LedgerEntry.node_id == node_id, LedgerEntry.kind == EntryKind(kind)
                )
            ).scalars()
            return int(sum(rows))

    def tasks_in(self, state: TaskState) -> int:
        with self.engine.connect() as conn:
            return len(conn.execute(select(Task.id).where(Task.state == state)).all())

    def jobs_in(self, state: ValidationJobState) -> int:
        with self.engine.connect() as conn:
            rows = conn.execute(select(ValidationJob.id).where(ValidationJob.state == state))
            return len(rows.all())

    # ------------------------------------------------------------------ subprocesses

    def task_states(self) -> dict[str, tuple[TaskState, str | None]]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(Task.id, Task.state, Task.lease_holder)).all()
        return {r[0]: (r[1], r[2]) for r in rows}

    def commitments_per_task(self) -> dict[str, list[str]]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(Commitment.task_id, Commitment.node_id)).all()
        out: dict[str, list[str]] = {}
        for task_id, node_id in rows:
            out.setdefault(task_id, []).append(node_id)
        return out

    def commitment_count(self) -> int:
        with self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(Commitment)).scalar_one())

    def leased_by(self, node_id: str) -> list[str]:
        return [
            task_id
            for task_id, (state, holder) in self.task_states().items()
            if state is TaskState.LEASED and holder == node_id
        ]
