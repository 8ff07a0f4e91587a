"""Running untrusted code in a Linux sandbox: namespaces, a read-only file system, seccomp, rlimits.

Environment code (a verifiers taskset anyone can publish) and model-written programs (the
``code`` environment's completions) run on workers and validators, next to a node's private key
and data directory. This module starts such a program so that it

* sees only what it is given: a new mount namespace whose root holds the system's ``/usr`` (and
  the ``/bin``, ``/lib`` links), a few files of ``/etc``, the paths the caller names read-only
  (the Python installation and import path, a dataset), a fresh ``/proc`` and ``/dev``, and one
  writable scratch directory ``/tmp`` (a size-capped tmpfs that vanishes with the sandbox);
  the node's data directory and key stay out even when they lie under a readable path
  (:func:`protect_paths`);
* has no network: a new network namespace holds only a loopback interface, and seccomp refuses
  sockets other than Unix-domain ones;
* cannot see or signal the caller's processes (new PID, IPC and UTS namespaces) and dies with
  the caller (``--die-with-parent``);
* runs without privileges: started by root, it switches to a fresh user id of its own (so its
  process count is its own, and files only root may read stay unreadable); started by another
  user, it runs in a new user namespace. No capabilities, ``no_new_privs``;
* is held to rlimits: CPU seconds, address space, processes (and threads), file size and open
  files, on every process it starts;
* cannot use the kernel interfaces sandboxes are usually escaped through (seccomp, x86-64):
  ``ptrace``, ``process_vm_*``, ``bpf``, ``perf_event_open``, ``userfaultfd``, ``io_uring``,
  keyrings, mounts, new namespaces, module and kexec calls, clock changes.

It uses `bubblewrap <https://github.com/containers/bubblewrap>`_ (``bwrap``, Debian package
``bubblewrap``) for the namespaces and mounts, and util-linux's ``setpriv`` and ``prlimit`` for
the user switch and the rlimits. Wall-clock limits and output caps are the caller's (see
:func:`run_isolated`). ``docs/environments.md`` lists what this protects against and what not.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import platform
import secrets
import selectors
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

__all__ = [
    "IsolationUnavailable",
    "Limits",
    "RunResult",
    "inside_sandbox",
    "isolated_popen",
    "isolation_problem",
    "mark_inside_sandbox",
    "protect_paths",
    "protected_paths",
    "python_paths",
    "run_isolated",
]

log = logging.getLogger(__name__)


class IsolationUnavailable(RuntimeError):
    """This host cannot start the sandbox (not Linux, ``bwrap`` missing or not working)."""


@dataclass(frozen=True, slots=True)
class Limits:
    """Resource limits of a sandbox, applied as rlimits to every process in it.

    Attributes:
        memory_bytes: Address space of each process (``RLIMIT_AS``).
        processes: Processes and threads the sandbox may hold at once (``RLIMIT_NPROC``).
        cpu_s: CPU seconds of each process (``RLIMIT_CPU``); ``None`` for no limit (a
            long-lived process is held to a wall-clock limit per request instead).
        file_bytes: Largest file a process may write (``RLIMIT_FSIZE``).
        open_files: Open file descriptors per process (``RLIMIT_NOFILE``).
        scratch_bytes: Size of the writable ``/tmp``.
    """

    memory_bytes: int
    processes: int
    cpu_s: int | None = None
    file_bytes: int = 16 << 20
    open_files: int = 256
    scratch_bytes: int = 64 << 20

    def __post_init__(self) -> None:
        for name in ("memory_bytes", "processes", "file_bytes", "open_files", "scratch_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"Limits.{name} must be positive")
        if self.cpu_s is not None and self.cpu_s < 1:
            raise ValueError("Limits.cpu_s must be positive (or None)")


@dataclass(frozen=True, slots=True)
class RunResult:
    """How a program run by :func:`run_isolated` ended.

    ``returncode`` is the program's exit status, or ``128 + signal`` when a signal ended it
    (``bwrap``'s convention: ``152`` for ``SIGXCPU``, the CPU limit), ``None`` when it was killed
    for running out of wall-clock time or writing too much. ``stdout`` holds at most
    ``max_output_bytes``.
    """

    returncode: int | None
    stdout: bytes
    timed_out: bool = False
    output_exceeded: bool = False

    @property
    def cpu_limited(self) -> bool:
        """The CPU-time rlimit ended the program (``SIGXCPU``, or ``SIGKILL`` at the hard limit
        one second later)."""
        return self.returncode in (128 + signal.SIGXCPU, 128 + signal.SIGKILL)


_BWRAP_CANDIDATES = ("/usr/bin/bwrap", "/bin/bwrap")
_SYSTEM_DIRECTORIES = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# What a program needs of /etc: the dynamic linker's cache, user and group names, time zone,
# certificates (read, not used: there is no network). Nothing secret.
_ETC_FILES = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/passwd",
    "/etc/group",
    "/etc/nsswitch.conf",
    "/etc/ssl/certs",
    "/etc/alternatives",
)
_BASE_ENVIRONMENT = {
    "PATH": "/usr/local/bin:/usr/bin:/bin",
    "HOME": "/tmp",
    "TMPDIR": "/tmp",
    "LANG": "C.UTF-8",
    "PYTHONDONTWRITEBYTECODE": "1",
}
# User ids given to sandboxes started by root: one per sandbox, far above any real account, so
# that RLIMIT_NPROC counts that sandbox's processes alone (the kernel does not apply it to root).
_UID_BASE = 0x4000_0000
_UID_SPAN = 0x3FFF_0000

_protected: set[str] = set()
_protected_lock = threading.Lock()
_inside = False


def protect_paths(*paths: str | os.PathLike[str]) -> None:
    """Keep ``paths`` (a node's data directory, its key file) out of every sandbox this process
    starts from now on, even one that may read a directory holding them.

    Called by ``rollnet worker``, ``rollnet validator`` and ``rollnet coordinator`` at start.
    """
    with _protected_lock:
        for path in paths:
            _protected.add(os.path.abspath(os.fspath(path)))


def protected_paths() -> tuple[str, ...]:
    """The paths :func:`protect_paths` was given, sorted."""
    with _protected_lock:
        return tuple(sorted(_protected))


def mark_inside_sandbox() -> None:
    """Record that this process is the sandboxed side (the reward sandbox's child)."""
    global _inside
    _inside = True


def inside_sandbox() -> bool:
    """Whether :func:`mark_inside_sandbox` was called in this process."""
    return _inside


@functools.cache
def isolation_problem() -> str | None:
    """Why this host cannot start the sandbox, or ``None`` when it can (checked once: a
    sandbox is started and must run ``true``)."""
    if not sys.platform.startswith("linux"):
        return f"the sandbox needs Linux (this is {sys.platform})"
    bwrap = _bwrap()
    if bwrap is None:
        return "bubblewrap is not installed (Debian: apt-get install bubblewrap)"
    for tool in ("setpriv", "prlimit"):
        if _tool(tool) is None:
            return f"util-linux's {tool} is not installed"
    limits = Limits(memory_bytes=512 << 20, processes=16, cpu_s=10)
    # This interpreter, as the sandboxes will run it: started by root, a sandbox runs under a
    # user id of its own, which must be able to read the installation.
    probe = [os.path.realpath(sys.executable), "-I", "-S", "-c", ""]
    try:
        command = _command(probe, limits, readable=python_paths(), files={}, env={}, cwd="/tmp")
        with _descriptors(command.files, command.seccomp) as fds:
            done = subprocess.run(
                command.argv(fds),
                pass_fds=tuple(fds.values()),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=60,
                check=False,
            )
    except (OSError, subprocess.SubprocessError) as error:
        return f"bubblewrap cannot start a sandbox here: {error}"
    if done.returncode != 0:
        detail = done.stderr.decode(errors="replace").strip()[-300:]
        return (
            f"a sandbox cannot run this Python here (exit {done.returncode}; the files it reads "
            f"must be readable by other users when started by root): {detail}"
        )
    return None


def python_paths(extra: Iterable[str | os.PathLike[str]] = ()) -> tuple[str, ...]:
    """What a Python child needs to read: this interpreter's installation and virtual
    environment, every directory of the import path but the working directory, and
    ``extra``."""
    candidates = [
        sys.prefix,
        sys.base_prefix,
        sys.exec_prefix,
        sys.base_exec_prefix,
        os.path.dirname(os.path.realpath(sys.executable)),
        *sys.path,
        *(os.fspath(path) for path in extra),
    ]
    # Left out: the working directory (``python -m`` and ``-c`` put it on the import path,
    # and a node's data directory is often below it), and directories too broad to hand over
    # whole, where other programs' files live.
    left_out = {os.getcwd(), "/", "/tmp", tempfile.gettempdir(), os.path.expanduser("~")}
    found: list[str] = []
    for candidate in candidates:
        if not candidate or candidate == ".":
            continue
        path = os.path.abspath(candidate)
        if path not in left_out and os.path.exists(path):
            found.append(path)
    return tuple(sorted(set(found)))


def isolated_popen(
    argv: Sequence[str],
    limits: Limits,
    *,
    readable: Sequence[str] = (),
    files: Mapping[str, bytes] | None = None,
    env: Mapping[str, str] | None = None,
    cwd: str = "/tmp",
    pass_fds: Sequence[int] = (),
    **popen: Any,
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in a sandbox (see the module docs) and return its process.

    ``readable`` paths are bound read-only at the same place; ``files`` (absolute path →
    content) are created read-only inside; ``env`` is the program's whole environment, on top
    of a minimal one (``PATH``, ``HOME=/tmp``, ``LANG=C.UTF-8``); ``pass_fds`` are inherited.
    Other keyword arguments go to :class:`subprocess.Popen` (``stdin``, ``stdout``, ...). The
    process is the sandbox's ``bwrap``: killing it ends everything in the sandbox.

    Raises:
        IsolationUnavailable: this host cannot start the sandbox (:func:`isolation_problem`).
    """
    problem = isolation_problem()
    if problem is not None:
        raise IsolationUnavailable(problem)
    command = _command(argv, limits, readable, files or {}, env or {}, cwd)
    with _descriptors(command.files, command.seccomp) as fds:
        return subprocess.Popen(command.argv(fds), pass_fds=(*fds.values(), *pass_fds), **popen)


def run_isolated(
    argv: Sequence[str],
    limits: Limits,
    *,
    stdin: bytes = b"",
    wall_s: float,
    max_output_bytes: int,
    readable: Sequence[str] = (),
    files: Mapping[str, bytes] | None = None,
) -> RunResult:
    """Run ``argv`` in a sandbox to the end, or until ``wall_s`` seconds have passed or it
    wrote more than ``max_output_bytes`` to its standard output; then kill the sandbox.

    ``stdin`` is the program's whole input; its standard error is discarded. Nothing of the
    sandbox outlives the call (its ``/tmp`` is a tmpfs of its own mount namespace).
    """
    stdin_fd = _memfd("stdin", stdin)
    try:
        process = isolated_popen(
            argv,
            limits,
            readable=readable,
            files=files,
            stdin=stdin_fd,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    finally:
        os.close(stdin_fd)
    assert process.stdout is not None
    output, timed_out, exceeded = _read_bounded(process.stdout, wall_s, max_output_bytes)
    if timed_out or exceeded:
        _kill(process)
        returncode = None
    else:
        returncode = _wait(process, max(1.0, wall_s))
    process.stdout.close()
    return RunResult(returncode, output, timed_out=timed_out, output_exceeded=exceeded)


# --- building the command ----------------------------------------------------------------


@dataclass
class _Command:
    """A ``bwrap`` command line whose file descriptors are filled in at spawn time."""

    parts: list[str | tuple[str]]
    files: dict[str, bytes] = field(default_factory=dict)
    seccomp: bytes | None = None

    def argv(self, fds: Mapping[str, int]) -> list[str]:
        """The command line, with each ``(key,)`` placeholder replaced by its descriptor."""
        return [part if isinstance(part, str) else str(fds[part[0]]) for part in self.parts]


def _bwrap() -> str | None:
    found = shutil.which("bwrap")
    if found is not None:
        return found
    return next((path for path in _BWRAP_CANDIDATES if os.access(path, os.X_OK)), None)


def _tool(name: str) -> str | None:
    return shutil.which(name) or next(
        (p for p in (f"/usr/bin/{name}", f"/bin/{name}") if os.access(p, os.X_OK)), None
    )


def _command(
    argv: Sequence[str],
    limits: Limits,
    readable: Sequence[str],
    files: Mapping[str, bytes],
    env: Mapping[str, str],
    cwd: str,
) -> _Command:
    bwrap, setpriv, prlimit = _bwrap(), _tool("setpriv"), _tool("prlimit")
    assert bwrap is not None
    assert setpriv is not None
    assert prlimit is not None
    root = os.geteuid() == 0
    parts: list[str | tuple[str]] = [bwrap]
    if not root:
        # Without privileges bwrap needs a user namespace; --disable-userns keeps the sandbox
        # from making more of them.
        parts += ["--unshare-user", "--disable-userns"]
    parts += [
        "--unshare-pid",
        "--unshare-net",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        "--die-with-parent",
        "--new-session",  # no TIOCSTI into the caller's terminal
        "--hostname",
        "sandbox",
    ]
    parts += ["--ro-bind", "/usr", "/usr"]
    for directory in _SYSTEM_DIRECTORIES:
        if os.path.islink(directory):
            parts += ["--symlink", os.readlink(directory), directory]
        elif os.path.isdir(directory):
            parts += ["--ro-bind", directory, directory]
    bound = _outermost(p for p in readable if not _under(p, ("/usr",)))
    made: set[str] = {"/", "/tmp"}

    def make_parents(path: str, *, itself: bool = False) -> None:
        # Directories bwrap creates on its own are private (0700): a sandbox running under
        # another user id could not walk through them.
        chain = [*reversed(Path(path).parents), *([Path(path)] if itself else [])]
        for parent in chain:
            text = str(parent)
            if text not in made and not _under(text, bound):
                parts.extend(["--perms", "0755", "--dir", text])
                made.add(text)

    for path in _ETC_FILES:
        if os.path.exists(path):
            make_parents(path)
            parts += ["--ro-bind", path, path]
    # /tmp before the readable paths: one below it (a test's temporary directory) is bound on
    # top of the sandbox's own.
    parts += ["--proc", "/proc", "--dev", "/dev"]
    parts += ["--perms", "1777", "--size", str(limits.scratch_bytes), "--tmpfs", "/tmp"]
    for path in bound:
        make_parents(path)
        parts += ["--ro-bind", path, path]
    for hidden in protected_paths():
        if not _under(hidden, bound) or not os.path.exists(hidden):
            continue
        if os.path.isdir(hidden):
            parts += ["--perms", "0000", "--size", "4096", "--tmpfs", hidden]
        else:
            parts += ["--ro-bind", "/dev/null", hidden]
    command = _Command(parts)
    for index, (path, content) in enumerate(sorted(files.items())):
        key = f"file{index}"
        command.files[key] = content
        make_parents(path)
        parts += ["--perms", "0444", "--ro-bind-data", (key,), path]
    if not _under(cwd, bound):
        make_parents(cwd, itself=True)
    # Nothing outside /tmp is writable, not even the directories bwrap made.
    parts += ["--remount-ro", "/", "--chdir", cwd, "--clearenv"]
    for name, value in {**_BASE_ENVIRONMENT, **env}.items():
        parts += ["--setenv", name, value]
    command.seccomp = _seccomp_program()
    if command.seccomp is not None:
        parts += ["--seccomp", ("seccomp",)]
    parts.append("--")
    if root:
        uid = str(_UID_BASE + secrets.randbelow(_UID_SPAN))
        parts += [
            setpriv,
            f"--reuid={uid}",
            f"--regid={uid}",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
            "--",
        ]
    parts += [prlimit, *_rlimit_options(limits), "--", *argv]
    return command


def _rlimit_options(limits: Limits) -> list[str]:
    options = [
        f"--as={limits.memory_bytes}",
        f"--nproc={limits.processes}",
        f"--fsize={limits.file_bytes}",
        f"--nofile={limits.open_files}",
        "--core=0",
    ]
    if limits.cpu_s is not None:
        # SIGXCPU at the soft limit; the kernel's SIGKILL at the hard one if it is caught.
        options.append(f"--cpu={limits.cpu_s}:{limits.cpu_s + 1}")
    return options


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def _outermost(paths: Iterable[str]) -> list[str]:
    """The paths, without those lying inside another one of them."""
    kept: list[str] = []
    for path in sorted({os.path.abspath(p) for p in paths}):
        if not _under(path, kept):
            kept.append(path)
    return kept


@contextlib.contextmanager
def _descriptors(files: Mapping[str, bytes], seccomp: bytes | None) -> Any:
    """Memory files holding ``files`` (and the seccomp program), closed after the spawn."""
    fds: dict[str, int] = {}
    try:
        for key, content in files.items():
            fds[key] = _memfd(key, content)
        if seccomp is not None:
            fds["seccomp"] = _memfd("seccomp", seccomp)
        yield fds
    finally:
        for fd in fds.values():
            os.close(fd)


def _memfd(name: str, content: bytes) -> int:
    fd = os.memfd_create(f"rollnet-{name}", 0)  # inheritable only through pass_fds
    try:
        view = memoryview(content)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


# --- running -----------------------------------------------------------------------------


def _read_bounded(stream: IO[bytes], wall_s: float, limit: int) -> tuple[bytes, bool, bool]:
    """Read ``stream`` to its end; stop early past ``wall_s`` or ``limit`` bytes."""
    deadline = time.monotonic() + wall_s
    chunks: list[bytes] = []
    size = 0
    fd = stream.fileno()
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return b"".join(chunks), True, False
            if not selector.select(remaining):
                continue
            chunk = os.read(fd, 65536)
            if not chunk:
                return b"".join(chunks), False, False
            size += len(chunk)
            if size > limit:
                chunks.append(chunk[: len(chunk) - (size - limit)])
                return b"".join(chunks), False, True
            chunks.append(chunk)


def _kill(process: subprocess.Popen[bytes]) -> None:
    # bwrap and its session; the PID namespace takes every other process of the sandbox with
    # its first process when that one dies.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError):
        process.kill()
    process.wait()


def _wait(process: subprocess.Popen[bytes], timeout: float) -> int:
    try:
        return process.wait(timeout)
    except subprocess.TimeoutExpired:
        _kill(process)
        return process.returncode


# --- seccomp -----------------------------------------------------------------------------

# x86-64 system call numbers (asm/unistd_64.h) refused with EPERM.
_BLOCKED_X86_64 = {
    "ptrace": 101,
    "syslog": 103,
    "vhangup": 153,
    "pivot_root": 155,
    "adjtimex": 159,
    "acct": 163,
    "settimeofday": 164,
    "mount": 165,
    "umount2": 166,
    "swapon": 167,
    "swapoff": 168,
    "reboot": 169,
    "iopl": 172,
    "ioperm": 173,
    "init_module": 175,
    "delete_module": 176,
    "quotactl": 179,
    "lookup_dcookie": 212,
    "clock_settime": 227,
    "kexec_load": 246,
    "add_key": 248,
    "request_key": 249,
    "keyctl": 250,
    "unshare": 272,
    "perf_event_open": 298,
    "name_to_handle_at": 303,
    "open_by_handle_at": 304,
    "clock_adjtime": 305,
    "setns": 308,
    "process_vm_readv": 310,
    "process_vm_writev": 311,
    "finit_module": 313,
    "kexec_file_load": 320,
    "bpf": 321,
    "userfaultfd": 323,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsmount": 432,
    "fspick": 433,
    "mount_setattr": 442,
}
_X86_64_SOCKET = 41
_X86_64_CLONE = 56
_X86_64_CLONE3 = 435
_AUDIT_ARCH_X86_64 = 0xC000003E
_X32_SYSCALL_BIT = 0x4000_0000
_AF_UNIX = 1
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET, and NEWTIME.
_CLONE_NAMESPACES = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000
_CLONE_NAMESPACES |= 0x20000000 | 0x40000000 | 0x00000080

_LD_W_ABS = 0x20  # BPF_LD | BPF_W | BPF_ABS
_JEQ_K = 0x15  # BPF_JMP | BPF_JEQ | BPF_K
_JGE_K = 0x35  # BPF_JMP | BPF_JGE | BPF_K
_JSET_K = 0x45  # BPF_JMP | BPF_JSET | BPF_K
_RET_K = 0x06  # BPF_RET | BPF_K
_RET_ALLOW = 0x7FFF_0000
_RET_KILL_PROCESS = 0x8000_0000
_RET_ERRNO = 0x0005_0000
# struct seccomp_data: nr at 0, arch at 4, args[i] at 16 + 8 i (low word first on x86-64).
_NR, _ARCH, _ARG0 = 0, 4, 16


@functools.cache
def _seccomp_program() -> bytes | None:
    """The classic-BPF seccomp filter for this machine, or ``None`` where there is none
    (only x86-64 is written out; elsewhere the namespaces and rlimits still apply)."""
    if platform.machine() != "x86_64":
        log.warning("sandbox_seccomp_unavailable machine=%s", platform.machine())
        return None
    eperm = _RET_ERRNO | errno.EPERM
    enosys = _RET_ERRNO | errno.ENOSYS
    program: list[tuple[int, int, int, int]] = []

    def ret(value: int) -> None:
        program.append((_RET_K, 0, 0, value))

    program.append((_LD_W_ABS, 0, 0, _ARCH))
    program.append((_JEQ_K, 1, 0, _AUDIT_ARCH_X86_64))
    ret(_RET_KILL_PROCESS)
    program.append((_LD_W_ABS, 0, 0, _NR))
    program.append((_JGE_K, 0, 1, _X32_SYSCALL_BIT))  # the x32 ABI: its own numbering
    ret(eperm)
    for number in sorted(_BLOCKED_X86_64.values()):
        program.append((_JEQ_K, 0, 1, number))
        ret(eperm)
    # clone3 passes its flags in memory, out of the filter's reach: ENOSYS makes the C
    # library fall back to clone, whose flags are checked.
    program.append((_JEQ_K, 0, 1, _X86_64_CLONE3))
    ret(enosys)
    program.append((_JEQ_K, 0, 3, _X86_64_CLONE))
    program.append((_LD_W_ABS, 0, 0, _ARG0))
    program.append((_JSET_K, 0, 1, _CLONE_NAMESPACES))
    ret(eperm)
    program.append((_LD_W_ABS, 0, 0, _NR))
    program.append((_JEQ_K, 0, 3, _X86_64_SOCKET))
    program.append((_LD_W_ABS, 0, 0, _ARG0))
    program.append((_JEQ_K, 1, 0, _AF_UNIX))
    ret(eperm)
    ret(_RET_ALLOW)
    return b"".join(struct.pack("=HBBI", *instruction) for instruction in program)
