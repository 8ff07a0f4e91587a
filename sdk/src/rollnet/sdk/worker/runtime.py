"""The worker runtime: everything but turning a task into rollouts.

``Worker(config, identity, generator).run()`` registers the key and heartbeats in the background
through a :class:`~rollnet.sdk.node.NodeSession` (the node lifecycle every role shares: jittered
heartbeats at the coordinator's interval, its commands, back-off, refusals for good), long-polls
``PullTask``, hands each leased task to the generator, seals the rollouts into a batch, stores it
in the :class:`~rollnet.sdk.worker.outbox.Outbox`, uploads it, submits the commitment and keeps
the signed receipt. It retries network failures forever with capped, jittered back-off and stops
cleanly on :meth:`Worker.request_stop`: no more pulls, running tasks finish (or are given back
after ``drain_timeout``), finished work is submitted, the node deregisters, and ``run`` returns.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Sequence
from typing import Any

from google.protobuf import duration_pb2

from rollnet.sdk.batches import SealedBatch, seal
from rollnet.sdk.client import RollnetClient
from rollnet.sdk.commitments import verify_receipt
from rollnet.sdk.dtypes import compute_dtype_name
from rollnet.sdk.errors import RollnetError
from rollnet.sdk.identity import Identity
from rollnet.sdk.node import (
    MAX_RELAY_REPORTS,
    PROTOCOL_VERSION,
    LeaseReport,
    NodeConfig,
    NodeFatalError,
    NodeReport,
    NodeSession,
    StopRequested,
    default_hardware,
    log_event,
    run_until_signalled,
)
from rollnet.sdk.worker.config import WorkerConfig
from rollnet.sdk.worker.lease import LeaseContext, LeaseLost
from rollnet.sdk.worker.outbox import Outbox, PendingSubmission
from rollnet.v1 import (
    blob_service_pb2,
    common_pb2,
    node_pb2,
    node_service_pb2,
    rollout_pb2,
    task_pb2,
    task_service_pb2,
)

log = logging.getLogger("rollnet.worker")


def _log(level: int, event: str, fields: dict[str, object]) -> None:
    log_event(log, level, event, fields)


class WorkerFatalError(NodeFatalError):
    """The coordinator refused this worker for good (banned, ejected, wrong network, ...)."""


class RolloutGenerator(abc.ABC):
    """The one thing a worker author writes: turn a leased task into rollouts.

    Subclass it and implement :meth:`generate`. The runtime fills the batch metadata, checks the
    rollout count and seeds, computes every digest, uploads, commits and keeps the receipt.
    """

    @abc.abstractmethod
    async def generate(
        self, task: task_pb2.Task, lease: LeaseContext
    ) -> Sequence[rollout_pb2.Rollout]:
        """Return ``len(task.prompt_ids) * task.samples_per_prompt`` rollouts ordered by
        ``(prompt_index, sample_index)``; rollout ``i`` must be sampled with
        ``lease.sampling_seed(i)``. Check ``lease.cancelled`` (or call
        ``lease.raise_if_cancelled()``) between steps and report progress with
        ``lease.report_progress``. Blocking work belongs on a thread (``asyncio.to_thread``) so
        heartbeats keep flowing."""

    @property
    def checkpoint_step(self) -> int:
        """The newest checkpoint step loaded (reported in heartbeats; 0 when none)."""
        return 0

    def take_relay_reports(self, limit: int) -> Sequence[node_service_pb2.RelayReport]:
        """Relays that served wrong checkpoint bytes since the last call (at most ``limit``),
        for the next heartbeat; a generator fetching from relays returns its
        :meth:`~rollnet.sdk.checkpoints.CheckpointStore.take_relay_reports`. Default: none."""
        return ()

    async def prefetch_checkpoint(self, step: int, client: RollnetClient) -> None:  # noqa: B027
        """The coordinator announced checkpoint ``step``: fetch it before a task needs it.

        The default does nothing; errors are logged and ignored.
        """


class Worker:
    """Runs one worker node until it is stopped. See the module docs."""

    def __init__(
        self,
        config: WorkerConfig,
        identity: Identity,
        generator: RolloutGenerator,
        *,
        hardware: node_pb2.HardwareReport | None = None,
    ) -> None:
        self.config = config
        self.identity = identity
        self.generator = generator
        self.session = NodeSession(
            NodeConfig.for_role(
                config,
                common_pb2.ROLE_WORKER,
                capabilities=node_pb2.Capabilities(
                    backends=list(config.backends),
                    environments=list(config.environments),
                    dtypes=list(config.dtypes),
                    max_concurrent_leases=config.max_concurrent_tasks,
                ),
                hardware=hardware,
                pool=config.pool,
                invite_token=config.invite_token,
            ),
            identity,
            report=self._report,
            on_leases=self._leases_reported,
            on_checkpoint=self._prefetch,
            logger=log,
        )
        """The node's registration, heartbeats and stop (shared with every role)."""
        self.hardware = self.session.hardware
        self.receipts_kept = 0
        """Commitments acknowledged in this run with a receipt the worker kept (replays
        included): its signature verified with the coordinator key of registration, or no key
        was given to check it with."""
        self.receipts_invalid = 0
        """Receipts refused because their signature did not verify (their work dropped)."""
        self._outbox: Outbox | None = None
        self._leases: dict[str, LeaseContext] = {}
        self._submitting: dict[str, PendingSubmission] = {}
        self._work: set[asyncio.Task[None]] = set()
        self._prefetching: set[int] = set()
        self._background: set[asyncio.Task[None]] = set()

    # ------------------------------------------------------------------ public surface

    @property
    def node_id(self) -> str:
        """This worker's node id."""
        return self.identity.node_id

    @property
    def coordinator_public_key(self) -> bytes:
        """The coordinator's receipt-signing key, learned at registration."""
        return self.session.coordinator_public_key

    @property
    def compute_dtype(self) -> str:
        """The dtype the network computes in, learned at registration."""
        return self.session.compute_dtype

    @property
    def stopping(self) -> bool:
        """Whether :meth:`request_stop` was called (or the coordinator said drain)."""
        return self.session.stopping

    def request_stop(self) -> None:
        """Stop pulling, finish or give back running tasks, deregister, return from ``run``."""
        if not self.session.stopping:
            _log(logging.INFO, "worker_stop_requested", {})
        self.session.request_stop()

    async def run(self) -> None:
        """Serve until stopped. Raises :class:`WorkerFatalError` when refused for good."""
        session = self.session
        self._outbox = Outbox(self.config.data_dir)
        try:
            if await session.start():
                for item in self._outbox.pending():
                    _log(logging.INFO, "outbox_resubmit", {"task_id": item.task_id})
                    self._spawn(self._submit(item))
                await self._pull_loop()
                await self._drain()
                await session.deregister("worker stopped")
        finally:
            for task in list(self._background) + list(self._work):
                task.cancel()
            await asyncio.gather(*self._background, *self._work, return_exceptions=True)
            await session.close()
            self._outbox.close()
        if session.fatal is not None:
            raise WorkerFatalError(str(session.fatal), session.fatal.reason) from session.fatal

    @property
    def outbox(self) -> Outbox:
        """The outbox (open while :meth:`run` runs)."""
        if self._outbox is None:
            raise RuntimeError("the worker is not running")
        return self._outbox

    # ------------------------------------------------------------------ plumbing

    @property
    def client(self) -> RollnetClient:
        """The signed client (open while :meth:`run` runs)."""
        return self.session.client

    def _spawn(self, coroutine: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coroutine)
        self._work.add(task)
        task.add_done_callback(self._work.discard)

    def _background_task(self, coroutine: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    # ------------------------------------------------------------------ heartbeats

    def _report(self) -> NodeReport:
        held = set(self._leases)
        held.update(item.lease_id for item in self._submitting.values())
        return NodeReport(
            activity=(
                node_service_pb2.ACTIVITY_BUSY if self._leases else node_service_pb2.ACTIVITY_IDLE
            ),
            held_lease_ids=sorted(held),
            checkpoint_step=self.generator.checkpoint_step,
            metrics={"leases": float(len(self._leases)), "outbox": float(len(self._submitting))},
            relay_reports=self.generator.take_relay_reports(MAX_RELAY_REPORTS),
        )

    def _leases_reported(self, leases: Sequence[LeaseReport]) -> None:
        for status in leases:
            context = self._leases.get(status.lease_id)
            if context is None:
                continue
            if status.valid:
                context.extend(status.deadline)
            else:
                context.cancel("the coordinator says the lease is no longer valid")

    def _prefetch(self, step: int) -> None:
        if step in self._prefetching or step <= self.generator.checkpoint_step:
            return
        self._prefetching.add(step)

        async def fetch() -> None:
            try:
                await self.generator.prefetch_checkpoint(step, self.client)
                # Heartbeats repeat the command until the step is loaded; fetch only once.
                return
            except Exception:
                log.exception("checkpoint_prefetch_failed", extra={"step": step})
            # Failed: let a later command try again.
            self._prefetching.discard(step)

        self._background_task(fetch())

    # ------------------------------------------------------------------ pulling

    async def _pull_loop(self) -> None:
        slots = asyncio.Semaphore(self.config.max_concurrent_tasks)
        wait = duration_pb2.Duration()
        wait.FromMilliseconds(int(self.config.pull_wait * 1000))
        session = self.session
        while not session.stopping:
            if not await session.unless_stopped(slots.acquire()):
                break
            # One request id per pull: a retry after a lost response returns the same lease.
            request = task_service_pb2.PullTaskRequest(
                request_id=uuid.uuid4().hex, wait=wait, environments=list(self.config.environments)
            )
            try:
                # A stop interrupts the long poll; a lease granted meanwhile is released when
                # the node deregisters.
                response = await session.unless_stopped(
                    session.call("pull", functools.partial(self.client.tasks.pull_task, request))
                )
            except (StopRequested, NodeFatalError):
                response = None
            except RollnetError as error:
                slots.release()
                _log(
                    logging.WARNING,
                    "pull_refused",
                    {"code": error.code.name, "reason": error.reason},
                )
                if await session.sleep(session.backoff(1)):
                    break
                continue
            if response is None:
                slots.release()
                break
            if not response.HasField("task"):
                slots.release()
                retry_after = response.retry_after.ToTimedelta().total_seconds()
                if await session.sleep(max(0.0, retry_after)):
                    break
                continue
            self._spawn(self._run_task(response.task, response.lease, slots))

    async def _run_task(
        self, task: task_pb2.Task, lease: task_pb2.Lease, slots: asyncio.Semaphore
    ) -> None:
        remaining = (lease.deadline.ToMicroseconds() - lease.issued_at.ToMicroseconds()) / 1e6
        context = LeaseContext(
            task=task,
            lease=lease,
            network_id=self.config.network_id,
            node_id=self.node_id,
            client=self.client,
            deadline=time.monotonic() + remaining,
        )
        self._leases[lease.lease_id] = context
        _log(logging.INFO, "task_leased", {"task_id": task.task_id, "lease_id": lease.lease_id})
        item: PendingSubmission | None = None
        try:
            refusal = self._dtype_refusal(task)
            if refusal:
                context.cancel(
                    refusal, give_back=task_service_pb2.FAIL_REASON_COMPUTE_DTYPE_UNSUPPORTED
                )
                await self._refuse_dtype(context)
                return
            rollouts = await self._generate(context)
            if rollouts is not None:
                try:
                    item = self._pending(context, rollouts)
                except ValueError as error:
                    _log(logging.ERROR, "rollouts_invalid", {"detail": str(error)})
                    await self._give_back(
                        context, task_service_pb2.FAIL_REASON_BACKEND_ERROR, message=str(error)
                    )
                else:
                    self.outbox.put(item)
        finally:
            del self._leases[lease.lease_id]
            slots.release()
        if item is not None:
            await self._submit(item)

    def _dtype_refusal(self, task: task_pb2.Task) -> str:
        """Why this worker may not generate ``task`` in its dtype ("" when it may)."""
        try:
            dtype = compute_dtype_name(task.compute_dtype)
        except ValueError as error:
            return f"task {task.task_id}: {error}"
        if self.config.dtypes and dtype not in self.config.dtypes:
            return (
                f"task {task.task_id} is to be generated in {dtype}; this worker runs "
                f"{', '.join(self.config.dtypes)}"
            )
        return ""

    async def _refuse_dtype(self, context: LeaseContext) -> None:
        """Give back a task in a dtype this worker does not run, then register again.

        The coordinator admitted this worker for its dtype, so the task predates a change of the
        network's dtype, or the network changed since. Registering again tells which: refused
        (the network moved on: the worker stops, ``COMPUTE_DTYPE_UNSUPPORTED``) or admitted (an
        old task: the worker carries on; another worker takes the task).
        """
        _log(
            logging.ERROR,
            "task_dtype_unsupported",
            {"task_id": context.task.task_id, "detail": context.cancel_reason},
        )
        await self._give_back(context, context.give_back_reason)
        await self.session.register_again()

    async def _generate(self, context: LeaseContext) -> Sequence[rollout_pb2.Rollout] | None:
        """Run the generator under a watchdog; None when the work was abandoned."""
        generation = asyncio.ensure_future(self.generator.generate(context.task, context))
        watchdog = asyncio.ensure_future(self._watch(context, generation))
        try:
            rollouts = await generation
        except (LeaseLost, asyncio.CancelledError):
            if not context.cancelled:
                raise  # our own task was cancelled (shutdown), not the generation
            await self._abandon(context)
            return None
        except Exception as error:
            log.exception("generation_failed", extra={"task_id": context.task.task_id})
            context.cancel(f"generation failed: {error}")
            await self._give_back(
                context, task_service_pb2.FAIL_REASON_BACKEND_ERROR, message=str(error)[:500]
            )
            return None
        finally:
            watchdog.cancel()
        if context.cancelled:
            await self._abandon(context)
            return None
        return rollouts

    async def _abandon(self, context: LeaseContext) -> None:
        """Give back a task whose generation was cancelled, with the reason it was cancelled for."""
        if context.give_back_reason == task_service_pb2.FAIL_REASON_COMPUTE_DTYPE_UNSUPPORTED:
            await self._refuse_dtype(context)  # the generator found the task's dtype wrong
            return
        _log(
            logging.WARNING,
            "task_abandoned",
            {"task_id": context.task.task_id, "reason": context.cancel_reason},
        )
        await self._give_back(context, context.give_back_reason)

    async def _watch(self, context: LeaseContext, generation: asyncio.Future[Any]) -> None:
        """Cancel the generation when the lease is lost or cannot be finished in time."""
        last_reported = -1
        while not generation.done():
            await asyncio.sleep(min(1.0, max(0.05, self.session.heartbeat_interval / 2)))
            now = time.monotonic()
            completed, total = context.progress
            if context.cancelled:
                pass
            elif now >= context.deadline:
                context.cancel("the lease deadline passed")
            elif completed and total > completed:
                elapsed = now - context.started
                finish = now + elapsed / completed * (total - completed)
                # Heartbeats extend the lease while they get through; only when they stopped
                # getting through is the current deadline the real one.
                interval = self.session.heartbeat_interval
                stalled = now - self.session.last_heartbeat_ok > 2 * interval
                if stalled and finish > context.deadline:
                    context.cancel(
                        "cannot finish before the lease deadline",
                        give_back=task_service_pb2.FAIL_REASON_DEADLINE,
                    )
            if context.cancelled:
                generation.cancel()
                return
            if completed != last_reported:
                last_reported = completed
                self._background_task(self._report_progress(context, completed, total))

    async def _report_progress(self, context: LeaseContext, completed: int, total: int) -> None:
        with contextlib.suppress(RollnetError):
            await self.client.tasks.report_progress(
                task_service_pb2.ReportProgressRequest(
                    lease_id=context.lease_id,
                    fencing_token=context.lease.fencing_token,
                    completed_rollouts=completed,
                    total_rollouts=total,
                )
            )

    async def _give_back(
        self,
        context: LeaseContext,
        reason: task_service_pb2.FailReason.ValueType | None,
        *,
        message: str = "",
    ) -> None:
        """FailTask, a few attempts at most: an expired lease requeues the task by itself."""
        if reason is None:
            return
        request = task_service_pb2.FailTaskRequest(
            request_id=uuid.uuid4().hex,
            lease_id=context.lease_id,
            fencing_token=context.lease.fencing_token,
            reason=reason,
            message=message or context.cancel_reason,
        )
        try:
            await self.session.call(
                "fail_task",
                lambda: self.client.tasks.fail_task(request),
                until=time.monotonic() + 2 * self.session.heartbeat_interval + 5.0,
                stoppable=False,
            )
            _log(logging.INFO, "task_given_back", {"task_id": context.task.task_id})
        except (RollnetError, TimeoutError, NodeFatalError) as error:
            _log(logging.WARNING, "give_back_failed", {"detail": str(error)[:200]})

    @property
    def receipts_received(self) -> int:
        """:attr:`receipts_kept` under its rollnet 0.1 name (it never counted receipts refused
        for their signature: those are :attr:`receipts_invalid`)."""
        return self.receipts_kept

    # ------------------------------------------------------------------ sealing and submitting

    def seal(self, context: LeaseContext, rollouts: Sequence[rollout_pb2.Rollout]) -> SealedBatch:
        """The batch and commitment request for the generated ``rollouts`` of a lease:
        :func:`rollnet.sdk.batches.seal` under ``context.binding`` (``ValueError`` for rollouts
        a validator would refuse; the task is then given back).

        The hook for what a worker commits: a subclass may override it (the adversary of the
        reference implementation does, to commit work it should not)."""
        return seal(context.binding, context.task, rollouts)

    def _pending(
        self, context: LeaseContext, rollouts: Sequence[rollout_pb2.Rollout]
    ) -> PendingSubmission:
        """The outbox entry for ``rollouts``: :meth:`seal`, with a fresh request id."""
        task, lease = context.task, context.lease
        sealed = self.seal(context, rollouts)
        request = sealed.request
        request.request_id = uuid.uuid4().hex
        return PendingSubmission(
            request_id=request.request_id,
            task_id=task.task_id,
            lease_id=lease.lease_id,
            fencing_token=lease.fencing_token,
            batch=sealed.batch,
            commitment_request=request.SerializeToString(deterministic=True),
        )

    async def _submit(self, item: PendingSubmission) -> None:
        """Upload and commit one outbox entry until a receipt or a final refusal."""
        if item.request_id in self._submitting:
            return
        self._submitting[item.request_id] = item
        request = item.request()
        try:
            await self.session.call(
                "upload",
                lambda: self.client.blobs.upload(
                    item.batch, blob_service_pb2.BLOB_KIND_ROLLOUT_BATCH
                ),
                stoppable=False,
            )
            response = await self.session.call(
                "submit_commitment",
                lambda: self.client.commitments.submit_commitment(request),
                stoppable=False,
            )
        except NodeFatalError:
            return
        except RollnetError as error:
            # The lease expired, was re-leased or closed, or the batch is refused: this work can
            # never be committed. Remember why and move on.
            reason = f"{error.code.name} {error.reason}: {error.message}"
            _log(logging.WARNING, "commitment_refused", {"task_id": item.task_id, "detail": reason})
            self.outbox.drop(item, reason)
            return
        finally:
            self._submitting.pop(item.request_id, None)
        if self.coordinator_public_key and not verify_receipt(
            response.receipt, self.coordinator_public_key
        ):
            # Not kept as a receipt: it proves nothing. Asking again would replay the same
            # answer (the same request id), so the submission is dropped, saying why.
            _log(logging.ERROR, "receipt_signature_invalid", {"task_id": item.task_id})
            self.receipts_invalid += 1
            self.outbox.drop(
                item,
                "the receipt's signature does not verify with the coordinator key given at "
                "registration",
            )
            return
        self.outbox.complete(item, response)
        self.receipts_kept += 1
        _log(
            logging.INFO,
            "commitment_receipt",
            {
                "task_id": item.task_id,
                "commitment_id": response.commitment.commitment_id,
            },
        )

    # ------------------------------------------------------------------ stopping

    async def _drain(self) -> None:
        """Let running tasks finish within ``drain_timeout``, then give the rest back."""
        config = self.config
        if self._work:
            _log(logging.INFO, "worker_draining", {"tasks": len(self._leases)})
            await asyncio.wait(set(self._work), timeout=config.drain_timeout)
        for context in list(self._leases.values()):
            context.cancel(
                "the worker is draining", give_back=task_service_pb2.FAIL_REASON_DRAINING
            )
        if self._work:
            # Given-back tasks end quickly; submissions get a bounded last chance.
            await asyncio.wait(set(self._work), timeout=config.deregister_timeout)
        for task in list(self._work):
            task.cancel()
        await asyncio.gather(*self._work, return_exceptions=True)


__all__ = [
    "PROTOCOL_VERSION",
    "RolloutGenerator",
    "Worker",
    "WorkerFatalError",
    "default_hardware",
    "run_until_signalled",
]
