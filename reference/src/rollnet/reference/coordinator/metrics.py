"""Prometheus metrics of the coordinator, in a registry of their own (one per coordinator)."""

from __future__ import annotations

from collections.abc import Callable
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server


class CoordinatorMetrics:
    """The coordinator's counters, gauges and histograms."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._http_server: WSGIServer | None = None
        self.rpcs = Counter(
            "rollnet_rpcs_total",
            "RPCs served, by method and status code",
            ["method", "code"],
            registry=self.registry,
        )
        self.rpc_seconds = Histogram(
            "rollnet_rpc_duration_seconds",
            "RPC handling time, by method",
            ["method"],
            registry=self.registry,
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5, 30),
        )
        self.nodes = Gauge(
            "rollnet_nodes", "Registered nodes, by state", ["state"], registry=self.registry
        )
        self.tasks = Gauge("rollnet_tasks", "Tasks, by state", ["state"], registry=self.registry)
        self.validation_queue = Gauge(
            "rollnet_validation_jobs_queued", "Validation jobs waiting", registry=self.registry
        )
        self.leases_requeued = Counter(
            "rollnet_leases_requeued_total",
            "Expired or revoked leases whose task went back to the queue",
            registry=self.registry,
        )
        self.tasks_expired = Counter(
            "rollnet_tasks_expired_total",
            "Queued tasks ended by the sweep: their checkpoint fell behind the staleness bound"
            " (async_level), so no worker may lease them",
            registry=self.registry,
        )
        self.attempts_ended = Counter(
            "rollnet_task_attempts_ended_total",
            "Task leases that ended without credit, by node and outcome (given_back, expired,"
            " taken_back, rejected, unvalidated, duplicate): the give-back history, counted",
            ["node", "outcome"],
            registry=self.registry,
        )
        self.duplicate_rollouts = Counter(
            "rollnet_duplicate_rollouts_total",
            "Rollouts refused at intake as copies of an improbable completion already committed",
            registry=self.registry,
        )
        self.validation_failed = Counter(
            "rollnet_validation_jobs_failed_total",
            "Validation jobs given up after max_validation_attempts leases (tasks queued again)",
            registry=self.registry,
        )
        self.verdicts = Counter(
            "rollnet_verdicts_total",
            "Verdicts recorded, by decision and reason",
            ["decision", "reason"],
            registry=self.registry,
        )
        self.nodes_flagged = Counter(
            "rollnet_nodes_flagged_total",
            "Workers flagged (and ejected) by a per-node statistics test, by test",
            ["test"],
            registry=self.registry,
        )
        self.orphan_blobs_deleted = Counter(
            "rollnet_orphan_blobs_deleted_total",
            "Uploads deleted because nothing referenced them within orphan_blob_ttl",
            registry=self.registry,
        )
        self.orphan_bytes_deleted = Counter(
            "rollnet_orphan_blob_bytes_deleted_total",
            "Bytes of uploads deleted because nothing referenced them within orphan_blob_ttl",
            registry=self.registry,
        )
        self.rejected_blobs_pruned = Counter(
            "rollnet_rejected_blobs_pruned_total",
            "Rollout batches of uncredited work (rejected, or validation failed) deleted "
            "rejected_blob_ttl after",
            registry=self.registry,
        )
        self.rejected_bytes_pruned = Counter(
            "rollnet_rejected_blob_bytes_pruned_total",
            "Bytes of rollout batches of uncredited work deleted rejected_blob_ttl after",
            registry=self.registry,
        )
        self.pending_upload_bytes = Gauge(
            "rollnet_pending_upload_bytes",
            "Bytes (whole disk blocks) of uploads that no commitment or checkpoint references yet",
            registry=self.registry,
        )
        self.replay_cache_keys = Gauge(
            "rollnet_replay_cache_keys",
            "Keys holding live nonces in the verifier's replay cache, by pool: registered, "
            "trusted (allow-listed roles), registering (unregistered keys)",
            ["pool"],
            registry=self.registry,
        )
        self.replay_cache_nonces = Gauge(
            "rollnet_replay_cache_nonces",
            "Live nonces in the verifier's replay cache, all keys together",
            registry=self.registry,
        )
        self.blob_cache_bytes = Gauge(
            "rollnet_blob_cache_bytes",
            "Bytes of recent small blobs (rollout batches) held in memory; they fill up to "
            "rollnet_blob_cache_limit_bytes, then the oldest are evicted",
            registry=self.registry,
        )
        self.blob_cache_limit_bytes = Gauge(
            "rollnet_blob_cache_limit_bytes",
            "The most bytes of blobs held in memory",
            registry=self.registry,
        )
        self.uploads_refused = Counter(
            "rollnet_uploads_refused_total",
            "Uploads refused before storing, by reason (quota, storage, role)",
            ["reason"],
            registry=self.registry,
        )
        self.work_units = Counter(
            "rollnet_work_units_credited_total", "Work units credited", registry=self.registry
        )
        self.accepted_rollouts = Counter(
            "rollnet_accepted_rollouts_total", "Rollouts accepted", registry=self.registry
        )
        self.loop_lag = Gauge(
            "rollnet_event_loop_lag_seconds",
            "How late the event loop runs due work (median of recent probes); above 0.1 s the "
            "coordinator is behind and grants longer heartbeat intervals",
            registry=self.registry,
        )
        self.db_commits = Gauge(
            "rollnet_db_commits",
            "Write transactions committed since start (SQLite group commit; 0 on PostgreSQL)",
            registry=self.registry,
        )
        self.db_write_calls = Gauge(
            "rollnet_db_write_calls",
            "Calls whose writes those commits carried (calls per commit = this / commits)",
            registry=self.registry,
        )
        self.pull_batches = Gauge(
            "rollnet_pull_batches",
            "Lease transactions run for PullTask calls since start (one per pull on PostgreSQL)",
            registry=self.registry,
        )
        self.pulls_batched = Gauge(
            "rollnet_pulls_batched",
            "PullTask attempts those transactions carried (pulls per batch = this / batches)",
            registry=self.registry,
        )

    def watch_pulls(self, batches: Callable[[], float], pulls: Callable[[], float]) -> None:
        """Read the pull-batching figures when scraped."""
        self.pull_batches.set_function(batches)
        self.pulls_batched.set_function(pulls)

    def watch_load(
        self,
        lag: Callable[[], float],
        commits: Callable[[], float] | None = None,
        write_calls: Callable[[], float] | None = None,
    ) -> None:
        """Read the load figures when scraped (nothing is spent on them per call)."""
        self.loop_lag.set_function(lag)
        if commits is not None and write_calls is not None:
            self.db_commits.set_function(commits)
            self.db_write_calls.set_function(write_calls)

    def serve(self, host: str, port: int) -> int:
        """Expose the metrics over HTTP; returns the bound port."""
        server, _thread = start_http_server(port, addr=host, registry=self.registry)
        self._http_server = server
        return int(server.server_address[1])

    def close(self) -> None:
        """Stop serving the metrics over HTTP (if :meth:`serve` was called) and free the port."""
        server, self._http_server = self._http_server, None
        if server is not None:
            server.shutdown()
            server.server_close()
