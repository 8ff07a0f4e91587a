"""One error-handling layer for every ``rollnet`` command.

Whatever goes wrong, a command ends with one line on stderr naming what is wrong and what to do,
and exit code 2 — never a Python traceback. Commands raise :class:`CliError` for the mistakes
they find themselves; everything else that escapes a handler (a key file that is a directory, an
unreachable database, a port in use, an unwritable output file, a coordinator that cannot be
reached) is worded here, once, for all commands. Argument errors print the same one line
(:class:`OneLineParser`).

Exit codes: 0 done; 1 a result that is "no" (the coordinator refused, the ledger was tampered
with); 2 an error; 130 interrupted (Ctrl-C). ``ROLLNET_TRACEBACK=1`` prints the traceback of an
unexpected error as well, for bug reports.
"""

from __future__ import annotations

import argparse
import errno
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any, NoReturn

EXIT_OK = 0
EXIT_REFUSED = 1
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130

#: Set to print the traceback of an unexpected error too.
TRACEBACK_ENV = "ROLLNET_TRACEBACK"


class CliError(Exception):
    """A mistake or obstacle the user can fix; the message says what is wrong and what to do."""


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (``rollnet worker: ... (see --help)``).

    argparse prints the whole usage block above its error; with a dozen options the error
    scrolls out of sight. Subparsers inherit the class, so every command behaves the same.
    """

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_ERROR, f"{self.prog}: {message} (see '{self.prog} --help')\n")


def one_line(text: str) -> str:
    """``text`` with its lines joined: drivers and libraries put details on lines of their own."""
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def run_handler(prog: str, handler: Callable[[argparse.Namespace], int], args: Any) -> int:
    """Run a command's handler; print one line and return its exit code when it fails."""
    try:
        return handler(args)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except CliError as error:
        line, code = str(error), EXIT_ERROR
    except Exception as error:  # every other failure, worded once for all commands
        line, code = describe(error)
        if code == EXIT_ERROR and _unexpected(error) and os.environ.get(TRACEBACK_ENV):
            traceback.print_exc()
    print(f"{prog}: {one_line(line)}", file=sys.stderr)
    return code


def describe(error: BaseException) -> tuple[str, int]:
    """The line and exit code for an error a handler did not catch."""
    from sqlalchemy.exc import SQLAlchemyError

    from rollnet.ledger.engine import (
        DatabaseMissingError,
        DatabaseUrlError,
        describe_database_error,
    )
    from rollnet.reference.coordinator.config import ConfigError
    from rollnet.sdk import KeyFileError, RollnetError

    if isinstance(error, KeyFileError | ConfigError | DatabaseUrlError | DatabaseMissingError):
        return str(error), EXIT_ERROR
    if isinstance(error, SQLAlchemyError):
        return f"cannot use the database: {describe_database_error(error)}", EXIT_ERROR
    if isinstance(error, RollnetError):
        return describe_rollnet_error(error)
    if isinstance(error, OSError):
        return describe_os_error(error), EXIT_ERROR
    detail = f": {error}" if str(error) else ""
    return (
        f"unexpected error {type(error).__name__}{detail} (a bug: please report it; "
        f"{TRACEBACK_ENV}=1 prints the traceback)",
        EXIT_ERROR,
    )


def describe_rollnet_error(error: Any) -> tuple[str, int]:
    """A coordinator's refusal (exit 1), or why it could not be asked at all (exit 2)."""
    import grpc

    code = error.code
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return (
            f"cannot reach the coordinator ({code.name}: {error.message}): is it running, and "
            "are --coordinator (HOST:PORT), --tls-ca and --network-id right?",
            EXIT_ERROR,
        )
    reason = f" {error.reason}" if error.reason else ""
    return f"refused by the coordinator: {code.name}{reason}: {error.message}", EXIT_REFUSED


_OS_HINTS = {
    errno.ENOENT: "check the path (a missing directory is not created)",
    errno.EACCES: "no permission: choose another path or fix the permissions",
    errno.EPERM: "no permission: choose another path or fix the permissions",
    errno.EISDIR: "it is a directory: name a file",
    errno.ENOTDIR: "a part of the path is a file, not a directory",
    errno.EEXIST: "it already exists",
    errno.ENOSPC: "the disk is full",
    errno.EROFS: "the file system is read-only",
    errno.EADDRINUSE: "another process listens there: choose another port",
    errno.EADDRNOTAVAIL: "that address is not one of this machine's",
}


def describe_os_error(error: OSError) -> str:
    """``PATH: reason (what to do)`` for a file or socket error."""
    what = error.strerror or str(error)
    where = error.filename
    if error.filename2:
        where = f"{where} -> {error.filename2}"
    hint = _OS_HINTS.get(error.errno or 0, "")
    prefix = f"{where}: " if where else ""
    return f"{prefix}{what}" + (f" ({hint})" if hint else "")


def _unexpected(error: BaseException) -> bool:
    return not isinstance(error, OSError)
