"""The soak's diagnostics: the coordinator's opt-in tracemalloc reports, and the soak's verdict
telling memory that levels off (a cache filling to its bound) from memory that keeps growing."""

from __future__ import annotations

import argparse
import sys
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollnet.reference.cli import main
from rollnet.reference.memory_trace import (
    MEMORY_TRACE_COLLECT_ENV,
    MEMORY_TRACE_ENV,
    MEMORY_TRACE_FRAMES_ENV,
    MEMORY_TRACE_INTERVAL_ENV,
    MemoryTrace,
    MemoryTraceSettings,
    traced,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import soak  # bench/soak.py, found through sys.path


def test_settings_come_from_the_environment_only_when_asked(tmp_path: Path) -> None:
    assert MemoryTraceSettings.from_environment({}) is None
    assert MemoryTraceSettings.from_environment({MEMORY_TRACE_ENV: ""}) is None
    settings = MemoryTraceSettings.from_environment(
        {
            MEMORY_TRACE_ENV: str(tmp_path / "trace.txt"),
            MEMORY_TRACE_INTERVAL_ENV: "2.5",
            MEMORY_TRACE_FRAMES_ENV: "4",
            MEMORY_TRACE_COLLECT_ENV: "1",
        }
    )
    assert settings == MemoryTraceSettings(tmp_path / "trace.txt", 2.5, 4, collect=True)
    plain = MemoryTraceSettings.from_environment(
        {MEMORY_TRACE_ENV: "trace.txt", MEMORY_TRACE_COLLECT_ENV: "0"}
    )
    assert plain == MemoryTraceSettings(Path("trace.txt"), 60.0, 1, collect=False)


@pytest.mark.parametrize(
    ("name", "value", "said"),
    [
        (MEMORY_TRACE_INTERVAL_ENV, "soon", "a number"),
        (MEMORY_TRACE_INTERVAL_ENV, "0", "seconds in"),
        (MEMORY_TRACE_FRAMES_ENV, "0", "1 to 64"),
        (MEMORY_TRACE_FRAMES_ENV, "2.5", "a number"),
    ],
)
def test_bad_settings_are_refused_by_name(name: str, value: str, said: str) -> None:
    with pytest.raises(ValueError, match=f"{name}: {said}"):
        MemoryTraceSettings.from_environment({MEMORY_TRACE_ENV: "trace.txt", name: value})


def test_the_coordinator_refuses_bad_settings_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(MEMORY_TRACE_ENV, str(tmp_path / "trace.txt"))
    monkeypatch.setenv(MEMORY_TRACE_INTERVAL_ENV, "-1")
    assert main(["coordinator", "--data-dir", str(tmp_path / "data")]) == 2
    said = capsys.readouterr().err
    assert f"{MEMORY_TRACE_INTERVAL_ENV}: seconds in (0, 86400], not -1.0" in said
    assert not (tmp_path / "data").exists()
    assert not (tmp_path / "trace.txt").exists()


class Hoarded:
    """A type of its own, so the report's object counts can be told apart."""

    def __init__(self, size: int) -> None:
        self.payload = bytearray(size)


@pytest.fixture
def untraced() -> Iterator[None]:
    was = tracemalloc.is_tracing()
    yield
    if not was:
        tracemalloc.stop()


def test_a_report_names_the_line_and_type_that_grew(tmp_path: Path, untraced: None) -> None:
    trace = MemoryTrace(MemoryTraceSettings(tmp_path / "trace.txt"))
    trace.start()
    hoard: list[Hoarded] = []
    first = trace.report()
    assert "(baseline" in first
    hoard.extend(Hoarded(4096) for _ in range(500))  # about 2 MiB
    grown_at = Hoarded.__init__.__code__.co_firstlineno + 1  # where the payload is allocated
    second = trace.report()
    since_baseline = second.split("-- traced memory since the previous report")[0]
    top = since_baseline.split("largest growth first:\n")[1].splitlines()[0]
    assert f"{Path(__file__).name}:{grown_at}" in top, second
    kib = float(top.split("KiB")[0])
    assert kib >= 500 * 4096 / 1024, top
    assert "+500 Hoarded (now 500)" in second
    assert (tmp_path / "trace.txt").read_text() == first + second
    assert len(hoard) == 500


async def test_a_traced_run_reports_once_more_when_it_ends(tmp_path: Path, untraced: None) -> None:
    async def work() -> None:
        assert tracemalloc.is_tracing()  # started before the work

    settings = MemoryTraceSettings(tmp_path / "trace.txt", interval=3600.0)
    await traced(work(), settings)
    assert (tmp_path / "trace.txt").read_text().startswith("== report 0 at ")


def _args(**overrides: float) -> argparse.Namespace:
    defaults = {
        "warmup": 0.0,
        "max_rss_growth": 0.2,
        "max_rss_growth_mib": 32.0,
        "max_fd_growth": 16,
    }
    return argparse.Namespace(**{**defaults, **overrides})


def _track(rss_at: list[float], interval: float = 10.0) -> soak.Track:
    track = soak.Track(1, "coordinator 1")
    track.samples = [soak.Sample(i * interval, rss, 30, 12) for i, rss in enumerate(rss_at)]
    return track


def test_memory_that_keeps_growing_is_growth() -> None:
    # 100 MiB, +3 MiB a minute for 30 minutes (a sample every 10 s).
    track = _track([100 + 0.5 * i for i in range(181)])
    verdict = soak.judge(track, 0.0, 1800.0, _args())
    assert verdict is not None
    assert verdict.plateau is None
    assert verdict.problems
    assert "still +3.00 MiB/min in the last third" in verdict.problems[0]


def test_memory_that_fills_to_a_bound_is_a_plateau() -> None:
    # +9 MiB a minute for the first 10 minutes, then flat at 190 MiB (a cache at its bound),
    # wobbling by a MiB.
    track = _track([100 + 1.5 * min(i, 60) + (i % 2) for i in range(181)])
    verdict = soak.judge(track, 0.0, 1800.0, _args())
    assert verdict is not None
    assert verdict.problems == []
    assert verdict.plateau is not None
    level, reached = verdict.plateau
    assert level == 191.0
    assert 500 <= reached <= 600  # within reach of the level in the tenth minute
    assert verdict.rss_slope_first > 2.5
    assert abs(verdict.rss_slope_last) < 0.1


def test_flat_memory_is_neither() -> None:
    verdict = soak.judge(_track([300.0 + (i % 3) for i in range(181)]), 0.0, 1800.0, _args())
    assert verdict is not None
    assert verdict.problems == []
    assert verdict.plateau is None
