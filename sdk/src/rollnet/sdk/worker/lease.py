"""``LeaseContext``: what a rollout generator knows about the lease it works under."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING

from rollnet.sdk.dtypes import compute_dtype_name
from rollnet.sdk.proofs.binding import LeaseBinding, derive_sampling_seed
from rollnet.v1 import task_pb2, task_service_pb2

if TYPE_CHECKING:
    from rollnet.sdk.client import RollnetClient


class LeaseLost(Exception):
    """The lease ended before the work did (expired, revoked, given back, or draining).

    Generators may raise it from :meth:`LeaseContext.raise_if_cancelled`; the runtime then
    discards the work (it could no longer be committed).
    """


class LeaseContext:
    """One leased task as a generator sees it.

    Thread-safe where it matters: a generator that runs inference on a thread may call
    :meth:`report_progress`, :attr:`cancelled` and :meth:`raise_if_cancelled` from it.
    """

    def __init__(
        self,
        *,
        task: task_pb2.Task,
        lease: task_pb2.Lease,
        network_id: str,
        node_id: str,
        client: RollnetClient,
        deadline: float,
    ) -> None:
        self.task = task
        self.lease = lease
        self.client = client
        """The worker's signed client (for example to fetch the task's checkpoint)."""
        self.binding = LeaseBinding(
            network_id=network_id,
            node_id=node_id,
            task_id=task.task_id,
            lease_id=lease.lease_id,
            fencing_token=lease.fencing_token,
        )
        self.started = time.monotonic()
        self._deadline = deadline
        self._cancel = threading.Event()
        self._lock = threading.Lock()
        self._reason = ""
        self._give_back: task_service_pb2.FailReason.ValueType | None = None
        self._completed = 0
        self._total = self.rollout_count

    @property
    def lease_id(self) -> str:
        """The lease id."""
        return self.lease.lease_id

    @property
    def rollout_count(self) -> int:
        """Rollouts the task asks for: ``len(prompt_ids) * samples_per_prompt``."""
        return len(self.task.prompt_ids) * self.task.samples_per_prompt

    @property
    def compute_dtype(self) -> str:
        """The dtype the task must be generated in (``float32`` or ``bfloat16``).

        Raises ``ValueError`` for a dtype this SDK does not know (the runtime gives such a task
        back before the generator sees it).
        """
        return compute_dtype_name(self.task.compute_dtype)

    def sampling_seed(self, rollout_index: int) -> int:
        """The Gumbel seed of rollout ``rollout_index`` (``prompt_index * samples + sample``)."""
        return derive_sampling_seed(self.binding.network_id, self.binding.task_id, rollout_index)

    @property
    def deadline(self) -> float:
        """When the lease ends unless extended, on the :func:`time.monotonic` clock."""
        with self._lock:
            return self._deadline

    def extend(self, deadline: float) -> None:
        """Record a new deadline (the runtime calls this after each heartbeat)."""
        with self._lock:
            self._deadline = deadline

    def report_progress(self, completed: int, total: int | None = None) -> None:
        """Tell the runtime how many rollouts are done (it estimates the finish time from it)."""
        with self._lock:
            self._completed = completed
            if total is not None:
                self._total = total

    @property
    def progress(self) -> tuple[int, int]:
        """``(completed, total)`` as last reported."""
        with self._lock:
            return self._completed, self._total

    @property
    def cancelled(self) -> bool:
        """Whether the work should stop (the lease is gone or being given back)."""
        return self._cancel.is_set()

    @property
    def cancel_reason(self) -> str:
        """Why the work was cancelled ("" while it is not)."""
        with self._lock:
            return self._reason

    @property
    def give_back_reason(self) -> task_service_pb2.FailReason.ValueType | None:
        """The ``FailTask`` reason to give the lease back with, if the runtime should."""
        with self._lock:
            return self._give_back

    def raise_if_cancelled(self) -> None:
        """Raise :class:`LeaseLost` when the work should stop."""
        if self._cancel.is_set():
            raise LeaseLost(self.cancel_reason)

    def cancel(
        self, reason: str, give_back: task_service_pb2.FailReason.ValueType | None = None
    ) -> None:
        """Ask the generator to stop (the runtime calls this; the first reason wins)."""
        with self._lock:
            if self._cancel.is_set():
                return
            self._reason = reason
            self._give_back = give_back
            self._cancel.set()
