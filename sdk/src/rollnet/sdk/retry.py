"""Which failed calls the SDK retries, and how long it waits in between.

The rule (AIP-194):

* ``UNAVAILABLE`` and ``ABORTED`` are retried;
* ``RESOURCE_EXHAUSTED`` only when the server attached a ``RetryInfo`` (a rate limit that will
  pass; a size cap will not);
* ``DEADLINE_EXCEEDED`` only for idempotent calls. Every rollnet RPC is idempotent: mutating calls
  carry a ``request_id`` the SDK keeps across attempts (the server answers a repeat with the
  original response), and the others (heartbeat, progress, reads, content-addressed uploads)
  can be repeated harmlessly;
* nothing else (bad input, refused signatures, failed preconditions) is retried.

Waits grow exponentially with jitter, and are never shorter than the server's ``RetryInfo``:
:func:`backoff_delay` is the one formula, used by :class:`RetryPolicy` (the client's bounded
retries of one call) and :class:`Backoff` (a node's calls that must eventually succeed).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import grpc

from rollnet.sdk.errors import RollnetError


def backoff_delay(
    attempt: int,
    *,
    initial: float,
    maximum: float,
    multiplier: float,
    jitter: float,
    retry_after: float | None = None,
) -> float:
    """Seconds to wait after failed attempt number ``attempt`` (1-based).

    ``min(maximum, initial * multiplier**(attempt-1))`` scaled by a random factor in
    ``[1 - jitter, 1 + jitter]``, or the server's ``retry_after`` scaled by ``[1, 1 + jitter]``
    when that is longer: a swarm that failed together neither retries together nor comes back
    before the server asked.
    """
    base = min(maximum, initial * multiplier ** (attempt - 1))
    delay = base * random.uniform(1 - jitter, 1 + jitter)
    if retry_after is not None:
        delay = max(delay, retry_after * random.uniform(1, 1 + jitter))
    return delay


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How often and how patiently a call is retried.

    The wait before attempt ``n + 1`` is ``min(max_backoff, initial_backoff * multiplier**(n-1))``
    scaled by a random factor in ``[1 - jitter, 1 + jitter]``, or the server's ``RetryInfo`` delay
    scaled by ``[1, 1 + jitter]`` when that is longer.
    """

    max_attempts: int = 5
    """Attempts in all, the first included (1 disables retries)."""
    initial_backoff: float = 0.1
    """Seconds before the second attempt (before jitter)."""
    max_backoff: float = 10.0
    """Cap on the exponential wait, in seconds."""
    multiplier: float = 2.0
    """Growth of the wait per attempt."""
    jitter: float = 0.2
    """Relative spread of each wait, so a swarm that failed together does not retry together."""

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if self.initial_backoff < 0 or self.max_backoff < 0 or self.multiplier < 1:
            raise ValueError("backoffs must be >= 0 and multiplier >= 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError("jitter must be within [0, 1]")

    @classmethod
    def no_retry(cls) -> RetryPolicy:
        """A policy that makes exactly one attempt."""
        return cls(max_attempts=1)

    def backoff(self, attempt: int, retry_after: float | None = None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (1-based)."""
        return backoff_delay(
            attempt,
            initial=self.initial_backoff,
            maximum=self.max_backoff,
            multiplier=self.multiplier,
            jitter=self.jitter,
            retry_after=retry_after,
        )


@dataclass(frozen=True, slots=True)
class Backoff:
    """Capped exponential back-off with jitter for calls that must eventually succeed.

    The wait after failure ``n`` (1-based) is :func:`backoff_delay`:
    ``min(maximum, initial * multiplier**(n-1))`` scaled by a random factor in
    ``[1 - jitter, 1 + jitter]``, and never shorter than a server's ``RetryInfo`` delay. There is
    no attempt limit: a node whose coordinator is unreachable keeps trying until it is told to
    stop (:class:`rollnet.sdk.node.NodeSession`).
    """

    initial: float = 0.5
    maximum: float = 30.0
    multiplier: float = 2.0
    jitter: float = 0.2

    def __post_init__(self) -> None:
        if self.initial <= 0 or self.maximum < self.initial or self.multiplier < 1:
            raise ValueError("need 0 < initial <= maximum and multiplier >= 1")
        if not 0 <= self.jitter < 1:
            raise ValueError("jitter must be within [0, 1)")

    def delay(self, failures: int, retry_after: float | None = None) -> float:
        """Seconds to wait after ``failures`` consecutive failures (1-based)."""
        return backoff_delay(
            failures,
            initial=self.initial,
            maximum=self.maximum,
            multiplier=self.multiplier,
            jitter=self.jitter,
            retry_after=retry_after,
        )


def is_retryable(error: RollnetError, *, idempotent: bool = True) -> bool:
    """Whether a call that failed with ``error`` may be tried again (see module docs)."""
    code = error.code
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.ABORTED):
        return True
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        return error.retry_after is not None
    if code is grpc.StatusCode.DEADLINE_EXCEEDED:
        return idempotent
    return False
