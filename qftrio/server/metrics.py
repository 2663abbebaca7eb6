"""Prometheus metrics of one job server, served at ``GET /metrics``.

Each :class:`~qftrio.server.engine.Engine` holds its own :class:`Metrics`
(one ``CollectorRegistry`` per server, so that two engines in one process,
as in tests, never share a counter). Counters and histograms count what this
server did, labelled by queue and kind; a fleet's figure is their sum over
servers. The per-queue gauges (jobs by status, the oldest ready job's age)
are read from the store at scrape time (:meth:`QueueGauges.update`), so every
server reports the same, right, figure however many share the database.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..models import QueueStats, Status

__all__ = ["Metrics", "QueueGauges"]

_LABELS = ("queue", "kind")

_SECONDS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800, 3600)


class QueueGauges(Collector):
    """Jobs by status and the oldest ready job's age of every queue of every
    tenant, as the store last answered (:meth:`update`, before each scrape)."""

    def __init__(self) -> None:
        self._queues: Sequence[tuple[str, QueueStats]] = ()
        self._now = 0.0

    def update(self, queues: Sequence[tuple[str, QueueStats]], *, now: float) -> None:
        self._queues = queues
        self._now = now

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def collect(self) -> Iterable[Metric]:
        jobs, oldest, paused = self._families()
        for tenant, stats in self._queues:
            for status in Status:
                jobs.add_metric([tenant, stats.queue, status.value], stats.counts.get(status.value, 0))
            age = 0.0 if stats.oldest_ready_at is None else max(0.0, self._now - stats.oldest_ready_at)
            oldest.add_metric([tenant, stats.queue], age)
            paused.add_metric([tenant, stats.queue], 1.0 if stats.paused else 0.0)
        return [jobs, oldest, paused]

    @staticmethod
    def _families() -> list[GaugeMetricFamily]:
        return [
            GaugeMetricFamily(
                "qftrio_queue_jobs", "Jobs of a queue by status, from the database", labels=["tenant", "queue", "status"]
            ),
            GaugeMetricFamily(
                "qftrio_queue_oldest_ready_age_seconds",
                "How long the oldest job ready to run has waited (0 when none): the signal for adding workers",
                labels=["tenant", "queue"],
            ),
            GaugeMetricFamily("qftrio_queue_paused", "1 while the queue is paused", labels=["tenant", "queue"]),
        ]


class Metrics:
    """The instruments of one server, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.enqueued = Counter("qftrio_jobs_enqueued", "Jobs enqueued", _LABELS, registry=r)
        self.leased = Counter("qftrio_jobs_leased", "Jobs handed out by lease calls", _LABELS, registry=r)
        self.completed = Counter("qftrio_jobs_completed", "Jobs completed", _LABELS, registry=r)
        self.failed = Counter(
            "qftrio_jobs_failed", "Failed attempts (retried or dead-lettered), lost leases included", _LABELS, registry=r
        )
        self.dead_lettered = Counter("qftrio_jobs_dead_lettered", "Jobs that ended failed", _LABELS, registry=r)
        self.stale_token = Counter(
            "qftrio_stale_token_rejections",
            "Heartbeats and reports refused for a stale lease token",
            _LABELS,
            registry=r,
        )
        self.run_time = Histogram(
            "qftrio_job_run_seconds",
            "Time from a job's claim to the report that ended the attempt (complete or fail)",
            _LABELS,
            buckets=_SECONDS,
            registry=r,
        )
        self.lease_wait = Histogram(
            "qftrio_lease_wait_seconds",
            "Time from a job becoming ready (due, or its retry due) to its claim",
            _LABELS,
            buckets=_SECONDS,
            registry=r,
        )
        self.queues = QueueGauges()
        r.register(self.queues)
        self._children: dict[tuple[int, str, str], Any] = {}

    def of(self, metric: Counter | Histogram, queue: str, kind: str) -> Any:
        """*metric*'s child of *queue* and *kind*. prometheus-client's
        ``labels()`` checks and locks on every call, and the hot paths count
        every job: each child is looked up there once, then kept here (no
        child is ever removed)."""
        key = (id(metric), queue, kind)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(queue, kind)
        return child
