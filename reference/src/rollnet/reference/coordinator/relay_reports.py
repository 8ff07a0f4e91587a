"""Relays that nodes reported for serving shards whose bytes do not match their signed digest.

Nodes report them in their heartbeats (``HeartbeatRequest.relay_reports``); this records, in the
coordinator's memory, who reported which relay and shard and when, for the operator: the
dashboard's "Relays reported" table, the Prometheus counter
``rollnet_relay_reports_total{relay}`` and one ``relay_reported`` log line per report. A report
is a node's word (a node may lie about a relay), so nothing acts on it; what tells an operator
that a relay is bad rather than one node lying is *how many different nodes* reported it.

Nodes cannot flood it: at most :data:`MAX_RELAY_REPORTS` per heartbeat (the bounds), a token
bucket of :data:`REPORTS_PER_MINUTE` per node, one count per (node, relay, shard), and at most
:data:`TRACKED_RELAYS` relay URLs tracked (a report naming one more is counted under
``relay="(other)"`` and logged, not kept). The record is per coordinator process and starts
empty at each start; the log lines are the durable trail.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter

from rollnet.v1 import node_service_pb2

log = logging.getLogger(__name__)

REPORTS_PER_MINUTE = 8
"""Reports recorded from one node per minute (a bucket of that many, refilled over a minute)."""
TRACKED_RELAYS = 256
"""Relay URLs kept in the record (and given their own metric label)."""
REPORTERS_KEPT = 1000
"""Distinct reporters remembered per relay."""
RECENT = 50
"""Single reports kept, newest first, for the dashboard."""
_SEEN_KEPT = 100_000
_OTHER = "(other)"


@dataclass
class RelayRecord:
    """What nodes said about one relay."""

    url: str
    reports: int = 0
    reporters: set[str] = field(default_factory=set)
    first_at: datetime | None = None
    last_at: datetime | None = None
    last_reporter: str = ""
    last_shard: bytes = b""
    last_step: int = 0


@dataclass(frozen=True)
class RecordedReport:
    """One report as recorded."""

    node_id: str
    relay_url: str
    shard_blake3: bytes
    checkpoint_step: int
    detected_at: datetime | None
    """The node's clock (``None`` when it did not say)."""
    received_at: datetime


class RelayReports:
    """The coordinator's record of relay reports (see the module docs)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.relays: dict[str, RelayRecord] = {}
        self.recent: deque[RecordedReport] = deque(maxlen=RECENT)
        self._buckets: dict[str, tuple[float, float]] = {}
        self._seen: OrderedDict[tuple[str, str, bytes], None] = OrderedDict()
        self.counter = Counter(
            "rollnet_relay_reports_total",
            "Reports by nodes of a relay serving bytes that do not match a shard's digest, by "
            f"relay URL (the first {TRACKED_RELAYS}; later ones as '{_OTHER}')",
            ["relay"],
            registry=registry,
        )
        self.dropped = Counter(
            "rollnet_relay_reports_dropped_total",
            "Relay reports not recorded, by reason (rate_limited: past "
            f"{REPORTS_PER_MINUTE} a minute from one node; repeated: the same node, relay and "
            "shard again)",
            ["reason"],
            registry=registry,
        )

    def record(
        self,
        node_id: str,
        reports: list[node_service_pb2.RelayReport],
        now: datetime,
        *,
        monotonic: float | None = None,
    ) -> int:
        """Record what one heartbeat of ``node_id`` reported; returns how many were recorded."""
        clock = time.monotonic() if monotonic is None else monotonic
        recorded = 0
        for report in reports:
            key = (node_id, report.relay_url, bytes(report.shard_blake3))
            if key in self._seen:
                self.dropped.labels("repeated").inc()
                continue
            if not self._take_token(node_id, clock):
                self.dropped.labels("rate_limited").inc()
                continue
            self._remember(key)
            recorded += 1
            self._add(node_id, report, now)
        return recorded

    def _take_token(self, node_id: str, clock: float) -> bool:
        tokens, stamp = self._buckets.get(node_id, (float(REPORTS_PER_MINUTE), clock))
        tokens = min(float(REPORTS_PER_MINUTE), tokens + (clock - stamp) * REPORTS_PER_MINUTE / 60)
        if tokens < 1.0:
            self._buckets[node_id] = (tokens, clock)
            return False
        if len(self._buckets) > _SEEN_KEPT:  # forget nodes whose buckets are full again
            self._buckets = {n: (t, s) for n, (t, s) in self._buckets.items() if clock - s < 60.0}
        self._buckets[node_id] = (tokens - 1.0, clock)
        return True

    def _remember(self, key: tuple[str, str, bytes]) -> None:
        self._seen[key] = None
        while len(self._seen) > _SEEN_KEPT:
            self._seen.popitem(last=False)

    def _add(self, node_id: str, report: node_service_pb2.RelayReport, now: datetime) -> None:
        url = report.relay_url
        detected = (
            report.detected_at.ToDatetime(tzinfo=now.tzinfo)
            if report.HasField("detected_at")
            else None
        )
        fields = {
            "node_id": node_id,
            "relay": url,
            "shard_blake3": report.shard_blake3.hex(),
            "checkpoint_step": report.checkpoint_step,
            "detected_at": None if detected is None else detected.isoformat(),
        }
        record = self.relays.get(url)
        if record is None and len(self.relays) >= TRACKED_RELAYS:
            self.counter.labels(_OTHER).inc()
            log.warning("relay_reported", extra=fields | {"tracked": False})
            return
        if record is None:
            record = self.relays[url] = RelayRecord(url, first_at=now)
        record.reports += 1
        if len(record.reporters) < REPORTERS_KEPT:
            record.reporters.add(node_id)
        record.last_at = now
        record.last_reporter = node_id
        record.last_shard = bytes(report.shard_blake3)
        record.last_step = report.checkpoint_step
        self.recent.appendleft(
            RecordedReport(
                node_id, url, bytes(report.shard_blake3), report.checkpoint_step, detected, now
            )
        )
        self.counter.labels(url).inc()
        log.warning("relay_reported", extra=fields | {"tracked": True})

    def overview(self, limit: int = 20) -> dict[str, Any]:
        """The record as the dashboard shows it (JSON-ready): relays by distinct reporters,
        then reports; the newest single reports."""
        ranked = sorted(self.relays.values(), key=lambda r: (-len(r.reporters), -r.reports, r.url))
        return {
            "relays": [
                {
                    "url": r.url,
                    "reports": r.reports,
                    "reporters": len(r.reporters),
                    "first_at": _iso(r.first_at),
                    "last_at": _iso(r.last_at),
                    "last_reporter": r.last_reporter,
                    "last_shard": r.last_shard.hex(),
                    "last_step": r.last_step,
                }
                for r in ranked[:limit]
            ],
            "relays_reported": len(self.relays),
            "recent": [
                {
                    "node_id": r.node_id,
                    "relay": r.relay_url,
                    "shard": r.shard_blake3.hex(),
                    "step": r.checkpoint_step,
                    "detected_at": _iso(r.detected_at),
                    "received_at": _iso(r.received_at),
                }
                for r in list(self.recent)[:10]
            ],
        }


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else moment.isoformat()
