"""The validator process: register, heartbeat, pull validation jobs, judge them, submit verdicts.

``Validator(config, identity).run()`` registers the key with the validator role (the key must be
on the coordinator's ``validators`` allow-list), heartbeats in the background at the
coordinator's interval listing the lease of the job in hand (which extends it), long-polls
``PullValidationJob``, and for each job downloads the rollout blob, makes sure the claimed
checkpoint is loaded (:class:`~rollnet.reference.validator.checkpoints.CheckpointModels`), runs
:func:`~rollnet.reference.validator.pipeline.validate_job` on a thread and submits the verdict.

Nothing is lost when a validator dies: the job's lease expires and the coordinator requeues it;
``SubmitVerdict`` is idempotent by ``request_id`` and the coordinator keeps one verdict per job.
:meth:`Validator.request_stop` (SIGTERM/SIGINT via ``rollnet.sdk.worker.run_until_signalled``)
drains: no more pulls, the job in hand is finished and submitted, the node deregisters, ``run``
returns.

The SDK's :class:`rollnet.sdk.worker.Worker` is built around ``PullTask`` and commitments (its
retry and heartbeat helpers are private to it), so this runtime keeps its own small loop, reusing
the SDK's :class:`~rollnet.sdk.worker.Backoff` policy and signed client.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from google.protobuf import duration_pb2

from rollnet.reference.envs import DEFAULT_TIME_LIMIT_S, RewardSandbox, SandboxError
from rollnet.reference.inference.base import DType
from rollnet.reference.logs import get_logger
from rollnet.reference.validator.checkpoints import CheckpointModels
from rollnet.reference.validator.metrics import ValidatorMetrics
from rollnet.reference.validator.pipeline import (
    EnvironmentCache,
    JobOutcome,
    JobUncheckable,
    refuse_oversized,
    validate_job,
)
from rollnet.sdk.checkpoints import CheckpointStore, CheckpointVerificationError
from rollnet.sdk.client import BlobIntegrityError, ConnectionConfig, RollnetClient, TlsConfig
from rollnet.sdk.dtypes import BFLOAT16, FLOAT32, compute_dtype_name
from rollnet.sdk.errors import ErrorReason, RollnetError
from rollnet.sdk.identity import Identity
from rollnet.sdk.retry import RetryPolicy, is_retryable
from rollnet.sdk.worker import DEFAULT_NETWORK_ID, Backoff, default_hardware
from rollnet.v1 import (
    common_pb2,
    node_pb2,
    node_service_pb2,
    task_pb2,
    validation_pb2,
    validation_service_pb2,
)

log = get_logger("rollnet.validator")

T = TypeVar("T")

PROTOCOL_VERSION = common_pb2.ProtocolVersion(major=1, minor=0)

# Refusals no retry can fix: the validator stops and says why.
_FATAL = frozenset(
    {
        ErrorReason.NODE_BANNED,
        ErrorReason.NODE_EJECTED,
        ErrorReason.ROLE_CONFLICT,
        ErrorReason.ROLE_NOT_PERMITTED,
        ErrorReason.ROLE_NOT_ALLOWED,
        ErrorReason.PROTOCOL_VERSION_UNSUPPORTED,
        ErrorReason.AUDIENCE_MISMATCH,
        ErrorReason.KEY_MISMATCH,
        ErrorReason.INVITE_TOKEN_INVALID,
        ErrorReason.COMPUTE_DTYPE_UNSUPPORTED,
    }
)
# Refusals after which the coordinator no longer knows this node: register again.
_REREGISTER = frozenset({ErrorReason.UNKNOWN_KEY, ErrorReason.NODE_DEREGISTERED})


class ValidatorFatalError(Exception):
    """The coordinator refused this validator for good (not allow-listed, wrong network, ...)."""


class _Stopped(Exception):
    """A stop was requested while waiting to retry."""


class _GaveUp(Exception):
    """The job in hand's inputs are no longer worth waiting for."""


@dataclass(frozen=True, slots=True)
class ValidatorConfig:
    """How a :class:`Validator` reaches its coordinator and runs its model."""

    target: str
    """Coordinator address, ``host:port``."""
    data_dir: Path
    """Where verified checkpoints are kept (``checkpoints/step-<n>/``)."""
    network_id: str = DEFAULT_NETWORK_ID
    """The network id every call is signed for."""
    tls: TlsConfig | None = None
    """``None`` for plaintext (loopback and tests)."""
    device: str = "cpu"
    """Torch device of the prefill model."""
    dtypes: tuple[DType, ...] = (FLOAT32, BFLOAT16)
    """The dtypes this validator may prefill in, named at registration (a network computing in
    another refuses it). Each job is prefilled in its task's ``compute_dtype`` with that dtype's
    calibrated thresholds; a job in a dtype not listed here is left for another validator."""
    keep_checkpoints: int = 3
    """Checkpoint versions kept on disk (``async_level + 1``); two stay loaded in memory."""
    pull_wait: float = 20.0
    """Seconds a PullValidationJob long-poll may wait (the coordinator caps it)."""
    call_timeout: float = 30.0
    """Deadline of one unary call attempt, in seconds."""
    backoff: Backoff = field(default_factory=Backoff)
    """Waits between retries of calls that must eventually succeed."""
    heartbeat_jitter: float = 0.1
    """Relative spread of heartbeat intervals."""
    drain_timeout: float = 60.0
    """On stop, how long the job in hand may still wait for its blob and checkpoint."""
    deregister_timeout: float = 10.0
    """On stop, how long to keep trying to submit the last verdict and deregister."""
    software_version: str = "rollnet-reference-validator/0.1"
    reward_time_limit_s: float = DEFAULT_TIME_LIMIT_S
    """Seconds one completion's reward may take in the reward sandbox before its verifier is
    killed (the completion then scores the environment's ``unverifiable_reward``)."""


class Validator:
    """Runs one validator node until stopped. See the module docs."""

    def __init__(
        self,
        config: ValidatorConfig,
        identity: Identity,
        *,
        metrics: ValidatorMetrics | None = None,
    ) -> None:
        self.config = config
        self.identity = identity
        self.metrics = metrics if metrics is not None else ValidatorMetrics()
        self.verdicts_submitted = 0
        """Verdicts the coordinator recorded in this run."""
        self.last_outcome: JobOutcome | None = None
        self._models = CheckpointModels(
            CheckpointStore(
                config.data_dir / "checkpoints",
                network_id=config.network_id,
                keep=config.keep_checkpoints,
            ),
            device=config.device,
        )
        self._environments = EnvironmentCache(
            RewardSandbox(time_limit_s=config.reward_time_limit_s)
        )
        self._stop = asyncio.Event()
        self._client: RollnetClient | None = None
        self._interval = 10.0
        self._lease: task_pb2.Lease | None = None
        self._lease_lost = False
        self._lost = asyncio.Event()
        self._fatal: ValidatorFatalError | None = None

    @property
    def node_id(self) -> str:
        """This validator's node id."""
        return self.identity.node_id

    def request_stop(self) -> None:
        """Stop pulling; finish the job in hand, deregister, return from :meth:`run`."""
        if not self._stop.is_set():
            log.info("validator_stop_requested")
        self._stop.set()

    @property
    def client(self) -> RollnetClient:
        """The signed client (open while :meth:`run` runs)."""
        if self._client is None:
            raise RuntimeError("the validator is not running")
        return self._client

    async def run(self) -> None:
        """Serve until stopped. Raises :class:`ValidatorFatalError` when refused for good."""
        config = self.config
        self._client = RollnetClient.connect(
            ConnectionConfig(
                target=config.target,
                network_id=config.network_id,
                tls=config.tls,
                timeout=config.call_timeout,
                retry=RetryPolicy.no_retry(),
            ),
            self.identity,
        )
        heartbeats: asyncio.Task[None] | None = None
        try:
            try:
                await self._persist("register", self._register)
            except _Stopped:
                return
            heartbeats = asyncio.create_task(self._heartbeat_loop())
            await self._pull_loop()
            if self._fatal is None:
                await self._deregister()
        except ValidatorFatalError as error:
            self._fatal = self._fatal or error
        finally:
            if heartbeats is not None:
                heartbeats.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await heartbeats
            await self.client.close()
            await asyncio.to_thread(self._environments.close)
        if self._fatal is not None:
            raise self._fatal

    # ---------------------------------------------------------------- plumbing

    def _delay(self, failures: int, retry_after: float | None) -> float:
        policy = self.config.backoff
        base = min(policy.maximum, policy.initial * policy.multiplier ** (failures - 1))
        delay = base * random.uniform(1 - policy.jitter, 1 + policy.jitter)
        return max(delay, retry_after or 0.0)

    async def _sleep(self, seconds: float, *, stoppable: bool) -> bool:
        """Sleep; wake early on stop when ``stoppable``. True when stopped."""
        if not stoppable:
            await asyncio.sleep(seconds)
            return False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)
        return self._stop.is_set()

    def _prefill_dtype(self, task: task_pb2.Task) -> DType | None:
        """The dtype to prefill ``task``'s rollouts in, or None when this validator may not."""
        try:
            name = compute_dtype_name(task.compute_dtype)
        except ValueError:
            return None
        for dtype in self.config.dtypes:
            if dtype == name:
                return dtype
        return None

    def _fail(self, error: RollnetError | str) -> ValidatorFatalError:
        message = error if isinstance(error, str) else f"{error.reason}: {error.message}"
        log.error("validator_refused", detail=message)
        self._fatal = self._fatal or ValidatorFatalError(message)
        self.request_stop()
        return self._fatal

    async def _fetch(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """:meth:`_persist` for the job in hand's inputs, given up (:class:`_GaveUp`) when the
        job's lease is lost, or ``drain_timeout`` seconds after a stop request."""
        fetching = asyncio.ensure_future(self._persist(what, call, stoppable=False))
        giving_up = asyncio.ensure_future(self._until_given_up())
        try:
            await asyncio.wait({fetching, giving_up}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            giving_up.cancel()
            if not fetching.done():
                # Given up, or this coroutine itself was cancelled: the fetch goes too.
                fetching.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await fetching
        if fetching.cancelled():
            raise _GaveUp(f"{what}: lease lost" if self._lost.is_set() else f"{what}: stopping")
        return fetching.result()

    async def _until_given_up(self) -> None:
        """Returns when the job in hand is to be dropped (see :meth:`_fetch`)."""
        lost = asyncio.ensure_future(self._lost.wait())
        stop = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({lost, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not lost.done():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(lost), self.config.drain_timeout)
        finally:
            lost.cancel()
            stop.cancel()

    async def _persist(
        self,
        what: str,
        call: Callable[[], Awaitable[T]],
        *,
        stoppable: bool = True,
        until: float | None = None,
    ) -> T:
        """Call until it succeeds, backing off on transient failures and re-registering when
        forgotten; raises non-transient errors, :class:`ValidatorFatalError`, ``TimeoutError``
        past ``until`` and :class:`_Stopped` on stop when ``stoppable``."""
        failures = 0
        while True:
            try:
                return await call()
            except RollnetError as error:
                if error.reason in _FATAL:
                    raise self._fail(error) from error
                if error.reason in _REREGISTER and what != "register":
                    await self._register()
                    retry_after: float | None = 0.0
                elif is_retryable(error):
                    retry_after = error.retry_after
                else:
                    raise
                failures += 1
                delay = self._delay(failures, retry_after)
                log.warning(
                    "call_failed_retrying",
                    call=what,
                    code=error.code.name,
                    target=self.config.target,
                    detail=(error.message or error.reason)[:200],
                    delay=round(delay, 2),
                )
            if until is not None and time.monotonic() + delay > until:
                raise TimeoutError(f"{what}: gave up")
            if await self._sleep(delay, stoppable=stoppable):
                raise _Stopped(what)

    # ---------------------------------------------------------------- registration, heartbeats

    async def _register(self) -> None:
        config = self.config
        request = node_service_pb2.RegisterNodeRequest(
            request_id=uuid.uuid4().hex,
            public_key=self.identity.public_key,
            role=common_pb2.ROLE_VALIDATOR,
            protocol_version=PROTOCOL_VERSION,
            software_version=config.software_version,
            capabilities=node_pb2.Capabilities(
                backends=["torch"], dtypes=list(config.dtypes), max_concurrent_leases=1
            ),
            hardware=default_hardware(),
        )
        response = await self.client.nodes.register_node(request)
        if response.network_id != config.network_id:
            raise self._fail(
                f"coordinator serves network {response.network_id!r}, not {config.network_id!r}"
            )
        if response.HasField("heartbeat_interval"):
            self._interval = max(0.05, response.heartbeat_interval.ToTimedelta().total_seconds())
        log.info("validator_registered", node_id=self.node_id)

    async def _heartbeat_loop(self) -> None:
        failures = 0
        while True:
            jitter = self.config.heartbeat_jitter
            wait = self._interval * random.uniform(1 - jitter, 1 + jitter)
            if failures:
                wait = min(wait, self._delay(failures, None))
            await asyncio.sleep(wait)
            try:
                await self._heartbeat_once()
                failures = 0
            except RollnetError as error:
                failures += 1
                if error.reason in _FATAL:
                    self._fail(error)
                    return
                if error.reason in _REREGISTER:
                    with contextlib.suppress(RollnetError):
                        await self._register()
                log.warning("heartbeat_failed", code=error.code.name)
            except Exception:
                failures += 1
                log.exception("heartbeat_error")

    async def _heartbeat_once(self) -> None:
        lease = self._lease
        if self._stop.is_set():
            activity = node_service_pb2.ACTIVITY_DRAINING
        elif lease is not None:
            activity = node_service_pb2.ACTIVITY_BUSY
        else:
            activity = node_service_pb2.ACTIVITY_IDLE
        response = await self.client.nodes.heartbeat(
            node_service_pb2.HeartbeatRequest(
                activity=activity,
                held_lease_ids=[lease.lease_id] if lease is not None else [],
                metrics={"busy": 1.0 if lease is not None else 0.0},
            )
        )
        if response.HasField("heartbeat_interval"):
            self._interval = max(0.05, response.heartbeat_interval.ToTimedelta().total_seconds())
        for status in response.leases:
            if lease is not None and status.lease_id == lease.lease_id and not status.valid:
                self._lease_lost = True
                self._lost.set()
                log.warning("job_lease_lost", lease_id=lease.lease_id)
        for command in response.commands:
            kind = command.WhichOneof("command")
            if kind == "drain":
                log.info("drain_commanded", reason=command.drain.reason)
                self.request_stop()
            elif kind == "reregister":
                with contextlib.suppress(RollnetError):
                    await self._register()

    async def _deregister(self) -> None:
        request = node_service_pb2.DeregisterNodeRequest(
            request_id=uuid.uuid4().hex, reason="validator stopped"
        )
        try:
            await self._persist(
                "deregister",
                lambda: self.client.nodes.deregister_node(request),
                stoppable=False,
                until=time.monotonic() + self.config.deregister_timeout,
            )
        except (RollnetError, TimeoutError, ValidatorFatalError) as error:
            log.warning("deregister_failed", detail=str(error)[:200])
            return
        log.info("validator_deregistered")

    # ---------------------------------------------------------------- jobs

    async def _pull_loop(self) -> None:
        wait = duration_pb2.Duration()
        wait.FromMilliseconds(int(self.config.pull_wait * 1000))
        while not self._stop.is_set():
            # One request id per pull: a retry after a lost answer returns the same lease.
            request = validation_service_pb2.PullValidationJobRequest(
                request_id=uuid.uuid4().hex, wait=wait
            )
            pull = asyncio.ensure_future(
                self._persist(
                    "pull",
                    functools.partial(self.client.validation.pull_validation_job, request),
                )
            )
            stop = asyncio.ensure_future(self._stop.wait())
            await asyncio.wait({pull, stop}, return_when=asyncio.FIRST_COMPLETED)
            stop.cancel()
            if not pull.done():
                # Stopping: abandon the long-poll. A job leased in that instant expires and is
                # requeued; nothing is lost.
                pull.cancel()
                with contextlib.suppress(asyncio.CancelledError, _Stopped, RollnetError):
                    await pull
                break
            try:
                response = pull.result()
            except _Stopped:
                break
            except RollnetError as error:
                log.warning("pull_refused", code=error.code.name, reason=error.reason)
                if await self._sleep(self._delay(1, None), stoppable=True):
                    break
                continue
            if not response.HasField("job"):
                self.metrics.queue_empty_polls.inc()
                retry_after = response.retry_after.ToTimedelta().total_seconds()
                if await self._sleep(max(0.0, retry_after), stoppable=True):
                    break
                continue
            # The job in hand is finished even when a stop arrives meanwhile (drain).
            await self._handle(response.job, response.lease)

    async def _handle(self, job: validation_pb2.ValidationJob, lease: task_pb2.Lease) -> None:
        started = time.monotonic()
        self._lease, self._lease_lost = lease, False
        self._lost.clear()
        self.metrics.busy.set(1)
        commitment = job.commitment
        log.info(
            "job_leased",
            job_id=job.job_id,
            commitment_id=commitment.commitment_id,
            worker_node_id=commitment.node_id,
            lease_id=lease.lease_id,
        )
        try:
            oversized = refuse_oversized(job)
            if oversized is not None:
                # Judged from the declared size: the blob is never downloaded or parsed.
                await self._submit(job, lease, oversized)
                return
            dtype = self._prefill_dtype(job.task)
            if dtype is None:
                # Not the worker's fault: no verdict; the lease expires and another validator,
                # one that runs the task's dtype, takes the job.
                self.metrics.abandoned.labels("dtype_unsupported").inc()
                log.error(
                    "job_dtype_unsupported",
                    job_id=job.job_id,
                    compute_dtype=job.task.compute_dtype,
                    dtypes=list(self.config.dtypes),
                )
                return
            try:
                blob = await self._fetch(
                    "get_blob", lambda: self.client.blobs.download(commitment.rollout_batch.blake3)
                )
                fetched = time.monotonic()
                model = await self._fetch(
                    "checkpoint",
                    lambda: self._models.get(job.task.checkpoint_step, dtype, self.client),
                )
            except _GaveUp as gave_up:
                # The lease is gone, or a stop came and the inputs did not arrive within
                # drain_timeout (a coordinator that stopped answering): drop the job; its lease
                # expires and it is requeued.
                self.metrics.abandoned.labels("gave_up").inc()
                log.warning("job_given_up", job_id=job.job_id, detail=str(gave_up))
                return
            except (
                RollnetError,
                CheckpointVerificationError,
                BlobIntegrityError,
                OSError,
            ) as error:
                # Without the blob or a verified checkpoint there is nothing fair to judge. The
                # lease expires and the job goes back to the queue (perhaps to a validator that
                # can fetch them).
                self.metrics.abandoned.labels("inputs_unavailable").inc()
                log.error(
                    "job_inputs_unavailable",
                    job_id=job.job_id,
                    detail=str(error)[:300],
                )
                return
            loaded = time.monotonic()
            try:
                outcome = await asyncio.to_thread(
                    validate_job, job, blob, model, self._environments
                )
            except Exception as error:
                # A fault on this side (the task's environment or prompts cannot be rebuilt
                # here, the reward sandbox cannot build the environment, a bug): no verdict.
                # The lease expires and the job goes back to the queue, for another validator.
                reason = "check_error"
                if isinstance(error, JobUncheckable):
                    reason = "environment_unavailable"
                elif isinstance(error, SandboxError):
                    reason = "reward_sandbox"
                self.metrics.abandoned.labels(reason).inc()
                log.exception("job_check_failed", job_id=job.job_id, reason=reason)
                return
            checked = time.monotonic()
            await self._submit(job, lease, outcome)
            metrics = self.metrics
            metrics.job_seconds.labels("fetch").observe(fetched - started)
            metrics.job_seconds.labels("checkpoint").observe(loaded - fetched)
            metrics.job_seconds.labels("check").observe(checked - loaded)
            log.info(
                "job_judged",
                job_id=job.job_id,
                commitment_id=commitment.commitment_id,
                decision="accept" if outcome.accepted else "reject",
                reject_reason=outcome.reject_reason,
                failed_checks=sorted(outcome.failed_checks),
                notes=outcome.notes[:8],
                rollouts=len(outcome.validated_rewards),
                tokens=outcome.prefill_tokens + outcome.decode_tokens,
                check_seconds=round(checked - loaded, 3),
            )
        finally:
            self._lease = None
            self.metrics.busy.set(0)

    async def _submit(
        self, job: validation_pb2.ValidationJob, lease: task_pb2.Lease, outcome: JobOutcome
    ) -> None:
        request = outcome.to_request(
            job.job_id, lease.lease_id, lease.fencing_token, uuid.uuid4().hex
        )
        try:
            await self._persist(
                "submit_verdict",
                lambda: self.client.validation.submit_verdict(request),
                stoppable=False,
                until=time.monotonic() + max(self.config.deregister_timeout, 60.0),
            )
        except (RollnetError, TimeoutError) as error:
            already = isinstance(error, RollnetError) and (
                error.reason == ErrorReason.VERDICT_ALREADY_RECORDED
            )
            if not already:
                # The lease expired or was re-leased: another validator judges this job.
                self.metrics.abandoned.labels("verdict_refused").inc()
                log.warning(
                    "verdict_refused",
                    job_id=job.job_id,
                    lease_lost=self._lease_lost,
                    detail=str(error)[:300],
                )
                return
        self.verdicts_submitted += 1
        self.last_outcome = outcome
        metrics = self.metrics
        metrics.jobs.labels("accept" if outcome.accepted else "reject").inc()
        if not outcome.accepted:
            metrics.rejects.labels(outcome.reject_reason).inc()
        metrics.tokens.labels("prompt").inc(outcome.prefill_tokens)
        metrics.tokens.labels("completion").inc(outcome.decode_tokens)
        metrics.rollouts.inc(len(outcome.validated_rewards))


__all__ = [
    "PROTOCOL_VERSION",
    "Validator",
    "ValidatorConfig",
    "ValidatorFatalError",
]
