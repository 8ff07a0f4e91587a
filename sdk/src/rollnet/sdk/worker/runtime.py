"""The worker runtime: everything but turning a task into rollouts.

``Worker(config, identity, generator).run()`` registers the key, heartbeats in the background
(jittered, at the coordinator's interval, obeying its commands), long-polls ``PullTask``, hands
each leased task to the generator, seals the rollouts into a batch, stores it in the
:class:`~rollnet.sdk.worker.outbox.Outbox`, uploads it, submits the commitment and keeps the signed
receipt. It retries network failures forever with capped, jittered back-off and stops cleanly on
:meth:`Worker.request_stop`: no more pulls, running tasks finish (or are given back after
``drain_timeout``), finished work is submitted, the node deregisters, and ``run`` returns.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import functools
import logging
import os
import random
import signal
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol, TypeVar

from google.protobuf import duration_pb2

from rollnet.sdk.client import ConnectionConfig, RollnetClient
from rollnet.sdk.commitments import seal_batch, verify_receipt
from rollnet.sdk.dtypes import FLOAT32, compute_dtype_name
from rollnet.sdk.errors import ErrorReason, RollnetError
from rollnet.sdk.identity import Identity
from rollnet.sdk.retry import RetryPolicy, is_retryable
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

T = TypeVar("T")


def _log(level: int, event: str, fields: dict[str, object]) -> None:
    """One line per event: a stable snake_case name, then key=value pairs (also as extras)."""
    if log.isEnabledFor(level):
        details = " ".join(f"{key}={value}" for key, value in fields.items())
        log.log(level, "%s %s", event, details, extra=fields)


PROTOCOL_VERSION = common_pb2.ProtocolVersion(major=1, minor=0)

# Refusals after which the coordinator no longer knows us as a live node: register again.
_REREGISTER = frozenset({ErrorReason.UNKNOWN_KEY, ErrorReason.NODE_DEREGISTERED})
# Refusals that end the worker: nothing it can do will make the coordinator accept it.
_FATAL = frozenset(
    {
        ErrorReason.NODE_BANNED,
        ErrorReason.NODE_EJECTED,
        ErrorReason.ROLE_CONFLICT,
        ErrorReason.ROLE_NOT_PERMITTED,
        ErrorReason.INVITE_TOKEN_INVALID,
        ErrorReason.PROTOCOL_VERSION_UNSUPPORTED,
        ErrorReason.AUDIENCE_MISMATCH,
        ErrorReason.KEY_MISMATCH,
        ErrorReason.HARDWARE_CLAIM_IMPLAUSIBLE,
        ErrorReason.COMPUTE_DTYPE_UNSUPPORTED,
    }
)


class WorkerFatalError(Exception):
    """The coordinator refused this worker for good (banned, ejected, wrong network, ...)."""


class _Stopped(Exception):
    """A stoppable retry loop noticed a stop request."""


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

    async def prefetch_checkpoint(self, step: int, client: RollnetClient) -> None:  # noqa: B027
        """The coordinator announced checkpoint ``step``: fetch it before a task needs it.

        The default does nothing; errors are logged and ignored.
        """


def default_hardware() -> node_pb2.HardwareReport:
    """CPU cores and memory of this machine (no accelerators)."""
    cores = os.cpu_count() or 1
    memory = 0
    with contextlib.suppress(ValueError, OSError, AttributeError):
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return node_pb2.HardwareReport(cpu_cores=cores, memory_bytes=memory)


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
        self.hardware = hardware if hardware is not None else default_hardware()
        self.coordinator_public_key = b""
        """The coordinator's receipt-signing key, learned at registration."""
        self.compute_dtype = FLOAT32
        """The dtype the network computes in, learned at registration."""
        self.receipts_received = 0
        """Commitments acknowledged with a receipt in this run (replays included)."""
        self._stop = asyncio.Event()
        self._fatal: WorkerFatalError | None = None
        self._client: RollnetClient | None = None
        self._outbox: Outbox | None = None
        self._interval = 10.0
        self._lease_duration = 120.0
        self._last_heartbeat_ok = time.monotonic()
        self._leases: dict[str, LeaseContext] = {}
        self._submitting: dict[str, PendingSubmission] = {}
        self._work: set[asyncio.Task[None]] = set()
        self._prefetching: set[int] = set()
        self._background: set[asyncio.Task[None]] = set()
        self._register_lock = asyncio.Lock()
        self._draining = False

    # ------------------------------------------------------------------ public surface

    @property
    def node_id(self) -> str:
        """This worker's node id."""
        return self.identity.node_id

    @property
    def stopping(self) -> bool:
        """Whether :meth:`request_stop` was called (or the coordinator said drain)."""
        return self._stop.is_set()

    def request_stop(self) -> None:
        """Stop pulling, finish or give back running tasks, deregister, return from ``run``."""
        if not self._stop.is_set():
            _log(logging.INFO, "worker_stop_requested", {})
        self._stop.set()

    async def run(self) -> None:
        """Serve until stopped. Raises :class:`WorkerFatalError` when refused for good."""
        config = self.config
        self._outbox = Outbox(config.data_dir)
        connection = ConnectionConfig(
            target=config.target,
            network_id=config.network_id,
            tls=config.tls,
            timeout=config.call_timeout,
            # The runtime retries by itself, forever, with its own back-off.
            retry=RetryPolicy.no_retry(),
        )
        self._client = RollnetClient.connect(connection, self.identity)
        heartbeats: asyncio.Task[None] | None = None
        try:
            if await self._register_until_done():
                heartbeats = asyncio.create_task(self._heartbeat_loop())
                for item in self._outbox.pending():
                    _log(logging.INFO, "outbox_resubmit", {"task_id": item.task_id})
                    self._spawn(self._submit(item))
                await self._pull_loop()
                await self._drain()
                if self._fatal is None:
                    await self._deregister()
        finally:
            if heartbeats is not None:
                heartbeats.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await heartbeats
            for task in list(self._background) + list(self._work):
                task.cancel()
            await asyncio.gather(*self._background, *self._work, return_exceptions=True)
            await self._client.close()
            self._outbox.close()
        if self._fatal is not None:
            raise self._fatal

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
        if self._client is None:
            raise RuntimeError("the worker is not running")
        return self._client

    def _backoff(self, failures: int, retry_after: float | None = None) -> float:
        policy = self.config.backoff
        base = min(policy.maximum, policy.initial * policy.multiplier ** (failures - 1))
        delay = base * random.uniform(1 - policy.jitter, 1 + policy.jitter)
        if retry_after is not None:
            delay = max(delay, retry_after)
        return delay

    async def _sleep(self, seconds: float, *, stoppable: bool = True) -> bool:
        """Sleep; with ``stoppable``, wake early when a stop is requested. True if stopped."""
        if not stoppable:
            await asyncio.sleep(seconds)
            return False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)
        return self._stop.is_set()

    def _spawn(self, coroutine: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coroutine)
        self._work.add(task)
        task.add_done_callback(self._work.discard)

    def _background_task(self, coroutine: Awaitable[None]) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coroutine)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def _set_fatal(self, error: RollnetError | str) -> None:
        if self._fatal is None:
            message = error if isinstance(error, str) else f"{error.reason}: {error.message}"
            _log(logging.ERROR, "worker_refused", {"detail": message})
            self._fatal = WorkerFatalError(message)
        self.request_stop()

    async def _persist(
        self,
        what: str,
        call: Callable[[], Awaitable[T]],
        *,
        until: float | None = None,
        stoppable: bool = True,
    ) -> T:
        """Call until it succeeds, backing off on transient failures (forever, or ``until``).

        Re-registers when the coordinator forgot us; raises a non-transient :class:`RollnetError`
        to the caller, :class:`WorkerFatalError` for a fatal refusal, ``TimeoutError`` past
        ``until`` and :class:`_Stopped` when ``stoppable`` and a stop is requested.
        """
        failures = 0
        while True:
            try:
                return await call()
            except RollnetError as error:
                if error.reason in _FATAL:
                    self._set_fatal(error)
                    raise WorkerFatalError(str(error)) from error
                if error.reason in _REREGISTER and what != "register":
                    _log(logging.WARNING, "coordinator_forgot_node", {"call": what})
                    await self._register_once()
                    retry_after: float | None = 0.0
                elif is_retryable(error):
                    retry_after = error.retry_after
                else:
                    raise
                failures += 1
                delay = self._backoff(failures, retry_after)
                _log(
                    logging.WARNING,
                    "call_failed_retrying",
                    {
                        "call": what,
                        "code": error.code.name,
                        "target": self.config.target,
                        "detail": (error.message or error.reason)[:200],
                        "delay": round(delay, 2),
                    },
                )
            if until is not None and time.monotonic() + delay > until:
                raise TimeoutError(f"{what}: gave up")
            if await self._sleep(delay, stoppable=stoppable):
                raise _Stopped(what)

    # ------------------------------------------------------------------ registration

    def _register_request(self) -> node_service_pb2.RegisterNodeRequest:
        config = self.config
        return node_service_pb2.RegisterNodeRequest(
            request_id=uuid.uuid4().hex,
            public_key=self.identity.public_key,
            role=common_pb2.ROLE_WORKER,
            protocol_version=PROTOCOL_VERSION,
            software_version=config.software_version,
            capabilities=node_pb2.Capabilities(
                backends=list(config.backends),
                environments=list(config.environments),
                dtypes=list(config.dtypes),
                max_concurrent_leases=config.max_concurrent_tasks,
            ),
            hardware=self.hardware,
            pool=config.pool,
            invite_token=config.invite_token,
        )

    def _registered(self, response: node_service_pb2.RegisterNodeResponse) -> None:
        if response.network_id != self.config.network_id:
            self._set_fatal(
                f"coordinator serves network {response.network_id!r}, "
                f"not {self.config.network_id!r}"
            )
            return
        try:
            dtype = compute_dtype_name(response.compute_dtype)
        except ValueError:
            dtype = f"unknown ({response.compute_dtype})"
        if self.config.dtypes and dtype not in self.config.dtypes:
            # A coordinator refuses such a registration itself; an older one does not say.
            self._set_fatal(
                f"the network computes in {dtype}; this worker runs {', '.join(self.config.dtypes)}"
            )
            return
        self.compute_dtype = dtype
        self.coordinator_public_key = response.coordinator_public_key
        if response.HasField("heartbeat_interval"):
            self._interval = max(0.05, response.heartbeat_interval.ToTimedelta().total_seconds())
        if response.HasField("lease_duration"):
            self._lease_duration = response.lease_duration.ToTimedelta().total_seconds()
        if response.HasField("server_time"):
            offset = response.server_time.ToMicroseconds() / 1e6 - time.time()
            # Only correct clocks that are really off: small offsets are network delay.
            self.client.signer.clock_offset = offset if abs(offset) > 5.0 else 0.0
        self._last_heartbeat_ok = time.monotonic()
        _log(
            logging.INFO, "worker_registered", {"node_id": self.node_id, "interval": self._interval}
        )

    async def _register_until_done(self) -> bool:
        """Register, retrying transient failures forever. False if stopped first."""
        request = self._register_request()
        try:
            response = await self._persist(
                "register", lambda: self.client.nodes.register_node(request)
            )
        except (_Stopped, WorkerFatalError):
            return False
        except RollnetError as error:
            # Refused and not retryable: a wrong key, role, network or request. Stop and say so.
            self._set_fatal(error)
            return False
        self._registered(response)
        return self._fatal is None

    async def _register_once(self) -> None:
        """Register again after the coordinator forgot us (errors are logged, not raised)."""
        async with self._register_lock:
            try:
                response = await self.client.nodes.register_node(self._register_request())
            except RollnetError as error:
                if error.reason in _FATAL:
                    self._set_fatal(error)
                _log(logging.WARNING, "reregister_failed", {"code": error.code.name})
                return
            self._registered(response)

    # ------------------------------------------------------------------ heartbeats

    def _held_lease_ids(self) -> list[str]:
        ids = set(self._leases)
        ids.update(item.lease_id for item in self._submitting.values())
        return sorted(ids)

    async def _heartbeat_loop(self) -> None:
        failures = 0
        while True:
            jitter = self.config.heartbeat_jitter
            wait = self._interval * random.uniform(1 - jitter, 1 + jitter)
            if failures:
                wait = min(wait, self._backoff(failures))
            await asyncio.sleep(wait)
            try:
                await self._heartbeat_once()
                failures = 0
            except RollnetError as error:
                failures += 1
                if error.reason in _FATAL:
                    self._set_fatal(error)
                    return
                if error.reason in _REREGISTER:
                    await self._register_once()
                _log(logging.WARNING, "heartbeat_failed", {"code": error.code.name})
            except Exception:
                failures += 1
                log.exception("heartbeat_error")

    async def _heartbeat_once(self) -> None:
        if self._draining:
            activity = node_service_pb2.ACTIVITY_DRAINING
        elif self._leases:
            activity = node_service_pb2.ACTIVITY_BUSY
        else:
            activity = node_service_pb2.ACTIVITY_IDLE
        request = node_service_pb2.HeartbeatRequest(
            activity=activity,
            held_lease_ids=self._held_lease_ids(),
            checkpoint_step=self.generator.checkpoint_step,
            metrics={"leases": float(len(self._leases)), "outbox": float(len(self._submitting))},
        )
        sent = time.monotonic()
        response = await self.client.nodes.heartbeat(request)
        self._last_heartbeat_ok = time.monotonic()
        if response.HasField("heartbeat_interval"):
            self._interval = max(0.05, response.heartbeat_interval.ToTimedelta().total_seconds())
        server_now = response.server_time.ToMicroseconds() / 1e6
        for status in response.leases:
            context = self._leases.get(status.lease_id)
            if context is None:
                continue
            if status.valid:
                remaining = status.deadline.ToMicroseconds() / 1e6 - server_now
                context.extend(sent + remaining)
            else:
                context.cancel("the coordinator says the lease is no longer valid")
        for command in response.commands:
            kind = command.WhichOneof("command")
            if kind == "drain":
                _log(logging.INFO, "drain_commanded", {"reason": command.drain.reason})
                self.request_stop()
            elif kind == "reregister":
                await self._register_once()
            elif kind == "update_checkpoint":
                self._prefetch(command.update_checkpoint.step)

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
        while not self._stop.is_set():
            if not await self._unless_stopped(slots.acquire()):
                break
            # One request id per pull: a retry after a lost response returns the same lease.
            request = task_service_pb2.PullTaskRequest(
                request_id=uuid.uuid4().hex, wait=wait, environments=list(self.config.environments)
            )
            try:
                # A stop interrupts the long poll; a lease granted meanwhile is released when
                # the node deregisters.
                response = await self._unless_stopped(
                    self._persist("pull", functools.partial(self.client.tasks.pull_task, request))
                )
            except (_Stopped, WorkerFatalError):
                response = None
            except RollnetError as error:
                slots.release()
                _log(
                    logging.WARNING,
                    "pull_refused",
                    {"code": error.code.name, "reason": error.reason},
                )
                if await self._sleep(self._backoff(1)):
                    break
                continue
            if response is None:
                slots.release()
                break
            if not response.HasField("task"):
                slots.release()
                retry_after = response.retry_after.ToTimedelta().total_seconds()
                if await self._sleep(max(0.0, retry_after)):
                    break
                continue
            self._spawn(self._run_task(response.task, response.lease, slots))

    async def _unless_stopped(self, awaitable: Awaitable[T]) -> T | None:
        """Await ``awaitable`` unless a stop comes first (then cancel it and return None)."""
        work = asyncio.ensure_future(awaitable)
        stop = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({work, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if work.done():
            # A result that arrived together with the stop is still handed over: the caller
            # decides (a semaphore slot must be released, a leased task is simply run).
            return work.result()
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError, _Stopped):
            await work
        return None

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
                    item = self._seal(context, rollouts)
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
        await self._register_once()

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
            await asyncio.sleep(min(1.0, max(0.05, self._interval / 2)))
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
                stalled = now - self._last_heartbeat_ok > 2 * self._interval
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
            await self._persist(
                "fail_task",
                lambda: self.client.tasks.fail_task(request),
                until=time.monotonic() + 2 * self._interval + 5.0,
                stoppable=False,
            )
            _log(logging.INFO, "task_given_back", {"task_id": context.task.task_id})
        except (RollnetError, TimeoutError, WorkerFatalError) as error:
            _log(logging.WARNING, "give_back_failed", {"detail": str(error)[:200]})

    # ------------------------------------------------------------------ sealing and submitting

    def _seal(
        self, context: LeaseContext, rollouts: Sequence[rollout_pb2.Rollout]
    ) -> PendingSubmission:
        """Build the batch and the commitment request; check what a validator would refuse."""
        task, lease = context.task, context.lease
        sealed = seal_batch(
            network_id=self.config.network_id,
            node_id=self.node_id,
            task=task,
            lease=lease,
            rollouts=rollouts,
        )
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
            await self._persist(
                "upload",
                lambda: self.client.blobs.upload(
                    item.batch, blob_service_pb2.BLOB_KIND_ROLLOUT_BATCH
                ),
                stoppable=False,
            )
            response = await self._persist(
                "submit_commitment",
                lambda: self.client.commitments.submit_commitment(request),
                stoppable=False,
            )
        except WorkerFatalError:
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
            _log(logging.ERROR, "receipt_signature_invalid", {"task_id": item.task_id})
        self.outbox.complete(item, response)
        self.receipts_received += 1
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
        self._draining = True
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

    async def _deregister(self) -> None:
        request = node_service_pb2.DeregisterNodeRequest(
            request_id=uuid.uuid4().hex, reason="worker stopped"
        )
        try:
            response = await self._persist(
                "deregister",
                lambda: self.client.nodes.deregister_node(request),
                until=time.monotonic() + self.config.deregister_timeout,
                stoppable=False,
            )
        except (RollnetError, TimeoutError, WorkerFatalError) as error:
            _log(logging.WARNING, "deregister_failed", {"detail": str(error)[:200]})
            return
        _log(logging.INFO, "worker_deregistered", {"released_leases": response.released_leases})


class Stoppable(Protocol):
    """A long-running node (a :class:`Worker`, a validator) that stops cleanly on request."""

    async def run(self) -> None:
        """Serve until stopped."""

    def request_stop(self) -> None:
        """Ask :meth:`run` to drain and return."""


async def run_until_signalled(worker: Stoppable) -> None:
    """Run ``worker``; SIGTERM and SIGINT request a clean stop (the only signal handling here).

    Works for anything with ``run()`` and ``request_stop()`` (workers, validators). Signals can
    be handled only by the main thread's event loop on a platform with loop signal handlers;
    anywhere else ``worker`` runs without them, and ``request_stop()`` is the way to stop it.
    """
    loop = asyncio.get_running_loop()
    installed = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        # NotImplementedError: no loop signal handlers here (Windows); RuntimeError: not the
        # main thread. Either way the worker still runs, stoppable through request_stop().
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, worker.request_stop)
            installed.append(signum)
    try:
        await worker.run()
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)


__all__ = [
    "PROTOCOL_VERSION",
    "RolloutGenerator",
    "Worker",
    "WorkerFatalError",
    "default_hardware",
    "run_until_signalled",
]
