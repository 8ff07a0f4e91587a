"""The copy index finds only the repeats the copy rule can use, bounded, on both engines."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from sqlalchemy.orm import Session, sessionmaker

from rollnet.ledger import NewTask, lease_next_task
from rollnet.ledger.artifacts import NewCommitment, record_blob, record_commitment
from rollnet.ledger.enums import TaskState
from rollnet.ledger.fingerprints import Fingerprint, find_originals, record_fingerprints
from rollnet.ledger.tasks import enqueue_tasks, transition_task

T0 = datetime(2026, 1, 1, tzinfo=UTC)
IMPROBABLE = -20.0
AddNodes = Callable[..., list[str]]

PROMPT_A, PROMPT_B = b"a" * 32, b"b" * 32  # tokens digests: two prompts' completions
SAME = b"s" * 32  # a completion digest both share


def _commit(
    sessions: sessionmaker[Session],
    worker: str,
    name: str,
    prints: list[Fingerprint],
    state: TaskState = TaskState.SUBMITTED,
) -> None:
    """Queue, lease and commit task ``name`` with ``prints`` indexed, its task in ``state``."""
    with sessions.begin() as session:
        enqueue_tasks(session, [NewTask(name, "arithmetic", 0, ["p"], seed=1)], now=T0)
        lease = lease_next_task(session, node_id=worker, now=T0, lease_duration=timedelta(60))
        assert lease is not None
        assert lease.task_id == name
        blob = name.encode().hex().ljust(64, "0")
        record_blob(session, blake3_hex=blob, size=1, location="x", uploader_id=worker, now=T0)
        record_commitment(
            session,
            NewCommitment(
                commitment_id=f"c-{name}",
                task_id=name,
                node_id=worker,
                lease_id=lease.lease_id,
                fencing_token=lease.fencing_token,
                rollout_blob_hash=blob,
                proof_blob_hash=None,
                sampling_seed=1,
                claimed_work=1,
                request_id="",
                signature=bytes(64),
            ),
            now=T0,
        )
        record_fingerprints(session, f"c-{name}", worker, prints)
        moves = [(TaskState.LEASED, TaskState.SUBMITTED)]
        if state is not TaskState.SUBMITTED:
            moves.append((TaskState.SUBMITTED, state))
        for from_state, to_state in moves:
            assert transition_task(session, name, from_state=from_state, to_state=to_state, now=T0)


def _found(
    sessions: sessionmaker[Session], prints: list[Fingerprint], limit: int = 100
) -> list[tuple[str, int]]:
    with sessions.begin() as session:
        found = find_originals(session, prints, improbable=IMPROBABLE, limit=limit)
    return [(o.commitment_id, o.rollout_index) for o in found]


def test_only_repeats_that_can_be_copies_are_read(
    sessions: sessionmaker[Session], add_nodes: AddNodes
) -> None:
    (worker,) = add_nodes(1)
    _commit(sessions, worker, "likely", [Fingerprint(0, PROMPT_A, SAME, -3.0)])
    _commit(sessions, worker, "unlikely", [Fingerprint(0, PROMPT_B, SAME, -30.0)])
    _commit(
        sessions, worker, "rejected", [Fingerprint(0, PROMPT_A, SAME, -40.0)], TaskState.REJECTED
    )

    # A likely print repeating a likely original's tokens: an honest repeat, nothing read.
    assert _found(sessions, [Fingerprint(0, PROMPT_A, SAME, -1.0)]) == []
    # ... the improbable original of the same tokens is read (the lower claim counts); the
    # rejected one never is.
    assert _found(sessions, [Fingerprint(0, PROMPT_B, SAME, -1.0)]) == [("c-unlikely", 0)]
    # A likely print matching only by completion (another prompt) reads nothing.
    assert _found(sessions, [Fingerprint(0, b"c" * 32, SAME, -1.0)]) == []
    # An improbable print reads every live repeat of its tokens or its completion, in order.
    assert _found(sessions, [Fingerprint(0, b"c" * 32, SAME, -25.0)]) == [
        ("c-likely", 0),
        ("c-unlikely", 0),
    ]
    assert _found(sessions, [Fingerprint(0, PROMPT_A, b"d" * 32, -25.0)]) == [("c-likely", 0)]
    assert _found(sessions, []) == []


def test_a_completion_committed_many_times_is_read_at_most_limit_times(
    sessions: sessionmaker[Session], add_nodes: AddNodes
) -> None:
    (worker,) = add_nodes(1)
    for n in range(6):
        _commit(sessions, worker, f"t{n}", [Fingerprint(i, PROMPT_A, SAME, -1.0) for i in range(3)])
    improbable = Fingerprint(0, PROMPT_A, SAME, -25.0)
    assert len(_found(sessions, [improbable])) == 18
    bounded = _found(sessions, [improbable], limit=4)
    assert len(bounded) == 4
    assert bounded == sorted(bounded)
    # Both kinds in one batch share the bound: likely prints' rows first, then the rest.
    likely_of_improbable = Fingerprint(1, PROMPT_B, b"e" * 32, -1.0)
    _commit(sessions, worker, "rare", [Fingerprint(0, PROMPT_B, b"e" * 32, -50.0)])
    assert _found(sessions, [likely_of_improbable, improbable], limit=2)[0] == ("c-rare", 0)
    assert len(_found(sessions, [likely_of_improbable, improbable], limit=2)) == 2
