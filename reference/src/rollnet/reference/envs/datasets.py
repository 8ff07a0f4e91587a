"""Problem files of dataset-backed environments (``math``, ``code``): JSON lines, pinned by BLAKE3.

An environment reads the configuration keys ``path`` (the file; ``null`` for the example the
package ships) and ``blake3`` (the expected digest, normalised to the file's real one, so the
normalised configuration and its digest pin the data: a host holding another file refuses to
load it). The file is UTF-8 (a byte-order mark is tolerated), one JSON object per line; blank
lines are skipped and ``\\r\\n`` endings are fine. Errors name the file and line.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import blake3

from rollnet.reference.envs.config import ConfigReader

__all__ = ["DatasetError", "DatasetFile", "field_text", "read_dataset", "record_id"]


class DatasetError(ValueError):
    """A problem file is unreadable or malformed; the message names the file and line."""

    def __init__(self, source: str, line: int | None, message: str) -> None:
        self.source = source
        self.line = line
        where = source if line is None else f"{source}:{line}"
        super().__init__(f"{where}: {message}")


@dataclass(frozen=True, slots=True)
class DatasetFile:
    """A problem file as read: where from, and its JSON objects with their line numbers."""

    source: str
    """The path as configured, or the packaged resource's location."""
    path: str | None
    """The configured path; ``None`` for the packaged example."""
    rows: tuple[tuple[int, dict[str, Any]], ...]

    def __iter__(self) -> Iterator[tuple[int, dict[str, Any]]]:
        return iter(self.rows)

    @property
    def sandbox_paths(self) -> tuple[str, ...]:
        """The file, when it is not the packaged example (the reward sandbox must read it)."""
        return () if self.path is None else (str(Path(self.path).resolve()),)


def read_dataset(reader: ConfigReader, example: str) -> DatasetFile:
    """Read the keys ``path`` and ``blake3`` and the file they name (``example``, a resource of
    :mod:`rollnet.reference.envs`, when ``path`` is ``null``), checking its digest."""
    path = reader.optional_string("path")
    expected = reader.optional_string("blake3")
    if path is None:
        resource = resources.files("rollnet.reference.envs").joinpath(example)
        source = str(resource)
        data = resource.read_bytes()
    else:
        source = path
        try:
            data = Path(path).read_bytes()
        except OSError as error:
            raise DatasetError(path, None, f"cannot read: {error.strerror or error}") from None
    digest = blake3.blake3(data).hexdigest()
    if expected is not None and expected.lower() != digest:
        raise DatasetError(
            source, None, f"BLAKE3 is {digest}, but config key 'blake3' expects {expected}"
        )
    reader.set_normalised("blake3", digest)
    return DatasetFile(source, path, tuple(_json_lines(source, data)))


def _json_lines(source: str, data: bytes) -> Iterator[tuple[int, dict[str, Any]]]:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise DatasetError(source, line, "not valid UTF-8") from None
    found = False
    for number, raw in enumerate(text.split("\n"), start=1):
        content = raw.removesuffix("\r")
        if not content.strip():
            continue
        try:
            item = json.loads(content)
        except json.JSONDecodeError as error:
            raise DatasetError(source, number, f"invalid JSON: {error.msg}") from None
        if not isinstance(item, dict):
            raise DatasetError(source, number, "expected a JSON object")
        found = True
        yield number, item
    if not found:
        raise DatasetError(source, None, "no problems")


def field_text(
    source: str, line: int, item: dict[str, Any], key: str, numbers: tuple[type, ...]
) -> str:
    """``item[key]`` as non-empty text: a string, or a number of one of the ``numbers`` types
    written as its shortest ``repr`` (so ``"answer": 0.5`` reads as ``"0.5"``)."""
    if key not in item:
        raise DatasetError(source, line, f"missing field {key!r}")
    value = item[key]
    if isinstance(value, str):
        text = value
    elif not isinstance(value, bool) and isinstance(value, numbers):
        if isinstance(value, float) and not math.isfinite(value):
            raise DatasetError(source, line, f"field {key!r} must be finite")
        text = repr(value)
    else:
        kinds = "a string" + (" or a number" if numbers else "")
        raise DatasetError(source, line, f"field {key!r} must be {kinds}")
    if not text.strip():
        raise DatasetError(source, line, f"field {key!r} is empty")
    return text


def record_id(source: str, line: int, item: dict[str, Any], key: str, seen: dict[str, int]) -> str:
    """The record's ``key`` field (a string or an integer) as text, refused when an earlier
    line (recorded in ``seen``, which this updates) had the same id."""
    ident = field_text(source, line, item, key, numbers=(int,))
    if ident in seen:
        raise DatasetError(source, line, f"duplicate id {ident!r} (first on line {seen[ident]})")
    seen[ident] = line
    return ident
