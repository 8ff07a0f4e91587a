"""Prepared statements: the raw SQLite path returns and stores exactly what SQLAlchemy would."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import String, bindparam, cast, create_engine, func, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from rollnet.ledger import idempotency, nodes
from rollnet.ledger.enums import TaskState
from rollnet.ledger.models import IdempotencyRecord, Node, Task, table_of
from rollnet.ledger.prepared import Prepared, prepared_insert
from rollnet.ledger.tasks import NewTask, enqueue_tasks

T0 = datetime(2026, 1, 1, tzinfo=UTC)
AddNodes = Callable[..., list[str]]

_T = table_of(Task).c
_N = table_of(Node).c

# Every kind of value the work path binds and reads: strings, integers, enums, JSON, datetimes.
_TASK_COLUMNS = select(
    _T.id,
    _T.state,
    _T.prompt_ids,
    _T.sampling,
    _T.seed,
    _T.lease_deadline,
    _T.updated_at,
).where(_T.id == bindparam("task_id"))
_LEASE = (
    update(table_of(Task))
    .where(_T.id == bindparam("task_id"), _T.state == TaskState.QUEUED)
    .values(
        state=TaskState.LEASED,
        attempt=_T.attempt + 1,
        fencing_token=_T.attempt + 1,
        lease_id=bindparam("holder"),
        lease_holder=bindparam("holder"),
        lease_deadline=bindparam("deadline"),
        updated_at=bindparam("now"),
    )
    .returning(_T.id, _T.state, _T.lease_deadline, _T.sampling)
)
_LEASED_BEFORE = (
    select(func.count())
    .select_from(table_of(Task))
    .where(_T.state == TaskState.LEASED, _T.lease_deadline < bindparam("when"))
)


def _enqueue(session: Session, count: int) -> list[str]:
    ids = [f"task-{i}" for i in range(count)]
    enqueue_tasks(
        session,
        [
            NewTask(
                task_id=task_id,
                environment="arithmetic",
                checkpoint_step=1,
                prompt_ids=[f"p{i}", "p-ünïcode"],
                seed=2**62 + i,
                sampling={"temperature": 0.7, "samples_per_prompt": 2},
            )
            for i, task_id in enumerate(ids)
        ],
        now=T0,
    )
    return ids


def test_reads_match_sqlalchemy(sessions: sessionmaker[Session]) -> None:
    prepared = Prepared(_TASK_COLUMNS)
    with sessions.begin() as session:
        (task_id,) = _enqueue(session, 1)
        core = tuple(session.execute(_TASK_COLUMNS, {"task_id": task_id}).one())
        assert prepared.one_or_none(session, {"task_id": task_id}) == core
        assert prepared.one_or_none(session, {"task_id": "missing"}) is None
        assert prepared.scalar(session, {"task_id": task_id}) == task_id
        assert core[1] == TaskState.QUEUED
        assert core[2] == ["p0", "p-ünïcode"]
        assert core[6] == T0
        assert core[6].tzinfo is not None


def test_writes_are_seen_by_sqlalchemy_and_comparisons_hold(
    sessions: sessionmaker[Session], add_nodes: AddNodes
) -> None:
    (holder,) = add_nodes(1)
    lease, leased_before = Prepared(_LEASE), Prepared(_LEASED_BEFORE)
    deadline = T0 + timedelta(seconds=90, microseconds=7)
    with sessions.begin() as session:
        first, second = _enqueue(session, 2)
        row = lease.one_or_none(
            session, {"task_id": first, "holder": holder, "deadline": deadline, "now": T0}
        )
        assert row == (
            first,
            TaskState.LEASED,
            deadline,
            {"temperature": 0.7, "samples_per_prompt": 2},
        )
        # Leasing it again matches nothing: the literal state bind is applied.
        again = {"task_id": first, "holder": holder, "deadline": deadline, "now": T0}
        assert lease.one_or_none(session, again) is None
        # A datetime bound on the raw path compares with one stored by it, as SQLAlchemy's do.
        assert leased_before.scalar(session, {"when": deadline}) == 0
        assert leased_before.scalar(session, {"when": deadline + timedelta(microseconds=1)}) == 1
        stored = session.get(Task, first)
        assert stored is not None
        assert stored.lease_deadline == deadline
        assert stored.lease_holder == holder
        assert session.get(Task, second).state is TaskState.QUEUED  # type: ignore[union-attr]


def test_rowcount_and_integrity_errors_are_sqlalchemys(
    sessions: sessionmaker[Session], add_nodes: AddNodes
) -> None:
    (node_id,) = add_nodes(1)
    rename = Prepared(
        update(table_of(Node)).where(_N.id == bindparam("node_id")).values(state_reason="x")
    )
    store = prepared_insert(
        table_of(IdempotencyRecord),
        ["caller_id", "method", "request_id", "response", "created_at"],
    )
    record = {
        "caller_id": node_id,
        "method": "M",
        "request_id": "r1",
        "response": b"\x00answer",
        "created_at": T0,
    }
    with sessions.begin() as session:
        assert rename.rowcount(session, {"node_id": node_id}) == 1
        assert rename.rowcount(session, {"node_id": "nobody"}) == 0
        store.run(session, record)
        with pytest.raises(IntegrityError), session.begin_nested():
            store.run(session, record)
        assert idempotency.lookup(session, node_id, "M", "r1") == b"\x00answer"
        assert idempotency.lookup(session, node_id, "M", "r2") is None


def test_pending_orm_changes_are_flushed_first(sessions: sessionmaker[Session]) -> None:
    prepared = Prepared(_TASK_COLUMNS)
    with sessions.begin() as session:
        (task_id,) = _enqueue(session, 1)
        task = session.get(Task, task_id)
        assert task is not None
        task.seed = 7  # pending in the session, not yet in the database
        row = prepared.one_or_none(session, {"task_id": task_id})
        assert row is not None
        assert row[4] == 7


def test_a_missing_parameter_is_an_error(sessions: sessionmaker[Session]) -> None:
    with sessions.begin() as session, pytest.raises(SQLAlchemyError, match="'task_id'"):
        Prepared(_TASK_COLUMNS).rows(session, {})


def test_in_lists_of_any_length_and_an_empty_one(sessions: sessionmaker[Session]) -> None:
    # A bound list and a literal one (states), as the heartbeat and leasing statements use.
    prepared = Prepared(
        select(_T.id)
        .where(
            _T.id.in_(bindparam("ids", expanding=True)),
            _T.state.in_([TaskState.QUEUED, TaskState.LEASED]),
        )
        .order_by(_T.id)
    )
    with sessions.begin() as session:
        ids = _enqueue(session, 5)
        for wanted in ([ids[0]], ids[1:4], ids, [*ids, "missing"], []):
            core = [row[0] for row in session.execute(prepared.statement, {"ids": wanted})]
            assert [row[0] for row in prepared.rows(session, {"ids": wanted})] == core
            assert core == sorted(set(wanted) & set(ids))


def _all_prepared() -> list[Prepared]:
    from rollnet.ledger import artifacts, nodes, tasks, validation

    found = []
    for module in (artifacts, idempotency, nodes, tasks, validation):
        for value in vars(module).values():
            found.extend([value] if isinstance(value, Prepared) else [])
            if isinstance(value, dict):
                found.extend(item for item in value.values() if isinstance(item, Prepared))
    return found


@pytest.mark.parametrize("url", ["sqlite://", "postgresql+psycopg://"])
def test_every_prepared_statement_converts_as_sqlalchemy_does(url: str) -> None:
    dialect = create_engine(url).dialect  # no connection is made
    statements = _all_prepared()
    assert len(statements) >= 15
    for prepared in statements:
        ours = prepared._compile(dialect)
        compiled = prepared.statement.compile(dialect=dialect)  # type: ignore[attr-defined]
        theirs = compiled._bind_processors
        for name, _, process in ours.binds:
            assert (process is None) == (theirs.get(name) is None), (prepared.statement, name)


def test_heartbeats_store_times_as_sqlalchemy_does(
    sessions: sessionmaker[Session], add_nodes: AddNodes
) -> None:
    # A parameter bound twice, once untyped inside a CASE, still gets the column's conversion.
    first, second = add_nodes(2)
    now = T0 + timedelta(seconds=5, microseconds=1)
    with sessions.begin() as session:
        nodes.record_heartbeats(session, [first], now=now)
        session.execute(update(table_of(Node)).where(_N.id == second).values(last_heartbeat_at=now))
    with sessions.begin() as session:
        stored: dict[str, str] = dict(
            session.execute(select(_N.id, cast(_N.last_heartbeat_at, String))).all()
        )
    assert stored[first] == stored[second]
    if sessions.kw["bind"].dialect.name == "sqlite":
        assert stored[first] == "2026-01-01 00:00:05.000001"


def test_a_failed_savepoint_rolls_back_only_its_own_writes(
    sessions: sessionmaker[Session], add_nodes: AddNodes
) -> None:
    """SAVEPOINT/RELEASE/ROLLBACK TO are sent straight to sqlite3 (see ledger.engine); an ORM
    flush that fails inside ``begin_nested`` still rolls back that savepoint alone, and the
    outer transaction, its earlier writes and the Session stay usable."""
    (node_id,) = add_nodes(1)
    reason = select(_N.state_reason).where(_N.id == node_id)
    with sessions.begin() as session:
        before = session.execute(reason).scalar_one()
        (kept,) = _enqueue(session, 1)
        duplicate = Task(**{c: getattr(session.get(Task, kept), c) for c in _TASK_FIELDS})
        with pytest.raises(IntegrityError), session.begin_nested():
            _flush(session, duplicate)  # same primary key: refused by the database
        with pytest.raises(RuntimeError), session.begin_nested():
            _fail_after_writing(session, node_id)
        assert session.execute(reason).scalar_one() == before != "inside the savepoint"
        with session.begin_nested(), session.begin_nested():
            nodes.set_state_reason(session, node_id, "nested twice")
        assert session.is_active
    with sessions() as session:
        assert session.get(Task, kept) is not None
        node = session.get(Node, node_id)
        assert node is not None
        assert node.state_reason == "nested twice"


def _flush(session: Session, row: Task) -> None:
    session.add(row)
    session.flush()


def _fail_after_writing(session: Session, node_id: str) -> None:
    nodes.set_state_reason(session, node_id, "inside the savepoint")
    raise RuntimeError("the call fails after writing")


_TASK_FIELDS = [c.name for c in table_of(Task).columns]
