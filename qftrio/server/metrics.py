"""Prometheus metrics of one job server, served at ``GET /metrics``.

Each :class:`~qftrio.server.engine.Engine` holds its own :class:`Metrics`
(one ``CollectorRegistry`` per server, so that two engines in one process,
as in tests, never share a counter). Counters and histograms count what this
server did, labelled by queue and kind; a fleet's figure is their sum over
servers. The per-queue gauges (jobs by status, the oldest ready job's age)
are read from the store at scrape time (:meth:`QueueGauges.update`), so every
server reports the same, right, figure however many share the database.

Labels are bounded, so that no caller can grow the exposition without bound
(queue and kind names are the callers'): the first ``max_queues`` queue names
and ``max_kinds`` kind names seen get series of their own, and so do at most
``max_queues + max_kinds`` (queue, kind) pairs; the rest are counted under
``other`` (a new pair under its queue and kind ``other``), as OpenTelemetry's
SDKs count attribute sets past their cardinality limit in one overflow series.
A queue that no longer exists in the store (no job of any tenant) at a
scrape loses its series and its place, which the next new name takes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from ..models import QueueStats, Status, elapsed

__all__ = ["Metrics", "QueueGauges", "OTHER"]

_LABELS = ("queue", "kind")

_SECONDS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 300, 1800, 3600)

#: The label of every name past the limits.
OTHER = "other"


class _Names:
    """The names that have a label of their own, at most *limit*, each
    with the scrape round it was given its place in."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.rounds: dict[str, int] = {}

    def label(self, name: str, round_: int) -> str:
        if name in self.rounds:
            return name
        if len(self.rounds) < self.limit and name != OTHER:
            self.rounds[name] = round_
            return name
        return OTHER


#: The flow controls that hold ready jobs back: the ``limit`` label.
_HELD = ("concurrency", "rate_limit")


class QueueGauges(Collector):
    """Jobs by status, the oldest ready job's age, pauses and the ready jobs
    flow control holds back of every queue of every tenant, as the store
    last answered (:meth:`update`, before each scrape). Queues past the label
    limit are summed per tenant under ``other`` (their oldest job is the
    oldest of them; ``paused`` counts the paused ones)."""

    def __init__(self, metrics: Metrics) -> None:
        self._metrics = metrics
        self._rows: dict[tuple[str, str], tuple[dict[str, int], float, int, dict[str, int]]] = {}

    def update(self, queues: Sequence[tuple[str, QueueStats]], *, now: float) -> None:
        self._metrics.forget_queues_but({stats.queue for _, stats in queues})
        rows: dict[tuple[str, str], tuple[dict[str, int], float, int, dict[str, int]]] = {}
        for tenant, stats in queues:
            key = (tenant, self._metrics.queue_label(stats.queue))
            counts, age, paused, held = rows.get(key) or ({s.value: 0 for s in Status}, 0.0, 0, dict.fromkeys(_HELD, 0))
            for status in counts:
                counts[status] += stats.counts.get(status, 0)
            if stats.oldest_ready_at is not None:
                age = max(age, elapsed(stats.oldest_ready_at, now))
            held["concurrency"] += stats.held_concurrency
            held["rate_limit"] += stats.held_rate_limit
            rows[key] = (counts, age, paused + (1 if stats.paused else 0), held)
        self._rows = rows

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def collect(self) -> Iterable[Metric]:
        jobs, oldest, paused, held_back = self._families()
        for (tenant, queue), (counts, age, n_paused, held) in self._rows.items():
            for status, count in counts.items():
                jobs.add_metric([tenant, queue, status], count)
            oldest.add_metric([tenant, queue], age)
            paused.add_metric([tenant, queue], n_paused)
            for limit, count in held.items():
                held_back.add_metric([tenant, queue, limit], count)
        return [jobs, oldest, paused, held_back]

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
            GaugeMetricFamily(
                "qftrio_queue_paused", "1 while the queue is paused (under 'other': how many are)", labels=["tenant", "queue"]
            ),
            GaugeMetricFamily(
                "qftrio_queue_held_back_jobs",
                "Ready jobs held back by a concurrency key at its limit or a rate limit with no unit left (limit: "
                "concurrency or rate_limit), each counted up to 10,000 per queue",
                labels=["tenant", "queue", "limit"],
            ),
        ]


class Metrics:
    """The instruments of one server, in a registry of their own.

    Args:
        max_queues: queue names with series of their own.
        max_kinds: kind names with series of their own.
    """

    def __init__(self, *, max_queues: int = 50, max_kinds: int = 100) -> None:
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
        self._instruments: tuple[Counter | Histogram, ...] = (
            self.enqueued, self.leased, self.completed, self.failed, self.dead_lettered, self.stale_token,
            self.run_time, self.lease_wait,
        )  # fmt: skip
        self.queues = QueueGauges(self)
        r.register(self.queues)
        self._children: dict[tuple[int, str, str], Any] = {}
        self.set_limits(max_queues=max_queues, max_kinds=max_kinds)

    def set_limits(self, *, max_queues: int, max_kinds: int) -> None:
        """Bound the labels anew (before any job is counted)."""
        self._queue_names = _Names(max_queues)
        self._kind_names = _Names(max_kinds)
        self._max_pairs = max_queues + max_kinds
        self._pairs: set[tuple[str, str]] = set()
        #: Scrapes so far: a queue is forgotten only by a scrape that read
        #: the store after the queue got its place (and after its first count).
        self._round = 0

    @property
    def rounds(self) -> int:
        """Readings of the store's gauges so far (scrapes)."""
        return self._round

    def queue_label(self, queue: str) -> str:
        return self._queue_names.label(queue, self._round)

    def of(self, metric: Counter | Histogram, queue: str, kind: str) -> Any:
        """*metric*'s child of *queue* and *kind*, or of ``other`` past the
        limits. prometheus-client's ``labels()`` checks and locks on every
        call, and the hot paths count every job: each child is looked up
        there once, then kept here."""
        q = self._queue_names.label(queue, self._round)
        k = self._kind_names.label(kind, self._round)
        if (q, k) not in self._pairs:
            if len(self._pairs) >= self._max_pairs:
                k = OTHER
            self._pairs.add((q, k))
        key = (id(metric), q, k)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(q, k)
        return child

    def forget_queues_but(self, existing: set[str]) -> None:
        """Drop the series of the queues not in *existing* that had their
        place before the previous scrape (a queue named since may not be in
        what this scrape read), and of the kinds left in no pair."""
        gone = {q for q, round_ in self._queue_names.rounds.items() if q not in existing and round_ < self._round}
        self._round += 1
        if not gone:
            return
        for q in gone:
            del self._queue_names.rounds[q]
        for pair in [pair for pair in self._pairs if pair[0] in gone]:
            self._pairs.discard(pair)
            for metric in self._instruments:
                self._children.pop((id(metric), *pair), None)
                try:
                    metric.remove(*pair)
                except KeyError:
                    pass
        kept = {k for _, k in self._pairs}
        for k in [k for k, round_ in self._kind_names.rounds.items() if k not in kept and round_ < self._round - 1]:
            del self._kind_names.rounds[k]
