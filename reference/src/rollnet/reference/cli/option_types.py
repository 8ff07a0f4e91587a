"""Checked argparse types for the options of every ``rollnet`` command.

A value is refused while the arguments are parsed — before a key is created, a database opened
or a process started — with a message naming the option, what is wrong with the value and what
a good one looks like.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
from collections.abc import Callable
from pathlib import Path

from rollnet.reference.addresses import split_host_port

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def whole(what: str, minimum: int = 1, maximum: int | None = None) -> Callable[[str], int]:
    """A whole number of ``what``, at least ``minimum`` (and at most ``maximum``)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value}: {what} must be {minimum} or more")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"{value}: {what} must be {maximum} or less")
        return value

    return parse


def seconds(minimum: float, maximum: float) -> Callable[[str], float]:
    """A number of seconds in ``[minimum, maximum]`` (NaN and inf refused)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
        if not (math.isfinite(value) and minimum <= value <= maximum):
            raise argparse.ArgumentTypeError(
                f"{text}: must be a number of seconds from {minimum:g} to {maximum:g}"
            )
        return value

    return parse


def address(text: str) -> str:
    """``HOST:PORT`` (``[v6addr]:PORT`` for IPv6) to dial, the port 1-65535."""
    try:
        split_host_port(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def listen_address(text: str) -> str:
    """``HOST:PORT`` to listen on; port 0 picks a free one."""
    try:
        split_host_port(text, allow_port_zero=True)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def network_id(text: str) -> str:
    """A network id (the audience of every signed call)."""
    from rollnet.reference.coordinator.config import check_network_id

    try:
        return check_network_id(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def compute_dtype(text: str) -> str:
    """A dtype a network may compute in (the names of ``rollnet.sdk.dtypes``)."""
    from rollnet.reference.coordinator.config import check_compute_dtype

    try:
        return check_compute_dtype(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def log_level(text: str) -> str:
    """A logging level name, in any case."""
    level = text.upper()
    if level not in LOG_LEVELS or not isinstance(logging.getLevelName(level), int):
        raise argparse.ArgumentTypeError(f"{text!r} is not one of {', '.join(LOG_LEVELS)}")
    return level


def database_url(text: str) -> str:
    """A SQLite or PostgreSQL URL (the scheme is checked, nothing is opened)."""
    from rollnet.ledger.engine import DatabaseUrlError
    from rollnet.ledger.engine import database_url as resolve

    try:
        resolve(text)
    except DatabaseUrlError as error:
        raise argparse.ArgumentTypeError(str(error)) from None
    return text


def readable_file(text: str) -> Path:
    """An existing regular file this process may read."""
    path = Path(text).expanduser()
    if not path.exists():
        raise argparse.ArgumentTypeError(f"{text}: no such file")
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"{text} is not a file")
    if not os.access(path, os.R_OK):
        raise argparse.ArgumentTypeError(f"{text}: no permission to read it")
    return path


def output_file(text: str) -> Path:
    """A file to write: its directory must exist (nothing is created on the way)."""
    path = Path(text).expanduser()
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory: name a file in it")
    parent = path.parent
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(
            f"{text}: the directory {parent} does not exist (create it first)"
        )
    if not os.access(parent, os.W_OK):
        raise argparse.ArgumentTypeError(f"{text}: no permission to write in {parent}")
    return path


def directory(text: str) -> Path:
    """A directory to use or create: refused when a file is in the way."""
    path = Path(text).expanduser()
    for part in (path, *path.parents):
        if part.exists():
            if not part.is_dir():
                where = "it" if part == path else f"{part}"
                raise argparse.ArgumentTypeError(
                    f"{text} cannot be a directory: {where} is a file (choose another path)"
                )
            break
    return path
