"""Prometheus metrics of a validator process (served on ``--metrics-listen``)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram


class ValidatorMetrics:
    """Counters a dashboard turns into jobs/s, validated tokens/s and rejects by reason.

    The validation queue's depth as this validator last saw it comes from the coordinator's
    answers (a pull that returned nothing means an empty queue); the coordinator's own
    ``rollnet_validation_queue`` gauge is the authoritative figure.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry if registry is not None else CollectorRegistry()
        self.jobs = Counter(
            "rollnet_validator_jobs",
            "Validation jobs judged, by decision",
            ["decision"],
            registry=self.registry,
        )
        self.rejects = Counter(
            "rollnet_validator_rejects",
            "Rejected commitments, by reason",
            ["reason"],
            registry=self.registry,
        )
        self.tokens = Counter(
            "rollnet_validator_validated_tokens",
            "Prompt and completion tokens validated",
            ["kind"],
            registry=self.registry,
        )
        self.rollouts = Counter(
            "rollnet_validator_rollouts", "Rollouts validated", registry=self.registry
        )
        self.job_seconds = Histogram(
            "rollnet_validator_job_seconds",
            "Time from lease to verdict, by phase",
            ["phase"],
            buckets=(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120),
            registry=self.registry,
        )
        self.busy = Gauge(
            "rollnet_validator_busy", "1 while a job is being validated", registry=self.registry
        )
        self.queue_empty_polls = Counter(
            "rollnet_validator_empty_polls",
            "Pulls that found the validation queue empty",
            registry=self.registry,
        )
        self.abandoned = Counter(
            "rollnet_validator_abandoned_jobs",
            "Jobs given up (lease lost, checkpoint unavailable, verdict refused)",
            ["why"],
            registry=self.registry,
        )


__all__ = ["ValidatorMetrics"]
