"""Bounds on every field of every request: one table, checked once per call, at the edge.

Each field of each message a request can carry gets a rule: what a string may look like (no
U+0000 anywhere, a length cap, an id syntax), a byte string's length, an integer's range (never
beyond what a SQL ``BIGINT`` holds, unless the field is only ever computed with), a finite float,
a known enum value, a Duration's or Timestamp's range, how many items a repeated field or map
may hold. :func:`field_rules` is the table; :class:`RequestBounds` compiles it once per request
type and walks a parsed request, returning a :class:`~rollnet.sdk.errors.FieldViolation` per
bad field, with its path (``held_lease_ids[3]``, ``metrics["tokens"]``,
``manifest.files[0].path``). The coordinator's ``FieldBoundsCheck`` interceptor refuses such
a request before any handler, or SQL, sees it; docs/protocol.md ("Bounds on every field") is
generated from the same table (:func:`markdown_table`).

Checks that depend on one field alone live here; checks that relate fields to each other or to
the coordinator's state live with the method that needs them.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from google.protobuf import descriptor_pool, message_factory
from google.protobuf.descriptor import Descriptor, EnumDescriptor, FieldDescriptor
from google.protobuf.message import DecodeError, Message

from rollnet.reference.coordinator.config import CoordinatorConfig
from rollnet.sdk.checkpoints import (
    MAX_CHECKPOINT_COMPONENT_BYTES,
    MAX_CHECKPOINT_FILES,
    MAX_CHECKPOINT_PATH_BYTES,
    MAX_CHECKPOINT_PATH_DEPTH,
    checkpoint_file_count_error,
    checkpoint_path_conflicts,
    checkpoint_path_error,
)
from rollnet.sdk.errors import FieldViolation
from rollnet.sdk.methods import ALL_METHODS

#: Most violations one refusal lists: its details travel in trailing metadata, which gRPC caps
#: (8 KiB by default on the receiving side). The walk stops once it has found this many.
MAX_REPORTED = 16
#: Deepest nesting of messages in a request (a ``Struct`` inside a ``Struct``...).
MAX_DEPTH = 32
#: Most rollouts one task may ask for (prompts per task x samples per prompt); bounds every
#: per-rollout list of a commitment or verdict.
MAX_ROLLOUTS_PER_TASK = 4096
#: Most names in each list of a node's capabilities, or in a pull's environment filter.
MAX_CAPABILITY_ITEMS = 64
#: Most leases a node may ask to hold at once (``Capabilities.max_concurrent_leases``).
MAX_CONCURRENT_LEASES = 256
#: Fewest lease ids a heartbeat may always name, whatever ``max_leases_per_node`` says.
MIN_HELD_LEASES = 16
#: Most prompts one RequestRollouts may ask for.
MAX_PROMPTS_PER_REQUEST = 65_536
#: Lowest sampling temperature a trainer may ask for (the highest is ``max_temperature``): well
#: above where ``logits / T`` overflows to inf/NaN in the validator's exact-sampling re-check
#: (1e-310 does).
MIN_TEMPERATURE = 1e-3
#: Longest Duration a request may carry where one is a wait or an interval (the coordinator
#: clamps further: ``pull_wait_max``, ``heartbeat_interval_max``).
MAX_WAIT_SECONDS = 86_400

SQL_INT = 2**63 - 1
"""The largest value a SQL ``BIGINT`` (and SQLite's INTEGER) holds."""
_UINT32 = 2**32 - 1
_UINT64 = 2**64 - 1
# Protobuf's own validity range of a Timestamp (google/protobuf/timestamp.proto).
_TIMESTAMP_MIN = -62_135_596_800  # 0001-01-01T00:00:00Z
_TIMESTAMP_MAX = 253_402_300_799  # 9999-12-31T23:59:59Z
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")

#: Lists and maps up to this long are checked item by item; longer ones with one call in C per
#: kind of check (which costs more to set up than a few items do).
_SMALL = 8

Out = list[tuple[str, str]]
"""Violations found so far: ``(field path, why)``."""


class _Full(Exception):
    """Enough violations found: the walk stops."""


def _add(out: Out, path: str, why: str) -> None:
    out.append((path, why))
    if len(out) >= MAX_REPORTED:
        raise _Full


def _number(value: float) -> str:
    if value < 0:
        return f"−{_number(-value)}"
    for power in (64, 63, 62, 32, 31):
        if value == 2**power - 1:
            return f"2^{power}−1"
        if value == 2**power:
            return f"2^{power}"
    return f"{value:,}" if isinstance(value, int) else f"{value}"


class Rule(Protocol):
    """What one field's value may be."""

    @property
    def required(self) -> bool:
        """Whether a request must set the field (a proto3 field left at its zero value is
        not set)."""

    def ok(self, value: Any, depth: int) -> bool:
        """Whether ``value`` (a present field) is within bounds: the fast path, which builds
        nothing; :meth:`check` says what is wrong when it is not."""

    def all_ok(self, values: Iterable[Any], depth: int) -> bool:
        """Whether every one of ``values`` is within bounds (a list's items, a map's keys)."""

    def check(self, value: Any, path: str, out: Out, depth: int) -> None:
        """Append ``(path, why)`` to ``out`` for each problem of ``value`` (a present field)."""

    def describe(self) -> str:
        """The rule in words, for violations and for docs/protocol.md."""

    def missing(self) -> str:
        """Why a required field that is not set is refused."""


class _Rule(ABC):
    """What the rules share: checking a whole list of values (overridden where one call in C
    checks them all, which matters on the hot paths: a heartbeat's lease ids and metrics), and
    what a required field's absence is called."""

    __slots__ = ()

    @abstractmethod
    def ok(self, value: Any, depth: int) -> bool:
        """Whether one value obeys the rule (``depth``: nesting, for messages in messages)."""

    @abstractmethod
    def describe(self) -> str:
        """The rule in words, for refusals and the docs' table."""

    def missing(self) -> str:
        """Why a required field that is not set is refused: "is required", and the rule."""
        return f"is required: {self.describe()}"

    def all_ok(self, values: Iterable[Any], depth: int) -> bool:
        """Whether every one of ``values`` is within bounds."""
        ok = self.ok
        for value in values:  # noqa: SIM110 - a loop costs less than all() over a generator
            if not ok(value, depth):
                return False
        return True


# ------------------------------------------------------------------------------------- scalars
@dataclass(frozen=True, slots=True)
class Text(_Rule):
    """A string: no U+0000, ``min_len`` to ``max_len`` characters (code points), and either
    only characters of ``chars`` (a class like ``0-9a-f``; ``syntax`` says what it is) or, for
    ``line`` text, no control characters."""

    max_len: int
    chars: str = ""
    syntax: str = ""
    line: bool = True
    required: bool = False
    min_len: int = 0
    _allowed: frozenset[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_allowed", frozenset(_expand(self.chars)))

    def ok(self, value: str, depth: int) -> bool:
        if not self.min_len <= len(value) <= self.max_len:
            return False
        if self._allowed:  # a set test in C, faster than a regex; U+0000 is never allowed
            return self._allowed.issuperset(value)
        return "\x00" not in value and (not self.line or _CONTROL.search(value) is None)

    def all_ok(self, values: Iterable[str], depth: int) -> bool:
        if not self._allowed:
            return _Rule.all_ok(self, values, depth)
        values = list(values)
        lengths = list(map(len, values))
        return (
            min(lengths, default=self.min_len) >= self.min_len
            and max(lengths, default=0) <= self.max_len
            and self._allowed.issuperset("".join(values))
        )

    def check(self, value: str, path: str, out: Out, depth: int) -> None:
        if "\x00" in value:
            _add(out, path, "contains U+0000 (NUL)")
        elif not self.min_len <= len(value) <= self.max_len:
            _add(out, path, f"{len(value):,} characters; must be {self.describe()}")
        elif self._allowed and not self._allowed.issuperset(value):
            _add(out, path, f"must be {self.describe()}")
        elif self.line and not self._allowed and _CONTROL.search(value) is not None:
            _add(out, path, "contains a control character; must be one line of text")

    def describe(self) -> str:
        if self.syntax:
            return self.syntax
        size = (
            f"{self.min_len}-{self.max_len:,} characters"
            if self.min_len
            else f"at most {self.max_len:,} characters"
        )
        return f"{'one line of text' if self.line else 'text'}, {size}"


def _expand(chars: str) -> str:
    """The characters of a class written like ``0-9A-Za-z_-`` (a ``-`` at an end is itself)."""
    out: list[str] = []
    index = 0
    while index < len(chars):
        if index + 2 < len(chars) and chars[index + 1] == "-":
            out.extend(chr(c) for c in range(ord(chars[index]), ord(chars[index + 2]) + 1))
            index += 3
        else:
            out.append(chars[index])
            index += 1
    return "".join(out)


def _syntax(name: str, chars: str, low: int, high: int, *, required: bool = False) -> Text:
    """A Text of ``low``-``high`` characters of the class ``chars``."""
    size = f"{high}" if low == high else f"{low}-{high}"
    shown = "printable ASCII, no spaces" if chars == PRINTABLE else f"`{chars}`"
    return Text(
        max_len=high,
        min_len=low,
        chars=chars,
        syntax=f"{name}: {size} characters of {shown}",
        required=required,
    )


PRINTABLE = "!-~"
"""Printable ASCII without the space (0x21 to 0x7E), as a character class."""
_PRINTABLE_SET = frozenset(_expand(PRINTABLE))
NODE_ID = _syntax("a node id", "0-9a-f", 32, 32)
"""A node id: 32 lowercase hex digits (docs/protocol.md, *Keys and node ids*)."""
ID = _syntax("an id the coordinator issued", "0-9A-Za-z_-", 1, 64)
"""Task, lease, commitment and job ids: opaque, issued by the coordinator."""
REQUEST_ID = _syntax("a request id", "0-9A-Za-z._:~-", 1, 128)
NAME = _syntax("a name", "0-9A-Za-z_.+-", 1, 64)
"""Environment, backend and dtype names (an environment's name is its entry point's)."""
KEY = _syntax("a key", "0-9A-Za-z_.:/-", 1, 64)
"""Keys of metric and figure maps."""
POOL = _syntax("a pool name", "0-9A-Za-z_.-", 0, 64)
MAX_RELAY_REPORTS = 8
"""Relay reports one heartbeat may carry."""


@dataclass(frozen=True, slots=True)
class Url(_Rule):
    """An ``http://`` or ``https://`` URL: printable ASCII without spaces, at most
    ``max_len`` characters."""

    max_len: int = 512
    required: bool = False

    def ok(self, value: str, depth: int) -> bool:
        return (
            len(value) <= self.max_len
            and value.startswith(("http://", "https://"))
            and len(value) > len("https://")
            and _PRINTABLE_SET.issuperset(value)
        )

    def check(self, value: str, path: str, out: Out, depth: int) -> None:
        if not self.ok(value, depth):
            _add(out, path, f"must be {self.describe()}")

    def describe(self) -> str:
        return (
            f"an `http://` or `https://` URL: at most {self.max_len} characters of printable "
            "ASCII, no spaces"
        )


RELAY_URL = Url(required=True)
PAGE_TOKEN = _syntax("a page token", "0-9A-Za-z_-", 0, 128)


def _optional(rule: Text) -> Text:
    """``rule``, or the empty string (a field whose emptiness means something)."""
    return replace(rule, min_len=0, syntax=f"empty, or {rule.syntax}")


def _required(rule: Text) -> Text:
    return replace(rule, required=True)


@dataclass(frozen=True, slots=True)
class Raw(_Rule):
    """A byte string of ``sizes`` bytes (one exact size, or any within the message cap)."""

    sizes: tuple[int, ...] = ()
    required: bool = False
    what: str = ""

    def ok(self, value: bytes, depth: int) -> bool:
        return not self.sizes or len(value) in self.sizes

    def check(self, value: bytes, path: str, out: Out, depth: int) -> None:
        if self.sizes and len(value) not in self.sizes:
            _add(out, path, f"{len(value):,} bytes; must be {self.describe()}")

    def describe(self) -> str:
        if not self.sizes:
            return f"{self.what or 'bytes'} (within the message cap)"
        sizes = " or ".join(f"{size}" for size in self.sizes)
        return f"{self.what + ', ' if self.what else ''}{sizes} bytes"


@dataclass(frozen=True, slots=True)
class Whole(_Rule):
    """An integer from ``low`` to ``high``; ``option`` names the setting ``high`` comes from."""

    low: int
    high: int
    required: bool = False
    option: str = ""
    note: str = ""

    def ok(self, value: int, depth: int) -> bool:
        return self.low <= value <= self.high

    def check(self, value: int, path: str, out: Out, depth: int) -> None:
        if not self.low <= value <= self.high:
            _add(out, path, f"{value} is outside {self.describe()}")

    def describe(self) -> str:
        text = f"{_number(self.low)} to {_number(self.high)}"
        if self.option:
            text += f" ({self.option})"
        return f"{text}; {self.note}" if self.note else text


@dataclass(frozen=True, slots=True)
class Real(_Rule):
    """A finite float, at least ``low`` and at most ``high`` when they are given."""

    low: float | None = None
    high: float | None = None
    required: bool = False
    option: str = ""

    def ok(self, value: float, depth: int) -> bool:
        return math.isfinite(value) and (
            (self.low is None or value >= self.low) and (self.high is None or value <= self.high)
        )

    def all_ok(self, values: Iterable[float], depth: int) -> bool:
        if self.low is None and self.high is None:
            return all(map(math.isfinite, values))
        # A long bounded list (a verdict's log-probabilities, 4 bytes a completion token, up to
        # 10^5 and more in one request) is read once into numpy: 4-5x faster than the passes of
        # Python over protobuf's container that finite-and-in-range takes.
        array = np.asarray(values if isinstance(values, Sequence) else list(values), np.float64)
        return array.size == 0 or bool(
            np.isfinite(array).all()
            and (self.low is None or array.min() >= self.low)
            and (self.high is None or array.max() <= self.high)
        )

    def check(self, value: float, path: str, out: Out, depth: int) -> None:
        if not self.ok(value, depth):
            _add(out, path, f"{value} is not {self.describe()}")

    def describe(self) -> str:
        if self.low is None and self.high is None:
            return "finite"
        if self.low is None:
            text = f"finite, at most {self.high}"
        elif self.high is None:
            text = f"finite, at least {self.low}"
        else:
            text = f"finite, {self.low} to {self.high}"
        return f"{text} ({self.option})" if self.option else text


@dataclass(frozen=True, slots=True)
class Flag(_Rule):
    """A bool: anything goes."""

    required: bool = False

    def ok(self, value: bool, depth: int) -> bool:
        return True

    def check(self, value: bool, path: str, out: Out, depth: int) -> None:
        return

    def describe(self) -> str:
        return "true or false"


@dataclass(frozen=True, slots=True)
class Choice(_Rule):
    """An enum value this coordinator knows; ``required``: not the zero (UNSPECIFIED) value."""

    enum: EnumDescriptor
    required: bool = False
    _known: frozenset[int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_known", frozenset(v.number for v in self.enum.values))

    def ok(self, value: int, depth: int) -> bool:
        return value in self._known

    def check(self, value: int, path: str, out: Out, depth: int) -> None:
        if value not in self._known:
            _add(out, path, f"{value} is not {self.describe()}")

    def describe(self) -> str:
        names = [v.name for v in self.enum.values if v.number or not self.required]
        return f"a known `{self.enum.name}` ({', '.join(names)})"


@dataclass(frozen=True, slots=True)
class Span(_Rule):
    """A ``google.protobuf.Duration`` from ``low`` to ``high`` seconds, valid as protobuf
    defines it (nanos within ±999,999,999 and of the same sign as seconds)."""

    low: int
    high: int
    required: bool = False
    note: str = ""

    def ok(self, value: Message, depth: int) -> bool:
        seconds: int = value.seconds  # type: ignore[attr-defined]
        nanos: int = value.nanos  # type: ignore[attr-defined]
        valid = abs(nanos) < 1_000_000_000 and (seconds * nanos >= 0)
        return valid and self.low <= seconds + nanos / 1e9 <= self.high

    def check(self, value: Message, path: str, out: Out, depth: int) -> None:
        if not self.ok(value, depth):
            seconds, nanos = value.seconds, value.nanos  # type: ignore[attr-defined]
            _add(out, path, f"{seconds} s {nanos} ns is not {self.describe()}")

    def describe(self) -> str:
        text = f"a Duration of {self.low:,} to {self.high:,} s"
        return f"{text}; {self.note}" if self.note else text


@dataclass(frozen=True, slots=True)
class Instant(_Rule):
    """A ``google.protobuf.Timestamp`` valid as protobuf defines it (years 1 to 9999)."""

    required: bool = False

    def ok(self, value: Message, depth: int) -> bool:
        seconds: int = value.seconds  # type: ignore[attr-defined]
        nanos: int = value.nanos  # type: ignore[attr-defined]
        return _TIMESTAMP_MIN <= seconds <= _TIMESTAMP_MAX and 0 <= nanos < 1_000_000_000

    def check(self, value: Message, path: str, out: Out, depth: int) -> None:
        if not self.ok(value, depth):
            seconds, nanos = value.seconds, value.nanos  # type: ignore[attr-defined]
            _add(out, path, f"{seconds} s {nanos} ns is not {self.describe()}")

    def describe(self) -> str:
        return "a Timestamp from 0001-01-01 to 9999-12-31 (nanos 0 to 999,999,999)"


@dataclass(frozen=True, slots=True)
class CheckpointPath(_Rule):
    """A checkpoint file path under the canonical path rule: the SDK's own
    :func:`~rollnet.sdk.checkpoints.checkpoint_path_error`, the rule every worker applies again
    before it writes a file, so the two can never disagree."""

    required: bool = False

    def ok(self, value: str, depth: int) -> bool:
        return checkpoint_path_error(value) is None

    def check(self, value: str, path: str, out: Out, depth: int) -> None:
        error = checkpoint_path_error(value)
        if error is not None:
            _add(out, path, error)

    def missing(self) -> str:
        return checkpoint_path_error("") or _Rule.missing(self)

    def describe(self) -> str:
        return (
            "a checkpoint file path ([Checkpoint file paths](#checkpoint-file-paths)): at most "
            f"{MAX_CHECKPOINT_PATH_BYTES:,} bytes, 1 to {MAX_CHECKPOINT_PATH_DEPTH} "
            f"`/`-separated names of 1 to {MAX_CHECKPOINT_COMPONENT_BYTES} characters of "
            "`A-Za-z0-9._-`, none starting or ending with `.` nor a Windows device name"
        )


# ------------------------------------------------------------------------- messages and lists
@dataclass(frozen=True, slots=True)
class Nested(_Rule):
    """A message of type ``name``, checked field by field with its own rules."""

    name: str
    required: bool = False
    #: Filled in when the table is compiled.
    compiled: dict[str, MessageCheck] = field(default_factory=dict, repr=False, compare=False)

    def ok(self, value: Message, depth: int) -> bool:
        return depth < MAX_DEPTH and self.compiled[self.name].ok(value, depth + 1)

    def check(self, value: Message, path: str, out: Out, depth: int) -> None:
        if depth >= MAX_DEPTH:
            _add(out, path, f"nested more than {MAX_DEPTH} messages deep")
            return
        self.compiled[self.name].walk(value, path + ".", out, depth + 1)

    def describe(self) -> str:
        return f"a message `{self.name.rpartition('.')[2]}` (below)"


@dataclass(frozen=True, slots=True)
class Embedded(_Rule):
    """Bytes that must hold a serialized message of type ``name``, checked like a field of
    that type (a checkpoint manifest travels as the exact bytes its trainer signed)."""

    name: str
    required: bool = False
    compiled: dict[str, MessageCheck] = field(default_factory=dict, repr=False, compare=False)

    def ok(self, value: bytes, depth: int) -> bool:
        return False  # rare (a checkpoint's publication): always walked

    def check(self, value: bytes, path: str, out: Out, depth: int) -> None:
        check = self.compiled[self.name]
        try:
            parsed = check.message_class.FromString(value)
        except DecodeError:
            _add(out, path, f"does not parse as a {self.name}")
            return
        check.walk(parsed, path + ".", out, depth + 1)

    def describe(self) -> str:
        return f"a serialized message `{self.name.rpartition('.')[2]}` (below)"


@dataclass(frozen=True, slots=True)
class Each(_Rule):
    """A repeated field: at most ``max_items`` items (at least one when ``required``), each
    following ``item``; ``unique``: no item twice."""

    item: Rule
    max_items: int
    required: bool = False
    unique: bool = False
    note: str = ""

    def ok(self, value: Any, depth: int) -> bool:
        count = len(value)
        if count > self.max_items or (self.unique and count > 1 and len(set(value)) != count):
            return False
        if count > _SMALL:
            return self.item.all_ok(value, depth)
        ok = self.item.ok
        for item in value:  # noqa: SIM110 - a loop costs less than all() over a generator
            if not ok(item, depth):
                return False
        return True

    def check(self, value: Any, path: str, out: Out, depth: int) -> None:
        if len(value) > self.max_items:
            _add(out, path, f"{len(value):,} items; at most {self.max_items:,}")
            return
        if self.unique and len(set(value)) != len(value):
            _add(out, path, "names an item twice")
        check = self.item.check
        for index, item in enumerate(value):
            check(item, f"{path}[{index}]", out, depth)

    def describe(self) -> str:
        least = "1" if self.required else "0"
        unique = ", no duplicates" if self.unique else ""
        note = f" ({self.note})" if self.note else ""
        return f"{least} to {self.max_items:,} items{note}{unique}; each {self.item.describe()}"


@dataclass(frozen=True, slots=True)
class CheckpointFiles(Each):
    """A checkpoint manifest's files: their count, and their paths taken together (no two the
    same file, none under another), by the SDK's path rule
    (:func:`~rollnet.sdk.checkpoints.checkpoint_file_count_error`,
    :func:`~rollnet.sdk.checkpoints.checkpoint_path_conflicts`); each path on its own is its
    field's (:class:`CheckpointPath`)."""

    def ok(self, value: Any, depth: int) -> bool:
        return Each.ok(self, value, depth) and not checkpoint_path_conflicts(
            [item.path for item in value]
        )

    def check(self, value: Any, path: str, out: Out, depth: int) -> None:
        count_error = checkpoint_file_count_error(len(value))
        if count_error is not None:
            _add(out, path, count_error)
            return
        check = self.item.check
        for index, item in enumerate(value):
            check(item, f"{path}[{index}]", out, depth)
        for conflict in checkpoint_path_conflicts([item.path for item in value]):
            _add(out, f"{path}[{conflict.index}].path", conflict.description)

    def missing(self) -> str:
        return checkpoint_file_count_error(0) or _Rule.missing(self)

    def describe(self) -> str:
        return (
            f"1 to {self.max_items:,} items, no two paths naming one file (compared without "
            "case) and none under another that is a file "
            f"([Checkpoint file paths](#checkpoint-file-paths)); each {self.item.describe()}"
        )


@dataclass(frozen=True, slots=True)
class Pairs(_Rule):
    """A map: at most ``max_items`` entries, keys following ``key``, values ``value``."""

    key: Text
    value: Rule
    max_items: int
    required: bool = False

    def ok(self, value: Mapping[str, Any], depth: int) -> bool:
        count = len(value)
        if count > self.max_items:
            return False
        if count > _SMALL:
            entries = dict(value)  # protobuf's map views cost more than a dict's
            return self.key.all_ok(entries.keys(), depth) and self.value.all_ok(
                entries.values(), depth
            )
        key_ok, value_ok = self.key.ok, self.value.ok
        for key, item in value.items():  # noqa: SIM110 - a loop costs less than all()
            if not (key_ok(key, depth) and value_ok(item, depth)):
                return False
        return True

    def check(self, value: Mapping[str, Any], path: str, out: Out, depth: int) -> None:
        if len(value) > self.max_items:
            _add(out, path, f"{len(value):,} entries; at most {self.max_items:,}")
            return
        for key, item in value.items():
            # The key as JSON (escaped), shortened: a path never echoes a huge or binary key.
            where = f"{path}[{json.dumps(key[:64])}]"
            self.key.check(key, where, out, depth)
            self.value.check(item, where, out, depth)

    def describe(self) -> str:
        return (
            f"at most {self.max_items:,} entries; keys {self.key.describe()}; "
            f"values {self.value.describe()}"
        )


# --------------------------------------------------------------------------------- the table
def field_rules(config: CoordinatorConfig) -> dict[str, dict[str, Rule]]:
    """Every field of every message a request may carry → its rule (see the module docs).

    Some bounds are the operator's (``config``): the sampling a trainer may ask for, the
    completion tokens a rollout may have, the lease ids a heartbeat may name.
    """
    enum = descriptor_pool.Default().FindEnumTypeByName
    free_line = Text(max_len=256)
    step = Whole(0, SQL_INT)
    fencing = Whole(0, SQL_INT)
    wait = Span(0, MAX_WAIT_SECONDS, note="the coordinator waits at most `pull_wait_max`")
    digest = Raw((32,), required=True, what="a BLAKE3-256 digest")
    plausible = "checked for plausibility (`HARDWARE_CLAIM_IMPLAUSIBLE`)"
    names = Each(NAME, MAX_CAPABILITY_ITEMS)
    finite = Real()
    node_filter = _optional(NODE_ID)
    return {
        # ------------------------------------------------------------------ NodeService
        "rollnet.v1.RegisterNodeRequest": {
            "request_id": REQUEST_ID,
            "public_key": Raw((32,), required=True, what="a raw Ed25519 public key"),
            "role": Choice(enum("rollnet.v1.Role"), required=True),
            "protocol_version": Nested("rollnet.v1.ProtocolVersion", required=True),
            "software_version": Text(max_len=64),
            "capabilities": Nested("rollnet.v1.Capabilities"),
            "hardware": Nested("rollnet.v1.HardwareReport"),
            "pool": POOL,
            "invite_token": _syntax("an invite token", PRINTABLE, 0, 256),
        },
        "rollnet.v1.ProtocolVersion": {
            "major": Whole(0, _UINT32),
            "minor": Whole(0, _UINT32),
        },
        "rollnet.v1.Capabilities": {
            "backends": names,
            "environments": names,
            "dtypes": names,
            "max_concurrent_leases": Whole(0, MAX_CONCURRENT_LEASES),
        },
        "rollnet.v1.HardwareReport": {
            "cpu_cores": Whole(0, _UINT32, note=plausible),
            "memory_bytes": Whole(0, _UINT64, note=plausible),
            "accelerators": Each(Nested("rollnet.v1.Accelerator"), 16),
        },
        "rollnet.v1.Accelerator": {
            "name": Text(max_len=128, min_len=1, required=True),
            "memory_bytes": Whole(0, _UINT64, note=plausible),
            "count": Whole(0, _UINT32, note=plausible),
        },
        "rollnet.v1.HeartbeatRequest": {
            "activity": Choice(enum("rollnet.v1.Activity")),
            # A node holds at most max_leases_per_node leases (a validator, one job at a time):
            # naming more is naming bogus ones, which cost the whole batch's transaction and
            # reply (300 heartbeats naming 256 each quadrupled honest heartbeats' latency).
            "held_lease_ids": Each(
                ID,
                max(MIN_HELD_LEASES, config.max_leases_per_node),
                unique=True,
                note=f"the larger of {MIN_HELD_LEASES} and `max_leases_per_node`",
            ),
            "checkpoint_step": step,
            "requested_interval": Span(
                0,
                MAX_WAIT_SECONDS,
                note="0 asks for the default; the coordinator clamps to "
                "[`heartbeat_interval_min`, `heartbeat_interval_max`]",
            ),
            "metrics": Pairs(KEY, finite, 64),
            "relay_reports": Each(
                Nested("rollnet.v1.RelayReport"),
                MAX_RELAY_REPORTS,
                note="the coordinator records at most 8 a minute from one node",
            ),
        },
        "rollnet.v1.RelayReport": {
            "relay_url": RELAY_URL,
            "shard_blake3": digest,
            "checkpoint_step": step,
            "detected_at": Instant(),
        },
        "rollnet.v1.DeregisterNodeRequest": {"request_id": REQUEST_ID, "reason": free_line},
        "rollnet.v1.GetNodeRequest": {"node_id": node_filter},
        "rollnet.v1.ListNodesRequest": {
            "page_size": Whole(0, _UINT32, note="the coordinator serves at most 1,000"),
            "page_token": PAGE_TOKEN,
            "state": Choice(enum("rollnet.v1.Node.State")),
            "role": Choice(enum("rollnet.v1.Role")),
        },
        "rollnet.v1.EjectNodeRequest": {
            "request_id": REQUEST_ID,
            "node_id": _required(NODE_ID),
            "reason": free_line,
        },
        "rollnet.v1.BanNodeRequest": {
            "request_id": REQUEST_ID,
            "node_id": _required(NODE_ID),
            "reason": free_line,
        },
        "rollnet.v1.ReinstateNodeRequest": {
            "request_id": REQUEST_ID,
            "node_id": _required(NODE_ID),
            "reason": free_line,
        },
        # ------------------------------------------------------------------ TaskService
        "rollnet.v1.PullTaskRequest": {
            "request_id": REQUEST_ID,
            "wait": wait,
            "environments": names,
        },
        "rollnet.v1.ReportProgressRequest": {
            "lease_id": _required(ID),
            "fencing_token": fencing,
            "completed_rollouts": Whole(0, MAX_ROLLOUTS_PER_TASK),
            "total_rollouts": Whole(0, MAX_ROLLOUTS_PER_TASK),
        },
        "rollnet.v1.FailTaskRequest": {
            "request_id": REQUEST_ID,
            "lease_id": _required(ID),
            "fencing_token": fencing,
            "reason": Choice(enum("rollnet.v1.FailReason")),
            "message": Text(max_len=1024, line=False),
        },
        # ------------------------------------------------------------------ BlobService
        "rollnet.v1.UploadBlobRequest": {
            "header": Nested("rollnet.v1.BlobHeader"),
            "chunk": Raw(what="content"),
        },
        "rollnet.v1.BlobHeader": {
            "blob": Nested("rollnet.v1.BlobRef", required=True),
            "kind": Choice(enum("rollnet.v1.BlobKind"), required=True),
        },
        "rollnet.v1.BlobRef": {
            "blake3": digest,
            "size": Whole(0, SQL_INT, note="at most `max_blob_bytes` (`BLOB_TOO_LARGE`)"),
        },
        "rollnet.v1.GetBlobRequest": {
            "blake3": digest,
            "offset": Whole(0, SQL_INT),
            "length": Whole(0, SQL_INT),
        },
        # ------------------------------------------------------------ CommitmentService
        "rollnet.v1.SubmitCommitmentRequest": {
            "request_id": REQUEST_ID,
            "lease_id": _required(ID),
            "fencing_token": fencing,
            "task_id": _required(ID),
            "rollout_batch": Nested("rollnet.v1.BlobRef", required=True),
            "rollouts": Each(
                Nested("rollnet.v1.RolloutDigest"), MAX_ROLLOUTS_PER_TASK, required=True
            ),
            "claimed_work": Nested("rollnet.v1.WorkClaim"),
            "binding_digest": digest,
        },
        "rollnet.v1.RolloutDigest": {
            "sampling_seed": Whole(0, _UINT64),
            "proof_blake3": digest,
            "completion_tokens": Whole(0, config.max_new_tokens, option="max_new_tokens"),
            "commitment_digest": Raw((0, 32), what="empty or a BLAKE3-256 digest"),
        },
        "rollnet.v1.WorkClaim": {
            "prefill_tokens": Whole(0, 2**62),
            "decode_tokens": Whole(0, 2**62),
        },
        "rollnet.v1.GetCommitmentRequest": {"commitment_id": _required(ID)},
        # ------------------------------------------------------------ ValidationService
        "rollnet.v1.PullValidationJobRequest": {"request_id": REQUEST_ID, "wait": wait},
        "rollnet.v1.SubmitVerdictRequest": {
            "request_id": REQUEST_ID,
            "job_id": _required(ID),
            "lease_id": _required(ID),
            "fencing_token": fencing,
            "decision": Choice(enum("rollnet.v1.Verdict.Decision"), required=True),
            "reject_reason": free_line,
            "checks": Each(Nested("rollnet.v1.CheckResult"), 16 * MAX_ROLLOUTS_PER_TASK),
            "validated_rewards": Each(Nested("rollnet.v1.Reward"), MAX_ROLLOUTS_PER_TASK),
            "validated_work": Nested("rollnet.v1.WorkClaim"),
            "validated_logprobs": Each(
                Nested("rollnet.v1.ValidatedLogprobs"),
                MAX_ROLLOUTS_PER_TASK,
                note="one per rollout, with an ACCEPT only",
            ),
            "rollout_statistics": Each(
                Nested("rollnet.v1.RolloutStatistics"),
                MAX_ROLLOUTS_PER_TASK,
                note="one per rollout, with an ACCEPT only",
            ),
        },
        "rollnet.v1.RolloutStatistics": {
            # Counts of a rollout's completion tokens: at most max_new_tokens each.
            "tokens": Whole(0, config.max_new_tokens, option="`max_new_tokens`"),
            "near_tie_losses": Whole(0, config.max_new_tokens, option="`max_new_tokens`"),
            "near_tie_wins": Whole(0, config.max_new_tokens, option="`max_new_tokens`"),
            "logprob_excess": finite,
            "logprob_variance": Real(low=0),
            "eos_near_tie_losses": Whole(0, config.max_new_tokens, option="`max_new_tokens`"),
            "eos_near_tie_passes": Whole(0, config.max_new_tokens, option="`max_new_tokens`"),
            # A sum of per-token values in [0, 1]: at most the tokens it sums over.
            "logprob_dispersion": Real(
                low=0, high=float(config.max_new_tokens), option="`max_new_tokens`"
            ),
            "dispersion_tokens": Whole(0, config.max_new_tokens, option="`max_new_tokens`"),
        },
        "rollnet.v1.ValidatedLogprobs": {
            # A log-probability: finite and at most 0; one per completion token, and a rollout
            # has at most max_new_tokens of them.
            "logprobs": Each(Real(high=0), config.max_new_tokens, note="`max_new_tokens`"),
        },
        "rollnet.v1.CheckResult": {
            "check": Text(max_len=64),
            "passed": Flag(),
            "reason": Text(max_len=128),
            "figures": Pairs(KEY, finite, 32),
            "rollout_index": Whole(0, MAX_ROLLOUTS_PER_TASK - 1),
        },
        "rollnet.v1.Reward": {"task_reward": finite, "length_penalty": finite, "total": finite},
        # ------------------------------------------------------------ CheckpointService
        "rollnet.v1.PublishCheckpointRequest": {
            "request_id": REQUEST_ID,
            "manifest": Embedded("rollnet.v1.CheckpointManifest", required=True),
            "signature": Raw((64,), required=True, what="an Ed25519 signature"),
        },
        "rollnet.v1.CheckpointManifest": {
            "step": step,
            "network_id": _syntax("a network id", PRINTABLE, 1, 64, required=True),
            "files": CheckpointFiles(
                Nested("rollnet.v1.CheckpointFile"), MAX_CHECKPOINT_FILES, required=True
            ),
            "flops_per_token": Whole(0, SQL_INT),
            "created_at": Instant(),
        },
        "rollnet.v1.CheckpointFile": {
            "path": CheckpointPath(required=True),
            "content": Nested("rollnet.v1.BlobRef", required=True),
            "shards": Each(Nested("rollnet.v1.BlobRef"), 65_536),
            "delta": Nested("rollnet.v1.CheckpointDelta"),
        },
        "rollnet.v1.CheckpointDelta": {
            "base_step": step,
            "base": Nested("rollnet.v1.BlobRef", required=True),
            "content": Nested("rollnet.v1.BlobRef", required=True),
            "shards": Each(Nested("rollnet.v1.BlobRef"), 65_536),
            "encoding": Choice(enum("rollnet.v1.DeltaEncoding"), required=True),
        },
        "rollnet.v1.GetLatestCheckpointRequest": {},
        "rollnet.v1.GetCheckpointRequest": {"step": step},
        "rollnet.v1.WatchCheckpointsRequest": {"after_step": step},
        # -------------------------------------------------------------- RolloutService
        "rollnet.v1.RequestRolloutsRequest": {
            "request_id": REQUEST_ID,
            "rollout_step": step,
            "environment": _required(NAME),
            "environment_config": Nested("google.protobuf.Struct"),
            "prompt_count": Whole(1, MAX_PROMPTS_PER_REQUEST, required=True),
            "samples_per_prompt": Whole(
                1, config.max_samples_per_prompt, required=True, option="max_samples_per_prompt"
            ),
            "sampling": Nested("rollnet.v1.SamplingParams", required=True),
            "prompts_per_task": Whole(
                0,
                MAX_ROLLOUTS_PER_TASK,
                note=f"0 means 1; times `samples_per_prompt` at most {MAX_ROLLOUTS_PER_TASK:,}",
            ),
        },
        "rollnet.v1.SamplingParams": {
            "temperature": Real(
                MIN_TEMPERATURE, config.max_temperature, required=True, option="max_temperature"
            ),
            "max_new_tokens": Whole(
                1, config.max_new_tokens, required=True, option="max_new_tokens"
            ),
        },
        "google.protobuf.Struct": {
            "fields": Pairs(Text(max_len=128), Nested("google.protobuf.Value"), 256),
        },
        "google.protobuf.Value": {
            "null_value": Choice(enum("google.protobuf.NullValue")),
            "number_value": finite,
            "string_value": Text(max_len=4096, line=False),
            "bool_value": Flag(),
            "struct_value": Nested("google.protobuf.Struct"),
            "list_value": Nested("google.protobuf.ListValue"),
        },
        "google.protobuf.ListValue": {"values": Each(Nested("google.protobuf.Value"), 1024)},
        "rollnet.v1.StreamRolloutsRequest": {
            "after_sequence": Whole(0, _UINT64),
            "min_checkpoint_step": step,
        },
        # ---------------------------------------------------------------- LedgerService
        "rollnet.v1.ListEntriesRequest": {
            "after_sequence": Whole(0, SQL_INT),
            "page_size": Whole(0, _UINT32, note="the coordinator serves at most 1,000"),
            "node_id": node_filter,
        },
        "rollnet.v1.GetBalanceRequest": {"node_id": node_filter},
        "rollnet.v1.GetChainHeadRequest": {"fresh": Flag()},
    }


# ------------------------------------------------------------------------------- compilation
_INTEGERS = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SINT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_SFIXED32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_UINT32: (0, _UINT32),
    FieldDescriptor.TYPE_FIXED32: (0, _UINT32),
    FieldDescriptor.TYPE_INT64: (-(2**63), SQL_INT),
    FieldDescriptor.TYPE_SINT64: (-(2**63), SQL_INT),
    FieldDescriptor.TYPE_SFIXED64: (-(2**63), SQL_INT),
    FieldDescriptor.TYPE_UINT64: (0, SQL_INT),
    FieldDescriptor.TYPE_FIXED64: (0, SQL_INT),
}


def default_rule(descriptor: FieldDescriptor) -> Rule:
    """The rule of a field the table does not name (a field added since): bounded by its type.

    A test lists such fields, so that each gets a considered rule of its own.
    """
    if descriptor.message_type is not None and descriptor.message_type.GetOptions().map_entry:
        value = descriptor.message_type.fields_by_name["value"]
        return Pairs(Text(max_len=128), _default_single(value), 64)
    single = _default_single(descriptor)
    return Each(single, 1024) if descriptor.is_repeated else single


def _default_single(descriptor: FieldDescriptor) -> Rule:
    kind = descriptor.type
    if kind == FieldDescriptor.TYPE_STRING:
        return Text(max_len=256)
    if kind == FieldDescriptor.TYPE_BYTES:
        return Raw()
    if kind == FieldDescriptor.TYPE_BOOL:
        return Flag()
    if descriptor.enum_type is not None:
        return Choice(descriptor.enum_type)
    if kind in (FieldDescriptor.TYPE_DOUBLE, FieldDescriptor.TYPE_FLOAT):
        return Real()
    if kind in _INTEGERS or descriptor.message_type is None:
        return Whole(*_INTEGERS[kind])
    name = descriptor.message_type.full_name
    if name == "google.protobuf.Duration":
        return Span(0, MAX_WAIT_SECONDS)
    if name == "google.protobuf.Timestamp":
        return Instant()
    return Nested(name)


class MessageCheck:
    """One message type's compiled rules: checks a message of that type."""

    def __init__(self, descriptor: Descriptor, rules: Mapping[str, Rule]) -> None:
        self.descriptor = descriptor
        self.message_class: type[Message] = message_factory.GetMessageClass(descriptor)
        #: Fields the table does not name, bounded by :func:`default_rule`.
        self.defaulted = [f.name for f in descriptor.fields if f.name not in rules]
        #: (field name, rule) in declaration order.
        self.fields = [(f.name, rules.get(f.name) or default_rule(f)) for f in descriptor.fields]
        # Each field read by name: fields with presence (messages, oneofs, `optional`) are set
        # when HasField says so, the others when not zero or empty, as protobuf defines it.
        # Reading a handful of attributes costs a fraction of ListFields, which builds a tuple
        # and a descriptor per set field.
        self._plan = [
            (name, rule, f.has_presence and not f.is_repeated)
            for f, (name, rule) in zip(descriptor.fields, self.fields, strict=True)
        ]

    def ok(self, message: Message, depth: int) -> bool:
        """Whether every field of ``message`` is within bounds (the fast path: builds nothing)."""
        for name, rule, presence in self._plan:
            if presence:
                if not message.HasField(name):
                    if rule.required:
                        return False
                    continue
                value = getattr(message, name)
            else:
                value = getattr(message, name)
                if not value:
                    if rule.required:
                        return False
                    continue
            if not rule.ok(value, depth):
                return False
        return True

    def walk(self, message: Message, prefix: str, out: Out, depth: int) -> None:
        """Append the violations of ``message`` (its fields' paths start with ``prefix``)."""
        for name, rule, presence in self._plan:
            value = getattr(message, name)
            if message.HasField(name) if presence else bool(value):
                rule.check(value, prefix + name, out, depth)
            elif rule.required:
                _add(out, prefix + name, rule.missing())


def _children(rule: Rule) -> Iterator[Nested | Embedded]:
    if isinstance(rule, Nested | Embedded):
        yield rule
    elif isinstance(rule, Each):
        yield from _children(rule.item)
    elif isinstance(rule, Pairs):
        yield from _children(rule.value)


def request_types() -> dict[str, Descriptor]:
    """Every protocol v1 method path → its request message's descriptor."""
    pool = descriptor_pool.Default()
    found = {}
    for path in sorted(ALL_METHODS):
        service, _, method = path.strip("/").partition("/")
        found[path] = pool.FindServiceByName(service).methods_by_name[method].input_type
    return found


def compile_rules(
    table: Mapping[str, Mapping[str, Rule]], roots: list[str]
) -> dict[str, MessageCheck]:
    """The :class:`MessageCheck` of every message type reachable from ``roots``, in the order
    they are reached (a message type the table does not name gets default rules)."""
    pool = descriptor_pool.Default()
    compiled: dict[str, MessageCheck] = {}
    pending = list(roots)
    while pending:
        name = pending.pop(0)
        if name in compiled:
            continue
        check = compiled[name] = MessageCheck(pool.FindMessageTypeByName(name), table.get(name, {}))
        for _, rule in check.fields:
            pending.extend(child.name for child in _children(rule))
    for check in compiled.values():
        for _, rule in check.fields:
            for child in _children(rule):
                child.compiled.update(compiled)
    return compiled


class RequestBounds:
    """The compiled table: the check of every protocol v1 method's requests."""

    def __init__(self, config: CoordinatorConfig) -> None:
        methods = request_types()
        roots = sorted({d.full_name for d in methods.values()})
        #: Every message type a request can carry, compiled.
        self.messages = compile_rules(field_rules(config), roots)
        self._checkers = {
            path: _violations_of(self.messages[d.full_name]) for path, d in methods.items()
        }

    def checker(self, method: str) -> Callable[[Message], list[FieldViolation]] | None:
        """The check of ``method``'s requests (``None`` for a method outside protocol v1): the
        violations of a request, at most :data:`MAX_REPORTED` of them."""
        return self._checkers.get(method)


def _violations_of(check: MessageCheck) -> Callable[[Message], list[FieldViolation]]:
    def violations(request: Message) -> list[FieldViolation]:
        if check.ok(request, 0):
            return []
        found: Out = []
        with contextlib.suppress(_Full):  # enough said
            check.walk(request, "", found, 0)
        return [FieldViolation(field=path, description=why) for path, why in found]

    return violations


# ------------------------------------------------------------------------------------- docs
def markdown_table(config: CoordinatorConfig | None = None) -> str:
    """The table of docs/protocol.md's "Bounds on every field" section (default settings)."""
    bounds = RequestBounds(config or CoordinatorConfig(data_dir=Path()))
    lines = ["| Message | Field | Rule |", "|---|---|---|"]
    for name, check in bounds.messages.items():
        short = name.removeprefix("rollnet.v1.")
        if not check.fields:
            lines.append(f"| `{short}` | — | no fields |")
        for field_name, rule in check.fields:
            text = rule.describe().replace("|", "\\|")
            if rule.required:
                text = f"required; {text}"
            lines.append(f"| `{short}` | `{field_name}` | {text} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":  # pragma: no cover - prints what docs/protocol.md holds
    print(markdown_table(), end="")
