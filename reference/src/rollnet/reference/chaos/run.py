"""A chaos run: start the swarm, inject seeded random faults for a budget, check the invariants.

Faults go one at a time, in rounds (begun while the budget lasts, each finished): a round is
every kind once, in an order drawn from the
seeded generator, against a target drawn the same way (which worker, which replica's proxy).
After each fault the harness waits until the swarm has **recovered**: the ledger has grown
since the fault ended (a rollout was validated and credited: the swarm makes progress) and every
process is serving again (coordinators answer their health check SERVING, relays their
``/healthz``, every node is ACTIVE with a heartbeat in the last three intervals). Both times are
recorded, from the end of the fault (the kill and restart; the end of a delay or a partition).

When the budget is spent the harness waits for one more trainer step, then checks the
invariants (:mod:`rollnet.reference.chaos.invariants`) and stops the swarm.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import text

from rollnet.reference.chaos.invariants import (
    Invariant,
    each_commitment_credited_once,
    each_rollout_trained_once,
    every_task_terminal_or_leased,
    ledger_verifies,
)
from rollnet.reference.chaos.postgres import PrivatePostgres
from rollnet.reference.chaos.swarm import ChaosSwarm, SwarmConfig

__all__ = ["FAULT_KINDS", "ChaosConfig", "ChaosReport", "FaultRecord", "run_chaos"]

#: Every kind of fault, in the report's order.
FAULT_KINDS = (
    "kill_worker",
    "kill_validator",
    "kill_relay",
    "kill_trainer",
    "kill_coordinator",
    "drop_db_connections",
    "restart_database",
    "proxy_delay",
    "proxy_reset",
    "proxy_partition",
)


@dataclass
class ChaosConfig:
    """What a chaos run does."""

    swarm: SwarmConfig
    budget: float = 60.0
    """Seconds of fault injection: rounds begin while it lasts, and the last one is finished
    (every kind as often as every other)."""
    seed: int = 0
    kinds: tuple[str, ...] = FAULT_KINDS
    """Kinds that do not apply are left out: drop_db_connections without PostgreSQL,
    restart_database without a ``database_server``, kill_relay without relays."""
    recovery_timeout: float = 120.0
    settle_timeout: float = 300.0
    """For the first trainer step before the faults, and one more after them."""
    delay: float = 0.3
    """Seconds a proxy holds each chunk during a delay fault."""
    fault_seconds: float = 6.0
    """How long a delay or a partition lasts."""
    database_server: PrivatePostgres | None = None
    """The swarm's own PostgreSQL server, which restart_database restarts (None: the database
    is on a shared server, which is never restarted)."""
    database_down: float = 2.0
    """Seconds the database server stays stopped during a restart_database fault."""
    log: Callable[[str], None] = print


@dataclass(frozen=True, slots=True)
class FaultRecord:
    """One injected fault and the swarm's recovery from it (None: not within the timeout)."""

    kind: str
    target: str
    at: float
    """Seconds since the faults began."""
    progress_s: float | None
    serving_s: float | None

    @property
    def survived(self) -> bool:
        """Whether the swarm made progress and every process served again."""
        return self.progress_s is not None and self.serving_s is not None


@dataclass
class ChaosReport:
    """What a chaos run found."""

    faults: list[FaultRecord] = field(default_factory=list)
    invariants: list[Invariant] = field(default_factory=list)
    steps: tuple[int, int] = (0, 0)
    """The trainer's step when the faults began, and at the end."""
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """Every fault survived and every invariant holds."""
        return all(f.survived for f in self.faults) and all(i.holds for i in self.invariants)

    def table(self) -> str:
        """Faults per kind (injected, survived, recovery times) and the invariants, as markdown."""
        rows = [
            "| fault | injected | survived | progress again, median (max) | all serving, "
            "median (max) |",
            "|---|---|---|---|---|",
        ]
        for kind in FAULT_KINDS:
            records = [f for f in self.faults if f.kind == kind]
            if not records:
                continue
            survived = sum(f.survived for f in records)
            rows.append(
                f"| {kind} | {len(records)} | {survived} | "
                f"{_spread([f.progress_s for f in records])} | "
                f"{_spread([f.serving_s for f in records])} |"
            )
        rows.append("")
        rows.append("| invariant | holds | detail |")
        rows.append("|---|---|---|")
        for invariant in self.invariants:
            mark = "yes" if invariant.holds else "**NO**"
            rows.append(f"| {invariant.name} | {mark} | {invariant.detail} |")
        return "\n".join(rows)


def _spread(values: list[float | None]) -> str:
    done = [v for v in values if v is not None]
    if not done:
        return "never"
    missing = len(values) - len(done)
    text = f"{statistics.median(done):.1f} s ({max(done):.1f} s)"
    return text + (f", {missing} never" if missing else "")


async def run_chaos(config: ChaosConfig) -> ChaosReport:
    """Run the swarm under faults; returns the report (the swarm is stopped either way)."""
    swarm = ChaosSwarm(config.swarm)
    kinds = _applicable(config)
    report = ChaosReport()
    rng = random.Random(config.seed)
    started = time.monotonic()
    try:
        await swarm.start()
        config.log(f"swarm started: {', '.join(sorted(swarm.commands))}")
        await _wait(
            lambda: _first_step(swarm), config.settle_timeout, "the trainer's first step", swarm
        )
        first = swarm.trainer_step()
        config.log(f"trainer at step {first}; injecting faults for {config.budget:.0f} s")
        faults_began = time.monotonic()
        while time.monotonic() - faults_began < config.budget:
            for kind in rng.sample(kinds, len(kinds)):
                record = await _inject(swarm, kind, rng, config, time.monotonic() - faults_began)
                report.faults.append(record)
                config.log(
                    f"{record.at:6.1f} s {record.kind:<20} {record.target:<14} "
                    f"progress {_seconds(record.progress_s)}, serving {_seconds(record.serving_s)}"
                )
        last = swarm.trainer_step()
        config.log(f"faults done; trainer at step {last}; waiting for one more step")
        await _wait(
            lambda: _stepped_past(swarm, last), config.settle_timeout, "a trainer step", swarm
        )
        await _wait(lambda: _all_serving(swarm), config.recovery_timeout, "all serving", swarm)
        problems = await swarm.not_serving()
        report.invariants.append(
            Invariant(
                "every process that should be alive is serving",
                not problems,
                "; ".join(problems) or f"{len(swarm.commands)} processes",
            )
        )
        report.invariants.append(await asyncio.to_thread(every_task_terminal_or_leased, swarm.db))
        final = swarm.trainer_step()
        report.steps = (first, final)
        report.invariants.append(
            Invariant("training progressed", final > first, f"trainer step {first} -> {final}")
        )
    finally:
        await swarm.stop()
    report.invariants.append(each_rollout_trained_once(swarm.root / "trainer"))
    report.invariants.append(await asyncio.to_thread(each_commitment_credited_once, swarm.db))
    swarm.db.dispose()
    report.invariants.append(await asyncio.to_thread(ledger_verifies, swarm.database_url))
    report.seconds = time.monotonic() - started
    return report


def _applicable(config: ChaosConfig) -> list[str]:
    unknown = sorted(set(config.kinds) - set(FAULT_KINDS))
    if unknown:
        raise ValueError(f"unknown fault kind(s) {unknown}: known are {', '.join(FAULT_KINDS)}")
    kinds = list(config.kinds)
    if config.swarm.database_url is None or not config.swarm.database_url.startswith("postgres"):
        kinds = [k for k in kinds if k != "drop_db_connections"]
    if config.database_server is None:
        kinds = [k for k in kinds if k != "restart_database"]
    if not config.swarm.relays:
        kinds = [k for k in kinds if k != "kill_relay"]
    if not kinds:
        raise ValueError("no fault kind applies to this swarm")
    return kinds


async def _inject(
    swarm: ChaosSwarm, kind: str, rng: random.Random, config: ChaosConfig, at: float
) -> FaultRecord:
    if kind.startswith("kill_"):
        prefix = {"kill_relay": "relay-"}.get(kind, kind.removeprefix("kill_"))
        target = rng.choice(swarm.names(prefix))
        await asyncio.to_thread(swarm.kill, target)
        swarm.restart(target)
    elif kind == "drop_db_connections":
        dropped = await asyncio.to_thread(_terminate_backends, swarm)
        target = f"{dropped} backends"
    elif kind == "restart_database":
        server = config.database_server
        assert server is not None  # _applicable leaves the kind out without one
        await asyncio.to_thread(server.restart, config.database_down)
        target = f"postgres:{server.port}"
    else:
        index = rng.randrange(len(swarm.proxies))
        proxy = swarm.proxies[index]
        target = f"proxy-{index}"
        if kind == "proxy_delay":
            proxy.delay(config.delay, config.fault_seconds)
            await asyncio.sleep(config.fault_seconds)
        elif kind == "proxy_reset":
            target += f" ({proxy.reset()} conns)"
        else:
            proxy.partition()
            await asyncio.sleep(config.fault_seconds)
            proxy.heal()
    ended = time.monotonic()
    # Read once the fault is over: a write in flight when it began must not count as progress.
    head = await asyncio.to_thread(swarm.ledger_head)
    progress_s = await _time_until(
        lambda: _ledger_past(swarm, head), config.recovery_timeout, ended
    )
    serving_s = await _time_until(lambda: _all_serving(swarm), config.recovery_timeout, ended)
    return FaultRecord(kind, target, at, progress_s, serving_s)


def _terminate_backends(swarm: ChaosSwarm) -> int:
    """Drop every connection to the swarm's PostgreSQL database but the one asking."""
    with swarm.db.connect() as connection:
        rows = connection.execute(
            text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = current_database() AND pid <> pg_backend_pid()"
            )
        ).all()
        connection.commit()
    return sum(1 for (done,) in rows if done)


async def _ledger_past(swarm: ChaosSwarm, head: int) -> bool:
    return await asyncio.to_thread(swarm.ledger_head) > head


async def _all_serving(swarm: ChaosSwarm) -> bool:
    return not await swarm.not_serving()


async def _first_step(swarm: ChaosSwarm) -> bool:
    return await _stepped_past(swarm, 0)


async def _stepped_past(swarm: ChaosSwarm, step: int) -> bool:
    return await asyncio.to_thread(swarm.trainer_step) > step


async def _time_until(condition: Callable[[], object], within: float, since: float) -> float | None:
    """Seconds from ``since`` until ``condition()`` (awaited) holds; None past ``within``."""
    while time.monotonic() - since < within:
        if await condition():  # type: ignore[misc]
            return time.monotonic() - since
        await asyncio.sleep(0.25)
    return None


async def _wait(
    condition: Callable[[], object], within: float, what: str, swarm: ChaosSwarm
) -> None:
    if await _time_until(condition, within, time.monotonic()) is None:
        problems = await swarm.not_serving()
        raise TimeoutError(
            f"no {what} within {within:.0f} s; not serving: {problems or 'none'}; "
            f"logs in {swarm.logs}"
        )


def _seconds(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f} s"
