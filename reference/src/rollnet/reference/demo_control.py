"""What keeps ``rollnet demo`` in hand: its options checked before anything starts, one demo per
data directory, and Ctrl-C / SIGTERM stopping every process it started.

- :func:`check_options` refuses a configuration that could not run (no workers, an unknown cheat,
  a port in use, more new tokens than the coordinator admits) with one line, before a file is
  written or a process started.
- :class:`DataDirLock` holds an exclusive lock on ``DATA_DIR/demo.lock`` for the demo's lifetime;
  every child process inherits the locked file, so while any of them still runs (a demo killed
  with SIGKILL, say) the next demo on that directory refuses instead of deleting their data under
  them.
- :class:`StopSignals` turns the first Ctrl-C or SIGTERM into a clean stop (the children are
  signalled, the summary is still printed) and the second into a forced one (every child's
  process group killed at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import errno
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollnet.reference.cli.errors import EXIT_INTERRUPTED, CliError

if TYPE_CHECKING:
    from rollnet.reference.demo import DemoConfig

LOCK_NAME = "demo.lock"


def known_cheats() -> list[str]:
    """The adversary's cheat names, in its order."""
    from rollnet.reference.adversary.cheats import CHEATS

    return [cheat.value for cheat in CHEATS]


def largest_max_new_tokens() -> int:
    """The most new tokens a demo may ask for: what the coordinator admits and the model holds.

    The demo's coordinator runs with the default ``max_new_tokens``; the tiny model's context
    (prompt and completion together) is its ``max_position_embeddings``.
    """
    from rollnet.reference.model.tiny import TinyModelSpec

    admitted = int(coordinator_default("max_new_tokens"))
    return min(admitted, TinyModelSpec().max_position_embeddings - 1)


def coordinator_default(name: str) -> Any:
    """The default of one of the coordinator's options (the demo's coordinator keeps them)."""
    from rollnet.reference.coordinator.config import CoordinatorConfig

    return next(f.default for f in dataclasses.fields(CoordinatorConfig) if f.name == name)


def check_options(config: DemoConfig) -> None:
    """Raise :class:`CliError` naming the first option the demo cannot run with."""
    from rollnet.reference.coordinator.bounds import MAX_ROLLOUTS_PER_TASK

    at_least_one = {
        "--workers": (config.workers, "honest workers: without one no rollout is made"),
        "--validators": (config.validators, "validators: without one no rollout is accepted"),
        "--steps": (config.steps, "trainer steps"),
        "--prompts": (config.prompts_per_step, "GRPO groups per step"),
        "--samples": (config.samples_per_prompt, "completions per group"),
        "--prompts-per-task": (config.prompts_per_task, "groups per task"),
    }
    for flag, (value, what) in at_least_one.items():
        if value < 1:
            raise CliError(f"{flag} {value}: give at least 1 ({what})")
    if config.samples_per_prompt < 2:
        raise CliError(
            f"--samples {config.samples_per_prompt}: give at least 2 (GRPO compares the "
            "completions of a group; one alone has no signal)"
        )
    most_samples = int(coordinator_default("max_samples_per_prompt"))
    if config.samples_per_prompt > most_samples:
        raise CliError(
            f"--samples {config.samples_per_prompt}: the coordinator admits at most "
            f"{most_samples} completions per prompt"
        )
    per_task = config.prompts_per_task * config.samples_per_prompt
    if per_task > MAX_ROLLOUTS_PER_TASK:
        raise CliError(
            f"--prompts-per-task {config.prompts_per_task} x --samples "
            f"{config.samples_per_prompt} = {per_task:,} rollouts per task: the coordinator "
            f"admits at most {MAX_ROLLOUTS_PER_TASK:,}"
        )
    if config.max_off_policy_steps < 0:
        raise CliError(f"--max-off-policy-steps {config.max_off_policy_steps}: give 0 or more")
    if config.warm_start_steps < 0:
        raise CliError(f"--warm-start-steps {config.warm_start_steps}: give 0 or more")
    cheats = known_cheats()
    unknown = [cheat for cheat in config.cheats if cheat not in cheats]
    if unknown:
        raise CliError(
            f"--cheat {unknown[0]}: no such cheat; choose from {', '.join(cheats)} "
            "(or 'none' for no cheater)"
        )
    if len(set(config.cheats)) != len(config.cheats):
        raise CliError("--cheat: each cheat once (each runs one cheating worker)")
    check_port(config.port)
    # Last: the model's context is read from its spec, which imports torch (seconds).
    if config.max_new_tokens < 1 or config.max_new_tokens > largest_max_new_tokens():
        raise CliError(
            f"--max-new-tokens {config.max_new_tokens}: give 1 to {largest_max_new_tokens():,} "
            "(the tiny model's context, within what the coordinator admits)"
        )


def check_port(port: int) -> None:
    """Refuse a coordinator port out of range or in use on loopback (0: any free port)."""
    if not 0 <= port <= 65535:
        raise CliError(f"--port {port}: give 1 to 65535, or 0 for any free port")
    if port == 0:
        return
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise CliError(
                    f"--port {port}: another process listens there; choose another port, "
                    "or leave --port out for a free one"
                ) from None
            raise CliError(f"--port {port}: cannot listen there ({error.strerror})") from None


class DataDirLock:
    """An exclusive lock on ``ROOT/demo.lock``, held by the demo and inherited by its children."""

    def __init__(self, root: Path) -> None:
        self.path = root / LOCK_NAME
        self.fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise :class:`CliError` saying who holds the directory."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 64).decode(errors="replace").strip()
            os.close(fd)
            raise CliError(self._held_message(holder)) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self.fd = fd

    def _held_message(self, holder: str) -> str:
        root = self.path.parent
        running = holder.isdigit() and _alive(int(holder))
        if running:
            return (
                f"another demo (pid {holder}) is running on {root}: stop it first "
                f"(Ctrl-C, or kill {holder}), or give another --data-dir"
            )
        pids = processes_using(root)
        listed = ", ".join(str(pid) for pid in pids[:8]) or "unknown"
        return (
            f"processes of an earlier demo still run on {root} (pids {listed}): stop them "
            "first (kill PID), or give another --data-dir"
        )

    def release(self) -> None:
        """Give the lock up (the children's inherited copies go with them)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def processes_using(root: Path) -> list[int]:
    """The pids of this user's processes whose command line names a path under ``root``."""
    marker = str(root.resolve())
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            args = (entry / "cmdline").read_bytes().split(b"\0")
            if any(marker in arg.decode(errors="replace") for arg in args):
                found.append(int(entry.name))
    return sorted(found)


def signal_groups(processes: Iterable[subprocess.Popen[bytes]], signum: int) -> None:
    """Send ``signum`` to each child's process group (each runs in a session of its own)."""
    for process in processes:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signum)


class StopSignals:
    """Ctrl-C and SIGTERM for a running demo: the first stops cleanly, the second forces.

    ``stopping`` is set on the first signal; the demo stops following the trainer, prints its
    summary and stops its processes. When the demo is not yet following (the warm start, the
    coordinator's start) its task is cancelled instead. The second signal kills every child's
    process group and ends the demo at once.
    """

    def __init__(self) -> None:
        self.stopping = asyncio.Event()
        self.following = False
        self.signal_name = ""
        self._task: asyncio.Task[Any] | None = None
        self._processes: Mapping[str, subprocess.Popen[bytes]] = {}

    def watch(self, processes: Mapping[str, subprocess.Popen[bytes]]) -> None:
        """The demo's child processes (a live mapping: later starts are seen)."""
        self._processes = processes

    def install(self, task: asyncio.Task[Any]) -> None:
        """Handle SIGINT and SIGTERM on the running loop for ``task``."""
        self._task = task
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(signum, self._on_signal, signum)

    def _on_signal(self, signum: int) -> None:
        name = signal.Signals(signum).name
        if self.stopping.is_set():
            print(f"{name} again: killing every process of the demo", file=sys.stderr, flush=True)
            signal_groups(self._processes.values(), signal.SIGKILL)
            os._exit(EXIT_INTERRUPTED)
        self.signal_name = name
        self.stopping.set()
        print(f"{name}: stopping the demo (Ctrl-C again to force) ...", file=sys.stderr, flush=True)
        if not self.following and self._task is not None:
            self._task.cancel()

    async def race(self, work: Coroutine[Any, Any, Any]) -> bool:
        """Await ``work`` unless a stop comes first (then cancel it); return whether it ran out.

        An exception of ``work`` is raised here.
        """
        self.following = True
        job = asyncio.ensure_future(work)
        stop = asyncio.ensure_future(self.stopping.wait())
        try:
            await asyncio.wait({job, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pending in (job, stop):
                if not pending.done():
                    pending.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await pending
        if job.cancelled():
            return False
        job.result()
        return True


@contextlib.contextmanager
def complete_when_done(target: Path) -> Iterator[Path]:
    """A directory to write ``target`` into, renamed to ``target`` only when the block completes.

    A demo stopped halfway through making a model leaves no half-written model for the next run
    to load (the next run starts the partial one afresh).
    """
    partial = target.with_name(target.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    yield partial
    if target.exists():
        shutil.rmtree(target)
    partial.rename(target)


async def in_daemon_thread(function: Callable[..., Any], *args: Any) -> Any:
    """``function(*args)`` in a daemon thread: a cancelled demo exits without waiting for it.

    (``asyncio.to_thread``'s executor is joined when the loop closes: a stop during the warm
    start would wait for all of it.)
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def target() -> None:
        result, failure = None, None
        try:
            result = function(*args)
        except BaseException as error:  # handed to the awaiting task
            failure = error
        with contextlib.suppress(RuntimeError):  # the loop is gone: the demo was stopped
            loop.call_soon_threadsafe(settle, result, failure)

    threading.Thread(target=target, name=getattr(function, "__name__", "demo"), daemon=True).start()
    return await future
