"""Turning trainer demand into tasks and handing them out by pull, with leases."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import secrets
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import blake3
import numpy as np
from google.protobuf import json_format, struct_pb2
from sqlalchemy.orm import Session

from rollnet.ledger import artifacts, idempotency, nodes, tasks
from rollnet.ledger.leases import LeaseOutcome
from rollnet.ledger.models import Task
from rollnet.ledger.nonces import NonceKey, claim_nonces
from rollnet.ledger.tasks import LeasedTask, NewTask
from rollnet.reference.coordinator.bounds import MAX_ROLLOUTS_PER_TASK
from rollnet.reference.coordinator.context import (
    IDEMPOTENCY_SCOPE,
    CoordinatorContext,
    IdempotencyScope,
    StoredResponse,
    wait_for,
)
from rollnet.reference.coordinator.logprobs import max_verdict_bytes
from rollnet.reference.coordinator.nodes import (
    Caller,
    capabilities_from_db,
    duration,
    refuse_unless_in_standing,
    refuse_unusable,
    timestamp,
)
from rollnet.reference.coordinator.prompt_lengths import PromptLengths
from rollnet.reference.coordinator.refusal import Refusal, Violations, invalid
from rollnet.reference.envs.config import EnvironmentConfigError
from rollnet.reference.envs.registry import (
    EnvironmentRegistryError,
    UnknownEnvironmentError,
    load_environment,
)
from rollnet.sdk.dtypes import FLOAT32, compute_dtype_value
from rollnet.sdk.errors import ErrorReason
from rollnet.sdk.verifier import current_nonce
from rollnet.v1 import common_pb2, rollout_service_pb2, task_pb2, task_service_pb2

log = logging.getLogger("rollnet.coordinator")

MAX_TASKS_PER_REQUEST = 10_000
# Long polls re-check the database this often, to see work queued by other replicas.
_POLL_SECONDS = 1.0


def lease_outcome_refusal(outcome: LeaseOutcome, what: str) -> Refusal:
    """The refusal that explains a failed lease-guarded write."""
    match outcome:
        case LeaseOutcome.UNKNOWN | LeaseOutcome.WRONG_HOLDER:
            return Refusal(ErrorReason.LEASE_NOT_FOUND, f"no such lease on {what} held by you")
        case LeaseOutcome.STALE_LEASE:
            return Refusal(
                ErrorReason.FENCING_TOKEN_STALE,
                f"the lease on {what} is not the current one (it expired and was re-leased)",
            )
        case LeaseOutcome.LEASE_EXPIRED:
            return Refusal(ErrorReason.LEASE_EXPIRED, f"the lease on {what} has expired")
        case _:
            return Refusal(ErrorReason.LEASE_CLOSED, f"{what} is no longer open ({outcome})")


def task_spec(row: Task | LeasedTask) -> dict[str, Any]:
    """The protocol-level task description kept in the task row's JSON column."""
    return dict(row.sampling)


def _lease_response(leased: LeasedTask, now: datetime) -> task_service_pb2.PullTaskResponse:
    lease = task_pb2.Lease(
        lease_id=leased.lease_id,
        fencing_token=leased.fencing_token,
        deadline=timestamp(leased.lease_deadline),
        issued_at=timestamp(now),
    )
    return task_service_pb2.PullTaskResponse(
        task=task_to_proto(leased, state=task_pb2.Task.STATE_LEASED, attempt=leased.fencing_token),
        lease=lease,
    )


def task_to_proto(row: Task | LeasedTask, *, state: Any, attempt: int) -> task_pb2.Task:
    """The wire form of a task."""
    spec = task_spec(row)
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


TASK_STATE_TO_PROTO = {
    "queued": task_pb2.Task.STATE_QUEUED,
    "leased": task_pb2.Task.STATE_LEASED,
    "submitted": task_pb2.Task.STATE_SUBMITTED,
    "validating": task_pb2.Task.STATE_VALIDATING,
    "accepted": task_pb2.Task.STATE_ACCEPTED,
    "rejected": task_pb2.Task.STATE_REJECTED,
    "failed": task_pb2.Task.STATE_FAILED,
}


@dataclass(frozen=True, slots=True)
class NoTask:
    """A pull that leased nothing, and the filters its long poll waits on."""

    environments: tuple[str, ...] | None
    min_checkpoint_step: int | None


@dataclass(slots=True)
class _PendingPull:
    caller: Caller
    #: The environments the pull asked for (``None``: the node's capabilities decide).
    environments: tuple[str, ...] | None
    scope: IdempotencyScope | None
    future: asyncio.Future[task_service_pb2.PullTaskResponse | NoTask] | None = None
    #: The call's nonce, recorded in the batch's transaction (first try of a long poll only).
    nonce: NonceKey | None = None


#: Outcome of a pull whose request id another pull of the same batch carries: it is retried in
#: the next batch, where the first one's record answers it.
_AGAIN = object()
#: Outcome of a pull whose caller went away before it could be tried again (nobody to answer).
_GONE = object()


class PullBatcher:
    """Leases for concurrent pulls, many in one transaction.

    On SQLite every write goes through the one writer thread, where each pull used to be a call
    of its own: its savepoint, its request-id look-up, its node's standing, the latest step, its
    held leases, a candidate, the lease, its answer's record. Pulls that arrive while a batch is
    being written now wait and go together in the next one (a lone pull is written at once):
    one look-up of their request ids, one read of their nodes, one of their held leases, one
    candidate query per environment filter, and then one UPDATE and one record per lease.
    Each pull still gets its own answer: a refusal, a replayed answer, a lease or nothing.

    On PostgreSQL writes run in parallel on a few threads and each pull stays a transaction of
    its own (a batch would lock many node rows at once, against heartbeat batches that lock
    them in another order).
    """

    def __init__(self, ctx: CoordinatorContext, *, max_batch: int = 256) -> None:
        self.ctx = ctx
        self.max_batch = max_batch
        self._queue: asyncio.Queue[_PendingPull] = asyncio.Queue()
        self._runner: asyncio.Task[None] | None = None
        #: Transactions sent to lease for pulls, and the pulls they carried (tests and metrics).
        self.batches = 0
        self.pulls = 0
        #: Pulls tried again alone after their batch's transaction failed.
        self.retried = 0

    async def lease(
        self,
        caller: Caller,
        environments: tuple[str, ...] | None,
        scope: IdempotencyScope | None,
        nonce: NonceKey | None = None,
    ) -> task_service_pb2.PullTaskResponse | NoTask:
        """Lease a task for one pull: its response (with a lease), or :class:`NoTask`.

        Raises the pull's :class:`Refusal` (``NONCE_REPLAYED`` when ``nonce``, recorded in the
        batch's transaction, was recorded before), or :class:`StoredResponse` when its request
        id was answered before.
        """
        pending = _PendingPull(caller, environments, scope, nonce=nonce)
        if self.ctx.group_commit is None:
            self._count([pending])
            (outcome,) = await self._write([pending])
            return _settled(outcome)
        loop = asyncio.get_running_loop()
        if self._runner is None or self._runner.done():
            # A context of its own: the runner must not carry the first caller's request id.
            self._runner = loop.create_task(self._run(), context=contextvars.Context())
        pending.future = loop.create_future()
        self._queue.put_nowait(pending)
        return await pending.future

    def _count(self, batch: list[_PendingPull]) -> None:
        # Counted on the event loop, when the batch goes to the writer (threads may not race).
        self.batches += 1
        self.pulls += len(batch)

    def _count_each(self, batch: list[_PendingPull]) -> None:
        self.batches += len(batch)
        self.pulls += len(batch)
        self.retried += len(batch)

    async def close(self) -> None:
        """Stop batching; pulls still queued are cancelled."""
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
        while not self._queue.empty():
            future = self._queue.get_nowait().future
            if future is not None:
                future.cancel()

    async def _run(self) -> None:
        while True:
            batch = [await self._queue.get()]
            while len(batch) < self.max_batch and not self._queue.empty():
                batch.append(self._queue.get_nowait())
            # A pull whose caller went away while it waited leases nothing: a lease taken for it
            # would count against its node's cap until it expired.
            batch = [pending for pending in batch if not _gone(pending)]
            if not batch:
                continue
            try:
                outcomes = await self._lease_batch(batch)
            except asyncio.CancelledError:  # closing: no pull of this batch is left waiting
                for pending in batch:
                    if pending.future is not None:
                        pending.future.cancel()
                raise
            for pending, outcome in zip(batch, outcomes, strict=True):
                future = pending.future
                assert future is not None
                if future.done() or outcome is _GONE:
                    continue  # the caller went away (a lease it took expires unused)
                if outcome is _AGAIN:
                    pending.nonce = None  # recorded with the batch that committed
                    self._queue.put_nowait(pending)
                elif isinstance(outcome, BaseException):
                    future.set_exception(outcome)
                else:
                    future.set_result(outcome)

    async def _lease_batch(self, batch: list[_PendingPull]) -> list[Any]:
        """The batch's outcomes. If its transaction fails, each pull is tried again alone, so
        that one pull's failure (a constraint it breaks, say) reaches its own caller only."""
        self._count(batch)
        try:
            return await self._write(batch)
        except Exception as error:
            if len(batch) == 1:
                return [error]
            log.warning(
                "a batch of %d pulls failed (%s: %s); trying each alone",
                len(batch),
                type(error).__name__,
                error,
            )
        outcomes: list[Any] = [_GONE] * len(batch)
        again = [i for i, pending in enumerate(batch) if not _gone(pending)]
        self._count_each([batch[i] for i in again])
        singles = await asyncio.gather(
            *(self._write([batch[index]]) for index in again), return_exceptions=True
        )
        for index, single in zip(again, singles, strict=True):
            outcomes[index] = single if isinstance(single, BaseException) else single[0]
        return outcomes

    async def _write(self, batch: list[_PendingPull]) -> list[Any]:
        # The batch handles its pulls' request ids itself (scoped=False).
        return await self.ctx.run_in_transaction(
            functools.partial(self._work, batch=batch), scoped=False
        )

    def _work(self, session: Session, batch: list[_PendingPull]) -> list[Any]:
        """Every pull's outcome: a response, :class:`NoTask`, an exception, or ``_AGAIN``."""
        for pending in batch:
            if pending.scope is not None:
                # Nothing of this transaction is recorded yet; a batch (or a group commit) that
                # failed before runs this again with its records rolled back.
                pending.scope.stored = False
        config = self.ctx.config
        outcomes: list[Any] = [None] * len(batch)
        # The pulls' nonces first: a replayed pull leases nothing and hears no stored answer.
        fresh = claim_nonces(session, [p.nonce for p in batch if p.nonce is not None])
        replays = []
        for index, pending in enumerate(batch):
            if pending.nonce is not None:
                if pending.nonce in fresh:
                    fresh.discard(pending.nonce)  # a second one in this batch is its replay
                else:
                    replays.append(index)
        repeats = _answer_repeats(session, batch, outcomes)
        for index in replays:
            outcomes[index] = Refusal(ErrorReason.NONCE_REPLAYED, "nonce already used by this key")
        asking = [index for index, outcome in enumerate(outcomes) if outcome is None]
        standings = nodes.get_standings(session, {batch[i].caller.node_id for i in asking})
        latest = artifacts.latest_checkpoint_step(session)
        min_step = None if latest is None else max(0, latest - config.async_level)
        requests: list[tasks.LeaseRequest] = []
        leasing: list[int] = []
        for index in asking:
            pending = batch[index]
            row = standings.get(pending.caller.node_id)
            try:
                if row is None:
                    raise Refusal(ErrorReason.UNKNOWN_KEY, "node is not registered")
                refuse_unusable(row)
                caps = capabilities_from_db(row.capabilities)
            except Exception as error:  # this pull's alone: the others' go on
                outcomes[index] = error
                continue
            environments = pending.environments or (tuple(sorted(caps.environments)) or None)
            cap = min(
                caps.max_concurrent_leases or config.max_leases_per_node, config.max_leases_per_node
            )
            requests.append(tasks.LeaseRequest(pending.caller.node_id, environments, cap))
            leasing.append(index)
        now = self.ctx.clock()
        leased = tasks.lease_tasks(
            session,
            requests,
            now=now,
            lease_duration=config.lease_duration,
            min_checkpoint_step=min_step,
        )
        for index, request, task in zip(leasing, requests, leased, strict=True):
            if task is None:
                outcomes[index] = NoTask(request.environments, min_step)
                continue
            # Built here, in the lease's transaction, so that a pull with a request id has its
            # answer recorded in that same transaction (not a second one).
            response = _lease_response(task, now)
            scope = batch[index].scope
            if scope is not None:
                scope.store(session, response, now)
            outcomes[index] = response
        for index, first in repeats.items():
            # A second pull with the first one's request id hears what the first one recorded,
            # as a retry would (the replay compares the two requests' digests). After a refusal
            # or no task nothing was recorded: it goes again, in the next batch.
            answer = outcomes[first]
            scope = batch[first].scope
            if isinstance(answer, StoredResponse):
                outcomes[index] = StoredResponse(answer.payload)
            elif isinstance(answer, task_service_pb2.PullTaskResponse) and scope is not None:
                outcomes[index] = StoredResponse(scope.record_of(answer))
        return outcomes


def _answer_repeats(
    session: Session, batch: list[_PendingPull], outcomes: list[Any]
) -> dict[int, int]:
    """Look up the batch's request ids (one read per method): a pull answered before gets
    :class:`StoredResponse`. A pull whose request id an earlier pull of the batch carries is
    set to go again; returned: its index, to the index of that earlier pull."""
    first: dict[tuple[str, str, str], int] = {}
    repeats: dict[int, int] = {}
    for index, pending in enumerate(batch):
        scope = pending.scope
        # Every scoped pull is looked up, whether or not an earlier try of its long poll was:
        # another call with its request id may have leased and recorded since.
        if scope is None:
            continue
        key = (scope.method, scope.caller_id, scope.request_id)
        if key in first:
            outcomes[index] = _AGAIN
            repeats[index] = first[key]
        else:
            first[key] = index
    for method in {method for method, _, _ in first}:
        ours = {
            (caller, request_id): i for (m, caller, request_id), i in first.items() if m == method
        }
        for pair, payload in idempotency.lookup_many(session, method, ours).items():
            outcomes[ours[pair]] = StoredResponse(payload)
    return repeats


def _gone(pending: _PendingPull) -> bool:
    return pending.future is not None and pending.future.done()


def _has_work(filters: NoTask, session: Session) -> bool:
    return tasks.has_queued_task(
        session,
        environments=filters.environments,
        min_checkpoint_step=filters.min_checkpoint_step,
    )


def _settled(outcome: Any) -> task_service_pb2.PullTaskResponse | NoTask:
    if isinstance(outcome, BaseException):
        raise outcome
    assert outcome is not _AGAIN, "a pull alone in its batch is never sent again"
    return outcome  # type: ignore[no-any-return]


#: The task spec's key for its prompts' token counts (absent: unknown, see prompt_lengths.py).
PROMPT_TOKENS = "prompt_tokens"


class HeldPolls:
    """The PullTask long polls each node holds open now; beyond ``most`` at once a pull does
    not wait. Every waiting poll re-reads the database each :data:`_POLL_SECONDS`: a node
    holding thousands (one key's rate limit admits thousands in a ``pull_wait_max``) would cost
    thousands of reads a second, and honest calls their latency. A worker pulls one at a time,
    at most one per lease it may hold."""

    def __init__(self, most: int) -> None:
        self.most = most
        self._held: Counter[str] = Counter()

    @contextlib.contextmanager
    def hold(self, node_id: str) -> Iterator[bool]:
        """Count a poll of ``node_id`` while it runs; yields whether it may wait."""
        self._held[node_id] += 1
        try:
            yield self._held[node_id] <= self.most
        finally:
            self._held[node_id] -= 1
            if not self._held[node_id]:
                del self._held[node_id]

    def held(self, node_id: str) -> int:
        """Polls ``node_id`` holds now."""
        return self._held[node_id]


class Dispatcher:
    """Creates tasks from demand and leases them to pulling workers."""

    def __init__(self, ctx: CoordinatorContext) -> None:
        self.ctx = ctx
        self.leases = PullBatcher(ctx)
        self.polls = HeldPolls(ctx.config.max_leases_per_node)
        self.prompt_lengths = PromptLengths(ctx.blobs, ctx.config.data_dir / "tokenizers")

    async def request_rollouts(
        self, caller: Caller, request: rollout_service_pb2.RequestRolloutsRequest
    ) -> rollout_service_pb2.RequestRolloutsResponse:
        """Split the trainer's demand into tasks of ``prompts_per_task`` prompts each (each
        field is in bounds; what relates them is checked here)."""
        v = Violations()
        config = self.ctx.config
        v.require(
            not config.environments or request.environment in config.environments,
            "environment",
            f"this coordinator serves {sorted(config.environments)} (environments)",
        )
        per_task = request.prompts_per_task or 1
        v.require(
            -(-request.prompt_count // per_task) <= MAX_TASKS_PER_REQUEST,
            "prompts_per_task",
            f"the demand would make more than {MAX_TASKS_PER_REQUEST} tasks",
        )
        v.require(
            per_task * request.samples_per_prompt <= MAX_ROLLOUTS_PER_TASK,
            "prompts_per_task",
            f"times samples_per_prompt at most {MAX_ROLLOUTS_PER_TASK} rollouts per task",
        )
        verdict = max_verdict_bytes(
            min(per_task, request.prompt_count) * request.samples_per_prompt,
            request.sampling.max_new_tokens,
        )
        v.require(
            verdict <= config.max_message_bytes,
            "prompts_per_task",
            f"a task's verdict would need up to {verdict} bytes (4 per completion token for the "
            f"validator's log-probabilities), over max_message_bytes ({config.max_message_bytes})",
        )
        v.raise_if_any()
        env_config = json_format.MessageToDict(request.environment_config)
        try:
            # Off the event loop: a verifiers taskset is listed by a sandboxed child (seconds,
            # the first time a configuration is seen).
            environment = await asyncio.to_thread(load_environment, request.environment, env_config)
        except UnknownEnvironmentError as error:
            raise invalid(("environment", str(error))) from error
        except (EnvironmentConfigError, EnvironmentRegistryError) as error:
            raise invalid(("environment_config", str(error))) from error
        normalized_config = dict(environment.config)
        # Prompt ids are drawn from the coordinator seed, the step and the request id, so an
        # auditor can redraw them; workers cannot choose their prompts.
        seed_words = [self.ctx.config.seed, request.rollout_step, *request.request_id.encode()]
        rng = np.random.default_rng(seed_words)
        limit = environment.num_prompts
        if limit is None:
            prompt_ids = rng.integers(0, 2**62, size=request.prompt_count, dtype=np.int64)
        else:
            prompt_ids = rng.integers(0, limit, size=request.prompt_count, dtype=np.int64)
        data_seed = int(rng.integers(0, 2**62))
        # What each assigned prompt's rollouts may claim as prefill: its token count with the
        # checkpoint the tasks are made against (prompt_lengths.py). Off the event loop.
        newest = await self.ctx.run_read(artifacts.latest_checkpoint)
        counted: tuple[int, list[int] | None] | None = None
        if newest is not None:
            lengths = self.prompt_lengths

            def count() -> list[int] | None:
                tokenizer = lengths.tokenizer(newest.manifest)
                if tokenizer is None:
                    return None
                return lengths.count(environment, tokenizer, [int(p) for p in prompt_ids])

            counted = (newest.step, await asyncio.to_thread(count))
        now = self.ctx.clock()

        def work(session: Session) -> rollout_service_pb2.RequestRolloutsResponse:
            latest = artifacts.latest_checkpoint(session)
            if latest is None:
                raise Refusal(
                    ErrorReason.CHECKPOINT_NOT_FOUND,
                    "no checkpoint is published yet: publish one before requesting rollouts",
                )
            # Counted against another checkpoint (one was published meanwhile): unknown.
            prompt_tokens = (
                counted[1] if counted is not None and counted[0] == latest.step else None
            )
            ids = [
                _task_id(caller.node_id, request.request_id, index)
                for index in range(-(-request.prompt_count // per_task))
            ]
            if request.request_id and tasks.get_task(session, ids[0]) is not None:
                # The same demand again (a retry whose answer was lost): create nothing.
                first = tasks.get_task(session, ids[0])
                assert first is not None
                return rollout_service_pb2.RequestRolloutsResponse(
                    task_ids=ids, checkpoint_step=first.checkpoint_step
                )
            new_tasks = []
            for index, start in enumerate(range(0, request.prompt_count, per_task)):
                chunk = prompt_ids[start : start + per_task]
                sampling: dict[str, Any] = {
                    "temperature": request.sampling.temperature,
                    "max_new_tokens": request.sampling.max_new_tokens,
                    "samples_per_prompt": request.samples_per_prompt,
                    "rollout_step": request.rollout_step,
                    "environment_config": normalized_config,
                    "compute_dtype": config.compute_dtype,
                }
                if prompt_tokens is not None:
                    sampling[PROMPT_TOKENS] = prompt_tokens[start : start + per_task]
                new_tasks.append(
                    NewTask(
                        task_id=ids[index],
                        environment=request.environment,
                        checkpoint_step=latest.step,
                        prompt_ids=[str(int(p)) for p in chunk],
                        seed=data_seed,
                        sampling=sampling,
                    )
                )
            tasks.enqueue_tasks(session, new_tasks, now=now)
            return rollout_service_pb2.RequestRolloutsResponse(
                task_ids=[t.task_id for t in new_tasks], checkpoint_step=latest.step
            )

        response = await self.ctx.run_in_transaction(work)
        self.ctx.signals.fire(self.ctx.signals.work_available)
        return response

    async def pull(
        self, caller: Caller, request: task_service_pb2.PullTaskRequest
    ) -> task_service_pb2.PullTaskResponse:
        """Long-poll for a task; lease the oldest matching one (a node's polls beyond
        ``max_leases_per_node`` at once do not wait: see :class:`HeldPolls`)."""
        with self.polls.hold(caller.node_id) as may_wait:
            return await self._pull(caller, request, may_wait)

    async def _pull(
        self, caller: Caller, request: task_service_pb2.PullTaskRequest, may_wait: bool
    ) -> task_service_pb2.PullTaskResponse:
        config = self.ctx.config
        wait = config.pull_wait_max
        if request.HasField("wait"):
            wait = min(request.wait.ToTimedelta(), config.pull_wait_max)
        if not may_wait:
            wait = timedelta(0)
        loop_deadline = self.ctx.clock() + wait
        asked = tuple(sorted(set(request.environments))) or None
        scope = IDEMPOTENCY_SCOPE.get()
        signed = current_nonce()
        nonce = (caller.node_id, signed.nonce, signed.timestamp_ms)
        outcome = await self.leases.lease(caller, asked, scope, nonce)
        while True:
            if not isinstance(outcome, NoTask):
                return outcome
            remaining = (loop_deadline - self.ctx.clock()).total_seconds()
            if remaining <= 0 or self.ctx.signals.stopping:
                return task_service_pb2.PullTaskResponse(retry_after=duration(config.retry_after))
            await wait_for(self.ctx.signals.work_available, min(remaining, _POLL_SECONDS))
            # An idle poll costs a read, not a write: lease only when something is queued.
            if await self.ctx.run_read(functools.partial(_has_work, outcome)):
                outcome = await self.leases.lease(caller, asked, scope)

    async def report_progress(
        self, caller: Caller, request: task_service_pb2.ReportProgressRequest
    ) -> task_service_pb2.ReportProgressResponse:
        """Acknowledge progress on a held lease; returns its deadline."""
        now = self.ctx.clock()

        def work(session: Session) -> task_service_pb2.ReportProgressResponse:
            row = tasks.find_by_lease(session, request.lease_id)
            if row is None or row.lease_holder != caller.node_id:
                raise Refusal(ErrorReason.LEASE_NOT_FOUND, "no such lease held by you")
            if row.fencing_token != request.fencing_token:
                raise lease_outcome_refusal(LeaseOutcome.STALE_LEASE, f"task {row.id}")
            outcome = tasks.lease_state_outcome(row.state, row.lease_deadline, now)
            if outcome is not LeaseOutcome.OK or row.lease_deadline is None:
                raise lease_outcome_refusal(outcome, f"task {row.id}")
            return task_service_pb2.ReportProgressResponse(deadline=timestamp(row.lease_deadline))

        return await self.ctx.run_in_transaction(work)

    async def fail(
        self, caller: Caller, request: task_service_pb2.FailTaskRequest
    ) -> task_service_pb2.FailTaskResponse:
        """Give a leased task back; it is requeued at once (or FAILED after the cap)."""
        now = self.ctx.clock()
        config = self.ctx.config

        def work(session: Session) -> task_service_pb2.FailTaskResponse:
            row = tasks.find_by_lease(session, request.lease_id)
            if row is None or row.lease_holder != caller.node_id:
                raise Refusal(ErrorReason.LEASE_NOT_FOUND, "no such lease held by you")
            outcome = tasks.give_back_task(
                session,
                task_id=row.id,
                lease_id=request.lease_id,
                fencing_token=request.fencing_token,
                node_id=caller.node_id,
                now=now,
                max_attempts=config.max_attempts,
                reason=task_service_pb2.FailReason.Name(request.reason),
                detail=request.message,
            )
            if outcome is not LeaseOutcome.OK:
                refuse_unless_in_standing(session, caller)  # ejected, banned: say so
                raise lease_outcome_refusal(outcome, f"task {row.id}")
            session.refresh(row)
            return task_service_pb2.FailTaskResponse(requeued=row.state == "queued")

        response = await self.ctx.run_in_transaction(work)
        self.ctx.metrics.attempts_ended.labels(caller.node_id, "given_back").inc()
        if response.requeued:
            self.ctx.signals.fire(self.ctx.signals.work_available)
        return response


def _task_id(node_id: str, request_id: str, index: int) -> str:
    """Task ids derive from the demand's request id, so a repeated demand creates nothing."""
    if not request_id:
        return secrets.token_hex(12)
    return blake3.blake3(f"{node_id}\n{request_id}\n{index}".encode()).hexdigest()[:24]
