"""Admission and liveness: registration, heartbeats, deregistration and operator actions."""

from __future__ import annotations

import time
from collections import defaultdict, deque
from collections.abc import Callable
from datetime import timedelta

from google.protobuf import duration_pb2
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from rollnet.ledger import nodes, tasks, validation
from rollnet.ledger.enums import NodeRole, NodeState
from rollnet.reference.coordinator.context import (
    PROTOCOL_MAJOR,
    PROTOCOL_MINOR,
    CoordinatorContext,
)
from rollnet.reference.coordinator.heartbeats import HeartbeatBatcher
from rollnet.reference.coordinator.refusal import Refusal, invalid
from rollnet.reference.coordinator.serde import (
    ROLE_TO_DB,
    STATE_FROM_DB,
    STATE_TO_DB,
    capabilities_to_db,
    duration,
    hardware_to_db,
    node_to_proto,
    timestamp,
)
from rollnet.reference.coordinator.standing import (
    Caller,
    eject_node,
    off_allow_list,
    refuse_unless_reaching_others,
    refuse_unusable,
)
from rollnet.sdk.dtypes import compute_dtype_value
from rollnet.sdk.errors import ErrorReason
from rollnet.sdk.identity import node_id_from_public_key
from rollnet.sdk.methods import method_path
from rollnet.sdk.verifier import current_nonce, network_of
from rollnet.v1 import common_pb2, node_pb2, node_service_pb2

GET_NODE = method_path("NodeService", "GetNode")

# Hardware claims beyond these are refused as implausible (a single host). The number of
# accelerator kinds and their names are bounded with every other field (bounds.py).
MAX_CPU_CORES = 4096
MAX_HOST_MEMORY = 64 * 2**40
MAX_ACCELERATORS = 64
MAX_ACCELERATOR_MEMORY = 2 * 2**40


class RegistrationLimiter:
    """Sliding one-minute window of registrations per client IP.

    Windows of addresses quiet for a minute are dropped once more than ``max_addresses`` are
    kept: every address that ever registered would otherwise stay (an IPv6 host has billions).
    """

    def __init__(
        self,
        per_minute: int,
        *,
        max_addresses: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.per_minute = per_minute
        self.max_addresses = max_addresses
        self.clock = clock
        self._seen: dict[str, deque[float]] = defaultdict(deque)
        # Scanned again once this many are kept: twice what the last scan left (at least the
        # bound), so that a minute of many active addresses costs linear time, not quadratic.
        self._scan_at = max_addresses

    def __len__(self) -> int:
        """Addresses whose windows are kept."""
        return len(self._seen)

    def admit(self, ip: str) -> float | None:
        """None when admitted, else the seconds until the next slot frees up.

        ``ip``: the caller's address (or gRPC peer); an IPv6 one counts as its /64 network."""
        ip = network_of(ip)
        now = self.clock()
        if ip not in self._seen and len(self._seen) >= self._scan_at:
            self._forget_quiet(now)
        window = self._seen[ip]
        while window and now - window[0] >= 60.0:
            window.popleft()
        if len(window) >= self.per_minute:
            return 60.0 - (now - window[0])
        window.append(now)
        return None

    def _forget_quiet(self, now: float) -> None:
        for ip in [ip for ip, window in self._seen.items() if not window or now - window[-1] >= 60]:
            del self._seen[ip]
        self._scan_at = max(self.max_addresses, 2 * len(self._seen))


class NodeRegistry:
    """Registration, heartbeats and node administration."""

    def __init__(self, ctx: CoordinatorContext) -> None:
        self.ctx = ctx
        self.limiter = RegistrationLimiter(ctx.config.registrations_per_ip_per_minute)
        self.heartbeats = HeartbeatBatcher(ctx)

    # ---------------------------------------------------------------- registration
    def _check_dtypes(self, caps: node_pb2.Capabilities) -> None:
        """Refuse a node that says which dtypes it runs, none of them the network's: it would
        do every task's work in a dtype whose proofs fail validation."""
        dtype = self.ctx.config.compute_dtype
        if caps.dtypes and dtype not in caps.dtypes:
            raise Refusal(
                ErrorReason.COMPUTE_DTYPE_UNSUPPORTED,
                f"this network computes in {dtype}; the node runs {', '.join(caps.dtypes)}",
                metadata={"compute_dtype": dtype},
            )

    def _check_hardware(self, hardware: node_pb2.HardwareReport) -> None:
        problems: list[str] = []
        if hardware.cpu_cores > MAX_CPU_CORES:
            problems.append(f"cpu_cores {hardware.cpu_cores} > {MAX_CPU_CORES}")
        if hardware.memory_bytes > MAX_HOST_MEMORY:
            problems.append(f"memory_bytes {hardware.memory_bytes} > {MAX_HOST_MEMORY}")
        total = 0
        for i, acc in enumerate(hardware.accelerators):
            total += acc.count
            if acc.memory_bytes > MAX_ACCELERATOR_MEMORY:
                problems.append(f"accelerators[{i}].memory_bytes {acc.memory_bytes} too large")
        if total > MAX_ACCELERATORS:
            problems.append(f"{total} accelerators > {MAX_ACCELERATORS} on one host")
        if problems:
            raise Refusal(
                ErrorReason.HARDWARE_CLAIM_IMPLAUSIBLE,
                "implausible hardware: " + "; ".join(problems),
            )

    def _check_role_permitted(self, role: NodeRole, public_key: bytes, node_id: str) -> None:
        why = off_allow_list(self.ctx.config, role, node_id, public_key)
        if why:
            raise Refusal(ErrorReason.ROLE_NOT_PERMITTED, why)

    def _check_pool(self, pool: str, token: str) -> None:
        config = self.ctx.config.pools.get(pool)
        if config is None:
            raise Refusal(ErrorReason.INVITE_TOKEN_INVALID, f"unknown pool {pool!r}")
        if config.invite_only and token not in config.invite_tokens:
            raise Refusal(
                ErrorReason.INVITE_TOKEN_INVALID, f"pool {pool!r} needs a valid invite token"
            )

    async def register(
        self,
        signer_public_key: bytes,
        peer_ip: str,
        request: node_service_pb2.RegisterNodeRequest,
    ) -> node_service_pb2.RegisterNodeResponse:
        """Admit a node (idempotent for the same key and role); its fields are in bounds."""
        if request.public_key != signer_public_key:
            raise Refusal(
                ErrorReason.KEY_MISMATCH, "public_key differs from the key that signed the call"
            )
        version = request.protocol_version
        if version.major != PROTOCOL_MAJOR:
            raise Refusal(
                ErrorReason.PROTOCOL_VERSION_UNSUPPORTED,
                f"protocol {version.major}.{version.minor} is not supported; this coordinator "
                f"speaks {PROTOCOL_MAJOR}.x (>= {PROTOCOL_MAJOR}.0, < {PROTOCOL_MAJOR + 1}.0)",
                metadata={
                    "supported_major": str(PROTOCOL_MAJOR),
                    "supported_minor": str(PROTOCOL_MINOR),
                },
            )
        self._check_dtypes(request.capabilities)
        self._check_hardware(request.hardware)
        role = ROLE_TO_DB[request.role]
        node_id = node_id_from_public_key(request.public_key)
        self._check_role_permitted(role, request.public_key, node_id)
        self._check_pool(request.pool, request.invite_token)
        wait = self.limiter.admit(peer_ip)
        if wait is not None:
            raise Refusal(
                ErrorReason.RATE_LIMITED,
                f"too many registrations from {peer_ip}",
                retry_after=wait,
            )
        hardware = hardware_to_db(request.hardware)
        now = self.ctx.clock()

        def work(session: Session) -> node_pb2.Node:
            existing = nodes.get_node(session, node_id)
            if existing is not None:
                if existing.role is not role:
                    raise Refusal(
                        ErrorReason.ROLE_CONFLICT,
                        f"key already registered as {existing.role}, not {role}",
                    )
                if existing.state is NodeState.BANNED:
                    raise Refusal(ErrorReason.NODE_BANNED, f"node {node_id} is banned")
            row = nodes.register_node(
                session,
                node_id=node_id,
                public_key=request.public_key,
                role=role,
                protocol_version=f"{version.major}.{version.minor}",
                software_version=request.software_version,
                capabilities=capabilities_to_db(request.capabilities),
                hardware=hardware,
                pool=request.pool or None,
                now=now,
            )
            if row.state is NodeState.DEREGISTERED:
                nodes.set_node_state(
                    session,
                    node_id,
                    NodeState.PENDING,
                    now=now,
                    from_states=[NodeState.DEREGISTERED],
                )
                session.refresh(row)
            return node_to_proto(row, reject_count(session, node_id))

        try:
            node = await self.ctx.run_in_transaction(work)
        except IntegrityError:
            # The same key registered at the same moment through another replica (or call)
            # inserted the row first; the second attempt finds it and is idempotent.
            node = await self.ctx.run_in_transaction(work)
        # Its key may be cached with the state it had before (DEREGISTERED, after a clean
        # restart): forgotten, the next call reads it afresh. (Another replica's cache is not
        # trusted to refuse: a refusing cached state is read again before it refuses.)
        self.ctx.forget_key(request.public_key)
        config = self.ctx.config
        return node_service_pb2.RegisterNodeResponse(
            node=node,
            network_id=config.network_id,
            server_protocol_version=common_pb2.ProtocolVersion(
                major=PROTOCOL_MAJOR, minor=PROTOCOL_MINOR
            ),
            heartbeat_interval=duration(config.heartbeat_interval),
            lease_duration=duration(config.lease_duration),
            server_time=timestamp(self.ctx.clock()),
            coordinator_public_key=self.ctx.identity.public_key,
            compute_dtype=compute_dtype_value(config.compute_dtype),
        )

    # ---------------------------------------------------------------- heartbeats
    def clamp_interval(self, requested: duration_pb2.Duration | None) -> timedelta:
        """The heartbeat interval granted for a requested one."""
        config = self.ctx.config
        if requested is None or (requested.seconds == 0 and requested.nanos == 0):
            return config.heartbeat_interval
        wanted = requested.ToTimedelta()
        return min(max(wanted, config.heartbeat_interval_min), config.heartbeat_interval_max)

    async def heartbeat(
        self, caller: Caller, request: node_service_pb2.HeartbeatRequest
    ) -> node_service_pb2.HeartbeatResponse:
        """Record liveness, extend held leases, hand out commands."""
        interval = self.clamp_interval(request.requested_interval)
        if self.heartbeats.behind:
            # The back-off hint: a coordinator that is behind asks for heartbeats less often.
            interval = min(interval * 2, self.ctx.config.heartbeat_interval_max)
        signed = current_nonce()
        result = await self.heartbeats.submit(
            caller.node_id,
            tuple(request.held_lease_ids),
            interval,
            request.checkpoint_step,
            (caller.node_id, signed.nonce, signed.timestamp_ms),
        )
        if result.replayed:
            raise Refusal(ErrorReason.NONCE_REPLAYED, "nonce already used by this key")
        if not result.known or result.state is None:
            raise Refusal(ErrorReason.UNKNOWN_KEY, "node is not registered")
        if result.state is NodeState.BANNED:
            raise Refusal(ErrorReason.NODE_BANNED, f"node {caller.node_id} is banned")
        if result.state in (NodeState.EJECTED, NodeState.DEREGISTERED):
            # Not an error: the node is told what to do. An ejected node drains (gives its work
            # back and stops); a deregistered one that still runs registers again.
            response = node_service_pb2.HeartbeatResponse(
                state=STATE_FROM_DB[result.state],
                heartbeat_interval=duration(interval),
                leases=[
                    node_service_pb2.LeaseStatus(lease_id=lease_id, valid=False)
                    for lease_id in request.held_lease_ids
                ],
                server_time=timestamp(self.ctx.clock()),
            )
            if result.state is NodeState.EJECTED:
                response.commands.add().drain.reason = f"ejected: {result.reason}"
            else:
                response.commands.add().reregister.reason = "the node deregistered"
            return response
        if request.relay_reports:
            self.ctx.relay_reports.record(
                caller.node_id, list(request.relay_reports), self.ctx.clock()
            )
        deadline = timestamp(result.deadline)
        statuses = []
        for lease_id in request.held_lease_ids:
            status = node_service_pb2.LeaseStatus(
                lease_id=lease_id, valid=lease_id in result.extended
            )
            if status.valid:
                status.deadline.CopyFrom(deadline)
            statuses.append(status)
        response = node_service_pb2.HeartbeatResponse(
            state=STATE_FROM_DB[result.state],
            heartbeat_interval=duration(interval),
            leases=statuses,
            server_time=timestamp(self.ctx.clock()),
        )
        if result.latest_step > request.checkpoint_step and result.role is not NodeRole.OPERATOR:
            response.commands.add().update_checkpoint.step = result.latest_step
        return response

    # ---------------------------------------------------------------- leaving and admin
    async def deregister(
        self, caller: Caller, request: node_service_pb2.DeregisterNodeRequest
    ) -> node_service_pb2.DeregisterNodeResponse:
        """Leave cleanly: give back leases (requeued at once), state DEREGISTERED."""
        now = self.ctx.clock()
        config = self.ctx.config

        def work(session: Session) -> node_service_pb2.DeregisterNodeResponse:
            row = nodes.get_node(session, caller.node_id)
            if row is None:
                raise Refusal(ErrorReason.UNKNOWN_KEY, "node is not registered")
            if row.state in (NodeState.BANNED, NodeState.EJECTED):
                refuse_unusable(row)
            released = tasks.requeue_leases_of_node(
                session, caller.node_id, now=now, max_attempts=config.max_attempts
            )
            jobs = validation.requeue_validation_jobs_of_node(
                session, caller.node_id, now=now, max_attempts=config.max_validation_attempts
            )
            nodes.set_node_state(session, caller.node_id, NodeState.DEREGISTERED, now=now)
            return node_service_pb2.DeregisterNodeResponse(
                released_leases=len(released.requeued)
                + len(released.failed)
                + len(jobs.requeued)
                + len(jobs.failed)
            )

        response = await self.ctx.run_in_transaction(work)
        self.ctx.forget_keys()  # its cached state is ACTIVE no more
        if response.released_leases:
            self.ctx.signals.fire(self.ctx.signals.work_available)
            self.ctx.signals.fire(self.ctx.signals.jobs_available)
        return response

    async def get(self, caller: Caller, node_id: str) -> node_pb2.Node:
        """One node; non-operators may only read themselves."""
        target = node_id or caller.node_id
        if target != caller.node_id:
            refuse_unless_reaching_others(GET_NODE, caller, "read other nodes")

        def work(session: Session) -> node_pb2.Node:
            row = nodes.get_node(session, target)
            if row is None:
                raise Refusal(ErrorReason.NODE_NOT_FOUND, f"no node {target}")
            return node_to_proto(row, reject_count(session, target))

        return await self.ctx.run_read(work)

    async def list(
        self, request: node_service_pb2.ListNodesRequest
    ) -> node_service_pb2.ListNodesResponse:
        """A page of nodes ordered by id."""
        page_size = min(request.page_size or 100, 1000)
        state = STATE_TO_DB.get(request.state) if request.state else None
        role = ROLE_TO_DB.get(request.role) if request.role else None

        def work(session: Session) -> node_service_pb2.ListNodesResponse:
            rows = nodes.list_nodes_page(
                session,
                role=role,
                state=state,
                after_id=request.page_token or None,
                limit=page_size + 1,
            )
            page = rows[:page_size]
            response = node_service_pb2.ListNodesResponse(nodes=[node_to_proto(r) for r in page])
            if len(rows) > page_size:
                response.next_page_token = page[-1].id
            return response

        return await self.ctx.run_read(work)

    async def remove(
        self, caller: Caller, node_id: str, reason: str, state: NodeState
    ) -> node_pb2.Node:
        """Eject or ban a node: revoke its leases (tasks requeued) and record why.

        An operator may not remove itself: it would lock itself out of the very commands that
        undo it (another operator key can still remove it).
        """
        if state not in (NodeState.EJECTED, NodeState.BANNED):
            raise ValueError(state)
        if node_id == caller.node_id:
            verb = "eject" if state is NodeState.EJECTED else "ban"
            raise invalid(("node_id", f"an operator cannot {verb} itself"))
        now = self.ctx.clock()
        config = self.ctx.config

        def work(session: Session) -> node_pb2.Node:
            row = nodes.get_node(session, node_id)
            if row is None:
                raise Refusal(ErrorReason.NODE_NOT_FOUND, f"no node {node_id}")
            eject_node(
                session,
                node_id,
                state,
                reason,
                now=now,
                max_attempts=config.max_attempts,
                max_validation_attempts=config.max_validation_attempts,
            )
            session.refresh(row)
            return node_to_proto(row, reject_count(session, node_id))

        node = await self.ctx.run_in_transaction(work)
        self.ctx.forget_keys()
        self.ctx.signals.fire(self.ctx.signals.work_available)
        return node

    async def reinstate(self, node_id: str, reason: str) -> node_pb2.Node:
        """Undo an ejection: the node goes OFFLINE (ACTIVE at its next heartbeat) with trust,
        streak and reject count starting afresh. A node that is not ejected is returned as it
        is (a retry after success changes nothing); a banned one is refused."""
        now = self.ctx.clock()

        def work(session: Session) -> node_pb2.Node:
            row = nodes.get_node(session, node_id)
            if row is None:
                raise Refusal(ErrorReason.NODE_NOT_FOUND, f"no node {node_id}")
            if row.state is NodeState.BANNED:
                raise Refusal(
                    ErrorReason.NODE_BANNED, f"node {node_id} is banned, which is for good"
                )
            rejects = reject_count(session, node_id)
            nodes.reinstate_node(
                session, node_id, reason=f"reinstated: {reason}", rejects=rejects, now=now
            )
            session.refresh(row)
            return node_to_proto(row, rejects)

        node = await self.ctx.run_in_transaction(work)
        self.ctx.forget_keys()  # its cached state is EJECTED no more
        return node


def reject_count(session: Session, node_id: str) -> int:
    """How many of the node's commitments were rejected."""
    return validation.count_rejected_commitments(session, node_id)
