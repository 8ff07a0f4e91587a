"""One node's life with its coordinator, the same for every role: :class:`NodeSession`.

A worker, a validator and a trainer differ in their work, not in how they stay known to the
coordinator. :class:`NodeSession` does that part for each of them:

* **registration** with the node's key and role, retried with back-off while the coordinator is
  unreachable (forever, until :meth:`NodeSession.request_stop`); the coordinator's network id,
  heartbeat interval, lease duration, clock and receipt key are taken from the answer;
* **heartbeats** in the background at the interval the coordinator grants (jittered, so a swarm
  does not beat in step; the reply's interval is followed from then on), each reporting what
  the node says it is doing (:class:`NodeReport`). Lease statuses go to the node
  (:class:`LeaseReport`); commands are followed: *drain* stops the session, *re-register*
  registers again, *update checkpoint* is handed to the node;
* **calls that must eventually succeed** (:meth:`NodeSession.call`): retried with the one
  back-off (:class:`~rollnet.sdk.retry.Backoff`) on transient failures, re-registering first when
  the coordinator forgot the node (:data:`REREGISTER_REASONS`);
* **refusals for good** (:data:`FATAL_REASONS`, any refused registration, a coordinator serving
  another network): the session records a :class:`NodeFatalError` and stops;
* **stopping**: :meth:`NodeSession.request_stop` wakes every stoppable wait;
  :meth:`NodeSession.deregister` ends the heartbeats and deregisters (within
  ``deregister_timeout``); :meth:`NodeSession.close` releases the connection.

The simplest use, for a node that drives its own loop (a trainer)::

    config = NodeConfig(target="127.0.0.1:7070", role=common_pb2.ROLE_TRAINER)
    async with NodeSession(config, Identity.load("trainer.key")) as session:
        while not session.stopping:
            await session.call("request_rollouts", lambda: session.client.rollouts...)

The library reads no environment variables and installs no signal handlers except through
:func:`run_until_signalled`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import signal
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Protocol, TypeVar

from google.protobuf import duration_pb2

from rollnet.sdk.client import ConnectionConfig, RollnetClient, TlsConfig
from rollnet.sdk.dtypes import FLOAT32, compute_dtype_name
from rollnet.sdk.errors import ErrorReason, RollnetError
from rollnet.sdk.identity import Identity
from rollnet.sdk.retry import Backoff, RetryPolicy, is_retryable
from rollnet.sdk.version import PROTOCOL_MAJOR, PROTOCOL_MINOR, software_version
from rollnet.v1 import common_pb2, node_pb2, node_service_pb2

T = TypeVar("T")

PROTOCOL_VERSION = common_pb2.ProtocolVersion(major=PROTOCOL_MAJOR, minor=PROTOCOL_MINOR)
"""The protocol version this SDK speaks: what every node registers with, and what the reference
coordinator serves (it admits any ``1.x``)."""

DEFAULT_NETWORK_ID = "rollnet-local"
"""The reference coordinator's default network id."""

FATAL_REASONS: frozenset[ErrorReason] = frozenset(
    {
        # The node itself is refused: banned (terminal), or ejected (it stays EJECTED even if it
        # registers again; only an operator can change that).
        ErrorReason.NODE_BANNED,
        ErrorReason.NODE_EJECTED,
        # Its key may not hold this role here: registered with another role, or not on the
        # role's allow-list (a coordinator configuration change is needed).
        ErrorReason.ROLE_CONFLICT,
        ErrorReason.ROLE_NOT_PERMITTED,
        # Its role may never make the call it depends on: the same call is refused every time,
        # so retrying (or carrying on without it) would only spin.
        ErrorReason.ROLE_NOT_ALLOWED,
        # What it registers with cannot be accepted and will not change by itself: another
        # network, another protocol major version, a body key that is not the signing key, an
        # invite the pool does not take, a hardware report the coordinator finds implausible,
        # dtypes that do not include the one the network computes in.
        ErrorReason.AUDIENCE_MISMATCH,
        ErrorReason.PROTOCOL_VERSION_UNSUPPORTED,
        ErrorReason.KEY_MISMATCH,
        ErrorReason.INVITE_TOKEN_INVALID,
        ErrorReason.HARDWARE_CLAIM_IMPLAUSIBLE,
        ErrorReason.COMPUTE_DTYPE_UNSUPPORTED,
    }
)
"""Refusals that end a node of any role: nothing it can do will make the coordinator accept it.

Refusals about one call (bad fields, a stale lease, a replayed nonce, a skewed clock) are not
here: they are raised to the caller, who knows whether that call matters."""

REREGISTER_REASONS: frozenset[ErrorReason] = frozenset(
    {ErrorReason.UNKNOWN_KEY, ErrorReason.NODE_DEREGISTERED}
)
"""Refusals after which the coordinator no longer knows the node as live: register again."""

_ROLE_NAMES = {
    common_pb2.ROLE_WORKER: "worker",
    common_pb2.ROLE_VALIDATOR: "validator",
    common_pb2.ROLE_TRAINER: "trainer",
    common_pb2.ROLE_OPERATOR: "operator",
    common_pb2.ROLE_RELAY: "relay",
}


class NodeFatalError(Exception):
    """The coordinator refused this node for good (banned, ejected, wrong network, ...)."""

    def __init__(self, message: str, reason: ErrorReason | str | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        """The refusal's ``ErrorInfo`` reason; ``None`` when the session itself decided (a
        coordinator serving another network)."""


class StopRequested(Exception):
    """A stoppable wait of a :class:`NodeSession` noticed :meth:`NodeSession.request_stop`."""


def default_hardware() -> node_pb2.HardwareReport:
    """CPU cores and memory of this machine (no accelerators)."""
    cores = os.cpu_count() or 1
    memory = 0
    with contextlib.suppress(ValueError, OSError, AttributeError):
        memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return node_pb2.HardwareReport(cpu_cores=cores, memory_bytes=memory)


class NodeSettings(Protocol):
    """The settings a node's own config shares with :class:`NodeConfig`."""

    @property
    def target(self) -> str: ...
    @property
    def network_id(self) -> str: ...
    @property
    def tls(self) -> TlsConfig | None: ...
    @property
    def software_version(self) -> str: ...
    @property
    def call_timeout(self) -> float: ...
    @property
    def backoff(self) -> Backoff: ...
    @property
    def heartbeat_jitter(self) -> float: ...
    @property
    def deregister_timeout(self) -> float: ...


@dataclass(frozen=True, slots=True)
class NodeConfig:
    """How a :class:`NodeSession` reaches its coordinator and presents its node."""

    target: str
    """Coordinator address, ``host:port``."""
    role: common_pb2.Role.ValueType
    """``ROLE_WORKER``, ``ROLE_VALIDATOR``, ``ROLE_TRAINER``, ``ROLE_OPERATOR`` or
    ``ROLE_RELAY``; the validator's, trainer's and operator's need the key on the coordinator's
    allow-list for it."""
    network_id: str = DEFAULT_NETWORK_ID
    """The network id every call is signed for. It must be known before the first call (the
    signature names it); registration checks that the coordinator serves it."""
    tls: TlsConfig | None = None
    """``None`` for plaintext (loopback and tests)."""
    capabilities: node_pb2.Capabilities = field(default_factory=node_pb2.Capabilities)
    """Backends, environments, dtypes and concurrent leases reported at registration."""
    hardware: node_pb2.HardwareReport | None = None
    """The hardware report; ``None`` reports :func:`default_hardware`."""
    pool: str = ""
    """Pool to join (``""`` for the default pool)."""
    invite_token: str = ""
    """Invite token for invite-only pools."""
    software_version: str = software_version("sdk")
    """Reported at registration (at most 64 characters)."""
    call_timeout: float = 30.0
    """Deadline of one unary call attempt, in seconds."""
    backoff: Backoff = field(default_factory=Backoff)
    """Waits between retries of calls that must eventually succeed."""
    heartbeat_jitter: float = 0.1
    """Relative spread of heartbeat intervals, so a swarm does not beat in step."""
    requested_heartbeat_interval: float | None = None
    """Seconds between heartbeats to ask for (the coordinator clamps it); ``None`` takes its
    default."""
    deregister_timeout: float = 10.0
    """How long :meth:`NodeSession.deregister` keeps trying."""

    def __post_init__(self) -> None:
        if self.role not in _ROLE_NAMES:
            raise ValueError(
                "role must be ROLE_WORKER, ROLE_VALIDATOR, ROLE_TRAINER, ROLE_OPERATOR or "
                "ROLE_RELAY"
            )
        if not self.network_id:
            raise ValueError("network_id must not be empty")
        if not 0 <= self.heartbeat_jitter < 1:
            raise ValueError("heartbeat_jitter must be within [0, 1)")
        if self.requested_heartbeat_interval is not None and self.requested_heartbeat_interval <= 0:
            raise ValueError("requested_heartbeat_interval must be positive")

    @classmethod
    def for_role(
        cls, settings: NodeSettings, role: common_pb2.Role.ValueType, **more: Any
    ) -> NodeConfig:
        """The session config of a node whose own config (a ``WorkerConfig``, a
        ``ValidatorConfig``) carries the common settings; ``more`` sets the rest."""
        return cls(
            target=settings.target,
            role=role,
            network_id=settings.network_id,
            tls=settings.tls,
            software_version=settings.software_version,
            call_timeout=settings.call_timeout,
            backoff=settings.backoff,
            heartbeat_jitter=settings.heartbeat_jitter,
            deregister_timeout=settings.deregister_timeout,
            **more,
        )

    @property
    def role_name(self) -> str:
        """``"worker"``, ``"validator"``, ``"trainer"``, ``"operator"`` or ``"relay"``."""
        return _ROLE_NAMES[self.role]


@dataclass(frozen=True, slots=True)
class NodeReport:
    """What one heartbeat says about the node (asked for just before each beat)."""

    activity: node_service_pb2.Activity.ValueType = node_service_pb2.ACTIVITY_IDLE
    """Idle or busy; a stopping session reports ``ACTIVITY_DRAINING`` whatever is given here."""
    held_lease_ids: Sequence[str] = ()
    """Leases the node holds and still works on: the coordinator extends them."""
    checkpoint_step: int = 0
    """The newest checkpoint step the node has loaded."""
    metrics: Mapping[str, float] = field(default_factory=dict)
    """Free-form gauges for operators' dashboards."""
    relay_reports: Sequence[node_service_pb2.RelayReport] = ()
    """Relays that served wrong shard bytes since the last heartbeat (at most 8; see
    :meth:`rollnet.sdk.checkpoints.CheckpointStore.take_relay_reports`)."""


MAX_RELAY_REPORTS = 8
"""Relay reports one heartbeat carries at most (the coordinator's bound)."""


@dataclass(frozen=True, slots=True)
class LeaseReport:
    """The coordinator's word on one lease a heartbeat listed."""

    lease_id: str
    valid: bool
    """False once the lease expired, was revoked, completed, or the node may no longer work."""
    deadline: float
    """When a valid lease now ends, on this process's ``time.monotonic()`` clock (the server's
    deadline less its clock at the reply, from when the heartbeat was sent); 0 when invalid."""


class Stoppable(Protocol):
    """A long-running node (a worker, a validator, a trainer) that stops cleanly on request."""

    async def run(self) -> None:
        """Serve until stopped."""

    def request_stop(self) -> None:
        """Ask :meth:`run` to drain and return."""


def log_event(logger: logging.Logger, level: int, event: str, fields: Mapping[str, object]) -> None:
    """One line per event: a stable snake_case name, then key=value pairs (also as extras)."""
    if logger.isEnabledFor(level):
        details = " ".join(f"{key}={value}" for key, value in fields.items())
        logger.log(level, "%s %s", event, details, extra=dict(fields))


class NodeSession:
    """One node's registration, heartbeats, commands, back-off and stop. See the module docs.

    ``report`` is asked what each heartbeat says; ``on_leases`` hears the coordinator's word on
    the leases it listed; ``on_checkpoint`` hears of each new checkpoint the coordinator
    announces (repeated until the node reports it loaded). Callbacks run on the event loop and
    must not block. Log records go to ``logger`` (default ``rollnet.<role>``) with stable event
    names such as ``<role>_registered``, ``call_failed_retrying``, ``drain_commanded``.
    """

    def __init__(
        self,
        config: NodeConfig,
        identity: Identity,
        *,
        report: Callable[[], NodeReport] | None = None,
        on_leases: Callable[[Sequence[LeaseReport]], None] | None = None,
        on_checkpoint: Callable[[int], None] | None = None,
        logger: logging.Logger | None = None,
    ) -> None:
        self.config = config
        self.identity = identity
        self.log = (
            logger if logger is not None else logging.getLogger(f"rollnet.{config.role_name}")
        )
        self._report = report if report is not None else NodeReport
        self._on_leases = on_leases
        self._on_checkpoint = on_checkpoint
        self.hardware = config.hardware if config.hardware is not None else default_hardware()
        self.registration: node_service_pb2.RegisterNodeResponse | None = None
        """The coordinator's latest answer to RegisterNode."""
        self.coordinator_public_key = b""
        """The coordinator's receipt-signing key, learned at registration."""
        self.compute_dtype: str = FLOAT32
        """The dtype the network computes in (``float32``, ``bfloat16``), learned at
        registration."""
        self.heartbeat_interval = 10.0
        """Seconds between heartbeats, as the coordinator last granted."""
        self.lease_duration = 120.0
        """How long a lease lasts without a heartbeat extending it, in seconds."""
        self.last_heartbeat_ok = time.monotonic()
        """``time.monotonic()`` of the last registration or heartbeat that got through."""
        self.heartbeats_ok = 0
        """Heartbeats the coordinator answered in this session."""
        self._stop = asyncio.Event()
        self._fatal: NodeFatalError | None = None
        self._client: RollnetClient | None = None
        self._heartbeats: asyncio.Task[None] | None = None
        self._register_lock = asyncio.Lock()
        self._registered_once = False
        self._deregistered = False

    # ------------------------------------------------------------------ state

    @property
    def node_id(self) -> str:
        """This node's id."""
        return self.identity.node_id

    @property
    def client(self) -> RollnetClient:
        """The signed client (open between :meth:`start` and :meth:`close`)."""
        if self._client is None:
            raise RuntimeError("the node session is not started")
        return self._client

    @property
    def stopping(self) -> bool:
        """Whether a stop was requested (by the node, a drain command or a fatal refusal)."""
        return self._stop.is_set()

    @property
    def heartbeating(self) -> bool:
        """Whether the background heartbeats run (from :meth:`start` to :meth:`deregister`,
        :meth:`close` or a refusal for good)."""
        return self._heartbeats is not None and not self._heartbeats.done()

    @property
    def fatal(self) -> NodeFatalError | None:
        """Why the coordinator refused this node for good; ``None`` while it has not."""
        return self._fatal

    def request_stop(self) -> None:
        """Stop: every stoppable wait (:meth:`call`, :meth:`sleep`) ends at once."""
        self._stop.set()

    async def wait_stopped(self) -> None:
        """Return once a stop is requested."""
        await self._stop.wait()

    def fail(
        self, error: RollnetError | str, *, reason: ErrorReason | None = None
    ) -> NodeFatalError:
        """Record a refusal for good (the first one sticks), stop, and return it.

        A refusal the session decides itself (``error`` a message) may name the ``reason`` the
        coordinator would have given; its message then starts with it, like a refusal's.
        """
        if self._fatal is None:
            if isinstance(error, RollnetError):
                message, why = f"{error.reason}: {error.message}", error.reason or None
            elif reason is not None:
                message, why = f"{reason}: {error}", reason
            else:
                message, why = error, None
            log_event(
                self.log, logging.ERROR, f"{self.config.role_name}_refused", {"detail": message}
            )
            self._fatal = NodeFatalError(message, why)
        self.request_stop()
        return self._fatal

    # ------------------------------------------------------------------ waiting and retrying

    def backoff(self, failures: int, retry_after: float | None = None) -> float:
        """Seconds to wait after ``failures`` consecutive failures (the config's back-off)."""
        return self.config.backoff.delay(failures, retry_after)

    async def sleep(self, seconds: float, *, stoppable: bool = True) -> bool:
        """Sleep; with ``stoppable``, wake early when a stop is requested. True if stopped."""
        if not stoppable:
            await asyncio.sleep(seconds)
            return False
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)
        return self._stop.is_set()

    async def unless_stopped(self, awaitable: Awaitable[T]) -> T | None:
        """Await ``awaitable`` unless a stop comes first (then cancel it and return None).

        A result that arrived together with the stop is still returned: the caller decides.
        """
        work = asyncio.ensure_future(awaitable)
        stop = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({work, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if work.done():
            return work.result()
        work.cancel()
        with contextlib.suppress(asyncio.CancelledError, StopRequested):
            await work
        return None

    async def call(
        self,
        what: str,
        call: Callable[[], Awaitable[T]],
        *,
        until: float | None = None,
        stoppable: bool = True,
    ) -> T:
        """``call()`` until it succeeds, backing off on transient failures (forever, or until
        the ``time.monotonic()`` deadline ``until``).

        Registers again first when the coordinator forgot the node. Raises
        :class:`NodeFatalError` for a refusal for good (the session stops), the
        :class:`~rollnet.sdk.errors.RollnetError` of any other refusal that no retry can fix,
        ``TimeoutError`` past ``until`` and, when ``stoppable``, :class:`StopRequested` once a
        stop is requested.
        """
        failures = 0
        while True:
            try:
                return await call()
            except RollnetError as error:
                if error.reason in FATAL_REASONS:
                    raise self.fail(error) from error
                if error.reason in REREGISTER_REASONS and what != "register":
                    log_event(self.log, logging.WARNING, "coordinator_forgot_node", {"call": what})
                    await self.register_again()
                    retry_after: float | None = 0.0
                elif is_retryable(error):
                    retry_after = error.retry_after
                else:
                    raise
                failures += 1
                delay = self.backoff(failures, retry_after)
                log_event(
                    self.log,
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
            if await self.sleep(delay, stoppable=stoppable):
                raise StopRequested(what)

    # ------------------------------------------------------------------ registration

    def _register_request(self) -> node_service_pb2.RegisterNodeRequest:
        config = self.config
        return node_service_pb2.RegisterNodeRequest(
            request_id=uuid.uuid4().hex,
            public_key=self.identity.public_key,
            role=config.role,
            protocol_version=PROTOCOL_VERSION,
            software_version=config.software_version,
            capabilities=config.capabilities,
            hardware=self.hardware,
            pool=config.pool,
            invite_token=config.invite_token,
        )

    def _registered(self, response: node_service_pb2.RegisterNodeResponse) -> bool:
        config = self.config
        if response.network_id != config.network_id:
            self.fail(
                f"coordinator serves network {response.network_id!r}, not {config.network_id!r}"
            )
            return False
        try:
            dtype = compute_dtype_name(response.compute_dtype)
        except ValueError:
            dtype = f"unknown ({response.compute_dtype})"
        dtypes = config.capabilities.dtypes
        if dtypes and dtype not in dtypes:
            # A coordinator refuses such a registration itself; an older one does not say.
            self.fail(
                f"the network computes in {dtype}; this {config.role_name} runs "
                f"{', '.join(dtypes)}",
                reason=ErrorReason.COMPUTE_DTYPE_UNSUPPORTED,
            )
            return False
        self.registration = response
        self.compute_dtype = dtype
        self.coordinator_public_key = response.coordinator_public_key
        if response.HasField("heartbeat_interval"):
            self._follow_interval(response.heartbeat_interval)
        if response.HasField("lease_duration"):
            self.lease_duration = response.lease_duration.ToTimedelta().total_seconds()
        if response.HasField("server_time"):
            offset = response.server_time.ToMicroseconds() / 1e6 - time.time()
            # Only correct clocks that are really off: small offsets are network delay.
            self.client.signer.clock_offset = offset if abs(offset) > 5.0 else 0.0
        self.last_heartbeat_ok = time.monotonic()
        self._registered_once = True
        self._deregistered = False
        log_event(
            self.log,
            logging.INFO,
            f"{config.role_name}_registered",
            {"node_id": self.node_id, "interval": self.heartbeat_interval},
        )
        return True

    def _follow_interval(self, interval: duration_pb2.Duration) -> None:
        self.heartbeat_interval = max(0.05, interval.ToTimedelta().total_seconds())

    async def start(self) -> bool:
        """Connect, register (retrying transient failures until stopped) and start heartbeats.

        True once registered; False when a stop came first or the coordinator refused the node
        (:attr:`fatal` says why). Any refusal of RegisterNode that no retry can fix (a wrong
        key, role, network or request) is a refusal for good.
        """
        if self._client is None:
            config = self.config
            connection = ConnectionConfig(
                target=config.target,
                network_id=config.network_id,
                tls=config.tls,
                timeout=config.call_timeout,
                # The session retries by itself, with its own back-off.
                retry=RetryPolicy.no_retry(),
            )
            self._client = RollnetClient.connect(connection, self.identity)
        request = self._register_request()
        try:
            # One request id across the retries: registration is idempotent anyway.
            response = await self.call("register", lambda: self.client.nodes.register_node(request))
        except (StopRequested, NodeFatalError):
            return False
        except RollnetError as error:
            self.fail(error)
            return False
        if not self._registered(response):
            return False
        if self._heartbeats is None:
            self._heartbeats = asyncio.create_task(self._heartbeat_loop())
        return True

    async def register_again(self) -> None:
        """RegisterNode once more, after the coordinator forgot the node (errors are logged;
        a refusal for good stops the session). Concurrent callers register once."""
        async with self._register_lock:
            try:
                response = await self.client.nodes.register_node(self._register_request())
            except RollnetError as error:
                if error.reason in FATAL_REASONS:
                    self.fail(error)
                log_event(self.log, logging.WARNING, "reregister_failed", {"code": error.code.name})
                return
            self._registered(response)

    # ------------------------------------------------------------------ heartbeats

    async def _heartbeat_loop(self) -> None:
        failures = 0
        while True:
            jitter = self.config.heartbeat_jitter
            wait = self.heartbeat_interval * random.uniform(1 - jitter, 1 + jitter)
            if failures:
                # Come back sooner than the interval while beats fail, so a lease is extended
                # as soon as the coordinator answers again.
                wait = min(wait, self.backoff(failures))
            await asyncio.sleep(wait)
            try:
                await self.heartbeat()
                failures = 0
            except RollnetError as error:
                failures += 1
                if error.reason in FATAL_REASONS:
                    self.fail(error)
                    return
                if error.reason in REREGISTER_REASONS:
                    await self.register_again()
                log_event(self.log, logging.WARNING, "heartbeat_failed", {"code": error.code.name})
            except Exception:
                failures += 1
                self.log.exception("heartbeat_error")

    async def heartbeat(self) -> node_service_pb2.HeartbeatResponse:
        """Send one heartbeat now and follow its reply (the background loop calls this)."""
        report = self._report()
        activity = node_service_pb2.ACTIVITY_DRAINING if self.stopping else report.activity
        request = node_service_pb2.HeartbeatRequest(
            activity=activity,
            held_lease_ids=list(report.held_lease_ids),
            checkpoint_step=report.checkpoint_step,
            metrics=dict(report.metrics),
            relay_reports=list(report.relay_reports)[:MAX_RELAY_REPORTS],
        )
        if self.config.requested_heartbeat_interval is not None:
            request.requested_interval.FromMilliseconds(
                round(self.config.requested_heartbeat_interval * 1000)
            )
        sent = time.monotonic()
        response = await self.client.nodes.heartbeat(request)
        self.last_heartbeat_ok = time.monotonic()
        self.heartbeats_ok += 1
        if response.HasField("heartbeat_interval"):
            self._follow_interval(response.heartbeat_interval)
        if self._on_leases is not None and response.leases:
            server_now = response.server_time.ToMicroseconds() / 1e6
            self._on_leases(
                [
                    LeaseReport(
                        lease_id=status.lease_id,
                        valid=status.valid,
                        deadline=(
                            sent + status.deadline.ToMicroseconds() / 1e6 - server_now
                            if status.valid
                            else 0.0
                        ),
                    )
                    for status in response.leases
                ]
            )
        for command in response.commands:
            kind = command.WhichOneof("command")
            if kind == "drain":
                log_event(
                    self.log, logging.INFO, "drain_commanded", {"reason": command.drain.reason}
                )
                self.request_stop()
            elif kind == "reregister":
                await self.register_again()
            elif kind == "update_checkpoint" and self._on_checkpoint is not None:
                self._on_checkpoint(command.update_checkpoint.step)
        return response

    async def _stop_heartbeats(self) -> None:
        heartbeats, self._heartbeats = self._heartbeats, None
        if heartbeats is not None:
            heartbeats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeats

    # ------------------------------------------------------------------ leaving

    async def deregister(self, reason: str = "") -> bool:
        """End the heartbeats and DeregisterNode, retrying for ``deregister_timeout`` seconds.

        Does nothing when the node was refused for good or never registered. A refusal for
        good here (an ejected node's deregistration) is recorded like any other. True when the
        coordinator confirmed.
        """
        # Heartbeats first: one answered after the deregistration would say "register again".
        await self._stop_heartbeats()
        if self._fatal is not None or not self._registered_once or self._deregistered:
            return False
        request = node_service_pb2.DeregisterNodeRequest(
            request_id=uuid.uuid4().hex, reason=reason or f"{self.config.role_name} stopped"
        )
        try:
            response = await self.call(
                "deregister",
                lambda: self.client.nodes.deregister_node(request),
                until=time.monotonic() + self.config.deregister_timeout,
                stoppable=False,
            )
        except (RollnetError, TimeoutError, NodeFatalError) as error:
            log_event(self.log, logging.WARNING, "deregister_failed", {"detail": str(error)[:200]})
            return False
        self._deregistered = True
        log_event(
            self.log,
            logging.INFO,
            f"{self.config.role_name}_deregistered",
            {"released_leases": response.released_leases},
        )
        return True

    async def close(self) -> None:
        """End the heartbeats and close the connection (no deregistration; idempotent)."""
        await self._stop_heartbeats()
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    def raise_if_fatal(self) -> None:
        """Raise :attr:`fatal` if the coordinator refused this node for good."""
        if self._fatal is not None:
            raise self._fatal

    async def __aenter__(self) -> NodeSession:
        """:meth:`start`; raises :class:`NodeFatalError` when refused (a stop before the
        registration enters with :attr:`stopping` set)."""
        try:
            await self.start()
            self.raise_if_fatal()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        """Deregister (on a normal exit only), close, and raise :attr:`fatal` if any."""
        try:
            if exc_type is None:
                await self.deregister()
        finally:
            await self.close()
        if exc_type is None:
            self.raise_if_fatal()


async def run_until_signalled(node: Stoppable) -> None:
    """Run ``node``; SIGTERM and SIGINT request a clean stop (the only signal handling here).

    Works for anything with ``run()`` and ``request_stop()`` (workers, validators, trainers).
    Signals can be handled only by the main thread's event loop on a platform with loop signal
    handlers; anywhere else ``node`` runs without them, and ``request_stop()`` is the way to
    stop it.
    """
    loop = asyncio.get_running_loop()
    installed = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        # NotImplementedError: no loop signal handlers here (Windows); RuntimeError: not the
        # main thread. Either way the node still runs, stoppable through request_stop().
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, node.request_stop)
            installed.append(signum)
    try:
        await node.run()
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)


__all__ = [
    "DEFAULT_NETWORK_ID",
    "FATAL_REASONS",
    "MAX_RELAY_REPORTS",
    "PROTOCOL_VERSION",
    "REREGISTER_REASONS",
    "LeaseReport",
    "NodeConfig",
    "NodeFatalError",
    "NodeReport",
    "NodeSession",
    "NodeSettings",
    "StopRequested",
    "Stoppable",
    "default_hardware",
    "log_event",
    "run_until_signalled",
]
