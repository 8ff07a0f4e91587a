"""The chaos harness's swarm: the demo's processes, restartable by name, behind fault proxies.

The processes are the demo's (:mod:`rollnet.reference.demo`): the same command lines, the same
tiny model and warm start, the same trainer configuration, each process in a session of its own
with its log under ``DIR/logs``. Added here: one or two coordinator replicas (two share one
PostgreSQL database, one key and one blob directory, as docs/coordinator.md says replicas must),
a :class:`~rollnet.reference.chaos.proxy.FaultProxy` in front of each replica that every node
goes through, two relays (an origin and a pull-through cache that prefetches from the
coordinator), and a restart of any process with its original command line.

The reference trainer writes no relay origin directory, so the harness keeps one: every blob the
coordinator stores is hard-linked into ``DIR/origin/blobs/<hex>`` every quarter of a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import urllib.request
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from sqlalchemy import Engine, create_engine, func, select
from sqlalchemy.pool import NullPool

from rollnet.ledger.models import LedgerEntry, Node
from rollnet.reference.chaos.proxy import FaultProxy
from rollnet.reference.demo import (
    ONE_THREAD,
    DemoConfig,
    _free_port,
    _key,
    _models,
    _rollnet,
    _Swarm,
    _trainer_toml,
    _wait_for_coordinator,
)
from rollnet.reference.trainer.metrics import read_jsonl

__all__ = ["ChaosSwarm", "SwarmConfig"]

NETWORK_ID = "rollnet-chaos"
#: Node heartbeat interval (s) the harness's coordinators grant; a node is taken for dead after
#: four missed ones, and "serving" means it heartbeated within three.
HEARTBEAT_INTERVAL = 2.0


@dataclass
class SwarmConfig:
    """What the chaos swarm runs."""

    data_dir: Path
    database_url: str | None = None
    """None: SQLite in the (single) coordinator's data directory; else a PostgreSQL URL of a
    database the harness may drop connections to (one of its own)."""
    replicas: int = 1
    workers: int = 2
    validators: int = 1
    relays: bool = True
    warm_start_steps: int = 50
    lease_duration: float = 30.0
    model_root: Path | None = None
    """Where the tiny model and its warm start are made, or found from an earlier run (default:
    the data directory)."""


@dataclass
class ChaosSwarm:
    """The running swarm: processes by name, the proxies, the database (read by the harness)."""

    config: SwarmConfig
    processes: _Swarm = field(default_factory=_Swarm)
    commands: dict[str, list[str]] = field(default_factory=dict)
    proxies: list[FaultProxy] = field(default_factory=list)
    coordinator_addresses: list[str] = field(default_factory=list)
    relay_urls: dict[str, str] = field(default_factory=dict)
    node_ids: dict[str, str] = field(default_factory=dict)
    """Process name -> node id of the nodes that heartbeat (trainer, workers, validators; a relay
    registers but does not heartbeat: its ``/healthz`` says whether it serves)."""
    started_at: dict[str, datetime] = field(default_factory=dict)
    """When each process was last (re)started: a node serves once it heartbeated since."""
    engine: Engine | None = None
    _mirror: asyncio.Task[None] | None = None

    @property
    def root(self) -> Path:
        """The run's directory."""
        return self.config.data_dir

    @property
    def logs(self) -> Path:
        """Where each process's log is."""
        return self.root / "logs"

    @property
    def database_url(self) -> str:
        """The coordinators' database."""
        if self.config.database_url is not None:
            return self.config.database_url
        return f"sqlite:///{self.root / 'coordinator-0' / 'rollnet.db'}"

    @property
    def db(self) -> Engine:
        """The harness's engine on the coordinators' database (a connection per read)."""
        if self.engine is None:
            self.engine = create_engine(self.database_url, poolclass=NullPool)
        return self.engine

    # -- starting ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Make the model, start every process and proxy (returns once the coordinators serve)."""
        config = self.config
        if config.replicas > 1 and config.database_url is None:
            raise ValueError("several coordinator replicas need a PostgreSQL database_url")
        for sub in ("keys", "logs", "origin/blobs"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)
        demo = DemoConfig(
            data_dir=self.root,
            steps=100_000,  # the budget ends the run, not the trainer
            prompts_per_step=4,
            samples_per_prompt=4,
            prompts_per_task=1,
            max_new_tokens=8,
            max_off_policy_steps=2,
            warm_start_steps=config.warm_start_steps,
        )
        model_root = config.model_root or self.root
        model_root.mkdir(parents=True, exist_ok=True)
        model_dir = await asyncio.to_thread(_models, model_root, demo)
        trainer = _key(self.root / "keys" / "trainer.key")
        validators = [
            _key(self.root / "keys" / f"validator-{i}.key") for i in range(config.validators)
        ]
        allow = ", ".join(f'"{v.node_id}"' for v in validators)
        (self.root / "coordinator.toml").write_text(
            f'network_id = "{NETWORK_ID}"\n'
            f'trainers = ["{trainer.node_id}"]\n'
            f"validators = [{allow}]\n"
            "eject_after_rejects = 1000\n"
            f"heartbeat_interval = {HEARTBEAT_INTERVAL:g}\n"
            f"lease_duration = {config.lease_duration:g}\n"
        )
        (self.root / "trainer.toml").write_text(
            _trainer_toml(demo).replace("demand_timeout = 120.0", "demand_timeout = 30.0")
        )
        shared_key = self.root / "coordinator.key"
        for replica in range(config.replicas):
            data_dir = self.root / f"coordinator-{replica}"
            data_dir.mkdir(exist_ok=True)
            if replica > 0:  # replicas share one blob directory (docs/coordinator.md)
                blobs = data_dir / "blobs"
                if not blobs.exists():
                    (self.root / "coordinator-0" / "blobs").mkdir(parents=True, exist_ok=True)
                    blobs.symlink_to(self.root / "coordinator-0" / "blobs")
            address = f"127.0.0.1:{_free_port()}"
            self.coordinator_addresses.append(address)
            command = [
                *_rollnet(),
                "coordinator",
                "--data-dir",
                str(data_dir),
                "--config",
                str(self.root / "coordinator.toml"),
                "--listen",
                address,
                "--key-file",
                str(shared_key),
            ]
            if config.database_url is not None:
                command += ["--db", config.database_url]
            name = f"coordinator-{replica}"
            self._start(name, command)
            # One at a time: the first migrates a fresh database.
            await _wait_for_coordinator(address, self.processes.processes[name], self._log(name))
            proxy = FaultProxy(address)
            await proxy.start()
            self.proxies.append(proxy)
        self._mirror = asyncio.create_task(self._mirror_origin())

        def common(index: int) -> list[str]:
            via = self.proxies[index % len(self.proxies)].address
            return ["--coordinator", via, "--network-id", NETWORK_ID]

        nodes = ["trainer"] + [f"worker-{i}" for i in range(config.workers)]
        nodes += [f"validator-{i}" for i in range(config.validators)]
        for name in nodes:  # made before the processes start: the harness needs their ids
            self.node_ids[name] = _key(self.root / "keys" / f"{name}.key").node_id
        relay_option: list[str] = []
        if config.relays:
            origin = f"127.0.0.1:{_free_port()}"
            cache = f"127.0.0.1:{_free_port()}"
            self.relay_urls = {"relay-origin": f"http://{origin}", "relay-cache": f"http://{cache}"}
            self._start(
                "relay-origin",
                [*_rollnet(), "relay", "--origin", str(self.root / "origin"), "--listen", origin],
            )
            self._start(
                "relay-cache",
                [
                    *_rollnet(),
                    "relay",
                    "--upstream",
                    f"http://{origin}",
                    "--listen",
                    cache,
                    "--data-dir",
                    str(self.root / "relay-cache"),
                    *common(0),
                    "--key",
                    str(self.root / "keys" / "relay-cache.key"),
                ],
            )
            relay_option = ["--relay", f"http://{cache},http://{origin}"]
        self._start(
            "trainer",
            [
                *_rollnet(),
                "trainer",
                *common(0),
                "--key",
                str(self.root / "keys" / "trainer.key"),
                "--model",
                str(model_dir),
                "--data-dir",
                str(self.root / "trainer"),
                "--config",
                str(self.root / "trainer.toml"),
                *ONE_THREAD,
            ],
        )
        for role, count in (("worker", config.workers), ("validator", config.validators)):
            for i in range(count):
                self._start(
                    f"{role}-{i}",
                    [
                        *_rollnet(),
                        role,
                        *common(i),
                        "--key",
                        str(self.root / "keys" / f"{role}-{i}.key"),
                        *ONE_THREAD,
                        "--data-dir",
                        str(self.root / f"{role}-{i}"),
                        *relay_option,
                    ],
                )

    def _log(self, name: str) -> Path:
        return self.logs / f"{name}.log"

    def _start(self, name: str, command: list[str]) -> None:
        self.commands[name] = command
        self.restart(name)

    async def _mirror_origin(self) -> None:
        """Hard-link the coordinator's blobs into the origin relay's directory, continually."""
        store = self.root / "coordinator-0" / "blobs"
        origin = self.root / "origin" / "blobs"
        while True:
            await asyncio.to_thread(_link_new_blobs, store, origin)
            await asyncio.sleep(0.25)

    # -- faults -------------------------------------------------------------------------------

    def names(self, prefix: str) -> list[str]:
        """The processes whose name starts with ``prefix``."""
        return sorted(name for name in self.commands if name.startswith(prefix))

    def kill(self, name: str) -> None:
        """SIGKILL the process and everything in its group; reap it."""
        process = self.processes.processes[name]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()

    def restart(self, name: str) -> None:
        """Start the process (again) with its original command line."""
        self.started_at[name] = datetime.now(UTC)
        self.processes.start(name, self.commands[name], self.logs)

    # -- observing ---------------------------------------------------------------------------

    def ledger_head(self) -> int:
        """The newest ledger entry's sequence (0 when empty)."""
        with self.db.connect() as connection:
            value = connection.execute(select(func.max(LedgerEntry.sequence))).scalar()
        return int(value or 0)

    def trainer_step(self) -> int:
        """The trainer's newest committed step (its metrics lines)."""
        lines = read_jsonl(self.root / "trainer" / "metrics.jsonl")
        return max((int(line["step"]) for line in lines), default=0)

    def dead(self) -> list[str]:
        """Processes that exited."""
        return sorted(n for n, p in self.processes.processes.items() if p.poll() is not None)

    async def not_serving(self) -> list[str]:
        """Processes that are not serving now, each with why (empty: all are)."""
        problems = [
            f"{name}: exited ({self.processes.processes[name].returncode})" for name in self.dead()
        ]
        for index, address in enumerate(self.coordinator_addresses):
            if not await _grpc_serving(address):
                problems.append(f"coordinator-{index}: health check not SERVING")
        for name, url in self.relay_urls.items():
            if not await asyncio.to_thread(_http_ok, f"{url}/healthz"):
                problems.append(f"{name}: /healthz not answering")
        heartbeats = await asyncio.to_thread(self._heartbeats)
        fresh = datetime.now(UTC) - timedelta(seconds=3 * HEARTBEAT_INTERVAL + 2)
        for name, node_id in sorted(self.node_ids.items()):
            state, seen = heartbeats.get(node_id, ("unregistered", None))
            since = max(fresh, self.started_at[name])
            if state != "active" or seen is None or seen < since:
                problems.append(f"{name}: node {state}, last heartbeat {seen}")
        return problems

    def _heartbeats(self) -> dict[str, tuple[str, datetime | None]]:
        with self.db.connect() as connection:
            rows = connection.execute(select(Node.id, Node.state, Node.last_heartbeat_at)).all()
        return {row[0]: (str(row[1]), _aware(row[2])) for row in rows}

    # -- stopping ----------------------------------------------------------------------------

    async def stop(self) -> None:
        """Stop every process (SIGTERM, then SIGKILL), the proxies and the mirror."""
        if self._mirror is not None:
            self._mirror.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._mirror
        for proxy in self.proxies:
            proxy.heal()
        # Nodes first (they drain against a live coordinator), then the coordinators.
        running = self.processes.processes
        for coordinators in (False, True):
            group = {
                n: p for n, p in running.items() if n.startswith("coordinator") == coordinators
            }
            await asyncio.to_thread(_Swarm(processes=group).stop, 30.0)
        for proxy in self.proxies:
            await proxy.close()
        if self.engine is not None:
            self.engine.dispose()


def _aware(moment: datetime | None) -> datetime | None:
    if moment is None or moment.tzinfo is not None:
        return moment
    return moment.replace(tzinfo=UTC)


def _link_new_blobs(store: Path, origin: Path) -> None:
    if not store.is_dir():
        return
    for path in store.glob("??/*"):
        target = origin / path.name
        if len(path.name) == 64 and not target.exists():
            with contextlib.suppress(FileNotFoundError, FileExistsError):
                os.link(path, target)


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=3) as reply:
            return bool(reply.status == 200)
    except OSError:
        return False


async def _grpc_serving(address: str) -> bool:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    async with grpc.aio.insecure_channel(address) as channel:
        try:
            reply = await health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(), timeout=3
            )
        except grpc.aio.AioRpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)
