"""``WorkerConfig``: everything the runtime needs to know, as one plain dataclass.

The runtime never reads environment variables or files other than its own data directory; a
command line (like ``rollnet worker``) builds this object from whatever sources it likes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rollnet.sdk.client import TlsConfig
from rollnet.sdk.node import DEFAULT_NETWORK_ID
from rollnet.sdk.retry import Backoff
from rollnet.sdk.version import software_version


@dataclass(frozen=True, slots=True)
class WorkerConfig:
    """How a :class:`~rollnet.sdk.worker.Worker` reaches its coordinator and behaves."""

    target: str
    """Coordinator address, ``host:port``."""
    data_dir: Path
    """Where the outbox and receipts live (``outbox.sqlite3``); one directory per worker."""
    network_id: str = DEFAULT_NETWORK_ID
    """The network id every call is signed for. It must be known before the first call (the
    signature names it), so it is configuration, not learned; registration checks that the
    coordinator serves this network and stops with a clear error otherwise."""
    tls: TlsConfig | None = None
    """``None`` for plaintext (loopback and tests)."""
    backends: tuple[str, ...] = ()
    """Inference backends reported in the capabilities (``"torch"``, ``"vllm"``, ...)."""
    environments: tuple[str, ...] = ()
    """Environments this worker serves; empty means any."""
    dtypes: tuple[str, ...] = ()
    """The dtypes this worker computes in (``"float32"``, ``"bfloat16"``), reported in the
    capabilities. When given, the runtime stops (``WorkerFatalError``) on a network that computes
    in another, and gives back a task whose ``compute_dtype`` is not among them before the
    generator sees it (``FAIL_REASON_COMPUTE_DTYPE_UNSUPPORTED``). Empty: the generator checks
    ``LeaseContext.compute_dtype`` itself."""
    max_concurrent_tasks: int = 1
    """Leases held and generated at once."""
    pool: str = ""
    """Pool to join (``""`` for the default pool)."""
    invite_token: str = ""
    """Invite token for invite-only pools."""
    software_version: str = software_version("sdk-worker")
    pull_wait: float = 20.0
    """Seconds a PullTask long-poll may wait for work (the coordinator caps it)."""
    heartbeat_jitter: float = 0.1
    """Relative spread of heartbeat intervals, so a swarm does not beat in step."""
    call_timeout: float = 30.0
    """Deadline of one unary call attempt, in seconds."""
    backoff: Backoff = field(default_factory=Backoff)
    """Waits between retries of calls that must eventually succeed."""
    drain_timeout: float = 60.0
    """On stop, how long running tasks may take to finish before they are given back."""
    deregister_timeout: float = 10.0
    """On stop, how long to keep trying to submit finished work and deregister."""

    def __post_init__(self) -> None:
        if self.max_concurrent_tasks < 1:
            raise ValueError("max_concurrent_tasks must be at least 1")
        if not 0 <= self.heartbeat_jitter < 1:
            raise ValueError("heartbeat_jitter must be within [0, 1)")
        if not self.network_id:
            raise ValueError("network_id must not be empty")
