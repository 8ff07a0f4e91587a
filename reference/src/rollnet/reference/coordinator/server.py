"""Assembling and running the coordinator: gRPC server, health, reflection, sweeper, metrics."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import gc
import logging
import math
import signal
import socket
import sys
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from rollnet.ledger import artifacts
from rollnet.ledger import nodes as node_repo
from rollnet.ledger import nonces as nonce_repo
from rollnet.ledger import tasks as task_repo
from rollnet.ledger import validation as job_repo
from rollnet.ledger.engine import create_engine, describe_database_error
from rollnet.ledger.migrate import check_ready, upgrade_to_head
from rollnet.reference.addresses import split_host_port
from rollnet.reference.coordinator import uploads
from rollnet.reference.coordinator.blob_intake import BlobDesk
from rollnet.reference.coordinator.blobstore import BlobStore
from rollnet.reference.coordinator.bounds import RequestBounds
from rollnet.reference.coordinator.checkpoint_desk import CheckpointDesk
from rollnet.reference.coordinator.commitments import CommitmentDesk
from rollnet.reference.coordinator.config import ConfigError, CoordinatorConfig
from rollnet.reference.coordinator.context import CoordinatorContext
from rollnet.reference.coordinator.database_errors import DatabaseErrors, is_connection_lost
from rollnet.reference.coordinator.database_lock import lock_database
from rollnet.reference.coordinator.dispatch import Dispatcher
from rollnet.reference.coordinator.interceptors import (
    CallerLimiter,
    FieldBoundsCheck,
    ReadinessGate,
    ResolvedInterceptors,
    RpcObserver,
    ServingState,
    TokenBuckets,
)
from rollnet.reference.coordinator.keys import KeyDirectory
from rollnet.reference.coordinator.ledger_reads import LedgerDesk
from rollnet.reference.coordinator.metrics import CoordinatorMetrics
from rollnet.reference.coordinator.nonces import NonceLedger
from rollnet.reference.coordinator.registry import NodeRegistry
from rollnet.reference.coordinator.servicers import (
    BlobServicer,
    CheckpointServicer,
    CommitmentServicer,
    Idempotency,
    LedgerServicer,
    NodeServicer,
    RolloutServicer,
    TaskServicer,
    ValidationServicer,
)
from rollnet.reference.coordinator.verdicts import VerdictDesk
from rollnet.sdk.identity import Identity, KeyFileError
from rollnet.sdk.methods import EXEMPT_PREFIXES, default_method_policy, method_path
from rollnet.sdk.verifier import RequestVerifier, VerifierConfig
from rollnet.v1 import (
    blob_service_pb2,
    blob_service_pb2_grpc,
    checkpoint_service_pb2,
    checkpoint_service_pb2_grpc,
    commitment_service_pb2,
    commitment_service_pb2_grpc,
    common_pb2,
    ledger_service_pb2,
    ledger_service_pb2_grpc,
    node_service_pb2,
    node_service_pb2_grpc,
    rollout_service_pb2,
    rollout_service_pb2_grpc,
    task_service_pb2,
    task_service_pb2_grpc,
    validation_service_pb2,
    validation_service_pb2_grpc,
)

if TYPE_CHECKING:
    from rollnet.reference.coordinator.dashboard import Dashboard

log = logging.getLogger("rollnet.coordinator")

#: Seconds calls in flight get to finish when the coordinator stops (long polls end at once).
STOP_GRACE_SECONDS = 1.0

#: Finished validation jobs read per query by the retention sweep.
_RETENTION_PAGE = 500

_SERVICE_DESCRIPTORS = (
    node_service_pb2,
    task_service_pb2,
    blob_service_pb2,
    commitment_service_pb2,
    validation_service_pb2,
    checkpoint_service_pb2,
    rollout_service_pb2,
    ledger_service_pb2,
)


def load_or_create_identity(config: CoordinatorConfig) -> Identity:
    """The coordinator key: loaded from its file, or generated (0600) on first start."""
    path = config.resolved_key_file
    if path.exists():
        return Identity.load(path)
    identity = Identity.generate()
    path.parent.mkdir(parents=True, exist_ok=True)
    identity.save(path)
    return identity


def preflight(config: CoordinatorConfig) -> None:
    """Check what can be checked before anything is created or started: an existing key file
    loads, the TLS files are a PEM certificate chain and its private key, and every listen
    address can be bound. Raises :class:`ConfigError` naming the option and the remedy."""
    key_file = config.resolved_key_file
    if key_file.exists():
        try:
            Identity.load(key_file)
        except KeyFileError as error:
            raise ConfigError(f"key_file: {error}") from None
    if config.tls_cert is not None and config.tls_key is not None:
        check_tls_files(config.tls_cert, config.tls_key)
    ports: dict[int, str] = {}
    for name in ("listen", "metrics_listen", "dashboard_listen"):
        value = getattr(config, name)
        if not value:
            continue
        port = split_host_port(value, allow_port_zero=True)[1]
        if port and port in ports:
            raise ConfigError(
                f"{name} {value}: port {port} is {ports[port]}'s too; give each its own port"
            )
        ports[port] = name
        check_can_listen(name, value)


def check_tls_files(cert: Path, key: Path) -> None:
    """``cert`` is a PEM certificate chain and ``key`` the PEM private key of its first
    certificate; else :class:`ConfigError` naming the file."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    def read(option: str, path: Path) -> bytes:
        try:
            return path.read_bytes()
        except OSError as error:
            raise ConfigError(
                f"{option} {path}: cannot read it: {error.strerror or error}"
            ) from None

    chain = read("tls_cert", cert)
    try:
        leaf = x509.load_pem_x509_certificates(chain)[0]
    except ValueError:
        raise ConfigError(f"tls_cert {cert}: not a PEM certificate chain") from None
    try:
        private = serialization.load_pem_private_key(read("tls_key", key), password=None)
    except (ValueError, TypeError):
        raise ConfigError(f"tls_key {key}: not an unencrypted PEM private key") from None
    raw = serialization.PublicFormat.SubjectPublicKeyInfo
    if private.public_key().public_bytes(
        serialization.Encoding.DER, raw
    ) != leaf.public_key().public_bytes(serialization.Encoding.DER, raw):
        raise ConfigError(f"tls_key {key} is not the key of the certificate in {cert}")


def check_can_listen(option: str, address: str) -> None:
    """Bind ``address`` for a moment: a port in use, or a host that is not this machine's, is
    a :class:`ConfigError` before the database is touched (port 0 always binds)."""
    host, port = split_host_port(address, allow_port_zero=True)
    if port == 0:
        return
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as error:
        raise ConfigError(f"{option} {address}: unknown host {host!r} ({error.strerror})") from None
    for family, kind, proto, _name, sockaddr in found:
        with socket.socket(family, kind, proto) as probe:
            # As the servers themselves bind: connections of a previous run in TIME_WAIT do not
            # block the port (on Linux a listening socket still does).
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(sockaddr)
            except OSError as error:
                why = (
                    "the port is in use (another coordinator?)"
                    if error.errno == errno.EADDRINUSE
                    else error.strerror or str(error)
                )
                raise ConfigError(
                    f"{option} {address}: cannot listen there: {why}; choose another "
                    f"--{option.replace('_', '-')}"
                ) from None


async def open_database(config: CoordinatorConfig, *, migrate: bool) -> Engine:
    """The engine, its schema migrated to head; an unreachable or missing database is a
    :class:`ConfigError` in one line (PostgreSQL's own words, and what to do)."""
    engine = create_engine(config.database_url, config.data_dir)
    try:
        if migrate:
            await asyncio.to_thread(upgrade_to_head, engine)
    except SQLAlchemyError as error:
        engine.dispose()
        url = config.database_url or f"sqlite:///{config.data_dir / 'rollnet.db'}"
        raise ConfigError(f"database: {describe_database_error(error, url)}") from None
    except BaseException:
        engine.dispose()
        raise
    return engine


@dataclass
class Coordinator:
    """A running coordinator (see :func:`start_coordinator`)."""

    ctx: CoordinatorContext
    server: grpc.aio.Server
    port: int
    health: health.aio.HealthServicer
    registry: NodeRegistry
    dispatcher: Dispatcher
    metrics_port: int | None = None
    readiness: ServingState = field(default_factory=ServingState)
    ledger: LedgerDesk | None = None
    dashboard: Dashboard | None = None
    _tasks: list[asyncio.Task[None]] = field(default_factory=list)

    @property
    def address(self) -> str:
        """``host:port`` clients dial."""
        host = self.ctx.config.listen.rsplit(":", 1)[0]
        return f"{host}:{self.port}"

    async def set_serving(self, serving: bool) -> None:
        """Drive the standard health service and the gate in front of every other call."""
        self.readiness.serving = serving
        status = (
            health_pb2.HealthCheckResponse.SERVING
            if serving
            else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        await self.health.set("", status)
        for module in _SERVICE_DESCRIPTORS:
            for service in module.DESCRIPTOR.services_by_name.values():
                await self.health.set(service.full_name, status)

    async def stop(self, grace: float | None = 5.0) -> None:
        """Drain: NOT_SERVING first, then stop accepting calls and finish in-flight ones.

        Long polls answer "come back later" and streams end at once, so ``grace`` bounds only
        calls doing real work. ``None`` aborts in-flight calls at once (a forced stop). Last,
        the ledger's chain head is signed, so a signed head covers every entry written here.
        """
        await self.set_serving(False)
        self.ctx.signals.stop()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        await self.server.stop(grace)
        if self.dashboard is not None:
            await self.dashboard.stop()
        await self.registry.heartbeats.close()
        await self.dispatcher.leases.close()
        if self.ledger is not None:
            try:
                await self.ledger.sign_head()
            except Exception:  # a database gone at shutdown must not hide the rest of it
                log.exception("could not sign the ledger's chain head at shutdown")
        await asyncio.to_thread(self.ctx.metrics.close)
        self.ctx.close()

    async def wait(self) -> None:
        """Wait until the server stops."""
        await self.server.wait_for_termination()


async def sweep_once(ctx: CoordinatorContext) -> None:
    """Requeue expired leases, move silent nodes to SUSPECT/OFFLINE, revoke OFFLINE leases,
    then end queued tasks behind the staleness bound (:func:`expire_stale_tasks`)."""
    config = ctx.config
    now = ctx.clock()
    interval = config.heartbeat_interval

    ended: list[tuple[str, str]] = []  # (node, outcome) of every lease taken back

    def work(session: Session) -> tuple[int, int, list[str]]:
        ended.clear()  # a retried transaction starts over
        stale = node_repo.mark_stale_nodes(
            session,
            suspect_before=now - interval * config.suspect_after_missed,
            offline_before=now - interval * config.offline_after_missed,
            now=now,
        )
        requeued = jobs = 0
        failed_jobs: list[str] = []
        for node_id in stale.offline:
            result = task_repo.requeue_leases_of_node(
                session, node_id, now=now, max_attempts=config.max_attempts
            )
            requeued += len(result.requeued)
            ended.extend((lease.node_id, "taken_back") for lease in result.ended)
            taken = job_repo.requeue_validation_jobs_of_node(
                session, node_id, now=now, max_attempts=config.max_validation_attempts
            )
            jobs += len(taken.requeued)
            failed_jobs += taken.failed
        expired = task_repo.requeue_expired_leases(
            session, now=now, max_attempts=config.max_attempts
        )
        requeued += len(expired.requeued)
        ended.extend((lease.node_id, "expired") for lease in expired.ended)
        taken = job_repo.requeue_expired_validation_jobs(
            session, now=now, max_attempts=config.max_validation_attempts
        )
        jobs += len(taken.requeued)
        failed_jobs += taken.failed
        # Nonces whose signatures expired (signed more than a skew window ago), a skew window
        # later still, in case a replica's clock runs behind this one's.
        nonce_repo.prune_nonces(session, signed_before=now - 2 * config.signature_skew)
        return requeued, jobs, failed_jobs

    requeued, jobs, failed_jobs = await ctx.run_in_transaction(work)
    await expire_stale_tasks(ctx)
    if requeued:
        ctx.metrics.leases_requeued.inc(requeued)
    for node_id, outcome in ended:
        ctx.metrics.attempts_ended.labels(node_id, outcome).inc()
    if requeued or failed_jobs:  # a given-up job's task was queued again
        ctx.signals.fire(ctx.signals.work_available)
    if jobs:
        ctx.signals.fire(ctx.signals.jobs_available)
    if failed_jobs:
        ctx.metrics.validation_failed.inc(len(failed_jobs))
        log.warning(
            "validation given up after max_validation_attempts leases; tasks queued again",
            extra={"jobs": failed_jobs},
        )


#: Batches of stale tasks one sweep ends at most (each its own transaction); the rest wait for
#: the next sweep.
_EXPIRE_BATCHES_PER_SWEEP = 20


async def expire_stale_tasks(ctx: CoordinatorContext) -> int:
    """End queued tasks that no worker may lease any more (their checkpoint is behind the
    staleness bound, ``async_level``) as EXPIRED, in batches; returns how many.

    The trainer does not wait for them: it writes off its demand of checkpoints too old to
    train on, and asks again. Leased tasks are left alone: a lease that ends without a
    commitment requeues its task, and a later sweep expires it then.
    """
    config = ctx.config
    total = 0
    for _ in range(_EXPIRE_BATCHES_PER_SWEEP):
        now = ctx.clock()

        def work(session: Session, now: datetime = now) -> list[str]:
            floor = task_repo.oldest_leasable_step(
                artifacts.latest_checkpoint_step(session), config.async_level
            )
            if not floor:  # no checkpoint yet, or none old enough to be behind the bound
                return []
            return task_repo.expire_stale_tasks(session, min_checkpoint_step=floor, now=now)

        ended = await ctx.run_in_transaction(work)
        if ended:
            total += len(ended)
            ctx.metrics.tasks_expired.inc(len(ended))
            log.info(
                "queued tasks expired behind the staleness bound",
                extra={"tasks": len(ended), "first": ended[0], "async_level": config.async_level},
            )
        if len(ended) < task_repo.EXPIRE_BATCH:
            break
    return total


async def sweep_orphan_blobs(ctx: CoordinatorContext) -> tuple[int, int]:
    """Delete uploads nothing referenced within ``orphan_blob_ttl``; returns (files, bytes)."""
    files, freed = await asyncio.to_thread(
        uploads.sweep_orphans,
        ctx.uploads,
        ctx.blobs,
        ctx.sessions,
        ctx.config.orphan_blob_ttl.total_seconds(),
    )
    if files:
        ctx.metrics.orphan_blobs_deleted.inc(files)
        ctx.metrics.orphan_bytes_deleted.inc(freed)
        log.info("orphan uploads deleted", extra={"files": files, "bytes": freed})
    return files, freed


async def prune_uncredited_blobs(ctx: CoordinatorContext) -> tuple[int, int]:
    """Delete the rollout batches of work that earned no credit (validation rejected it, or
    failed for good) ``rejected_blob_ttl`` after it ended; returns (files, bytes).

    Finished validation jobs are walked in the order they ended, from where the last sweep of
    this process stopped (the first sweep after a start walks them all once). Files go first,
    then the rows are marked pruned: a sweep interrupted between the two deletes nothing twice
    and marks the rest next time.
    """
    ttl = ctx.config.rejected_blob_ttl
    if ttl <= timedelta(0):
        return 0, 0
    cutoff = ctx.clock() - ttl
    files = freed = 0
    while True:
        page = await ctx.run_read(
            partial(
                job_repo.finished_jobs,
                ended_before=cutoff,
                after=ctx.retention_position,
                limit=_RETENTION_PAGE,
            )
        )
        if not page:
            break
        doomed = [job.uncredited_blob for job in page if job.uncredited_blob is not None]
        if doomed:
            gone, size = await asyncio.to_thread(
                uploads.delete_uncredited, ctx.uploads, ctx.blobs, doomed
            )
            mark = partial(artifacts.mark_blobs_pruned, blake3_hexes=gone, now=ctx.clock())
            await ctx.run_in_transaction(mark, scoped=False)
            files, freed = files + len(gone), freed + size
            if len(gone) < len(doomed):
                break  # a file could not be removed: from here again at the next sweep
        ctx.retention_position = (page[-1].ended_at, page[-1].job_id)
        if len(page) < _RETENTION_PAGE:
            break
    if files:
        ctx.metrics.rejected_blobs_pruned.inc(files)
        ctx.metrics.rejected_bytes_pruned.inc(freed)
        log.info("batches of uncredited work deleted", extra={"files": files, "bytes": freed})
    return files, freed


async def _sweep_blobs_forever(ctx: CoordinatorContext) -> None:
    """Adopt what the last run left unreferenced (tried again at each sweep until it succeeds;
    sweeping goes on meanwhile), and sweep."""
    adopted = False

    async def sweep() -> None:
        nonlocal adopted
        if not adopted:
            try:
                found = await asyncio.to_thread(
                    uploads.adopt_unreferenced, ctx.uploads, ctx.blobs, ctx.sessions
                )
            except Exception:
                log.exception("could not look for unreferenced blobs left by an earlier run")
            else:
                adopted = True
                if found:
                    log.info("unreferenced blobs found on start", extra={"files": found})
        await sweep_orphan_blobs(ctx)
        await prune_uncredited_blobs(ctx)

    await _every(ctx.config.blob_sweep_interval.total_seconds(), sweep)


async def _every(seconds: float, action: Any) -> None:
    while True:
        try:
            await action()
        except Exception as error:  # a sweep failing (database blip) must not kill the loop
            if is_connection_lost(error):  # expected while the database restarts: no traceback
                log.warning("periodic task: database connection lost", extra={"error": str(error)})
            else:
                log.exception("periodic task failed")
        await asyncio.sleep(seconds)


async def _serve_when_ready(coordinator: Coordinator, interval: float = 0.25) -> None:
    """Say SERVING as soon as the database answers at the head revision."""
    while True:
        readiness = await asyncio.to_thread(check_ready, coordinator.ctx.engine)
        if readiness.ready:
            break
        await asyncio.sleep(interval)
    log.info("database ready")
    await coordinator.set_serving(True)


async def start_coordinator(config: CoordinatorConfig, *, migrate: bool = True) -> Coordinator:
    """Open the database (migrating it), bind the port, start serving and sweeping.

    Anything wrong with the configuration's files, addresses or database is a
    :class:`ConfigError`, raised before anything is left running.
    """
    await asyncio.to_thread(preflight, config)
    # Before anything touches the database: a second coordinator on one SQLite database is
    # refused (replicas share PostgreSQL). Held until stop(), or until the process ends.
    database_lock = lock_database(config)
    try:
        engine = await open_database(config, migrate=migrate)
        identity = load_or_create_identity(config)
        blobs = BlobStore(
            config.blob_dir,
            max_bytes=config.max_blob_bytes,
            cache_bytes=config.blob_cache_bytes,
        )
        blobs.remove_partials()
    except BaseException:
        if database_lock is not None:
            database_lock.release()
        raise
    metrics = CoordinatorMetrics()
    ctx = CoordinatorContext(
        config=config,
        engine=engine,
        identity=identity,
        blobs=blobs,
        metrics=metrics,
        database_lock=database_lock,
    )
    metrics.pending_upload_bytes.set_function(ctx.uploads.pending_bytes)
    metrics.blob_cache_bytes.set_function(lambda: blobs.cached_bytes)
    metrics.blob_cache_limit_bytes.set(blobs.cache_limit)

    keys = KeyDirectory(ctx)
    nonces = NonceLedger(ctx)
    verifier = RequestVerifier(
        VerifierConfig(
            audience=config.network_id,
            key_resolver=keys.resolve,
            method_policy=default_method_policy(),
            skew=config.signature_skew.total_seconds(),
            max_message_bytes=config.max_message_bytes,
            nonce_max_unregistered_keys=config.max_registering_keys,
            # Allow-listed roles: registered workers filling the shared pool cannot slow them.
            nonce_trusted_roles=frozenset(
                {common_pb2.ROLE_TRAINER, common_pb2.ROLE_VALIDATOR, common_pb2.ROLE_OPERATOR}
            ),
            # An address's registrations admitted within one replay window, and no more: one
            # address alone cannot fill the pool of registering keys.
            nonce_unregistered_per_address=math.ceil(
                config.registrations_per_ip_per_minute
                * 2
                * config.signature_skew
                / timedelta(minutes=1)
            ),
            # Replays are refused across restarts and replicas: nonces live in the database
            # (heartbeats and pulls record theirs in their own batch's transaction).
            nonce_recorder=nonces.record,
            deferred_nonce_methods=frozenset(
                {method_path("NodeService", "Heartbeat"), method_path("TaskService", "PullTask")}
            ),
        )
    )
    # Read at scrape time, through the verifier: a flood of fresh keys shows as "registering".
    cached_keys = metrics.replay_cache_keys
    cached_keys.labels(pool="registered").set_function(lambda: verifier.nonces.registered_keys)
    cached_keys.labels(pool="trusted").set_function(lambda: verifier.nonces.trusted_keys)
    cached_keys.labels(pool="registering").set_function(lambda: verifier.nonces.unregistered_keys)
    metrics.replay_cache_nonces.set_function(lambda: len(verifier.nonces))
    limiter = CallerLimiter(
        TokenBuckets(rate=config.rate_limit_per_key, burst=config.rate_burst_per_key),
        EXEMPT_PREFIXES,
    )
    serving = ServingState()
    server = grpc.aio.server(
        # Outermost first: observe everything, answer a call that lost its database connection
        # UNAVAILABLE (retryable), refuse all but health while not serving, verify
        # signatures (after the message size), limit verified callers, check every field.
        interceptors=[
            ResolvedInterceptors(
                [
                    RpcObserver(metrics),
                    DatabaseErrors(),
                    ReadinessGate(serving, EXEMPT_PREFIXES),
                    verifier,
                    limiter,
                    FieldBoundsCheck(RequestBounds(config)),
                ],
                serving,
            )
        ],
        options=[
            # gRPC refuses a message over its limit itself, before any handler, with a bare
            # RESOURCE_EXHAUSTED; up to twice the cap, the verifier answers MESSAGE_TOO_LARGE
            # with an ErrorInfo instead, as the protocol promises.
            ("grpc.max_receive_message_length", 2 * config.max_message_bytes),
            ("grpc.max_send_message_length", config.max_message_bytes),
            ("grpc.server.max_pending_requests", config.max_pending_calls),
            ("grpc.server.max_pending_requests_hard_limit", 2 * config.max_pending_calls),
            # gRPC sets SO_REUSEPORT by default: a second coordinator on a port already in use
            # would share it with the first, each answering part of the calls.
            ("grpc.so_reuseport", 0),
        ],
    )
    idem = Idempotency(ctx)
    registry = NodeRegistry(ctx)
    registry.heartbeats.lag.start()  # measured from the start, not from the first heartbeat
    writer = ctx.group_commit
    metrics.watch_load(
        lambda: registry.heartbeats.lag.seconds,
        None if writer is None else (lambda: writer.batches),
        None if writer is None else (lambda: writer.jobs),
    )
    dispatcher = Dispatcher(ctx)
    metrics.watch_pulls(lambda: dispatcher.leases.batches, lambda: dispatcher.leases.pulls)
    checkpoints = CheckpointDesk(ctx)
    ledger = LedgerDesk(ctx)
    node_service_pb2_grpc.add_NodeServiceServicer_to_server(
        NodeServicer(ctx, idem, registry), server
    )
    task_service_pb2_grpc.add_TaskServiceServicer_to_server(
        TaskServicer(ctx, idem, dispatcher), server
    )
    blob_service_pb2_grpc.add_BlobServiceServicer_to_server(
        BlobServicer(ctx, idem, BlobDesk(ctx)), server
    )
    commitment_service_pb2_grpc.add_CommitmentServiceServicer_to_server(
        CommitmentServicer(ctx, idem, CommitmentDesk(ctx)), server
    )
    validation_service_pb2_grpc.add_ValidationServiceServicer_to_server(
        ValidationServicer(ctx, idem, VerdictDesk(ctx)), server
    )
    checkpoint_service_pb2_grpc.add_CheckpointServiceServicer_to_server(
        CheckpointServicer(ctx, idem, checkpoints), server
    )
    rollout_service_pb2_grpc.add_RolloutServiceServicer_to_server(
        RolloutServicer(ctx, idem, dispatcher, ledger), server
    )
    ledger_service_pb2_grpc.add_LedgerServiceServicer_to_server(
        LedgerServicer(ctx, idem, ledger), server
    )
    health_servicer = health.aio.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    names = [
        service.full_name
        for module in _SERVICE_DESCRIPTORS
        for service in module.DESCRIPTOR.services_by_name.values()
    ]
    reflection.enable_server_reflection(
        [*names, health.SERVICE_NAME, reflection.SERVICE_NAME], server
    )
    try:
        if config.tls_cert is not None and config.tls_key is not None:
            credentials = grpc.ssl_server_credentials(
                [(config.tls_key.read_bytes(), config.tls_cert.read_bytes())]
            )
            port = server.add_secure_port(config.listen, credentials)
        else:
            port = server.add_insecure_port(config.listen)
    except (RuntimeError, OSError) as error:
        ctx.close()
        raise ConfigError(
            f"listen: cannot serve on {config.listen} (in use, not an address of this machine, "
            f"or unreadable TLS files): {error}"
        ) from None
    coordinator = Coordinator(
        ctx=ctx,
        server=server,
        port=port,
        health=health_servicer,
        registry=registry,
        dispatcher=dispatcher,
        readiness=serving,
        ledger=ledger,
    )
    await coordinator.set_serving(False)
    await server.start()
    try:
        await _start_side_servers(coordinator, config, metrics)
    except BaseException:
        await coordinator.stop(grace=None)
        raise
    readiness = await asyncio.to_thread(check_ready, engine)
    if not readiness.ready:
        log.error("database not ready: %s", readiness.detail)
        # Stay NOT_SERVING but keep looking: the schema may be migrated, or the database come
        # back, after the coordinator started.
        coordinator._tasks.append(asyncio.create_task(_serve_when_ready(coordinator)))
    else:
        await coordinator.set_serving(True)
    coordinator._tasks.append(
        asyncio.create_task(_every(config.sweep_interval.total_seconds(), lambda: sweep_once(ctx)))
    )
    coordinator._tasks.append(
        asyncio.create_task(_every(config.head_sign_interval.total_seconds(), ledger.sign_head))
    )
    coordinator._tasks.append(asyncio.create_task(_sweep_blobs_forever(ctx)))
    return coordinator


async def _start_side_servers(
    coordinator: Coordinator, config: CoordinatorConfig, metrics: CoordinatorMetrics
) -> None:
    """Metrics and dashboard listeners (a port taken since the preflight: ConfigError)."""
    if config.metrics_listen:
        host, port = split_host_port(config.metrics_listen, allow_port_zero=True)
        try:
            coordinator.metrics_port = metrics.serve(host, port)
        except OSError as error:
            raise ConfigError(
                f"metrics_listen {config.metrics_listen}: cannot listen there: "
                f"{error.strerror or error}; choose another --metrics-listen"
            ) from None
    if config.dashboard_listen:
        from rollnet.reference.coordinator.dashboard import start_dashboard

        coordinator.dashboard = await start_dashboard(coordinator.ctx, config.dashboard_listen)


async def serve_forever(config: CoordinatorConfig) -> None:
    """Run until SIGINT/SIGTERM, then drain gracefully."""
    coordinator = await start_coordinator(config)
    # Everything allocated so far (modules, configuration, caches) lives as long as the process:
    # keep it out of the collector's scans, and collect young objects less eagerly. Each call
    # allocates a few hundred objects, so the default threshold (700) ran a collection every
    # couple of calls.
    gc.freeze()
    gc.set_threshold(50_000, 20, 20)
    signals = 0
    stop = asyncio.Event()
    force = asyncio.Event()

    def on_signal() -> None:
        nonlocal signals
        signals += 1
        (stop if signals == 1 else force).set()

    # Installed before the line below is printed: whoever waits for it may signal at once.
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, on_signal)
    # Always said, whatever the log level: scripts and operators wait for this line.
    print(
        f"rollnet coordinator listening on {coordinator.address} (network {config.network_id})",
        file=sys.stderr,
        flush=True,
    )
    if coordinator.dashboard is not None:
        print(f"rollnet coordinator dashboard on {coordinator.dashboard.url}", file=sys.stderr)
    await stop.wait()
    print(
        "rollnet coordinator stopping (Ctrl-C again to stop at once)", file=sys.stderr, flush=True
    )
    log.info("draining")
    drain = asyncio.create_task(coordinator.stop(grace=STOP_GRACE_SECONDS))
    forced = asyncio.create_task(force.wait())
    await asyncio.wait({drain, forced}, return_when=asyncio.FIRST_COMPLETED)
    if not drain.done():
        log.warning("forced stop: calls in flight are aborted")
        # The graceful stop goes on, with its grace cut to nothing: gRPC aborts every call.
        await coordinator.server.stop(None)
    forced.cancel()
    await drain
