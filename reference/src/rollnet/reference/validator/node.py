"""The validator process: register, heartbeat, pull validation jobs, judge them, submit verdicts.

``Validator(config, identity).run()`` registers the key with the validator role (the key must be
on the coordinator's ``validators`` allow-list), heartbeats in the background at the
coordinator's interval listing the lease of the job in hand (which extends it), long-polls
``PullValidationJob``, and for each job downloads the rollout blob, makes sure the claimed
checkpoint is loaded (:class:`~rollnet.reference.validator.checkpoint_cache.CheckpointModels`), runs
:func:`~rollnet.reference.validator.pipeline.validate_job` on a thread and submits the verdict.

Nothing is lost when a validator dies: the job's lease expires and the coordinator requeues it;
``SubmitVerdict`` is idempotent by ``request_id`` and the coordinator keeps one verdict per job.
:meth:`Validator.request_stop` (SIGTERM/SIGINT via ``rollnet.sdk.run_until_signalled``)
drains: no more pulls, the job in hand is finished and submitted, the node deregisters, ``run``
returns.

Registration, heartbeats, commands, back-off and refusals for good are the SDK's node lifecycle,
:class:`rollnet.sdk.node.NodeSession` (``validator.session``), the same one workers and trainers
use; this module is the validator's own loop: pull, fetch, judge, submit.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from google.protobuf import duration_pb2

from rollnet.reference.envs import (
    DEFAULT_TIME_LIMIT_S,
    IsolationMode,
    RewardSandbox,
    SandboxError,
)
from rollnet.reference.inference.base import DType
from rollnet.reference.logs import get_logger
from rollnet.reference.validator.checkpoint_cache import CheckpointModels
from rollnet.reference.validator.metrics import ValidatorMetrics
from rollnet.reference.validator.pipeline import (
    ChallengeInvalid,
    EnvironmentCache,
    JobOutcome,
    JobUncheckable,
    refuse_oversized,
    validate_job,
)
from rollnet.sdk.broadcast import RelayShards, TerminalProgress
from rollnet.sdk.checkpoints import CheckpointStore, CheckpointVerificationError
from rollnet.sdk.client import BlobIntegrityError, RollnetClient, TlsConfig
from rollnet.sdk.dtypes import BFLOAT16, FLOAT32, compute_dtype_name
from rollnet.sdk.errors import ErrorReason, RollnetError
from rollnet.sdk.identity import Identity
from rollnet.sdk.node import (
    DEFAULT_NETWORK_ID,
    MAX_RELAY_REPORTS,
    PROTOCOL_VERSION,
    LeaseReport,
    NodeConfig,
    NodeFatalError,
    NodeReport,
    NodeSession,
    StopRequested,
)
from rollnet.sdk.retry import Backoff
from rollnet.sdk.version import software_version
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


class ValidatorFatalError(NodeFatalError):
    """The coordinator refused this validator for good (not allow-listed, wrong network, ...)."""


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
    relays: tuple[str, ...] = ()
    """Relays to fetch checkpoint shards from (docs/broadcast.md); the coordinator serves
    what they cannot."""
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
    software_version: str = software_version("reference-validator")
    reward_time_limit_s: float = DEFAULT_TIME_LIMIT_S
    """Seconds one completion's reward may take in the reward sandbox before its verifier is
    killed (the completion then scores the environment's ``unverifiable_reward``)."""
    reward_isolation: IsolationMode = "auto"
    """Whether the reward sandbox's child runs isolated (:data:`IsolationMode`)."""


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
        self.session = NodeSession(
            NodeConfig.for_role(
                config,
                common_pb2.ROLE_VALIDATOR,
                capabilities=node_pb2.Capabilities(
                    backends=["torch"], dtypes=list(config.dtypes), max_concurrent_leases=1
                ),
            ),
            identity,
            report=self._report,
            on_leases=self._leases_reported,
            logger=logging.getLogger("rollnet.validator"),
        )
        """The node's registration, heartbeats and stop (shared with every role)."""
        self._models = CheckpointModels(
            CheckpointStore(
                config.data_dir / "checkpoints",
                network_id=config.network_id,
                keep=config.keep_checkpoints,
                progress=TerminalProgress("checkpoint"),
                relays=(
                    RelayShards(
                        config.relays,
                        partial_dir=config.data_dir / "checkpoints" / ".relay-partial",
                    )
                    if config.relays
                    else None
                ),
            ),
            device=config.device,
        )
        self._environments = EnvironmentCache(
            RewardSandbox(
                time_limit_s=config.reward_time_limit_s, isolation=config.reward_isolation
            )
        )
        self._lease: task_pb2.Lease | None = None
        self._lease_lost = False
        self._lost = asyncio.Event()

    @property
    def node_id(self) -> str:
        """This validator's node id."""
        return self.identity.node_id

    def request_stop(self) -> None:
        """Stop pulling; finish the job in hand, deregister, return from :meth:`run`."""
        if not self.session.stopping:
            log.info("validator_stop_requested")
        self.session.request_stop()

    @property
    def client(self) -> RollnetClient:
        """The signed client (open while :meth:`run` runs)."""
        return self.session.client

    async def run(self) -> None:
        """Serve until stopped. Raises :class:`ValidatorFatalError` when refused for good."""
        session = self.session
        try:
            if await session.start():
                await self._pull_loop()
                await session.deregister("validator stopped")
        except NodeFatalError:
            pass  # recorded by the session, raised below as this validator's error
        finally:
            await session.close()
            await asyncio.to_thread(self._environments.close)
        if session.fatal is not None:
            raise ValidatorFatalError(str(session.fatal), session.fatal.reason) from session.fatal

    # ---------------------------------------------------------------- plumbing

    def _report(self) -> NodeReport:
        lease = self._lease
        return NodeReport(
            activity=(
                node_service_pb2.ACTIVITY_BUSY
                if lease is not None
                else node_service_pb2.ACTIVITY_IDLE
            ),
            held_lease_ids=[lease.lease_id] if lease is not None else [],
            metrics={"busy": 1.0 if lease is not None else 0.0},
            relay_reports=self._models.store.take_relay_reports(MAX_RELAY_REPORTS),
        )

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

    def _leases_reported(self, leases: Sequence[LeaseReport]) -> None:
        lease = self._lease
        for status in leases:
            if lease is not None and status.lease_id == lease.lease_id and not status.valid:
                self._lease_lost = True
                self._lost.set()
                log.warning("job_lease_lost", lease_id=lease.lease_id)

    async def _fetch(self, what: str, call: Callable[[], Awaitable[T]]) -> T:
        """:meth:`NodeSession.call` for the job in hand's inputs, given up (:class:`_GaveUp`)
        when the job's lease is lost, or ``drain_timeout`` seconds after a stop request."""
        fetching = asyncio.ensure_future(self.session.call(what, call, stoppable=False))
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
        stop = asyncio.ensure_future(self.session.wait_stopped())
        try:
            await asyncio.wait({lost, stop}, return_when=asyncio.FIRST_COMPLETED)
            if not lost.done():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(asyncio.shield(lost), self.config.drain_timeout)
        finally:
            lost.cancel()
            stop.cancel()

    # ---------------------------------------------------------------- jobs

    async def _pull_loop(self) -> None:
        wait = duration_pb2.Duration()
        wait.FromMilliseconds(int(self.config.pull_wait * 1000))
        session = self.session
        while not session.stopping:
            # One request id per pull: a retry after a lost answer returns the same lease.
            request = validation_service_pb2.PullValidationJobRequest(
                request_id=uuid.uuid4().hex, wait=wait
            )
            try:
                # Stopping abandons the long-poll. A job leased in that instant expires and is
                # requeued; nothing is lost.
                response = await session.unless_stopped(
                    session.call(
                        "pull",
                        functools.partial(self.client.validation.pull_validation_job, request),
                    )
                )
            except StopRequested:
                break
            except RollnetError as error:
                log.warning("pull_refused", code=error.code.name, reason=error.reason)
                if await session.sleep(session.backoff(1)):
                    break
                continue
            if response is None:
                break
            if not response.HasField("job"):
                self.metrics.queue_empty_polls.inc()
                retry_after = response.retry_after.ToTimedelta().total_seconds()
                if await session.sleep(max(0.0, retry_after)):
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
                    validate_job,
                    job,
                    blob,
                    model,
                    self._environments,
                    self.session.coordinator_public_key,
                )
            except Exception as error:
                # A fault on this side (the task's environment or prompts cannot be rebuilt
                # here, the reward sandbox cannot build the environment, a bug): no verdict.
                # The lease expires and the job goes back to the queue, for another validator.
                reason = "check_error"
                if isinstance(error, ChallengeInvalid):
                    reason = "challenge_invalid"
                elif isinstance(error, JobUncheckable):
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
            await self.session.call(
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
