"""Turning trainer demand into tasks and handing them out by pull, with leases."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import secrets
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import blake3
import numpy as np
from google.protobuf import json_format
from sqlalchemy.orm import Session

from rollnet.ledger import artifacts, tasks
from rollnet.ledger.leases import LeaseClaim, LeaseOutcome
from rollnet.ledger.tasks import NewTask
from rollnet.reference.coordinator.bounds import MAX_ROLLOUTS_PER_TASK
from rollnet.reference.coordinator.context import (
    IDEMPOTENCY_SCOPE,
    CoordinatorContext,
    wait_for,
)
from rollnet.reference.coordinator.logprobs import max_verdict_bytes
from rollnet.reference.coordinator.prompt_lengths import PromptLengths
from rollnet.reference.coordinator.pull_batching import NoTask, PullBatcher, has_work
from rollnet.reference.coordinator.refusal import (
    Refusal,
    Violations,
    invalid,
    lease_outcome_refusal,
)
from rollnet.reference.coordinator.serde import (
    duration,
    timestamp,
)
from rollnet.reference.coordinator.standing import (
    Caller,
    refuse_unless_in_standing,
)
from rollnet.reference.envs.config import EnvironmentConfigError
from rollnet.reference.envs.registry import (
    EnvironmentRegistryError,
    UnknownEnvironmentError,
    load_environment,
)
from rollnet.sdk.errors import ErrorReason
from rollnet.sdk.verifier import current_nonce
from rollnet.v1 import rollout_service_pb2, task_service_pb2

MAX_TASKS_PER_REQUEST = 10_000
# Long polls re-check the database this often, to see work queued by other replicas.
_POLL_SECONDS = 1.0


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
            if await self.ctx.run_read(functools.partial(has_work, outcome)):
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
            claim = LeaseClaim(row.id, request.lease_id, request.fencing_token, caller.node_id, now)
            outcome = tasks.give_back_task(
                session,
                claim,
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
