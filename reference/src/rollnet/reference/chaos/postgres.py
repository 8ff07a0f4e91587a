"""A private PostgreSQL server for a chaos run: made, restarted and removed by the harness.

The machine's shared server must never be restarted (other work uses it), so a run that injects
``restart_database`` gets a server of its own: ``initdb`` makes a cluster under the run's
directory, ``pg_ctl`` starts it on a free port of 127.0.0.1 with its unix socket in the same
directory, or under the system's temporary directory when that path would pass the 107 bytes a
socket path may have (``fsync`` off: the cluster is thrown away, and a fast restart still replays
its write-ahead log), and :meth:`PrivatePostgres.remove` stops it and deletes the cluster.

PostgreSQL refuses to run as root. When the harness is root it runs ``initdb``, ``pg_ctl`` and
so the server as the ``postgres`` OS user (``runuser -u postgres --``): the cluster's directory
is given to that user, and every directory above it is made searchable (``o+x``, nothing more)
so that the user can reach it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pwd
import shutil
import stat
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import psycopg
from psycopg import sql

from rollnet.reference.demo import _free_port

__all__ = ["PrivatePostgres", "private_postgres_available"]

#: The OS user the server runs as when the harness is root.
SERVER_USER = "postgres"
#: Written into the cluster's postgresql.conf after initdb (port and socket added per cluster).
SETTINGS = (
    "listen_addresses = '127.0.0.1'",
    "fsync = off",
    "synchronous_commit = off",
    "full_page_writes = off",
    "max_connections = 200",
)
#: Tries at starting a new cluster on a free port, and what the log says when one was taken.
PORT_ATTEMPTS = 3
PORT_TAKEN = "could not bind IPv4 address"


def private_postgres_available() -> str | None:
    """Why a private server cannot be made here (None: it can)."""
    for program in ("initdb", "pg_ctl"):
        if shutil.which(program) is None:
            return f"{program} is not on PATH"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(SERVER_USER)
        except KeyError:
            return f"running as root and there is no {SERVER_USER!r} OS user to run PostgreSQL as"
        if shutil.which("runuser") is None:
            return "running as root and runuser is not on PATH"
    return None


@dataclass
class PrivatePostgres:
    """A throwaway PostgreSQL cluster in ``directory`` (``data/``, ``socket/``, ``server.log``)."""

    directory: Path
    port: int = 0
    """0: a free port is picked when the cluster is made."""
    timeout: float = 60.0
    """Seconds ``pg_ctl`` waits for the server to start or stop."""

    @property
    def data(self) -> Path:
        """The cluster's data directory."""
        return self.directory / "data"

    @property
    def log(self) -> Path:
        """The server's log."""
        return self.directory / "server.log"

    @property
    def server_url(self) -> str:
        """A psycopg URL of the server, without a database."""
        return f"postgresql://postgres@127.0.0.1:{self.port}"

    @property
    def socket_directory(self) -> Path:
        """Where the server's unix socket lies: ``socket/`` in the cluster's directory, unless that
        path is too long for a socket (107 bytes with ``.s.PGSQL.PORT``); then a directory under
        the system's temporary directory named after the cluster's, removed with it."""
        inside = self.directory / "socket"
        if len(str(inside)) <= 80:
            return inside
        digest = hashlib.blake2b(str(self.directory.resolve()).encode(), digest_size=8).hexdigest()
        return Path(tempfile.gettempdir()) / f"rollnet-pg-{digest}"

    def url(self, database: str) -> str:
        """The SQLAlchemy URL of ``database`` on this server."""
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def start(self) -> None:
        """Make the cluster (first time only) and start the server; returns once it accepts."""
        why = private_postgres_available()
        if why is not None:
            raise RuntimeError(f"cannot make a private PostgreSQL server: {why}")
        chosen = self.port == 0
        if not self.data.exists():
            self._make()
        for attempt in range(PORT_ATTEMPTS):
            try:
                self._pg_ctl("start", "-l", str(self.log))
                return
            except RuntimeError as error:
                # A port free when picked can be taken before the server binds it (another
                # process's outgoing connection): pick another one.
                if not chosen or attempt == PORT_ATTEMPTS - 1 or PORT_TAKEN not in str(error):
                    raise
                self.port = _free_port()
                self._configure(f"port = {self.port}")

    def stop(self) -> None:
        """Stop the server (fast: open sessions are rolled back and disconnected)."""
        self._pg_ctl("stop", "-m", "fast")

    def restart(self, pause: float = 0.0) -> None:
        """Stop the server, wait ``pause`` seconds with it down, start it again."""
        self.stop()
        time.sleep(pause)
        self._pg_ctl("start", "-l", str(self.log))

    def running(self) -> bool:
        """Whether the server runs (``pg_ctl status``)."""
        if not self.data.exists():
            return False
        result = subprocess.run(
            self._as_server_user(["pg_ctl", "status", "-D", str(self.data)]),
            capture_output=True,
            text=True,
            cwd=self.directory,
            check=False,
        )
        return result.returncode == 0

    def remove(self) -> None:
        """Stop the server if it runs and delete the cluster (safe to call in any state)."""
        with contextlib.suppress(RuntimeError):
            if self.running():
                self._pg_ctl("stop", "-m", "immediate")
        shutil.rmtree(self.socket_directory, ignore_errors=True)
        shutil.rmtree(self.directory, ignore_errors=True)

    def create_database(self, name: str) -> str:
        """Create database ``name``; returns its SQLAlchemy URL."""
        with psycopg.connect(
            f"{self.server_url}/postgres", autocommit=True, connect_timeout=5
        ) as connection:
            connection.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.url(name)

    # -- internals ---------------------------------------------------------------------------

    def _make(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        socket_dir = self.socket_directory
        socket_dir.mkdir(parents=True, exist_ok=True)
        if self.port == 0:
            self.port = _free_port()
        if os.geteuid() == 0:
            _reachable_by_others(self.directory)
            server_user = pwd.getpwnam(SERVER_USER)
            for path in (self.directory, socket_dir):
                os.chown(path, server_user.pw_uid, server_user.pw_gid)
        self._run(
            ["initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "--no-sync"],
            "initdb",
        )
        self._configure(
            "# rollnet chaos harness",
            *SETTINGS,
            f"port = {self.port}",
            f"unix_socket_directories = '{socket_dir}'",
        )

    def _configure(self, *lines: str) -> None:
        # Appended: of two lines setting one parameter, the server takes the last.
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.write("\n" + "\n".join(lines) + "\n")

    def _pg_ctl(self, action: str, *options: str) -> None:
        command = ["pg_ctl", action, "-D", str(self.data), "-w", "-t", f"{self.timeout:.0f}"]
        self._run([*command, *options], f"pg_ctl {action}")

    def _run(self, command: list[str], what: str) -> None:
        # A session of its own: a Ctrl-C meant for the harness does not stop the server under it;
        # remove() does.
        result = subprocess.run(
            self._as_server_user(command),
            capture_output=True,
            text=True,
            cwd=self.directory,
            start_new_session=True,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"{what} failed ({result.returncode}): {result.stderr.strip() or result.stdout}; "
                f"the end of the server log ({self.log}):\n{self._log_tail()}"
            )

    def _log_tail(self, lines: int = 20) -> str:
        # Read now: remove() deletes the log with the cluster.
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError as error:
            return f"(unreadable: {error})"

    @staticmethod
    def _as_server_user(command: list[str]) -> list[str]:
        if os.geteuid() == 0:
            return ["runuser", "-u", SERVER_USER, "--", *command]
        return command


def _reachable_by_others(directory: Path) -> None:
    """Add search permission for others to ``directory`` and every directory above it."""
    for path in (directory, *directory.parents):
        mode = path.stat().st_mode
        if not mode & stat.S_IXOTH:
            os.chmod(path, mode | stat.S_IXOTH)
