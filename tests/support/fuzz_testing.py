"""What the fuzz tests share: how many examples a property runs, and an event loop in a thread.

Examples per property: each test names its CI count; ``ROLLNET_FUZZ_SCALE`` multiplies them
(``ROLLNET_FUZZ_SCALE=50 pytest -n 0 tests/fuzz`` for a long run; README, "Fuzz tests").
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Coroutine
from concurrent.futures import Future
from typing import Any, TypeVar

from hypothesis import HealthCheck, settings

T = TypeVar("T")

#: The network id the fuzz tests' coordinators and nodes run on.
NETWORK = "rollnet-fuzz"


def fuzz_settings(examples: int) -> settings:
    """Hypothesis settings for ``examples`` examples in CI (times ``ROLLNET_FUZZ_SCALE``): no
    per-example deadline (a call's time depends on the machine), no example database on disk."""
    scale = float(os.environ.get("ROLLNET_FUZZ_SCALE", "1"))
    return settings(
        max_examples=max(1, round(examples * scale)),
        deadline=None,
        database=None,
        suppress_health_check=[
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.function_scoped_fixture,
        ],
    )


class LoopThread:
    """An event loop running in a daemon thread; :meth:`run` waits for a coroutine on it."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coroutine: Coroutine[Any, Any, T], timeout: float = 120.0) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coroutine, self.loop)
        return future.result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)
        self.loop.close()
