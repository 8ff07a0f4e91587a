"""Hypothesis strategies that write protobuf messages byte by byte, from their descriptors.

The generated Python classes refuse to hold what a hostile peer can send (a string that is not
UTF-8, an enum number nobody declared, a field with the wrong wire type, a message cut short), so
these strategies never build a message object: they encode tag and payload themselves. Every
field of the descriptor is covered, nested messages and maps included (to :data:`MAX_DEPTH`), with
edge values first: NUL and invalid UTF-8 in strings, out-of-range integers, NaN and infinities,
undeclared enum numbers, Durations and Timestamps beyond their documented range, huge repeated
fields and maps. :func:`mangled` then damages a whole message: cut short, a wrong wire type, an
impossible tag or length, an unknown field, or more bytes than the server's message cap.

``Pools`` carries realistic values (ids and digests the server knows) so that a share of the
requests gets past the syntax checks into the handlers.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import strategies as st

#: Deepest nesting generated (a Struct inside a Value inside a Struct ...).
MAX_DEPTH = 3
#: Most bytes one huge repeated field takes (a huge list of large items would be gigabytes).
MAX_HUGE_BYTES = 1 << 20

_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5
_WIRE_TYPE = {
    FieldDescriptor.TYPE_DOUBLE: _FIXED64,
    FieldDescriptor.TYPE_FIXED64: _FIXED64,
    FieldDescriptor.TYPE_SFIXED64: _FIXED64,
    FieldDescriptor.TYPE_FLOAT: _FIXED32,
    FieldDescriptor.TYPE_FIXED32: _FIXED32,
    FieldDescriptor.TYPE_SFIXED32: _FIXED32,
    FieldDescriptor.TYPE_STRING: _LENGTH,
    FieldDescriptor.TYPE_BYTES: _LENGTH,
    FieldDescriptor.TYPE_MESSAGE: _LENGTH,
}
_EDGE_INTS = (
    0,
    1,
    -1,
    2,
    2**31 - 1,
    -(2**31),
    2**31,
    2**32 - 1,
    2**32,
    2**53 + 1,
    2**63 - 1,
    -(2**63),
    2**64 - 1,
    315_576_000_000,  # the Duration/Timestamp range's end in seconds
    315_576_000_001,
    999_999_999,
    1_000_000_000,
)
_EDGE_FLOATS = (0.0, -0.0, 1.0, -1.0, float("nan"), float("inf"), float("-inf"), 1e308, 5e-324)
_BAD_UTF8 = (b"\xff", b"\xc3", b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"ab\xc0\xafcd", b"\x80abc")


@dataclass(frozen=True)
class Pools:
    """Values the server knows (ids, digests, numbers), drawn alongside random ones."""

    strings: Sequence[str] = ()
    blobs: Sequence[bytes] = ()
    numbers: Sequence[int] = ()
    _cache: dict[tuple[str, int], st.SearchStrategy[bytes]] = field(default_factory=dict)


def varint(value: int) -> bytes:
    """``value`` as a protobuf varint (negative numbers as their 64-bit two's complement)."""
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def tag(number: int, wire_type: int) -> bytes:
    """The key of a record: field number and wire type."""
    return varint((number << 3) | wire_type)


def record(number: int, wire_type: int, payload: bytes) -> bytes:
    """One encoded field; ``payload`` is already encoded for ``wire_type`` (length added)."""
    if wire_type == _LENGTH:
        return tag(number, wire_type) + varint(len(payload)) + payload
    return tag(number, wire_type) + payload


def _wire_type(descriptor: FieldDescriptor) -> int:
    return _WIRE_TYPE.get(descriptor.type, _VARINT)


def _is_repeated(descriptor: FieldDescriptor) -> bool:
    repeated = getattr(descriptor, "is_repeated", None)
    if repeated is not None:
        return bool(repeated)
    # protobuf before is_repeated; its stubs no longer declare label
    return bool(descriptor.label == FieldDescriptor.LABEL_REPEATED)  # type: ignore[attr-defined]


def _integers(pools: Pools) -> st.SearchStrategy[int]:
    choices: list[st.SearchStrategy[int]] = [
        st.sampled_from(_EDGE_INTS),
        st.integers(-(2**63), 2**64 - 1),
        st.integers(-3, 300),
    ]
    if pools.numbers:
        choices.append(st.sampled_from(list(pools.numbers)))
    return st.one_of(choices)


def _encode_int(descriptor: FieldDescriptor, value: int) -> bytes:
    kind = descriptor.type
    if kind in (FieldDescriptor.TYPE_SINT32, FieldDescriptor.TYPE_SINT64):
        value = (value << 1) ^ (value >> 63)
    if kind in (FieldDescriptor.TYPE_FIXED64, FieldDescriptor.TYPE_SFIXED64):
        return struct.pack("<Q", value & ((1 << 64) - 1))
    if kind in (FieldDescriptor.TYPE_FIXED32, FieldDescriptor.TYPE_SFIXED32):
        return struct.pack("<I", value & ((1 << 32) - 1))
    return varint(value)


def _text(pools: Pools) -> st.SearchStrategy[bytes]:
    known = list(pools.strings)
    choices: list[st.SearchStrategy[bytes]] = [
        st.text(max_size=40).map(str.encode),
        st.sampled_from(_BAD_UTF8),
        st.binary(max_size=40),
        st.sampled_from([b"", b"\x00", b"a\x00b", b" ", b"../../etc/passwd", "é".encode()]),
        st.sampled_from([255, 256, 1024, 65_537]).map(lambda n: b"a" * n),
    ]
    if known:
        pooled = st.sampled_from(known).map(str.encode)
        choices += [pooled, pooled, pooled.map(lambda s: s + b"\x00"), pooled.map(bytes.upper)]
    return st.one_of(choices)


def _binary(pools: Pools) -> st.SearchStrategy[bytes]:
    choices: list[st.SearchStrategy[bytes]] = [
        st.binary(max_size=80),
        st.sampled_from([b"", b"\x00" * 32, b"\xff" * 33, b"\x00" * 70_000]),
    ]
    if pools.blobs:
        pooled = st.sampled_from(list(pools.blobs))
        choices += [pooled, pooled, pooled.map(lambda b: b[:-1])]
    return st.one_of(choices)


def _float32(value: float) -> bytes:
    try:
        return struct.pack("<f", value)
    except OverflowError:  # beyond float32: the nearest it has
        return struct.pack("<f", float("inf") if value > 0 else float("-inf"))


def _scalar(descriptor: FieldDescriptor, pools: Pools) -> st.SearchStrategy[bytes]:
    """Encoded payloads (no tag) of one value of a non-message field."""
    kind = descriptor.type
    if kind == FieldDescriptor.TYPE_DOUBLE:
        values = st.one_of(st.sampled_from(_EDGE_FLOATS), st.floats())
        return values.map(lambda v: struct.pack("<d", v))
    if kind == FieldDescriptor.TYPE_FLOAT:
        values = st.one_of(st.sampled_from(_EDGE_FLOATS), st.floats(width=32))
        return values.map(_float32)
    if kind == FieldDescriptor.TYPE_BOOL:
        return st.sampled_from([0, 1, 2, 2**64 - 1]).map(varint)
    if kind == FieldDescriptor.TYPE_ENUM:
        assert descriptor.enum_type is not None
        declared = [value.number for value in descriptor.enum_type.values]
        return st.one_of(
            st.sampled_from(declared), st.sampled_from([-1, 99, 2**31 - 1, 2**40])
        ).map(varint)
    if kind == FieldDescriptor.TYPE_STRING:
        return _text(pools)
    if kind == FieldDescriptor.TYPE_BYTES:
        return _binary(pools)
    return _integers(pools).map(lambda v: _encode_int(descriptor, v))


def _repeated(item_and_count: tuple[bytes, int]) -> bytes:
    """``item`` ``count`` times, but never past :data:`MAX_HUGE_BYTES` in all."""
    item, count = item_and_count
    return item * max(1, min(count, MAX_HUGE_BYTES // max(len(item), 1)))


def _field(descriptor: FieldDescriptor, pools: Pools, depth: int) -> st.SearchStrategy[bytes]:
    """Zero or more encoded records of one field."""
    number, wire_type = descriptor.number, _wire_type(descriptor)
    if descriptor.type == FieldDescriptor.TYPE_MESSAGE:
        assert descriptor.message_type is not None
        payload = message(descriptor.message_type, pools, depth + 1)
    elif descriptor.type == FieldDescriptor.TYPE_GROUP:
        return st.just(b"")
    else:
        payload = _scalar(descriptor, pools)
    one = payload.map(lambda p: record(number, wire_type, p))
    if not _is_repeated(descriptor):
        # A singular field sent twice: the last one wins (or, for a message, they merge).
        return st.one_of(one, st.lists(one, min_size=2, max_size=3).map(b"".join))
    choices = [st.lists(one, max_size=6).map(b"".join)]
    if depth == 0:  # nested, huge lists would multiply into gigabytes
        # Huge: one element many times over (cheap to make, as costly to check as any).
        huge = st.tuples(one, st.sampled_from([257, 4097, 20_000])).map(_repeated)
        choices.append(huge)
    if wire_type != _LENGTH:  # numbers may also come packed
        choices.append(
            st.lists(payload, max_size=8).map(lambda ps: record(number, _LENGTH, b"".join(ps)))
        )
    return st.one_of(choices)


def message(descriptor: Descriptor, pools: Pools, depth: int = 0) -> st.SearchStrategy[bytes]:
    """Encoded messages of ``descriptor``'s type: any subset of its fields, each with edge and
    random values (nested messages down to :data:`MAX_DEPTH`)."""
    key = (descriptor.full_name, depth)
    cached = pools._cache.get(key)
    if cached is not None:
        return cached
    if depth >= MAX_DEPTH or not descriptor.fields:
        strategy: st.SearchStrategy[bytes] = st.just(b"")
    else:
        parts = [st.one_of(st.just(b""), _field(f, pools, depth)) for f in descriptor.fields]
        strategy = st.tuples(*parts).map(b"".join)
    pools._cache[key] = strategy
    return strategy


def _damage(
    descriptor: Descriptor, oversize: int
) -> list[st.SearchStrategy[Callable[[bytes], bytes]]]:
    numbers = [f.number for f in descriptor.fields] or [1]

    def cut(at: int) -> Callable[[bytes], bytes]:
        return lambda body: body[: max(len(body) - at, 0)]

    def wrong_type(number: int, wire_type: int) -> Callable[[bytes], bytes]:
        payload = {0: b"\x01", 1: b"\x00" * 8, 2: b"\x03abc", 5: b"\x00" * 4}.get(wire_type, b"")
        return lambda body: body + tag(number, wire_type) + payload

    def append(extra: bytes) -> Callable[[bytes], bytes]:
        return lambda body: body + extra

    return [
        st.integers(1, 12).map(cut),
        st.tuples(st.sampled_from(numbers), st.sampled_from([0, 1, 2, 3, 4, 5, 6, 7])).map(
            lambda t: wrong_type(*t)
        ),
        st.sampled_from(
            [
                b"\x00",  # field number 0
                b"\x0f",  # wire type 7
                b"\xff" * 11,  # a varint longer than ten bytes
                tag(numbers[0], _LENGTH) + varint(1 << 40),  # a length past the end
                tag(numbers[0], _LENGTH) + varint(5) + b"ab",  # a length past the end
                tag(2**29 - 1, _VARINT) + b"\x01",  # the largest field number
                tag(1000, _LENGTH) + b"\x03abc",  # unknown (a newer minor version's) field
                tag(numbers[0], 3),  # a group start never ended
            ]
        ).map(append),
        st.just(append(record(1001, _LENGTH, b"\x00" * oversize))),
    ]


def mangled(
    descriptor: Descriptor, body: st.SearchStrategy[bytes], *, oversize: int
) -> st.SearchStrategy[bytes]:
    """``body``'s messages, mostly as they are, otherwise damaged on the wire (``oversize``:
    the size of the unknown field that makes a message larger than the server's cap)."""
    damage = st.one_of(_damage(descriptor, oversize))
    return st.one_of(
        body,
        body,
        body,
        st.tuples(body, damage).map(lambda t: t[1](t[0])),
    )
