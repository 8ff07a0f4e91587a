"""The relay's Prometheus metrics (``GET /metrics``), in a registry of its own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge


class RelayMetrics:
    """Counters and gauges of one relay."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "rollnet_relay_requests",
            "Blob requests answered, by HTTP status",
            ["status"],
            registry=r,
        )
        self.served_bytes = Counter(
            "rollnet_relay_served_bytes", "Blob bytes sent to clients", registry=r
        )
        self.upstream_bytes = Counter(
            "rollnet_relay_upstream_bytes", "Blob bytes received from upstream", registry=r
        )
        self.upstream_errors = Counter(
            "rollnet_relay_upstream_errors", "Upstream transfers that failed", registry=r
        )
        self.cache_hits = Counter(
            "rollnet_relay_cache_hits", "Requests served from a stored blob", registry=r
        )
        self.cache_joins = Counter(
            "rollnet_relay_cache_joins",
            "Requests served from a fetch already in flight (fan-out)",
            registry=r,
        )
        self.cache_misses = Counter(
            "rollnet_relay_cache_misses", "Requests that started an upstream fetch", registry=r
        )
        self.rate_limited = Counter(
            "rollnet_relay_rate_limited", "Requests refused by the per-address limit", registry=r
        )
        self.blobs_evicted = Counter(
            "rollnet_relay_blobs_evicted", "Blobs deleted with an old version", registry=r
        )
        self.prefetched = Counter(
            "rollnet_relay_prefetched_blobs", "Blobs fetched ahead of requests", registry=r
        )
        self.watch_errors = Counter(
            "rollnet_relay_watch_errors",
            "Times watching the coordinator's checkpoints failed (retried)",
            registry=r,
        )
        self.inflight = Gauge(
            "rollnet_relay_inflight_fetches", "Upstream fetches in progress", registry=r
        )
        self.stored_bytes = Gauge("rollnet_relay_stored_bytes", "Bytes of blobs stored", registry=r)
