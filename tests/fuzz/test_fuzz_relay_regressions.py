"""The relay bugs the fuzz tests found, each pinned by the input that showed it (issue 25)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from fuzz_testing import LoopThread
from http_fuzzing import request

from rollnet.reference.checkpoint_publishing import write_origin_blob
from rollnet.reference.relay.server import RelayConfig, _byte_range, start_relay
from rollnet.sdk.broadcast.client import BLOB_PATH


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        # Numbers past int()'s 4300-digit limit raised ValueError: a 500 for one header.
        ("bytes=" + "9" * 5000 + "-", None),
        ("bytes=-" + "9" * 5000, (0, 100, True)),
        ("bytes=0-" + "9" * 5000, (0, 100, True)),
        # Only ASCII digits are digits in HTTP (RFC 9110): another script's are not a range.
        ("bytes=\u0663-", (0, 100, False)),
        ("bytes=10-19", (10, 20, True)),
    ],
)
def test_byte_range_of_hostile_headers(header: str, expected: tuple[int, int, bool] | None) -> None:
    assert _byte_range(header, 100) == expected


def test_relay_answers_hostile_range_and_missing_blob(
    loop_thread: LoopThread, tmp_path: Path
) -> None:
    origin_dir = tmp_path / "origin"
    data = os.urandom(1000)
    digest = write_origin_blob(origin_dir, data).hex()
    origin = loop_thread.run(start_relay(RelayConfig(data_dir=origin_dir)))
    relay = loop_thread.run(
        start_relay(RelayConfig(data_dir=tmp_path / "relay", upstreams=(origin.url,)))
    )
    try:
        # Served while it arrives from the origin: the relay's own Range parsing.
        huge = request(
            relay.port, "GET", BLOB_PATH + digest, [("Range", "bytes=" + "9" * 5000 + "-")]
        )
        assert huge.status == 416, huge  # was 500
        assert huge.headers["content-range"] == f"bytes */{len(data)}"
        # A blob no upstream has is not found, not a gateway failure to retry.
        missing = request(relay.port, "GET", BLOB_PATH + "ab" * 32, [])
        assert missing.status == 404, missing  # was 502
        assert request(relay.port, "GET", "/healthz", []).status == 200
    finally:
        loop_thread.run(relay.close())
        loop_thread.run(origin.close())
