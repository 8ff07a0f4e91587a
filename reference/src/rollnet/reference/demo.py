"""The local demo swarm: one machine, every role, real processes on loopback, learning.

``rollnet demo`` makes the tiny model and warm-starts it on the ``reverse`` environment's format
(seconds), starts a coordinator, then the trainer, honest workers, validators and a cheating
worker, each as its own process. The trainer publishes checkpoint 0, asks for GRPO groups, trains
on the validated ones and publishes a new checkpoint every step; the workers pick each one up.
The demo follows the trainer's per-step metrics and prints the reward as it rises, then the
reward at the start against the end, the ledger (credits, the cheater's slashes) and the check of
its hash chain with ``rollnet ledger verify``. The per-step metrics (``trainer/metrics.jsonl``)
and a reward curve (``reward.png``) are left in the data directory.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollnet.reference.cli.errors import EXIT_INTERRUPTED, CliError
from rollnet.reference.demo_control import (
    DataDirLock,
    StopSignals,
    complete_when_done,
    in_daemon_thread,
    signal_groups,
)
from rollnet.reference.demo_view import SwarmWatch
from rollnet.sdk import PROTOCOL_VERSION, ConnectionConfig, Identity, RollnetClient
from rollnet.sdk.version import software_version
from rollnet.v1 import (
    common_pb2,
    ledger_pb2,
    ledger_service_pb2,
    node_pb2,
    node_service_pb2,
)

NETWORK_ID = "rollnet-demo"
#: The ledger's export (``rollnet ledger export``'s format) a finished demo leaves.
LEDGER_EXPORT = "ledger.jsonl"


@dataclass
class DemoConfig:
    """What the demo runs."""

    data_dir: Path
    workers: int = 2
    validators: int = 1
    cheats: tuple[str, ...] = ("token_altered",)
    steps: int = 50
    """Trainer steps (each publishes a checkpoint)."""
    prompts_per_step: int = 32
    """GRPO groups per step."""
    samples_per_prompt: int = 8
    prompts_per_task: int = 4
    max_new_tokens: int = 12
    max_off_policy_steps: int = 1
    learning_rate: float = 3e-3
    warm_start_steps: int = 400
    step_timeout: float = 300.0
    port: int = 0
    eject_after_rejects: int = 2


@dataclass
class _Swarm:
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    keep_fds: tuple[int, ...] = ()
    """Inherited by every child: the data directory's lock (see demo_control.DataDirLock)."""

    def start(self, name: str, args: list[str], log_dir: Path) -> None:
        with open(log_dir / f"{name}.log", "ab") as log:
            self.processes[name] = subprocess.Popen(
                args,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                pass_fds=self.keep_fds,
            )

    def stop(self, timeout: float = 60.0) -> None:
        # Workers and validators first (they drain), the coordinator last.
        ordered = sorted(self.processes.items(), key=lambda item: item[0] == "coordinator")
        nodes = [p for name, p in ordered if name != "coordinator"]
        coordinator = [p for name, p in ordered if name == "coordinator"]
        for group in (nodes, coordinator):
            # Each child leads a session of its own: its group holds what it started itself.
            signal_groups(group, signal.SIGTERM)
            deadline = time.monotonic() + timeout
            for process in group:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=max(0.1, deadline - time.monotonic()))
                if process.poll() is None:
                    process.kill()
                    process.wait()
            signal_groups(group, signal.SIGKILL)  # whatever a child left in its group


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


#: Every model process of the demo shares this machine's cores: one PyTorch thread each, or their
#: threads wait on each other at every operation (see docs/worker.md).
ONE_THREAD = ("--torch-threads", "1")


def _rollnet() -> list[str]:
    return [sys.executable, "-m", "rollnet.reference.cli"]


#: What a demo run leaves that the next one must not start from (keys and the models stay).
_RUN_STATE = ("coordinator", "logs", "worker-*", "validator-*", "cheat-*", "trainer")


def clear_previous_run(root: Path) -> bool:
    """Remove an earlier run's coordinator database, blobs, node state and logs under ``root``.

    A trainer resumes from its state, and the coordinator's checkpoints and ledger would be ahead
    of a fresh one: every run starts a new network. The tiny model, its warm start and the keys
    are kept: they are the same every run. Returns whether anything was removed.
    """
    removed = False
    for pattern in _RUN_STATE:
        for path in root.glob(pattern):
            if path.is_dir():
                shutil.rmtree(path)
                removed = True
    for stale in ("reward.png", LEDGER_EXPORT):
        if (root / stale).exists():
            (root / stale).unlink()
    return removed


def _key(path: Path) -> Identity:
    if path.exists():
        return Identity.load(path)
    identity = Identity.generate()
    identity.save(path)
    return identity


async def _wait_for_coordinator(address: str, process: subprocess.Popen[bytes], log: Path) -> None:
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc

    deadline = time.monotonic() + 120
    async with grpc.aio.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise CliError(
                    f"the demo's coordinator exited at start ({process.returncode}); "
                    f"its log says why: {log}"
                )
            with contextlib.suppress(grpc.aio.AioRpcError):
                reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=2)
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            await asyncio.sleep(0.2)
    raise CliError(f"the demo's coordinator did not become ready within 120 s; see {log}")


def _trainer_toml(config: DemoConfig) -> str:
    return (
        'environment = "reverse"\n'
        f"group_size = {config.samples_per_prompt}\n"
        f"batch_groups = {config.prompts_per_step}\n"
        f"prompts_per_task = {config.prompts_per_task}\n"
        f"max_new_tokens = {config.max_new_tokens}\n"
        f"max_off_policy_steps = {config.max_off_policy_steps}\n"
        f"max_steps = {config.steps}\n"
        f"learning_rate = {config.learning_rate}\n"
        "grad_clip = 1.0\n"
        "demand_timeout = 120.0\n"
        "\n[loss]\n"
        'kind = "clip"\n'
    )


def _models(root: Path, config: DemoConfig) -> Path:
    """The tiny model and its warm start on ``reverse`` (made once, kept between runs)."""
    from rollnet.reference.model.tiny import init_tiny_model
    from rollnet.reference.trainer.warm_start import warm_start

    base = root / "model"
    if not (base / "config.json").exists():
        print("creating the tiny model ...", flush=True)
        with complete_when_done(base) as partial:
            init_tiny_model(partial)
    warm = root / f"model-warm-{config.warm_start_steps}"
    if not (warm / "config.json").exists():
        import torch

        # One thread, as every process of the demo: threads beyond the free cores only wait.
        torch.set_num_threads(1)
        started = time.monotonic()
        print("warm-starting it on the reverse environment's format ...", flush=True)
        with complete_when_done(warm) as partial:
            result = warm_start(
                base,
                partial,
                "reverse",
                fmt="copy",
                answer_share=0.1,
                steps=config.warm_start_steps,
            )
        print(
            f"warm start: loss {result.first_loss:.2f} -> {result.final_loss:.2f} in "
            f"{time.monotonic() - started:.0f} s",
            flush=True,
        )
    return warm


async def run_demo(config: DemoConfig, stop: StopSignals | None = None) -> int:
    """Run the demo swarm; returns a process exit code.

    Refuses (``CliError``) while another demo's processes use the data directory. With ``stop``,
    Ctrl-C and SIGTERM end the run early: the summary is printed and every process stopped.
    """
    root = config.data_dir.resolve()
    lock = DataDirLock(root)
    lock.acquire()
    try:
        return await _run_locked(config, root, lock, stop)
    finally:
        lock.release()


async def _run_locked(
    config: DemoConfig, root: Path, lock: DataDirLock, stop: StopSignals | None
) -> int:
    if clear_previous_run(root):
        print(f"starting afresh: the previous run's network under {root} removed")
    for sub in ("keys", "logs"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    # A thread a stop need not wait for: the models appear only once complete.
    model_dir = await in_daemon_thread(_models, root, config)
    trainer = _key(root / "keys" / "trainer.key")
    validators = [_key(root / "keys" / f"validator-{i}.key") for i in range(config.validators)]
    port = config.port or _free_port()
    address = f"127.0.0.1:{port}"
    dashboard = f"127.0.0.1:{_free_port()}"
    allow = ", ".join(f'"{v.node_id}"' for v in validators)
    (root / "coordinator.toml").write_text(
        f'network_id = "{NETWORK_ID}"\n'
        f'trainers = ["{trainer.node_id}"]\n'
        f"validators = [{allow}]\n"
        f"eject_after_rejects = {config.eject_after_rejects}\n"
        f'dashboard_listen = "{dashboard}"\n'
        "heartbeat_interval = 2\n"
        "lease_duration = 120\n"
    )
    (root / "trainer.toml").write_text(_trainer_toml(config))
    swarm = _Swarm(keep_fds=(lock.fd,) if lock.fd is not None else ())
    if stop is not None:
        stop.watch(swarm.processes)
    logs = root / "logs"
    common = ["--coordinator", address, "--network-id", NETWORK_ID]
    ok = False
    try:
        swarm.start(
            "coordinator",
            [
                *_rollnet(),
                "coordinator",
                "--data-dir",
                str(root / "coordinator"),
                "--config",
                str(root / "coordinator.toml"),
                "--listen",
                address,
            ],
            logs,
        )
        await _wait_for_coordinator(
            address, swarm.processes["coordinator"], logs / "coordinator.log"
        )
        print(f"coordinator on {address} (network {NETWORK_ID}); logs in {logs}", flush=True)
        print(f"dashboard: http://{dashboard}/", flush=True)
        swarm.start(
            "trainer",
            [
                *_rollnet(),
                "trainer",
                *common,
                "--key",
                str(root / "keys" / "trainer.key"),
                "--model",
                str(model_dir),
                "--data-dir",
                str(root / "trainer"),
                "--config",
                str(root / "trainer.toml"),
                *ONE_THREAD,
            ],
            logs,
        )
        for i in range(config.workers):
            swarm.start(
                f"worker-{i}",
                [
                    *_rollnet(),
                    "worker",
                    *common,
                    "--key",
                    str(root / "keys" / f"worker-{i}.key"),
                    *ONE_THREAD,
                    "--data-dir",
                    str(root / f"worker-{i}"),
                ],
                logs,
            )
        for i in range(config.validators):
            swarm.start(
                f"validator-{i}",
                [
                    *_rollnet(),
                    "validator",
                    *common,
                    "--key",
                    str(root / "keys" / f"validator-{i}.key"),
                    *ONE_THREAD,
                    "--data-dir",
                    str(root / f"validator-{i}"),
                ],
                logs,
            )
        for cheat in config.cheats:
            swarm.start(
                f"cheat-{cheat}",
                [
                    sys.executable,
                    "-m",
                    "rollnet.reference.adversary",
                    "--cheat",
                    cheat,
                    *common,
                    "--key",
                    str(root / "keys" / f"cheat-{cheat}.key"),
                    *ONE_THREAD,
                    "--data-dir",
                    str(root / f"cheat-{cheat}"),
                ],
                logs,
            )
        print(
            f"started the trainer, {config.workers} worker(s), {config.validators} "
            f"validator(s), cheats: {', '.join(config.cheats) or 'none'}",
            flush=True,
        )
        print(
            f"training on reverse: {config.steps} steps of {config.prompts_per_step} groups x "
            f"{config.samples_per_prompt} completions, up to {config.max_off_policy_steps} "
            "step(s) off-policy",
            flush=True,
        )
        lines = await _watch_trainer(root, swarm, config, f"http://{dashboard}", stop)
        ok = len(lines) == config.steps
        if lines:
            _summarize(lines, root)
        else:
            print("no trainer step finished", flush=True)
        names = {Identity.load(path).node_id: path.stem for path in (root / "keys").glob("*.key")}
        client = RollnetClient.connect(ConnectionConfig(address, NETWORK_ID), trainer)
        async with client:
            await client.nodes.register_node(
                node_service_pb2.RegisterNodeRequest(
                    public_key=trainer.public_key,
                    role=common_pb2.ROLE_TRAINER,
                    protocol_version=PROTOCOL_VERSION,
                    software_version=software_version("demo"),
                    capabilities=node_pb2.Capabilities(),
                )
            )
            await _report_ledger(client, names)
    finally:
        print("stopping the swarm ...", flush=True)
        # In a thread: a second Ctrl-C must still be heard while the children drain.
        await asyncio.shield(asyncio.to_thread(swarm.stop))
    db = f"sqlite:///{root / 'coordinator' / 'rollnet.db'}"
    await asyncio.to_thread(_export_ledger, db, root / LEDGER_EXPORT)
    verify = await asyncio.create_subprocess_exec(*_rollnet(), "ledger", "verify", "--db", db)
    verified = await verify.wait()
    if stop is not None and stop.stopping.is_set():
        print(f"stopped by {stop.signal_name}", flush=True)
        return EXIT_INTERRUPTED
    return 0 if ok and verified == 0 else 1


async def _watch_trainer(
    root: Path,
    swarm: _Swarm,
    config: DemoConfig,
    dashboard_url: str,
    stop: StopSignals | None,
) -> list[dict[str, Any]]:
    """Follow the trainer's steps with the swarm's view shown, until done or stopped."""
    from rollnet.reference.trainer.metrics import read_jsonl

    watch = SwarmWatch(dashboard_url, metrics=root / "trainer" / "metrics.jsonl")
    poller = asyncio.create_task(watch.run())
    try:
        with watch.shown():
            follow = _follow_trainer(root / "trainer", swarm.processes["trainer"], config)
            if stop is None:
                return await follow
            await stop.race(follow)
            return read_jsonl(root / "trainer" / "metrics.jsonl")
    finally:
        poller.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await poller


def _export_ledger(db: str, out: Path) -> None:
    """Write the ledger's export (``rollnet ledger export``) and say where."""
    from rollnet.ledger.engine import open_existing
    from rollnet.ledger.export import export_jsonl

    engine = open_existing(db)
    try:
        count = export_jsonl(engine, out)
    finally:
        engine.dispose()
    print(f"ledger export: {count} entries in {out}", flush=True)


async def _follow_trainer(
    data_dir: Path, process: subprocess.Popen[bytes], config: DemoConfig
) -> list[dict[str, Any]]:
    """Print each step's line of the trainer's metrics as it appears; return them all."""
    from rollnet.reference.trainer.metrics import read_jsonl

    path = data_dir / "metrics.jsonl"
    shown = 0
    lines: list[dict[str, Any]] = []
    last_progress = time.monotonic()
    while shown < config.steps:
        lines = read_jsonl(path)
        for line in lines[shown:]:
            lag = ", ".join(f"{k}:{v}" for k, v in sorted(line["staleness"].items()))
            print(
                f"step {line['step']:>3}: task reward {line['sampled_task_reward']:.3f} "
                f"(batch {line['task_reward']:.3f}, {line['samples']} rollouts, lag {{{lag}}}, "
                "trainer idle "
                f"{100 * line['idle_fraction']:.0f}%, {line['tokens_per_s']:.0f} tokens/s)",
                flush=True,
            )
            last_progress = time.monotonic()
        shown = max(shown, len(lines))
        if process.poll() is not None and shown < config.steps:
            lines = read_jsonl(path)
            if len(lines) > shown:
                continue
            print(f"the trainer exited ({process.returncode}); see logs/trainer.log", flush=True)
            break
        if time.monotonic() - last_progress > config.step_timeout:
            print(f"no step for {config.step_timeout:.0f} s; see logs/", flush=True)
            break
        await asyncio.sleep(0.5)
    return read_jsonl(path)


def _summarize(lines: list[dict[str, Any]], root: Path) -> None:
    rewards = [line["sampled_task_reward"] for line in lines]
    head = statistics.fmean(rewards[:3])
    tail = statistics.fmean(rewards[-5:])
    print(
        f"reward: {head:.3f} at the start (mean of the first 3 steps) -> {tail:.3f} at the end "
        f"(last 5 steps), {len(lines)} steps",
        flush=True,
    )
    idle = statistics.fmean(line["idle_fraction"] for line in lines)
    dropped = lines[-1]["dropped_stale"], lines[-1]["dropped_no_signal"]
    print(
        f"trainer: idle {100 * idle:.0f}% of the time waiting for rollouts; groups dropped: "
        f"{dropped[0]} stale, {dropped[1]} without signal",
        flush=True,
    )
    print(f"per-step metrics: {root / 'trainer' / 'metrics.jsonl'}", flush=True)
    try:
        picture = plot_rewards(lines, root / "reward.png")
    except ImportError as error:  # matplotlib is a dependency; say so plainly if it is gone
        print(f"no reward curve: {error}", flush=True)
    else:
        print(f"reward curve: {picture}", flush=True)


def plot_rewards(lines: list[dict[str, Any]], out: Path) -> Path:
    """Draw the task reward per step — of all sampled groups, and of the batch — into ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [line["step"] for line in lines]
    figure, axes = plt.subplots(figsize=(7, 4), dpi=120)
    sampled = [line["sampled_task_reward"] for line in lines]
    batch = [line["task_reward"] for line in lines]
    axes.plot(steps, sampled, marker="o", markersize=3, label="all sampled groups")
    axes.plot(steps, batch, alpha=0.5, label="the batch (groups with signal)")
    axes.legend(loc="lower right")
    axes.set_xlabel("trainer step")
    axes.set_ylabel("mean task reward")
    axes.set_ylim(0, 1)
    axes.set_title("rollnet demo: GRPO on reverse, tiny model, local swarm")
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(out)
    plt.close(figure)
    return out


async def _report_ledger(client: RollnetClient, names: dict[str, str]) -> None:
    kinds: Counter[str] = Counter()
    balances: Counter[str] = Counter()
    slashes: Counter[str] = Counter()
    after, head = 0, 0
    while True:  # every page, not only the first
        page = await client.ledger.list_entries(
            ledger_service_pb2.ListEntriesRequest(after_sequence=after, page_size=1000)
        )
        head = page.head_sequence
        for entry in page.entries:
            kinds[ledger_pb2.LedgerEntry.Kind.Name(entry.kind)] += 1
            balances[entry.node_id] += entry.amount
            if entry.kind == ledger_pb2.LedgerEntry.KIND_SLASH:
                slashes[entry.memo or "?"] += 1
        if not page.entries or page.entries[-1].sequence >= head:
            break
        after = page.entries[-1].sequence
    print(f"ledger: {head} entries", flush=True)
    for kind, count in sorted(kinds.items()):
        label = kind.removeprefix("KIND_").lower().replace("_", " ")
        print(f"  {label:<24} {count:>8,} entries", flush=True)
    for reason, count in slashes.most_common():
        print(f"  rejected: {count} x {reason}", flush=True)
    for node_id, amount in balances.most_common():
        name = names.get(node_id, "?")
        print(f"  balance {name:<24} {node_id}: {amount:>8,} work units", flush=True)
