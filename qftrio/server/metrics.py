"""Prometheus metrics of the job server, served at ``GET /metrics``."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

__all__ = ["REGISTRY", "ENQUEUED", "LEASED", "COMPLETED", "FAILED", "DEAD_LETTERED", "STALE_TOKEN", "LEASE_WAIT"]

REGISTRY = CollectorRegistry(auto_describe=True)

ENQUEUED = Counter("qftrio_jobs_enqueued", "Jobs enqueued", registry=REGISTRY)
LEASED = Counter("qftrio_jobs_leased", "Jobs handed out by lease calls", registry=REGISTRY)
COMPLETED = Counter("qftrio_jobs_completed", "Jobs completed", registry=REGISTRY)
FAILED = Counter("qftrio_jobs_failed", "Failed attempts (retried or dead-lettered)", registry=REGISTRY)
DEAD_LETTERED = Counter("qftrio_jobs_dead_lettered", "Jobs that ended failed", registry=REGISTRY)
STALE_TOKEN = Counter(
    "qftrio_stale_token_rejections", "Heartbeats and reports refused for a stale lease token", registry=REGISTRY
)
LEASE_WAIT = Histogram(
    "qftrio_lease_wait_seconds",
    "Time a lease call waited before it claimed jobs",
    buckets=(0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60),
    registry=REGISTRY,
)
