"""The sandbox for untrusted code: each attack is contained, and the host is untouched after it.

Every program here runs through :func:`run_isolated` exactly as the ``code`` environment runs a
completion. The host must be able to isolate (Linux with bubblewrap: ``make dev`` installs
it); elsewhere these tests are skipped with the reason.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from pathlib import Path

import pytest
from process_testing import exited, tree

from rollnet.reference.envs import isolation
from rollnet.reference.envs.isolation import (
    IsolationUnavailable,
    Limits,
    RunResult,
    isolated_popen,
    python_paths,
    run_isolated,
)
from rollnet.sdk.testing import wait_until_blocking

pytestmark = pytest.mark.usefixtures("sandbox_host")

LIMITS = Limits(memory_bytes=512 << 20, processes=16, cpu_s=5, scratch_bytes=1 << 20)


def run(code: str, *, wall_s: float = 10.0, limit: int = 1 << 20, **kwargs: object) -> RunResult:
    return run_isolated(
        [sys.executable, "-I", "-S", "-c", code],
        LIMITS,
        wall_s=wall_s,
        max_output_bytes=limit,
        readable=python_paths(),
        **kwargs,  # type: ignore[arg-type]
    )


def test_a_program_runs_and_gets_its_input_and_files() -> None:
    result = run(
        "import sys; print(sys.stdin.read()[::-1], open('/sandbox/data').read())",
        stdin=b"olleh",
        files={"/sandbox/data": b"payload"},
    )
    assert result == RunResult(0, b"hello payload\n")


def test_nothing_outside_tmp_is_writable_and_tmp_does_not_outlive_the_sandbox(
    tmp_path: Path,
) -> None:
    target = tmp_path / "escaped"
    code = f"""
import os
for path in ({str(target)!r}, "/etc/passwd", "/usr/escaped", "/escaped", "/sandbox/data"):
    try:
        open(path, "w").write("x")
        print("wrote", path)
    except OSError as error:
        print("refused", path, error.errno)
open("/tmp/scratch", "w").write("fine")
print(open("/tmp/scratch").read())
"""
    result = run(code, files={"/sandbox/data": b"read only"})
    lines = result.stdout.decode().splitlines()
    assert result.returncode == 0
    assert [line.split()[0] for line in lines[:-1]] == ["refused"] * 5
    assert lines[-1] == "fine"
    assert not target.exists()
    assert "ls: " not in run("import os; print(os.listdir('/tmp'))").stdout.decode()
    # A fresh /tmp: the last sandbox's scratch file is gone. (It may hold the mount points of
    # read-only paths that lie under the host's /tmp, such as a virtualenv there.)
    listing = run("import os; print(sorted(os.listdir('/tmp')))").stdout.decode()
    assert "scratch" not in listing, listing


def test_protected_paths_stay_out_even_below_a_readable_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(isolation, "_protected", set())
    tmp_path.chmod(0o755)  # pytest makes it private; a readable directory is the point here
    data_dir = tmp_path / "validator-data"
    data_dir.mkdir()
    (data_dir / "ledger.db").write_text("private")
    key = tmp_path / "validator.key"
    # Readable by anyone, so that only the protection keeps it out (a sandbox started by root
    # runs under another user id, which a 0600 key would stop by itself).
    key.write_text("secret key")
    key.chmod(0o644)
    readable = (*python_paths(), str(tmp_path))
    code = f"""
for path in ({str(key)!r}, {str(data_dir / "ledger.db")!r}):
    try:
        print(repr(open(path).read()))
    except OSError as error:
        print("refused", error.errno)
"""
    isolation.protect_paths(data_dir, key)
    result = run_isolated(
        [sys.executable, "-I", "-S", "-c", code],
        LIMITS,
        wall_s=10.0,
        max_output_bytes=4096,
        readable=readable,
    )
    out = result.stdout.decode()
    assert "secret" not in out
    assert "private" not in out
    assert out.count("refused") + out.count("''") == 2, out


def test_no_network_and_no_socket_but_unix_ones() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    accepted: list[socket.socket] = []
    threading.Thread(target=lambda: accepted.append(listener.accept()[0]), daemon=True).start()
    code = f"""
import socket
for family in (socket.AF_INET, socket.AF_INET6):
    try:
        socket.socket(family, socket.SOCK_STREAM)
        print("made")
    except OSError as error:
        print("refused", error.errno)
try:
    socket.create_connection(("127.0.0.1", {port}), timeout=2)
    print("connected")
except OSError as error:
    print("refused", error.errno)
a, b = socket.socketpair()
a.sendall(b"unix ok")
print(b.recv(16).decode())
"""
    try:
        result = run(code)
    finally:
        listener.close()
    assert result.stdout.decode().splitlines() == ["refused 1", "refused 1", "refused 1", "unix ok"]
    assert not accepted


def test_escape_interfaces_are_refused() -> None:
    code = """
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
for name, call in [
    ("ptrace", lambda: libc.ptrace(16, 1, 0, 0)),
    ("unshare", lambda: libc.unshare(0x10000000)),
    ("bpf", lambda: libc.syscall(321, 0, 0, 0)),
    ("userfaultfd", lambda: libc.syscall(323, 0)),
    ("io_uring_setup", lambda: libc.syscall(425, 1, 0)),
    ("keyctl", lambda: libc.syscall(250, 0, 0)),
    ("mount", lambda: libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)),
]:
    print(name, call(), ctypes.get_errno())
print("uid", os.getuid(), "root" if os.getuid() == 0 else "unprivileged")
"""
    result = run(code)
    lines = result.stdout.decode().splitlines()
    assert result.returncode == 0, result
    assert all(line.split()[1:] == ["-1", "1"] for line in lines[:-1]), lines
    assert lines[-1].endswith("unprivileged")


def test_a_fork_bomb_is_capped_and_killed_with_the_sandbox() -> None:
    code = """
import os, time
count = 0
try:
    while True:
        if os.fork() == 0:
            time.sleep(60)
            os._exit(0)
        count += 1
except OSError as error:
    print(count, error.errno, flush=True)
time.sleep(60)
"""
    started = time.monotonic()
    result = run(code, wall_s=3.0)
    assert time.monotonic() - started < 30
    assert result.timed_out
    count, error = result.stdout.split()
    assert int(count) < LIMITS.processes
    assert int(error) == 11


@pytest.mark.slow
def test_an_endless_loop_meets_the_cpu_limit_and_a_sleeper_the_wall_clock() -> None:
    looping = run("while True: pass", wall_s=30.0)
    assert looping.cpu_limited
    assert not looping.timed_out
    sleeping = run("import time; time.sleep(60)", wall_s=1.0)
    assert sleeping.timed_out
    assert sleeping.returncode is None


def test_a_10_gb_allocation_fails_inside() -> None:
    result = run("x = bytearray(10 * 1024 ** 3)")
    assert result.returncode == 1
    result = run(
        "import sys\ntry:\n    bytearray(10 * 1024 ** 3)\nexcept MemoryError:\n    print('no')"
    )
    assert result.stdout == b"no\n"


def test_output_is_capped_and_the_writer_killed() -> None:
    started = time.monotonic()
    result = run(
        "import os\nwhile True:\n    os.write(1, b'x' * 65536)", limit=1 << 20, wall_s=60.0
    )
    assert result.output_exceeded
    assert result.returncode is None
    assert len(result.stdout) == 1 << 20
    assert time.monotonic() - started < 30


def test_files_in_tmp_are_capped() -> None:
    result = run("open('/tmp/big', 'wb').write(b'x' * (4 << 20))")
    assert result.returncode != 0


def test_the_sandbox_dies_with_its_process() -> None:
    process = isolated_popen(
        [sys.executable, "-I", "-S", "-c", "import time; print('up', flush=True); time.sleep(600)"],
        LIMITS,
        readable=python_paths(),
        stdout=-1,
    )
    assert process.stdout is not None
    assert process.stdout.readline() == b"up\n"
    inside = tree(process.pid)[1:]
    assert inside
    process.kill()
    process.wait()
    wait_until_blocking(
        lambda: all(exited(pid) for pid in inside),
        within=20,
        what="the sandboxed processes to end with their sandbox",
    )
    process.stdout.close()


def test_no_sandbox_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(isolation, "isolation_problem", lambda: "bubblewrap is not installed")
    with pytest.raises(IsolationUnavailable, match="bubblewrap is not installed"):
        run("print(1)")


def test_python_paths_leave_out_the_working_directory_and_broad_directories(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(sys, "path", ["", ".", "/tmp", "/", os.path.expanduser("~"), *sys.path])
    paths = python_paths()
    assert not {"", ".", "/", "/tmp", os.path.expanduser("~"), os.getcwd()} & set(paths)
    assert os.path.realpath(sys.base_prefix) in {os.path.realpath(p) for p in paths}
