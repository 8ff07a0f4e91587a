"""Environment verifiers in a child process: on its main thread, under a hard time limit.

A reward is computed from text a model wrote, and a verifier can be made to run for a very long
time by it (sympy expanding ``9^{9^{9}}``). Two things stop the worker and the validator from
simply calling :meth:`Environment.reward <rollnet.reference.envs.Environment.reward>` with a
time limit:

* they call it from threads (their event loops hold the main thread), and a limit enforced with
  ``SIGALRM`` (math-verify's) only works on a process's main thread;
* a signal cannot interrupt a long computation inside C code (big-integer arithmetic), so even on
  the main thread such a limit may not fire.

:class:`RewardSandbox` runs the verifiers in one long-lived child process (a fresh interpreter,
so it holds no copy of the caller's threads or model) that scores on its main thread. The caller
waits at most ``time_limit_s`` for each completion; past it the child is killed and restarted,
and that completion gets :meth:`Environment.unverifiable_reward
<rollnet.reference.envs.Environment.unverifiable_reward>` (task reward 0.0, the length penalty
still applied), the same value the math environment gives when its own limit fires. A verifier
that raises, or a child that dies (out of memory, a crash in native code), gives that value too.
Each :class:`RewardResult` says whether and why the verifier did not finish.

The child builds environments the way the caller's process does, by name and normalised
configuration through :func:`rollnet.reference.envs.load_environment` (built-ins and entry
points), and checks it arrives at the caller's digest. POSIX only (a socket pair carries the
requests).

Environment code can be anyone's (a published verifiers taskset), and a verifier reads text a
model wrote, so the child runs isolated where the host allows it (Linux with bubblewrap; see
:mod:`rollnet.reference.envs.isolation`): no network, no file system beyond the Python
installation and what the environment declares, no node key or data directory, rlimits on
memory, processes and files. An environment whose own code is untrusted
(:attr:`Environment.runs_untrusted_code <rollnet.reference.envs.Environment.runs_untrusted_code>`)
is never run without that isolation. An environment that isolates what it runs itself
(:attr:`Environment.isolates_itself <rollnet.reference.envs.Environment.isolates_itself>`, the
``code`` environment: each completion's program in a sandbox of its own) is scored in the
calling process.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import IO, Any, Literal

from rollnet.reference.envs.base import Environment, Problem, RewardBreakdown
from rollnet.reference.envs.config import canonical_json
from rollnet.reference.envs.isolation import (
    IsolationUnavailable,
    Limits,
    isolated_popen,
    isolation_problem,
    mark_inside_sandbox,
    python_paths,
)

__all__ = [
    "DEFAULT_SANDBOX_LIMITS",
    "DEFAULT_TIME_LIMIT_S",
    "IsolationMode",
    "RewardItem",
    "RewardResult",
    "RewardSandbox",
    "SandboxError",
]

log = logging.getLogger(__name__)

DEFAULT_TIME_LIMIT_S = 30.0
"""Seconds one completion's reward may take before its verifier is killed."""

DEFAULT_SANDBOX_LIMITS = Limits(memory_bytes=2 << 30, processes=256, file_bytes=64 << 20)
"""rlimits of an isolated reward child: 2 GiB of address space (verifiers with its imports
reserves ~0.3 GiB; the rest is the verifier's to use), 256 processes and threads (a fork bomb's
ceiling), no CPU limit (the child lives long; each completion has a wall-clock limit instead)."""

IsolationMode = Literal["auto", "required", "off"]
"""``auto``: isolate the reward child where the host can (and refuse environments whose code
is untrusted where it cannot); ``required``: refuse to score anything without isolation;
``off``: never isolate (environments with untrusted code are refused)."""

_STDERR_LIMIT = 64 << 10
"""Bytes of a reward child's standard error passed on to the log; the rest is dropped."""

DEFAULT_LOADER = "rollnet.reference.envs.registry:load_environment"
"""How the child builds an environment from ``(name, config)`` unless told otherwise."""

RewardItem = tuple[Problem, str, int]
"""``(problem, completion_text, completion_token_count)``: the arguments of ``reward``."""


class SandboxError(RuntimeError):
    """The sandbox could not build the environment (it differs there, or failed to load)."""


@dataclass(frozen=True, slots=True)
class RewardResult:
    """One completion's reward, and why the verifier did not finish when it did not.

    ``failure`` is ``None`` when the environment's ``reward`` returned; otherwise
    ``"time_limit"`` (killed after ``time_limit_s``), ``"crashed"`` (the child process died) or
    ``"error: <exception>"`` (the verifier raised), and ``reward`` is the environment's
    ``unverifiable_reward``.
    """

    reward: RewardBreakdown
    failure: str | None = None


class RewardSandbox:
    """Scores completions with environment verifiers in a child process (see the module docs).

    Thread-safe (one batch at a time). The child starts on the first call and is reused; it is
    told which environment to build by name and normalised configuration, and must arrive at the
    caller's digest. ``loader`` (``"module:function"``) is what builds it there from
    ``(name, config)``; the default is the environment registry. :meth:`close` stops the child;
    so does garbage collection of the sandbox or the end of the calling process, and the child
    exits by itself when its parent is gone.

    ``isolation`` (:data:`IsolationMode`) says whether the child runs isolated, under
    ``limits``; ``readable`` adds paths it may read (a dataset directory outside the Python
    installation).
    """

    def __init__(
        self,
        *,
        time_limit_s: float = DEFAULT_TIME_LIMIT_S,
        load_limit_s: float = 300.0,
        loader: str = DEFAULT_LOADER,
        isolation: IsolationMode = "auto",
        limits: Limits = DEFAULT_SANDBOX_LIMITS,
        readable: Sequence[str] = (),
    ) -> None:
        if not time_limit_s > 0 or not load_limit_s > 0:
            raise ValueError("time_limit_s and load_limit_s must be positive")
        module, _, function = loader.partition(":")
        if not module or not function:
            raise ValueError(f"loader must be 'module:function', got {loader!r}")
        if isolation not in ("auto", "required", "off"):
            raise ValueError(f"isolation must be 'auto', 'required' or 'off', got {isolation!r}")
        self.time_limit_s = time_limit_s
        self.load_limit_s = load_limit_s
        self.loader = loader
        self.isolation: IsolationMode = isolation
        self.limits = limits
        self.readable = tuple(readable)
        self.restarts = 0
        """Children killed or lost so far (each costs a process start and environment load)."""
        self._lock = threading.Lock()
        self._child = _Child()
        weakref.finalize(self, self._child.close)

    @property
    def isolated(self) -> bool:
        """Whether the child runs isolated (``isolation`` allows it and the host can)."""
        return self.isolation != "off" and isolation_problem() is None

    @property
    def child_pid(self) -> int | None:
        """The process id of the running child (its sandbox's ``bwrap`` when isolated)."""
        process = self._child.process
        return None if process is None or process.poll() is not None else process.pid

    def check(self, environment: Environment) -> None:
        """Raise :class:`SandboxError` when this sandbox cannot score ``environment`` here (its
        code needs isolation that this host or the ``isolation`` setting does not give). Call it
        before the work whose completions need scoring."""
        problem = isolation_problem()
        if environment.isolates_itself:
            # It runs its programs in sandboxes of its own, whatever this sandbox's setting.
            if problem is not None:
                raise SandboxError(
                    f"environment {environment.name!r} runs untrusted programs and needs the "
                    f"sandbox, but {problem}"
                )
            return
        if not environment.runs_untrusted_code and self.isolation != "required":
            return
        if self.isolation == "off":
            problem = "the reward sandbox's isolation is off"
        if problem is not None:
            what = "runs untrusted code" if environment.runs_untrusted_code else "is to be scored"
            raise SandboxError(
                f"environment {environment.name!r} {what} and needs the sandbox, but {problem}"
            )

    def rewards(self, environment: Environment, items: Sequence[RewardItem]) -> list[RewardResult]:
        """The reward of every item, in order; see :class:`RewardResult` for failures.

        Raises:
            SandboxError: the child could not build ``environment`` (or not within
                ``load_limit_s``).
        """
        self.check(environment)
        if environment.isolates_itself:
            return [_reward_result(environment, item) for item in items]
        request = ("score", environment.name, dict(environment.config), environment.digest)
        results: list[RewardResult] = []
        readable = (*self.readable, *environment.sandbox_paths)
        with self._lock:
            self._child.readable_needed(readable)
            try:
                while len(results) < len(items):
                    self._score(environment, request, items[len(results) :], results)
            except BaseException:
                # Replies of this batch may still be on their way: a later batch must not
                # read them. Start afresh.
                self._child.stop()
                raise
        return results

    def _score(
        self,
        environment: Environment,
        request: tuple[Any, ...],
        pending: Sequence[RewardItem],
        results: list[RewardResult],
    ) -> None:
        """Score ``pending`` until done or the child is lost (then the rest is left)."""
        message = (*request, list(pending))
        conn = self._send(message)
        if not self._await_ready(conn, environment.name):
            # The child died before answering: killed while idle, after the liveness check.
            # One fresh child; if that one dies too, it is the environment's doing.
            conn = self._send(message)
            if not self._await_ready(conn, environment.name):
                raise SandboxError(
                    f"environment {environment.name!r}: the reward sandbox died building it (twice)"
                )
        for problem, _, count in pending:
            kind, value = self._receive(conn, self.time_limit_s)
            if kind in ("ok", "error"):
                results.append(_as_result(environment, problem, count, kind, value))
                continue
            # No answer: the child overran or died. The rest go to a new child.
            self._lost()
            results.append(RewardResult(environment.unverifiable_reward(problem, count), kind))
            return

    def close(self) -> None:
        """Stop the child process (a later call starts a new one)."""
        with self._lock:
            self._child.stop()

    def __enter__(self) -> RewardSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, message: tuple[Any, ...]) -> Connection:
        """Send to a live child, starting one when there is none (or it died while idle)."""
        for _ in range(2):
            try:
                conn = self._child.connection(self.loader, self._spawn_settings())
            except (OSError, RuntimeError) as error:
                # RuntimeError: the spawning thread is gone (the interpreter is exiting).
                raise SandboxError(f"the reward sandbox cannot start a child: {error}") from error
            try:
                conn.send(message)
                return conn
            except OSError:
                self._lost()
        raise SandboxError("the reward sandbox's child process cannot be started")

    def _await_ready(self, conn: Connection, name: str) -> bool:
        """True when the child built the environment; False when it died first (restarted)."""
        kind, value = self._receive(conn, self.load_limit_s)
        if kind == "ready":
            return True
        if kind == "refused":
            raise SandboxError(f"environment {name!r}: the reward sandbox cannot build it: {value}")
        self._lost()
        if kind == "crashed":
            return False
        raise SandboxError(
            f"environment {name!r}: the reward sandbox took over {self.load_limit_s:g} s "
            "building it"
        )

    @staticmethod
    def _receive(conn: Connection, limit: float) -> tuple[str, Any]:
        """The child's next reply, or ``("time_limit", None)`` / ``("crashed", None)``."""
        try:
            if not conn.poll(limit):
                return "time_limit", None
            reply: tuple[str, Any] = conn.recv()
        except (EOFError, OSError):
            return "crashed", None
        return reply

    def _lost(self) -> None:
        self.restarts += 1
        self._child.stop()

    def _spawn_settings(self) -> Limits | None:
        """The next child's limits when it is to be isolated; ``None`` to start it plainly."""
        if not self.isolated:
            if self.isolation == "required":
                raise IsolationUnavailable(isolation_problem() or "isolation is off")
            return None
        return self.limits


def _reward_result(environment: Environment, item: RewardItem) -> RewardResult:
    """Score one item in this process (an environment that isolates what it runs itself)."""
    problem, text, count = item
    kind, value = _score(environment, problem, text, count)
    return _as_result(environment, problem, count, kind, value)


def _score(environment: Environment, problem: Problem, text: str, count: int) -> tuple[str, Any]:
    """``("ok", RewardBreakdown)``, or ``("error", description)`` when the verifier raised."""
    try:
        return "ok", environment.reward(problem, text, count)
    except Exception as error:  # the verifier's failure is the item's result
        return "error", f"{type(error).__name__}: {error}"[:500]


def _as_result(
    environment: Environment, problem: Problem, count: int, kind: str, value: Any
) -> RewardResult:
    if kind == "ok":
        return RewardResult(value)
    return RewardResult(environment.unverifiable_reward(problem, count), f"error: {value}")


class _Child:
    """The child process and our end of its socket (held apart from the sandbox so that a
    finalizer can stop it)."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self.conn: Connection | None = None
        self.readable: tuple[str, ...] = ()
        """What the running child may read besides the Python installation."""
        # Children are started from this one long-lived thread: on Linux a child asks to be
        # killed when the thread that started it ends (PR_SET_PDEATHSIG follows the thread,
        # not the process), and the callers' threads (asyncio's pool) come and go.
        self._spawner = ThreadPoolExecutor(1, thread_name_prefix="rollnet-reward-sandbox")

    def readable_needed(self, paths: Sequence[str]) -> None:
        """Make the next child able to read ``paths`` too (restarting a running one that
        cannot: its sandbox's mounts are fixed when it starts)."""
        missing = set(paths) - set(self.readable)
        if missing:
            self.readable = tuple(sorted({*self.readable, *missing}))
            self.stop()

    def connection(self, loader: str, limits: Limits | None) -> Connection:
        if self.process is not None and self.process.poll() is not None:
            self.stop()  # it died while idle
        if self.conn is None:
            # A fresh interpreter (not multiprocessing's spawn, which re-imports the caller's
            # main module: a script without a __main__ guard would run again in the child),
            # given the caller's import path, talking over a socket pair.
            ours, theirs = socket.socketpair()
            with theirs:
                self.process = self._spawner.submit(
                    self._start, loader, theirs.fileno(), limits
                ).result()
            self.conn = Connection(ours.detach())
            assert self.process.stderr is not None
            threading.Thread(
                target=_pass_on_stderr,
                args=(self.process.stderr, self.process.pid),
                name="rollnet-reward-sandbox-stderr",
                daemon=True,
            ).start()
        return self.conn

    def _start(self, loader: str, fd: int, limits: Limits | None) -> subprocess.Popen[bytes]:
        path = {_PATH_VARIABLE: json.dumps(sys.path)}
        streams: dict[str, Any] = {
            "stdin": subprocess.DEVNULL,
            "stdout": subprocess.DEVNULL,
            "stderr": subprocess.PIPE,
        }
        if limits is None:
            command = [sys.executable, "-c", _CHILD, str(fd), loader, str(os.getpid()), ""]
            return subprocess.Popen(command, pass_fds=(fd,), env={**os.environ, **path}, **streams)
        # Isolated: a PID namespace of its own (its parent's id means nothing in there; the
        # sandbox dies with us instead), the working directory kept for relative dataset paths.
        command = [sys.executable, "-c", _CHILD, str(fd), loader, "0", _pid_namespace()]
        return isolated_popen(
            command,
            limits,
            readable=python_paths(self.readable),
            env=path,
            cwd=os.getcwd(),
            pass_fds=(fd,),
            **streams,
        )

    def close(self) -> None:
        """Stop the child and the spawning thread (the sandbox is gone)."""
        self.stop()
        self._spawner.shutdown(wait=False)

    def stop(self) -> None:
        process, conn = self.process, self.conn
        self.process = self.conn = None
        if conn is not None:
            conn.close()
        if process is not None:
            if process.poll() is None:
                process.kill()
            process.wait(timeout=10)


_PATH_VARIABLE = "ROLLNET_REWARD_SANDBOX_PATH"
"""Carries the caller's import path to the child (in its environment, not its command line)."""
_CHILD = (
    "import json, os, sys; "
    f"sys.path[:] = json.loads(os.environ.pop({_PATH_VARIABLE!r})); "
    "from rollnet.reference.envs.sandbox import _child_main; "
    "_child_main(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4])"
)
_PR_SET_PDEATHSIG = 1


def _pass_on_stderr(stream: IO[bytes], pid: int) -> None:
    """Log what a child writes to its standard error, up to :data:`_STDERR_LIMIT` bytes (a
    verifier that prints without end must not fill the node's log)."""
    passed = 0
    with stream:
        for line in stream:
            if passed < _STDERR_LIMIT:
                text = line[: _STDERR_LIMIT - passed].decode(errors="replace").rstrip()
                log.warning("reward_sandbox_stderr", extra={"child": pid, "line": text})
            elif passed - len(line) < _STDERR_LIMIT:
                log.warning("reward_sandbox_stderr_truncated", extra={"child": pid})
            passed += len(line)


def _pid_namespace() -> str:
    """This process's PID namespace (empty where there is no ``/proc``)."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return ""


def _child_main(fd: int, loader: str, parent: int, parent_namespace: str = "") -> None:
    """Entry point of the child process: serve on the inherited socket until it closes.

    ``parent`` is the caller's process id, or 0 in an isolated child (whose sandbox dies with
    the caller: ``bwrap --die-with-parent`` and a PID namespace of its own, which differs from
    the caller's ``parent_namespace``).
    """
    mark_inside_sandbox()
    # Exit when the parent is gone (killed, crashed) even while a verifier is busy: its socket
    # closing is only noticed between requests. On Linux the kernel kills us with it, even in
    # the middle of one long C call (sympy's big integers); elsewhere a thread checks once a
    # second, between bytecodes.
    if parent:
        if sys.platform.startswith("linux"):
            import ctypes

            ctypes.CDLL(None).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # it died before the request took effect
            os._exit(0)

        def watch() -> None:
            while True:
                time.sleep(1.0)
                if os.getppid() != parent:
                    os._exit(0)

        threading.Thread(target=watch, name="parent-watch", daemon=True).start()
    module, _, function = loader.partition(":")
    # Only in a PID namespace of its own may the child kill "every other process".
    sweep = not parent and bool(parent_namespace) and _pid_namespace() not in ("", parent_namespace)
    _serve(Connection(fd), getattr(importlib.import_module(module), function), sweep=sweep)


def _serve(
    conn: Connection,
    load_environment: Callable[[str, Mapping[str, Any]], Any],
    *,
    sweep: bool = False,
) -> None:
    """The child: build environments on request and score items, one reply per item.

    With ``sweep`` (an isolated child, alone in its PID namespace but for the namespace's
    init) every other process is killed after each item: whatever a verifier started is gone
    before the next completion is scored.
    """
    # Ctrl-C reaches the whole process group; the parent decides when the child stops.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    environments: dict[tuple[str, bytes], Environment] = {}
    while True:
        try:
            _, name, config, digest, items = conn.recv()
        except (EOFError, OSError):
            return
        environment = _build(environments, load_environment, name, config)
        if isinstance(environment, str):
            conn.send(("refused", environment))
            continue
        if environment.digest != digest:
            conn.send(("refused", f"its digest here is {environment.digest}, not {digest}"))
            continue
        conn.send(("ready", None))
        for problem, text, count in items:
            reply = _score(environment, problem, text, count)
            if sweep:
                _kill_strays()
            conn.send(reply)


def _kill_strays() -> None:
    """Kill every other process of the PID namespace (its init excepted), and reap those that
    were this process's children: a zombie still counts against ``RLIMIT_NPROC``."""
    with contextlib.suppress(ProcessLookupError):  # nothing left to kill
        os.kill(-1, signal.SIGKILL)
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return  # no children left; the namespace's init reaps the others
        if pid == 0:
            time.sleep(0.005)


def _build(
    environments: dict[tuple[str, bytes], Environment],
    load: Callable[[str, Mapping[str, Any]], Any],
    name: str,
    config: Mapping[str, Any],
) -> Environment | str:
    key = (name, canonical_json(config))
    environment = environments.get(key)
    if environment is None:
        try:
            environment = load(name, config)
        except Exception as error:
            return f"{type(error).__name__}: {error}"[:500]
        if not isinstance(environment, Environment):
            return f"the loader returned {type(environment).__name__}, not an Environment"
        environments[key] = environment
    return environment
