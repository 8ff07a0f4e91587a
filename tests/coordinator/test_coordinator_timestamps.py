"""Reply timestamps and durations are built in integer arithmetic: what protobuf's gives."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from google.protobuf import duration_pb2, timestamp_pb2

from rollnet.reference.coordinator.serde import duration, timestamp


@pytest.mark.parametrize(
    "moment",
    [
        datetime(1970, 1, 1, tzinfo=UTC),
        datetime(1969, 12, 31, 23, 59, 59, 999_999, tzinfo=UTC),
        datetime(2026, 11, 29, 12, 0, 0, 1, tzinfo=UTC),
        datetime(2099, 2, 28, 23, 59, 59, 500_000, tzinfo=UTC),
        datetime(2026, 6, 1, 8, 0, tzinfo=UTC) + timedelta(microseconds=123_457),
    ],
)
def test_timestamp_matches_protobuf(moment: datetime) -> None:
    expected = timestamp_pb2.Timestamp()
    expected.FromDatetime(moment)
    assert timestamp(moment) == expected
    assert timestamp(moment).ToDatetime(tzinfo=UTC) == moment


@pytest.mark.parametrize(
    "delta",
    [
        timedelta(0),
        timedelta(seconds=10),
        timedelta(seconds=0.05),
        timedelta(days=3, seconds=7, microseconds=123_456),
        timedelta(microseconds=-1),
        timedelta(seconds=-1.5),
        timedelta(days=-2, microseconds=999_999),
    ],
)
def test_duration_matches_protobuf(delta: timedelta) -> None:
    expected = duration_pb2.Duration()
    expected.FromTimedelta(delta)
    assert duration(delta) == expected
    assert duration(delta).ToTimedelta() == delta
