"""The worker runtime: implement :class:`RolloutGenerator`, hand it to :class:`Worker`, run it.

::

    class MyGenerator(RolloutGenerator):
        async def generate(self, task, lease):
            ...  # one rollout per (prompt, sample), sampled with lease.sampling_seed(i)

    worker = Worker(WorkerConfig(target="127.0.0.1:7070", data_dir=Path("data")),
                    Identity.load("worker.key"), MyGenerator())
    await run_until_signalled(worker)   # SIGTERM/SIGINT -> drain, deregister, return

Registration, heartbeats, commands and back-off are the SDK's one node lifecycle,
:class:`rollnet.sdk.node.NodeSession` (``worker.session``), which validators and trainers use too.
"""

from rollnet.sdk.node import (
    DEFAULT_NETWORK_ID,
    PROTOCOL_VERSION,
    default_hardware,
    run_until_signalled,
)
from rollnet.sdk.retry import Backoff
from rollnet.sdk.worker.config import WorkerConfig
from rollnet.sdk.worker.lease import LeaseContext, LeaseLost
from rollnet.sdk.worker.outbox import OUTBOX_FILE, Outbox, PendingSubmission
from rollnet.sdk.worker.runtime import RolloutGenerator, Worker, WorkerFatalError

__all__ = [
    "DEFAULT_NETWORK_ID",
    "OUTBOX_FILE",
    "PROTOCOL_VERSION",
    "Backoff",
    "LeaseContext",
    "LeaseLost",
    "Outbox",
    "PendingSubmission",
    "RolloutGenerator",
    "Worker",
    "WorkerConfig",
    "WorkerFatalError",
    "default_hardware",
    "run_until_signalled",
]
