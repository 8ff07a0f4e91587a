"""Two coordinator replicas on one PostgreSQL database serve one swarm: several workers and a
validator on both replicas at once; no task is leased twice, no ledger entry is duplicated, and
``rollnet ledger verify`` accepts the chain both replicas appended to.

Blobs live in each replica's data directory, so the replicas here share one blob directory (the
second replica's ``blobs`` is a link to the first one's), as replicas on one host or on a shared
volume would. Replicas with separate disks need a shared blob store (not built yet).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path

import pytest
from coordinator_testing import commitment_request as build_commitment
from coordinator_testing import (
    make_work,
    publish_checkpoint,
    pull,
    register,
    request_tasks,
    try_judge_next_job,
)

from rollnet.reference.cli import main as cli_main
from rollnet.reference.coordinator.config import CoordinatorConfig, with_overrides
from rollnet.reference.coordinator.server import start_coordinator
from rollnet.sdk import Identity, RollnetClient
from rollnet.sdk.testing import connect
from rollnet.v1 import blob_service_pb2, common_pb2, ledger_pb2, ledger_service_pb2

TASKS = 24
WORKERS = 4


@pytest.mark.parametrize(
    "db_url", [pytest.param("postgres", marks=pytest.mark.postgres)], indirect=True
)
@pytest.mark.timeout(120)
async def test_two_replicas_one_database(
    coordinator_config: CoordinatorConfig,
    trainer_identity: Identity,
    validator_identity: Identity,
    db_url: str,
    tmp_path: Path,
) -> None:
    shared_key = tmp_path / "coordinator.key"
    first_config = with_overrides(
        coordinator_config, data_dir=tmp_path / "replica-a", key_file=shared_key
    )
    second_config = with_overrides(
        coordinator_config, data_dir=tmp_path / "replica-b", key_file=shared_key
    )
    first_config.blob_dir.mkdir(parents=True)
    second_config.data_dir.mkdir(parents=True)
    second_config.blob_dir.symlink_to(first_config.blob_dir, target_is_directory=True)
    replicas = [await start_coordinator(first_config), await start_coordinator(second_config)]
    addresses = [r.address for r in replicas]
    clients: list[RollnetClient] = []

    def client_for(identity: Identity, replica: int) -> RollnetClient:
        client = connect(addresses[replica], identity)
        clients.append(client)
        return client

    try:
        trainer = client_for(trainer_identity, 0)
        await register(trainer, trainer_identity, common_pb2.ROLE_TRAINER)
        await publish_checkpoint(trainer, trainer_identity, step=1)
        task_ids = set(await request_tasks(trainer, TASKS))
        assert len(task_ids) == TASKS

        leases: list[tuple[str, int]] = []
        committed: list[str] = []

        async def worker_loop(index: int) -> None:
            identity = Identity.generate()
            # Pull and commit on one replica, upload to the other: any replica serves any call.
            home = client_for(identity, index % 2)
            away = client_for(identity, (index + 1) % 2)
            await register(home, identity, common_pb2.ROLE_WORKER)
            while True:
                pulled = await pull(home, wait=0.3)
                if not pulled.HasField("task"):
                    return
                leases.append((pulled.task.task_id, pulled.lease.fencing_token))
                work = make_work(identity, pulled.task, pulled.lease)
                blob = await away.blobs.upload(work.batch, blob_service_pb2.BLOB_KIND_ROLLOUT_BATCH)
                response = await home.commitments.submit_commitment(
                    build_commitment(identity, work, blob.blob)
                )
                committed.append(response.commitment.commitment_id)

        judged: list[str] = []

        async def validator_loop(replica: int) -> None:
            validator = client_for(validator_identity, replica)
            await register(validator, validator_identity, common_pb2.ROLE_VALIDATOR)
            while len(judged) < TASKS:
                verdict = await try_judge_next_job(validator, accept=True, wait=0.3)
                if verdict is not None:
                    judged.append(verdict.verdict.commitment_id)

        await asyncio.wait_for(
            asyncio.gather(
                *(worker_loop(i) for i in range(WORKERS)), validator_loop(0), validator_loop(1)
            ),
            timeout=90,
        )

        # Every task leased exactly once, on its first attempt, and committed once.
        assert Counter(task for task, _ in leases) == Counter(dict.fromkeys(task_ids, 1))
        assert {token for _, token in leases} == {1}
        assert len(set(committed)) == len(committed) == TASKS
        assert sorted(judged) == sorted(committed)

        # One credit and one validator reward per commitment, on one unbroken sequence.
        entries: list[ledger_pb2.LedgerEntry] = []
        while True:
            page = await trainer.ledger.list_entries(
                ledger_service_pb2.ListEntriesRequest(
                    after_sequence=entries[-1].sequence if entries else 0, page_size=100
                )
            )
            if not page.entries:
                break
            entries.extend(page.entries)
        assert [e.sequence for e in entries] == list(range(1, 2 * TASKS + 1))
        kinds = Counter((e.kind, e.commitment_id) for e in entries)
        assert set(kinds.values()) == {1}, "no entry is duplicated"
        credits = {e.commitment_id for e in entries if e.kind == ledger_pb2.LedgerEntry.KIND_CREDIT}
        assert credits == set(committed)
        for client in (client_for(trainer_identity, 0), client_for(trainer_identity, 1)):
            head = await client.ledger.get_chain_head(
                ledger_service_pb2.GetChainHeadRequest(fresh=True)
            )
            assert head.head.sequence == 2 * TASKS
    finally:
        for client in clients:
            await client.close()
        for replica in replicas:
            await replica.stop(grace=0.1)
    assert await asyncio.to_thread(cli_main, ["ledger", "verify", "--db", db_url]) == 0
