"""Blobs, commitments, checkpoints, validation jobs, verdicts and idempotency, on both engines."""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from alembic import command
from sqlalchemy import func, select
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from rollnet.ledger import (
    EntryKind,
    LeaseClaim,
    LeaseOutcome,
    NewEntry,
    NewTask,
    NodeRole,
    append_entries,
    balance,
    lease_next_task,
    lease_next_validation_job,
)
from rollnet.ledger import idempotency as idem
from rollnet.ledger.artifacts import (
    ConflictError,
    NewCommitment,
    get_blob,
    get_checkpoint,
    latest_checkpoint,
    manifests_after,
    mark_blobs_pruned,
    record_blob,
    record_checkpoint,
    record_commitment,
    unpruned_blobs,
)
from rollnet.ledger.enums import TaskState
from rollnet.ledger.leases import extend_leases
from rollnet.ledger.migrate import alembic_config, check_models_match
from rollnet.ledger.models import IdempotencyRecord, LedgerEntry, Task, ValidationJob
from rollnet.ledger.tasks import enqueue_tasks, get_task, transition_task
from rollnet.ledger.validation import (
    enqueue_validation_job,
    get_verdict_for_commitment,
    requeue_expired_validation_jobs,
    requeue_validation_jobs_of_node,
    settle_failed_jobs,
    submit_verdict,
)

T0 = datetime(2026, 1, 1, tzinfo=UTC)
LEASE = timedelta(seconds=60)
AddNodes = Callable[..., list[str]]


def _commit_one_task(sessions: sessionmaker[Session], worker: str) -> str:
    """Queue, lease and commit one task; returns the commitment id."""
    with sessions.begin() as session:
        enqueue_tasks(
            session,
            [NewTask("t1", "arithmetic", 0, ["p1"], seed=7, sampling={"temperature": 1.0})],
            now=T0,
        )
        lease = lease_next_task(session, node_id=worker, now=T0, lease_duration=LEASE)
        assert lease is not None
        record_blob(
            session, blake3_hex="ab" * 32, size=10, location="blobs/ab", uploader_id=worker, now=T0
        )
        record_commitment(
            session,
            NewCommitment(
                commitment_id="c1",
                task_id=lease.task_id,
                node_id=worker,
                lease_id=lease.lease_id,
                fencing_token=lease.fencing_token,
                rollout_blob_hash="ab" * 32,
                proof_blob_hash=None,
                sampling_seed=7,
                claimed_work=1234,
                request_id="r1",
                signature=b"\x00" * 64,
            ),
            now=T0,
        )
    return "c1"


def test_blobs_and_checkpoints_are_written_once(
    sessions: sessionmaker[Session], add_nodes: AddNodes
) -> None:
    (trainer,) = add_nodes(1, NodeRole.TRAINER)
    with sessions.begin() as session:
        record_blob(session, blake3_hex="cd" * 32, size=5, location="x", uploader_id=None, now=T0)
        # The same blob again is a no-op: the first record stands.
        record_blob(session, blake3_hex="cd" * 32, size=5, location="y", uploader_id=None, now=T0)
        blob = get_blob(session, "cd" * 32)
        assert blob is not None
        assert (blob.size, blob.location) == (5, "x")
        with pytest.raises(ConflictError):
            record_blob(
                session, blake3_hex="cd" * 32, size=6, location="x", uploader_id=None, now=T0
            )
        assert get_blob(session, "cd" * 32) is blob
        for step in (0, 1):
            record_checkpoint(
                session,
                step=step,
                manifest=b"manifest %d" % step,
                manifest_hash=f"{step:064x}",
                signature=b"\x01" * 64,
                signer_public_key=b"\x02" * 32,
                publisher_id=trainer,
                now=T0,
            )
        with pytest.raises(ConflictError):
            record_checkpoint(
                session,
                step=1,
                manifest=b"other",
                manifest_hash="f" * 64,
                signature=b"\x01" * 64,
                signer_public_key=b"\x02" * 32,
                publisher_id=trainer,
                now=T0,
            )
        latest = latest_checkpoint(session)
        assert latest is not None
        assert (latest.step, latest.manifest) == (1, b"manifest 1")
        assert get_checkpoint(session, 0) is not None
        assert list(manifests_after(session, -1)) == [(0, b"manifest 0"), (1, b"manifest 1")]
        assert list(manifests_after(session, 0)) == [(1, b"manifest 1")]
        assert list(manifests_after(session, 1)) == []
        record_blob(session, blake3_hex="ef" * 32, size=5, location="z", uploader_id=None, now=T0)
        assert mark_blobs_pruned(session, ["ef" * 32], now=T0) == 1
        # A pruned blob's bytes are gone: it counts as unrecorded, like one never recorded.
        asked = ["cd" * 32, "ef" * 32, "01" * 32]
        assert unpruned_blobs(session, asked) == {"cd" * 32}
        assert unpruned_blobs(session, []) == set()


def test_one_commitment_per_lease(sessions: sessionmaker[Session], add_nodes: AddNodes) -> None:
    (worker,) = add_nodes(1)
    _commit_one_task(sessions, worker)
    with pytest.raises(IntegrityError), sessions.begin() as session:
        record_commitment(
            session,
            NewCommitment(
                commitment_id="c2",
                task_id="t1",
                node_id=worker,
                lease_id="whatever",
                fencing_token=1,
                rollout_blob_hash="ab" * 32,
                proof_blob_hash=None,
                sampling_seed=7,
                claimed_work=1,
                request_id="r2",
                signature=b"\x00" * 64,
            ),
            now=T0,
        )


def test_extend_leases_extends_live_task_and_job_leases_of_their_holders(
    sessions: sessionmaker[Session], add_nodes: AddNodes
) -> None:
    (worker,) = add_nodes(1)
    (validator,) = add_nodes(1, NodeRole.VALIDATOR)
    commitment_id = _commit_one_task(sessions, worker)
    later = T0 + timedelta(seconds=30)
    second = NewTask("t2", "arithmetic", 0, ["p2"], seed=8, sampling={})
    with sessions.begin() as session:
        enqueue_validation_job(session, job_id="j1", commitment_id=commitment_id, now=T0)
        job = lease_next_validation_job(session, node_id=validator, now=T0, lease_duration=LEASE)
        enqueue_tasks(session, [second], now=T0)
        task = lease_next_task(session, node_id=worker, now=T0, lease_duration=LEASE)
        assert task is not None
        assert job is not None
        holders = [
            (task.lease_id, worker),
            (job.lease_id, validator),
            (task.lease_id, validator),  # not its holder: not extended
            ("no-such-lease", worker),
        ]
        extended = extend_leases(session, holders, now=later, lease_duration=LEASE)
        assert extended == {task.lease_id, job.lease_id}
        assert extend_leases(session, [], now=later, lease_duration=LEASE) == set()
    with sessions.begin() as session:
        row = get_task(session, "t2")
        assert row is not None
        assert row.lease_deadline == later + LEASE
        job_row = session.get(ValidationJob, "j1")
        assert job_row is not None
        assert job_row.lease_deadline == later + LEASE
        # An expired lease is not brought back.
        gone = later + 2 * LEASE
        assert extend_leases(session, holders, now=gone, lease_duration=LEASE) == set()


def test_validation_job_lease_verdict_and_credit(
    sessions: sessionmaker[Session], add_nodes: AddNodes
) -> None:
    (worker,) = add_nodes(1)
    first_validator, second_validator = add_nodes(2, NodeRole.VALIDATOR)
    commitment_id = _commit_one_task(sessions, worker)
    with sessions.begin() as session:
        enqueue_validation_job(session, job_id="j1", commitment_id=commitment_id, now=T0)
        job = lease_next_validation_job(
            session, node_id=first_validator, now=T0, lease_duration=LEASE
        )
        assert job is not None
        assert (job.commitment_id, job.fencing_token) == (commitment_id, 1)
        assert (
            lease_next_validation_job(
                session, node_id=second_validator, now=T0, lease_duration=LEASE
            )
            is None
        )
    late = T0 + LEASE
    with sessions.begin() as session:
        taken = requeue_expired_validation_jobs(session, now=late, max_attempts=5)
        assert (taken.requeued, taken.failed) == (["j1"], [])
        retry = lease_next_validation_job(
            session, node_id=second_validator, now=late, lease_duration=LEASE
        )
        assert retry is not None
        assert retry.fencing_token == 2
    verdict = {
        "verdict_id": "v1",
        "accepted": True,
        "reasons": [],
        "check_figures": {"toploc": {"exp_mismatch_max": 3, "mant_err_mean": 1.5}},
        "awarded_work": 1234,
    }
    with sessions.begin() as session:
        stale = submit_verdict(
            session,
            LeaseClaim("j1", job.lease_id, job.fencing_token, first_validator, late),
            **verdict,  # type: ignore[arg-type]
        )
        assert stale is LeaseOutcome.STALE_LEASE
        assert get_verdict_for_commitment(session, commitment_id) is None
    with sessions.begin() as session:
        ok = submit_verdict(
            session,
            LeaseClaim("j1", retry.lease_id, retry.fencing_token, second_validator, late),
            **verdict,  # type: ignore[arg-type]
        )
        assert ok is LeaseOutcome.OK
        # The credit commits atomically with the verdict that earns it.
        append_entries(
            session,
            [
                NewEntry(
                    worker, EntryKind.CREDIT, 1234, commitment_id=commitment_id, verdict_id="v1"
                ),
                NewEntry(second_validator, EntryKind.VALIDATOR_REWARD, 12, verdict_id="v1"),
            ],
            now=late,
        )
    with sessions.begin() as session:
        stored = get_verdict_for_commitment(session, commitment_id)
        assert stored is not None
        assert stored.check_figures["toploc"]["exp_mismatch_max"] == 3
        assert balance(session, worker) == 1234
        again = submit_verdict(
            session,
            LeaseClaim("j1", retry.lease_id, retry.fencing_token, second_validator, late),
            **verdict,  # type: ignore[arg-type]
        )
        assert again is LeaseOutcome.ALREADY_SUBMITTED


def _count(session: Session, model: type[LedgerEntry] | type[IdempotencyRecord]) -> int:
    return session.scalar(select(func.count()).select_from(model)) or 0


def test_repeated_request_returns_the_original_response_and_writes_nothing(
    sessions: sessionmaker[Session], add_nodes: AddNodes
) -> None:
    (worker,) = add_nodes(1)
    calls = 0

    def credit(session: Session) -> bytes:
        nonlocal calls
        calls += 1
        [entry] = append_entries(session, [NewEntry(worker, EntryKind.CREDIT, 5)])
        return f"sequence={entry.sequence}".encode()

    first = idem.run_idempotent(
        sessions, caller_id=worker, method="/rollnet.v1.X/Credit", request_id="r-1", mutate=credit
    )
    second = idem.run_idempotent(
        sessions, caller_id=worker, method="/rollnet.v1.X/Credit", request_id="r-1", mutate=credit
    )
    other = idem.run_idempotent(
        sessions, caller_id=worker, method="/rollnet.v1.X/Credit", request_id="r-2", mutate=credit
    )
    assert (first.response, first.replayed) == (b"sequence=1", False)
    assert (second.response, second.replayed) == (b"sequence=1", True)
    assert (other.response, other.replayed) == (b"sequence=2", False)
    assert calls == 2
    with sessions.begin() as session:
        assert _count(session, LedgerEntry) == 2
        assert idem.lookup(session, worker, "/rollnet.v1.X/Credit", "r-1") == b"sequence=1"
        assert idem.lookup(session, worker, "/rollnet.v1.X/Other", "r-1") is None
        assert idem.prune(session, older_than=datetime.now(UTC) + timedelta(days=1)) == 2


def test_looking_up_many_request_ids_matches_exact_pairs(
    sessions: sessionmaker[Session], add_nodes: AddNodes
) -> None:
    a, b = add_nodes(2)
    pull, commit = "/rollnet.v1.TaskService/PullTask", "/rollnet.v1.X/Commit"
    with sessions.begin() as session:
        idem.store(session, a, pull, "r-1", b"a1", now=T0)
        idem.store(session, b, pull, "r-2", b"b2", now=T0)
        idem.store(session, a, commit, "r-2", b"a2-commit", now=T0)
    with sessions.begin() as session:
        # (a, r-2) and (b, r-1) share a caller and an id with stored pairs, and are not stored;
        # (a, r-2) is stored for another method only. Repeated pairs are asked once.
        found = idem.lookup_many(
            session, pull, [(a, "r-1"), (a, "r-2"), (b, "r-1"), (b, "r-2"), (a, "r-1")]
        )
        assert found == {(a, "r-1"): b"a1", (b, "r-2"): b"b2"}
        assert idem.lookup_many(session, commit, [(a, "r-2"), (b, "r-2")]) == {
            (a, "r-2"): b"a2-commit"
        }
        assert idem.lookup_many(session, pull, []) == {}
        assert idem.lookup_many(session, pull, [(b, "r-2")]) == {(b, "r-2"): b"b2"}
        assert idem.lookup_many(session, pull, [(b, "r-1")]) == {}
        many = [(a, f"x-{i}") for i in range(300)] + [(b, "r-2")]
        assert idem.lookup_many(session, pull, many) == {(b, "r-2"): b"b2"}


def test_concurrent_duplicates_mutate_once(
    sessions: sessionmaker[Session], add_nodes: AddNodes
) -> None:
    (worker,) = add_nodes(1)
    racers = 4
    barrier = threading.Barrier(racers)
    results: list[idem.IdempotentResult] = []
    errors: list[BaseException] = []

    def credit(session: Session) -> bytes:
        [entry] = append_entries(session, [NewEntry(worker, EntryKind.CREDIT, 5)])
        return f"sequence={entry.sequence}".encode()

    def racer() -> None:
        try:
            barrier.wait(timeout=30)
            results.append(
                idem.run_idempotent(
                    sessions, caller_id=worker, method="M", request_id="same", mutate=credit
                )
            )
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=racer) for _ in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors, errors
    assert {result.response for result in results} == {b"sequence=1"}
    assert sum(not result.replayed for result in results) == 1
    with sessions.begin() as session:
        assert _count(session, LedgerEntry) == 1
        assert _count(session, IdempotencyRecord) == 1


def test_a_validation_job_no_validator_finishes_is_given_up_and_its_work_requeued(
    sessions: sessionmaker[Session], add_nodes: AddNodes
) -> None:
    """After max_attempts leases (expired, or taken back from a validator that left) the job is
    FAILED and settled in the same call: the task FAILED and a fresh copy queued, with no credit
    and no slash."""
    (worker,) = add_nodes(1)
    (validator,) = add_nodes(1, NodeRole.VALIDATOR)
    commitment_id = _commit_one_task(sessions, worker)
    with sessions.begin() as session:
        transition_task(
            session, "t1", from_state=TaskState.LEASED, to_state=TaskState.SUBMITTED, now=T0
        )
        enqueue_validation_job(session, job_id="j1", commitment_id=commitment_id, now=T0)
    now = T0
    for attempt in range(1, 4):
        with sessions.begin() as session:
            assert lease_next_validation_job(
                session, node_id=validator, now=now, lease_duration=LEASE
            )
            now += LEASE
            if attempt == 2:  # the validator left: its leases are taken back (and counted)
                taken = requeue_validation_jobs_of_node(session, validator, now=now, max_attempts=3)
            else:
                taken = requeue_expired_validation_jobs(session, now=now, max_attempts=3)
            if attempt < 3:
                assert (taken.requeued, taken.failed) == (["j1"], [])
            else:
                assert (taken.requeued, taken.failed) == ([], ["j1"])
    with sessions.begin() as session:
        assert (
            lease_next_validation_job(session, node_id=validator, now=now, lease_duration=LEASE)
            is None
        )
        task = get_task(session, "t1")
        assert task is not None
        assert task.state is TaskState.FAILED
        (copy_id,) = session.scalars(select(Task.id).where(Task.state == TaskState.QUEUED))
        copy = get_task(session, copy_id)
        assert copy is not None
        assert (copy.state, copy.prompt_ids, copy.seed) == (
            TaskState.QUEUED,
            task.prompt_ids,
            task.seed,
        )
        assert get_verdict_for_commitment(session, commitment_id) is None
        assert session.scalar(select(func.count()).select_from(LedgerEntry)) == 0
        # Settling twice changes nothing.
        assert settle_failed_jobs(session, ["j1"], now=now) == []


def test_migrations_rebuild_tables_that_rows_reference(
    sessions: sessionmaker[Session], add_nodes: AddNodes, migrated_engine: Engine
) -> None:
    # On SQLite a migration that alters validation_jobs rebuilds it (copy, drop, rename); with
    # verdicts referencing its rows, the drop failed while foreign keys were enforced, so a
    # coordinator with any verdict could not upgrade. Down to 0005 and back up, rows kept.
    (worker,) = add_nodes(1)
    (validator,) = add_nodes(1, NodeRole.VALIDATOR)
    commitment_id = _commit_one_task(sessions, worker)
    with sessions.begin() as session:
        enqueue_validation_job(
            session, job_id="j1", commitment_id=commitment_id, now=T0, check_probability=0.25
        )
        job = lease_next_validation_job(session, node_id=validator, now=T0, lease_duration=LEASE)
        assert job is not None
        assert (
            submit_verdict(
                session,
                LeaseClaim("j1", job.lease_id, job.fencing_token, validator, T0),
                verdict_id="v1",
                accepted=False,
                reasons=["TOKEN_NOT_SAMPLED"],
                check_figures={},
                awarded_work=0,
            )
            is LeaseOutcome.OK
        )
    config = alembic_config(migrated_engine)
    command.downgrade(config, "0005")
    command.upgrade(config, "head")
    check_models_match(migrated_engine)
    with sessions.begin() as session:
        assert get_verdict_for_commitment(session, commitment_id) is not None
        # Rows from before 0006 were checked with certainty (the old slash).
        probability = session.scalar(select(ValidationJob.check_probability))
        assert probability == 1.0
    with migrated_engine.connect() as connection:
        if connection.dialect.name == "sqlite":
            assert connection.exec_driver_sql("PRAGMA foreign_key_check").fetchall() == []
            assert connection.exec_driver_sql("PRAGMA foreign_keys").scalar() == 1
