"""Bad input to the relay's HTTP endpoints (issue 25): any method, any path, hostile ``Range``
headers and ``step`` hints, huge and many headers, broken request lines.

An origin holds the blobs; a relay in front of it serves them, either from its store or while
they still arrive from upstream (a new blob per example takes the streaming path). The property:
never a 5xx, a well-formed answer, a 200/206/416 to a blob ``GET`` consistent with the blob (the
exact bytes of the range announced), and ``/healthz`` answering 200 afterwards.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import pytest
from fuzz_testing import LoopThread, fuzz_settings
from http_fuzzing import METHODS, PRINTABLE, Answer, header_lines, plain_headers, request
from hypothesis import given
from hypothesis import strategies as st

from rollnet.reference.checkpoint_publishing import write_origin_blob
from rollnet.reference.relay.server import RelayConfig, RelayServer, start_relay
from rollnet.sdk.broadcast.client import BLOB_PATH

EXAMPLES = 40


@dataclass
class Relays:
    origin_dir: Path
    origin: RelayServer
    relay: RelayServer
    stored: dict[str, bytes]


@pytest.fixture(scope="module")
def relays(loop_thread: LoopThread, module_dir: Path) -> Iterator[Relays]:
    origin_dir = module_dir / "origin"
    stored = {}
    for size in (0, 1, 1000, 70_000):
        data = os.urandom(size)
        stored[write_origin_blob(origin_dir, data).hex()] = data
    origin = loop_thread.run(start_relay(RelayConfig(data_dir=origin_dir)))
    relay = loop_thread.run(
        start_relay(
            RelayConfig(data_dir=module_dir / "relay", upstreams=(origin.url,), keep_versions=2)
        )
    )
    try:
        yield Relays(origin_dir, origin, relay, stored)
    finally:
        loop_thread.run(relay.close())
        loop_thread.run(origin.close())


def _number() -> st.SearchStrategy[str]:
    return st.one_of(
        st.just(""),
        st.integers(0, 80_000).map(str),
        st.sampled_from(["0", "00", "-1", "+1", " 1", "1.5", "0x10", "٣", "²", "1e3"]),
        st.sampled_from([20, 4301, 8000]).map("9".__mul__),  # past int()'s 4300-digit limit
    )


RANGES = st.one_of(
    st.none(),
    st.tuples(_number(), _number()).map(lambda t: f"bytes={t[0]}-{t[1]}"),
    st.tuples(_number(), _number(), _number()).map(lambda t: f"bytes={t[0]}-{t[1]},{t[2]}-"),
    st.sampled_from(["bytes=", "bytes=-", "items=0-1", "bytes 0-1", "BYTES=0-1", " bytes=0-1 "]),
    st.text(PRINTABLE, max_size=40),
)
STEPS = st.one_of(
    st.none(),
    st.integers(0, 2**70).map(str),
    st.sampled_from(["", "-1", "²", "٣", "1_000", "9" * 5000]),
    st.text(max_size=10),
)


def _check_blob(answer: Answer, data: bytes, method: str, range_header: str | None) -> None:
    size = len(data)
    if answer.status == 200:
        if method == "GET":
            assert answer.body == data, "200 with other bytes than the blob's"
    elif answer.status == 206:
        first_last, _, total = answer.headers["content-range"].removeprefix("bytes ").partition("/")
        first, _, last = first_last.partition("-")
        assert int(total) == size
        assert 0 <= int(first) <= int(last) < size, answer.headers["content-range"]
        if method == "GET":
            assert answer.body == data[int(first) : int(last) + 1], "206 with other bytes"
    elif answer.status == 416:
        assert range_header is not None, "416 without a Range header"
    else:
        raise AssertionError(
            f"GET of a stored blob answered {answer.status}: {answer.body[:200]!r}"
        )


@fuzz_settings(EXAMPLES)
@given(
    method=st.one_of(st.sampled_from(["GET", "HEAD"]), METHODS),
    blob=st.sampled_from(["stored", "new", "new", "unknown", "bad"]),
    path_suffix=st.one_of(st.just(""), st.sampled_from(["/", "?", "%00", "/../x", "#f"])),
    range_header=RANGES,
    step=STEPS,
    extra=header_lines(),
    which=st.sampled_from(["origin", "relay"]),
)
def test_relay_survives_bad_requests(
    relays: Relays,
    method: str,
    blob: str,
    path_suffix: str,
    range_header: str | None,
    step: str | None,
    extra: list[tuple[str, str]],
    which: str,
) -> None:
    data = b""
    if blob == "stored":
        digest = sorted(relays.stored)[len(extra) % len(relays.stored)]
        data = relays.stored[digest]
    elif blob == "new":  # the relay fetches it now: served while it arrives
        data = os.urandom(len(extra) * 997 % 50_000 + 1)
        digest = write_origin_blob(relays.origin_dir, data).hex()
    elif blob == "unknown":
        digest = os.urandom(32).hex()
    else:
        digest = os.urandom(32).hex().upper()[: len(extra) + 10]
    target = BLOB_PATH + digest + path_suffix
    if step is not None:
        target += ("&" if "?" in target else "?") + "step=" + quote(step, safe="")
    headers = list(extra) + ([("Range", range_header)] if range_header is not None else [])
    server = relays.origin if which == "origin" else relays.relay
    answer = request(server.port, method, target, headers)
    assert answer.status != 0, "the connection closed without an answer"
    assert answer.status < 500, f"{answer.status}: {answer.body[:300]!r}"
    wellformed = method in ("GET", "HEAD") and not path_suffix and plain_headers(extra)
    if wellformed and blob in ("stored", "new"):
        _check_blob(answer, data, method, range_header)
    health = request(server.port, "GET", "/healthz", [])
    assert health.status == 200
