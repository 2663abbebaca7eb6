"""The engine: qftrio's behaviour, independent of HTTP and of the database.

Routes parse and authorise, then call one engine method; the in-process worker
transport calls the same methods. The engine owns

* decisions: every outcome of a job (a report against its state and token,
  retry or dead letter, lease expiry, cancel, retry, workflow advancement and
  failure) is a pure function of :mod:`qftrio.server.transitions`, which
  both stores call inside the transaction that executes it;
* policy: defaults, the retry backoff (handed to those decisions as
  ``retry_at``), what counts as valid input;
* time: every store call gets ``now`` from :attr:`Engine.clock`;
* long-poll leases: waiting tasks park on a per-queue
  :class:`~qftrio.server.waker.Waker` that enqueues (and, on PostgreSQL, the
  store's LISTEN connection) ring;
* metrics (a registry per engine, :attr:`Engine.metrics_registry`);
* operations: queue stats, pause and resume, bulk actions by filter, the
  live workers (those holding jobs, and those seen leasing lately: a
  :class:`~qftrio.server.sightings.Sightings` cache keeps each server's
  writes of them rare and bounded);
* workflows (docs/workflows.md): the graph is checked here
  (:mod:`qftrio.server.workflows`); advancing one
  (:func:`~qftrio.server.transitions.advance`) happens inside the store's job
  transactions, and the engine wakes the long-polls of the queue that the
  unblocked steps landed on.

Each state transition is one store call, so one transaction. What is not an
operation lives in a module of its own, which the engine delegates to:
:mod:`~qftrio.server.janitor` (the loop that reaps expired leases, compacts
the counts, prunes old jobs and purges), :mod:`~qftrio.server.waker`
(long-poll parking and hand-off), :mod:`~qftrio.server.sessions` (dashboard
sessions), :mod:`~qftrio.server.sightings` (the workers seen),
:mod:`~qftrio.server.cursors` (the keyset pages' cursors),
:mod:`~qftrio.server.schedule_firing` (schedules' ticks) and
:mod:`~qftrio.server.new_jobs` (the job an enqueue request asks for).
"""

from __future__ import annotations

import functools
import time
from collections import Counter
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Sequence
from contextlib import aclosing
from typing import Any

import trio
from prometheus_client import CollectorRegistry, generate_latest

from .. import errors
from .._batching import Batcher
from ..models import (
    to_datetime,
    TERMINAL,
    MAX_ANSWER_BYTES,
    MAX_BATCH,
    QUEUES_PAGE,
    EnqueueRequest,
    Job,
    JobConfig,
    Lease,
    QueueStats,
    RateLimit,
    Schedule,
    ScheduleRequest,
    Status,
    WorkerInfo,
    Workflow,
    StepsAddRequest,
    WorkflowCreateRequest,
    WorkflowStatus,
)
from . import janitor, schedule_firing, schedules, sessions, transitions
from .cursors import decode_cursor, decode_queue_cursor, encode_cursor, encode_queue_cursor
from .metrics import Metrics
from .new_jobs import new_job
from .store.base import (
    ALL_QUEUES,
    BulkAction,
    BulkFilter,
    ClaimRequest,
    CompleteItem,
    DashboardSession,
    FailItem,
    HeartbeatItem,
    ProgressItem,
    HeartbeatResult,
    Inserted,
    NewJob,
    NewSchedule,
    Outcome,
    ReportResult,
    RetryPolicy,
    SnoozeItem,
    Store,
)
from .sightings import Sightings
from .events import KEEPALIVE, EventStreams, Subscriber, chunks, sse
from .waits import JobWaits
from .waker import Parked, Waker, wake_after_reports
from .workflows import new_steps, new_workflow

# Parked, Sightings, Waker, new_job and session_key are imported from here too.
__all__ = ["Engine", "Parked", "RetryPolicy", "Sightings", "Waker", "new_job", "session_key"]

session_key = sessions.session_key


class Engine:
    """Every operation of the job server.

    Args:
        store: the backend.
        policy: retry backoff.
        clock: wall-clock seconds since the epoch; tests pass a clock derived
            from Trio's so that time is deterministic.
        safety_poll_secs: a parked long-poll re-checks the store at least this
            often, in case a wake-up was missed.
        max_answer_bytes: a page of jobs or workflows stops before the item
            that would take it past this size (never before its first item),
            so that no listing pins more memory than this, about.
    """

    #: The workers list shows workers seen (lease calls, claims,
    #: heartbeats) this recently.
    WORKERS_SEEN_SECS = 300.0
    #: A worker's lease calls on one queue are written at most this often.
    SIGHTING_EVERY_SECS = 5.0
    #: ``(worker_id, queue)`` pairs each server writes per window at most.
    MAX_SIGHTINGS = 10_000
    #: Workers one answer lists at most (those holding most jobs first).
    MAX_WORKERS_LISTED = 1000
    #: Rate limits one tenant may declare: a list of them, with each one's
    #: claim times, is one answer, so their number is bounded.
    MAX_RATE_LIMITS = 100
    #: Sightings and expired sessions are purged this often.
    PURGE_EVERY_SECS = 60.0
    #: A dashboard session's id is this long; a longer cookie is not looked up.
    MAX_SESSION_ID = sessions.MAX_SESSION_ID
    #: A session's idle end moves on at most this often.
    SESSION_TOUCH_SECS = sessions.SESSION_TOUCH_SECS
    #: Waits (``GET /api/v1/jobs/{id}/wait``) one tenant may have parked on
    #: this server at once.
    MAX_WAITS_PER_TENANT = 1000
    #: Event streams (``GET /api/v1/events``) one tenant may have open on
    #: this server at once.
    MAX_STREAMS_PER_TENANT = 100
    #: An open stream sends a comment this often, and renews its
    #: registration in the store.
    EVENTS_KEEPALIVE_SECS = 15.0
    #: A stream's registration outlives its last renewal by this long (a
    #: stream of a server that died stops costing notifications then).
    EVENTS_HOLD_SECS = 60.0
    #: Queues one ``event: stats`` round covers at most, with no queue named.
    MAX_STATS_QUEUES = 100
    #: Seconds a wait's end may take to unregister it (shielded).
    WAIT_END_SECS = 5.0

    def __init__(
        self,
        store: Store,
        *,
        policy: RetryPolicy = RetryPolicy(),
        clock: Callable[[], float] = time.time,
        safety_poll_secs: float = 5.0,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
        session_idle_secs: float = 8 * 3600.0,
        session_lifetime_secs: float = 7 * 86400.0,
    ) -> None:
        self.store = store
        self.max_answer_bytes = max_answer_bytes
        self.policy = policy
        self.clock = clock
        self.safety_poll_secs = safety_poll_secs
        self.sessions = sessions.Sessions(
            store, clock, idle_secs=session_idle_secs, lifetime_secs=session_lifetime_secs
        )
        self.waker = Waker()
        self.waits = JobWaits(self.MAX_WAITS_PER_TENANT)
        store.on_ended = self.waits.ended
        self.events = EventStreams(self.MAX_STREAMS_PER_TENANT)
        store.on_event = self.events.changed
        self.metrics = Metrics()
        self.sightings = Sightings(
            every=self.SIGHTING_EVERY_SECS, window=self.WORKERS_SEEN_SECS, capacity=self.MAX_SIGHTINGS
        )
        # Concurrent lease calls due to be written share one store call.
        self._sighted: Batcher[tuple[str, str], None] = Batcher(self._write_sightings)
        self._closing = trio.Event()
        # Concurrent reports and claims share store calls (qftrio/_batching.py).
        self._heartbeats: Batcher[HeartbeatItem, HeartbeatResult] = Batcher(
            lambda items: self.store.jobs_heartbeat(items, now=self.clock())
        )
        self._completes: Batcher[CompleteItem, ReportResult] = Batcher(
            lambda items: self.store.jobs_complete(items, now=self.clock())
        )
        self._fails: Batcher[FailItem, ReportResult] = Batcher(
            lambda items: self.store.jobs_fail(items, now=self.clock(), retry_at=self.policy.retry_at)
        )
        self._snoozes: Batcher[SnoozeItem, ReportResult] = Batcher(
            lambda items: self.store.jobs_snooze(items, now=self.clock())
        )
        self._claims: dict[tuple[str, float, str | None], Batcher[int, list[Lease]]] = {}
        # Concurrent enqueues share one insert, one round trip and one commit;
        # each call's jobs still go in together or not at all (a batch that
        # fails runs again one call at a time), and a repeated idempotency
        # key stands for its first job, as within one call. Items are (job,
        # the enqueue's time); a batch's jobs are created at the latest, so
        # that a lone call's are created when it was made, as before.
        self._inserts: Batcher[tuple[NewJob, float], Inserted] = Batcher(
            lambda items: self.store.jobs_insert([job for job, _ in items], now=max(now for _, now in items)),
            max_items=MAX_BATCH,
        )

    @property
    def session_idle_secs(self) -> float:
        """A dashboard session ends after this long without a request."""
        return self.sessions.idle_secs

    @session_idle_secs.setter
    def session_idle_secs(self, secs: float) -> None:
        self.sessions.idle_secs = secs

    @property
    def session_lifetime_secs(self) -> float:
        """A dashboard session ends this long after sign-in whatever happens."""
        return self.sessions.lifetime_secs

    @session_lifetime_secs.setter
    def session_lifetime_secs(self, secs: float) -> None:
        self.sessions.lifetime_secs = secs

    # -- lifecycle ---------------------------------------------------------

    def begin_shutdown(self) -> None:
        """Make parked long-polls return (empty) at once, and new ones not wait."""
        self._closing.set()
        self.waker.notify_all()
        self.waits.close()
        self.events.close()

    @property
    def closing(self) -> bool:
        return self._closing.is_set()

    # -- metrics -------------------------------------------------------------

    @property
    def metrics_registry(self) -> CollectorRegistry:
        """This engine's Prometheus registry. Its per-queue gauges hold what
        the store last answered: :meth:`metrics_exposition` reads them anew."""
        return self.metrics.registry

    async def metrics_exposition(self) -> bytes:
        """The text of ``GET /metrics``: this server's counters and
        histograms, and every queue's gauges read from the store now (so
        alike on every server sharing the database)."""
        now = self.clock()
        self.metrics.queues.update(await self.store.queues_overview(now=now), now=now)
        return generate_latest(self.metrics.registry)

    def _count_leased(self, leases: Sequence[Lease]) -> None:
        m = self.metrics
        by_pair: dict[tuple[str, str], list[Job]] = {}
        for lease in leases:
            job = lease.job
            by_pair.setdefault((job.queue, job.kind), []).append(job)
        for (queue, kind), jobs in by_pair.items():
            m.of(m.leased, queue, kind).inc(len(jobs))
            observe = m.of(m.lease_wait, queue, kind).observe
            for job in jobs:
                # claimed at updated_at; ready since it was due (or its retry was)
                observe(max(0.0, (job.updated_at - max(job.scheduled_at, job.created_at)).total_seconds()))

    def _count_enqueued(self, pairs: Iterable[tuple[str, str]]) -> None:
        """Count enqueued jobs by their ``(queue, kind)``."""
        m = self.metrics
        for (queue, kind), n in Counter(pairs).items():
            m.of(m.enqueued, queue, kind).inc(n)

    def _count_ended(self, results: Sequence[ReportResult], now: float) -> None:
        """Count the attempts *results* ended (applied reports only)."""
        m = self.metrics
        ended: Counter[tuple[str, str, Status]] = Counter()
        for r in results:
            if not r.applied or r.queue is None:
                continue
            kind = r.kind or ""
            ended[r.queue, kind, r.status] += 1  # type: ignore[index]
            if r.claimed_at is not None:
                m.of(m.run_time, r.queue, kind).observe(max(0.0, now - r.claimed_at))
        for (queue, kind, status), n in ended.items():
            if status is Status.COMPLETED:
                m.of(m.completed, queue, kind).inc(n)
            else:
                m.of(m.failed, queue, kind).inc(n)
                if status is Status.FAILED:
                    m.of(m.dead_lettered, queue, kind).inc(n)

    # -- application side --------------------------------------------------

    async def enqueue(self, tenant: str, jobs: Sequence[EnqueueRequest]) -> list[Inserted]:
        """Enqueue *jobs* (validated requests, as routes parse them) for
        *tenant* in one transaction: a job whose idempotency key the tenant
        used before is not enqueued, its first job is returned."""
        now = self.clock()
        await self._check_rate_limits(tenant, [job.config for job in jobs], "config.rate_limit", now)
        new = [new_job(tenant, job, now) for job in jobs]
        # Jobs due now go straight to the long-polls parked on their queue:
        # claimed for them in the insert's own transaction.
        handed = [] if self.closing else self.waker.take_due(new, now)
        claimed: list[list[Lease]] = []
        if not handed:
            inserted = await self._inserts([(job, now) for job in new])
        else:
            try:
                # Shielded: the polls' jobs are claimed whether or not this
                # enqueue's caller stays, so the polls must get them.
                with trio.CancelScope(shield=True):
                    inserted, claimed = await self.store.jobs_insert_claiming(
                        new, now=now, claims=[parked.claim for parked in handed]
                    )
            finally:
                # On failure too: a poll given nothing claims for itself.
                for k, parked in enumerate(handed):
                    if k < len(claimed) and claimed[k]:
                        parked.leases = claimed[k]
                    parked.event.set()
            # Let the polls send their jobs before anything else is done
            # here: a worker is waiting on them, the enqueuer only on a
            # receipt. A woken poll answers in the next batch of Trio's
            # scheduler without yielding; the first yield here puts this
            # task in that batch too (in no set order), the second after it.
            await trio.lowlevel.cancel_shielded_checkpoint()
            await trio.lowlevel.cancel_shielded_checkpoint()
        created = [i.new for i in inserted if i.existing is None]
        if created:
            self._count_enqueued((job.queue, job.kind) for job in created)
            # Wake the other polls of a queue unless the hand-off took every
            # claimable job there (a poll got less than it could hold).
            full: dict[str, bool] = {}
            for parked, leases in zip(handed, claimed):
                queue = parked.claim.queue
                full[queue] = full.get(queue, True) and len(leases) >= parked.claim.limit
            later = {job.queue for job in created if job.scheduled_at > now}  # polls recompute their wait
            for queue in {job.queue for job in created}:
                if full.get(queue, True) or queue in later:
                    self.waker.notify(queue)
        return inserted

    async def rate_limit_set(self, tenant: str, name: str, limit: int, per_secs: float) -> tuple[RateLimit, bool]:
        """Declare or change the tenant's rate limit *name*: it and whether it is new.

        Raises:
            Conflict: *name* is new and the tenant has :attr:`MAX_RATE_LIMITS` already.
        """
        declared = await self.store.rate_limits_list(tenant=tenant, now=self.clock())
        if len(declared) >= self.MAX_RATE_LIMITS and name not in {r.name for r in declared}:
            raise errors.Conflict(
                f"rate limit {name}: the tenant has {len(declared)} rate limits, the most it may declare; delete one first"
            )
        created = await self.store.rate_limit_set(tenant=tenant, name=name, limit=limit, per_secs=per_secs)
        self.waker.notify_all()  # a raised limit may free held-back jobs
        return await self.rate_limit_get(tenant, name), created

    async def rate_limit_get(self, tenant: str, name: str) -> RateLimit:
        found = await self.store.rate_limits_list(tenant=tenant, now=self.clock(), names=[name])
        if not found:
            raise errors.NotFound(f"rate limit {name} not found")
        return found[0]

    async def rate_limits_list(self, tenant: str) -> list[RateLimit]:
        return await self.store.rate_limits_list(tenant=tenant, now=self.clock())

    async def rate_limit_delete(self, tenant: str, name: str) -> None:
        """Forget the rate limit: jobs naming it are no longer held back by it."""
        if not await self.store.rate_limit_delete(tenant=tenant, name=name):
            raise errors.NotFound(f"rate limit {name} not found")
        self.waker.notify_all()

    async def job_get(self, tenant: str, job_id: str) -> Job:
        job = await self.store.job_get(job_id, tenant=tenant)
        if job is None:
            raise errors.NotFound(f"job {job_id} not found")
        return job

    async def job_wait(self, tenant: str, job_id: str, timeout_secs: float) -> Job:
        """The job once it is terminal (completed, failed, cancelled), or as
        it stands when *timeout_secs* pass or the server begins shutting
        down; at once when it is terminal already. Woken by the store's word
        that it ended, from this server or another (:attr:`Store.on_ended`),
        and reading it again every ``safety_poll_secs`` besides.

        Raises:
            NotFound: no such job of *tenant*.
            TooManyRequests: the tenant has ``MAX_WAITS_PER_TENANT`` waits
                parked here already.
        """
        job = await self.job_get(tenant, job_id)
        if job.status in TERMINAL or timeout_secs <= 0 or self.closing:
            return job
        deadline = trio.current_time() + timeout_secs
        with self.waits.park(tenant, job_id) as parked:
            wait_id = await self.store.job_wait_begin(job_id, now=self.clock(), wait_secs=timeout_secs)
            try:
                while True:
                    remaining = deadline - trio.current_time()
                    # Listening before the read: an end another server
                    # commits after it reaches this wait.
                    await self.store.notifications_wanted(max(0.0, remaining))
                    job = await self.job_get(tenant, job_id)
                    remaining = deadline - trio.current_time()
                    if job.status in TERMINAL or remaining <= 0 or self.waits.closed:
                        return job
                    with trio.move_on_after(min(remaining, self.safety_poll_secs)):
                        await parked.event.wait()
                    parked.rearm()
            finally:
                # The wait's row goes even when the caller went away.
                with trio.CancelScope(shield=True), trio.move_on_after(self.WAIT_END_SECS):
                    await self.store.job_wait_end(wait_id)

    def events_open(self, tenant: str, *, queue: str | None, kind: str | None, job: str | None) -> Subscriber:
        """Open an event stream of *tenant*'s jobs that match the filters;
        :meth:`events_run` relays it.

        Raises:
            TooManyRequests: the tenant has ``MAX_STREAMS_PER_TENANT``
                streams open here already.
            Unavailable: the server is shutting down.
        """
        return self.events.open(tenant, queue=queue, kind=kind, job=job)

    async def events_run(
        self, subscriber: Subscriber, *, stats_secs: float | None, write: Callable[[bytes], Awaitable[bool]]
    ) -> None:
        """Relay :meth:`events_chunks` with *write* (False: the client has
        gone)."""
        async with aclosing(self.events_chunks(subscriber, stats_secs=stats_secs)) as stream:
            async for chunk in stream:
                if not await write(chunk):
                    return

    async def events_chunks(self, subscriber: Subscriber, *, stats_secs: float | None) -> AsyncGenerator[bytes, None]:
        """*subscriber*'s stream, chunk by chunk, until the stream
        overflows or the server shuts down (or the consumer closes it). The
        stream is registered in the store, and the store listening, before
        the first chunk (a comment): a change committed after the client has
        that is on the stream. The stream is closed (:meth:`EventStreams.close_one`)
        when this ends, whether or not it began."""
        tenant = subscriber.tenant
        try:
            stream_id = await self.store.events_begin(
                tenant, now=self.clock(), until=self.clock() + self.EVENTS_HOLD_SECS
            )
            try:
                await self.store.notifications_wanted(2 * self.EVENTS_KEEPALIVE_SECS)
                subscriber.live = True
                yield KEEPALIVE

                async def keep() -> None:
                    await self.store.events_renew(stream_id, until=self.clock() + self.EVENTS_HOLD_SECS)
                    await self.store.notifications_wanted(2 * self.EVENTS_KEEPALIVE_SECS)

                async def stats() -> list[bytes]:
                    if subscriber.queue is not None:
                        found = await self.queues_stats(tenant, subscriber.queue)
                    else:
                        found, _ = await self.queues_page(tenant, limit=self.MAX_STATS_QUEUES)
                    return [sse("stats", queue.to_wire()) for queue in found]

                async def fill(event: dict[str, Any]) -> dict[str, Any]:
                    job = await self.store.job_get(event["id"], tenant=tenant)
                    return {**event, "progress": None if job is None else job.last_progress}

                async with aclosing(
                    chunks(subscriber, keepalive_secs=self.EVENTS_KEEPALIVE_SECS, keep=keep, stats_secs=stats_secs,
                           stats=stats, fill=fill)
                ) as stream:  # fmt: skip
                    async for chunk in stream:
                        yield chunk
            finally:
                # The registration goes even when the client went away.
                with trio.CancelScope(shield=True), trio.move_on_after(self.WAIT_END_SECS):
                    await self.store.events_end(stream_id)
        finally:
            self.events.close_one(subscriber)

    async def jobs_list(
        self,
        tenant: str,
        *,
        queue: str | None = None,
        status: Status | None = None,
        kind: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> tuple[list[Job], str | None]:
        """A page of jobs, newest first, and the cursor of the next page
        (None on the last page): *limit* jobs, or fewer where more would
        pass :attr:`max_answer_bytes`."""
        before = decode_cursor(cursor) if cursor else None
        page = await self.store.jobs_page(
            tenant=tenant, queue=queue, status=status, kind=kind, limit=limit, before=before,
            max_bytes=self.max_answer_bytes,
        )  # fmt: skip
        return page.items, None if page.next is None else encode_cursor(page.next)

    async def job_cancel(self, tenant: str, job_id: str) -> Job:
        job = await self.store.job_cancel(job_id, tenant=tenant, now=self.clock())
        if job is None:
            raise errors.NotFound(f"job {job_id} not found")
        # A running job of a key frees its place (a pending one's costs a
        # claim for nothing: cancels are rare). A workflow's steps have no key.
        self.waker.after_change((), freed=job.concurrency is not None)
        return job

    async def job_retry(self, tenant: str, job_id: str) -> Job:
        job = await self.store.job_retry(job_id, tenant=tenant, now=self.clock())
        if job is None:
            raise errors.NotFound(f"job {job_id} not found")
        self.waker.notify(job.queue)
        return job

    async def queues_stats(self, tenant: str, queue: str | None = None) -> list[QueueStats]:
        """Stats of every queue the tenant has jobs in or has paused (of
        *queue* only when given), sorted by name; exact counts, at a cost
        that does not grow with the number of jobs kept."""
        return await self.store.queues_stats(tenant=tenant, now=self.clock(), queue=queue)

    async def queues_page(
        self, tenant: str, *, limit: int = QUEUES_PAGE, cursor: str | None = None
    ) -> tuple[list[QueueStats], str | None]:
        """A page of :meth:`queues_stats`, by name, and the cursor of the
        next page (None on the last page): O(*limit*), however many queues
        the tenant has."""
        after = decode_queue_cursor(cursor) if cursor else None
        stats = await self.store.queues_page(tenant=tenant, now=self.clock(), limit=limit + 1, after=after)
        if len(stats) > limit:
            stats = stats[:limit]
            return stats, encode_queue_cursor(stats[-1].queue)
        return stats, None

    # -- operations ----------------------------------------------------------

    async def queue_pause(self, tenant: str, queue: str) -> QueueStats:
        """Pause the tenant's *queue* on every server (idempotent): leases
        hand out none of its jobs, long polls on it wait; running jobs go on
        and report. Returns the queue's stats."""
        return await self._set_paused(tenant, queue, True)

    async def queue_resume(self, tenant: str, queue: str) -> QueueStats:
        """Resume the tenant's *queue* (idempotent); its parked long polls
        look again at once, on every server. Returns the queue's stats."""
        return await self._set_paused(tenant, queue, False)

    async def _set_paused(self, tenant: str, queue: str, paused: bool) -> QueueStats:
        now = self.clock()
        await self.store.queue_set_paused(tenant=tenant, queue=queue, paused=paused, now=now)
        if not paused:
            self.waker.notify(queue)
        (stats,) = await self.store.queues_stats(tenant=tenant, now=now, queue=queue)
        return stats

    #: Jobs per transaction of a bulk action.
    BULK_BATCH = 1000

    async def jobs_bulk(
        self,
        tenant: str,
        action: BulkAction,
        *,
        queue: str | None = None,
        status: Status | None = None,
        kind: str | None = None,
        created_after: float | None = None,
        created_before: float | None = None,
        limit: int = 10_000,
    ) -> int:
        """Retry, cancel or delete the tenant's jobs matching the filters,
        at most *limit*, newest first, in batches of :attr:`BULK_BATCH` jobs
        (one transaction each), each job decided as the single-job call
        decides it. Returns how many jobs changed.

        Raises:
            InvalidInput: *status* is not one *action* applies to (retry:
                failed, cancelled; cancel: pending, running; delete:
                completed, failed, cancelled), or *action* is unknown.
        """
        if action not in transitions.BULK_STATUSES:
            raise errors.InvalidInput(f"action: not one of retry, cancel, delete: {action!r}")
        where = BulkFilter(
            tenant=tenant,
            statuses=transitions.bulk_statuses(action, status),
            queue=queue,
            kind=kind,
            created_after=created_after,
            created_before=created_before,
        )
        changed = 0
        after: tuple[float, str] | None = None
        while changed < limit:
            batch = await self.store.jobs_bulk(
                action, where, limit=min(self.BULK_BATCH, limit - changed), after=after, now=self.clock()
            )
            changed += batch.changed
            self.waker.after_change(batch.ready_queues, freed=batch.keyed)
            if batch.last is None:
                break
            after = batch.last
        return changed

    async def jobs_failed_since(self, tenant: str, since: float, *, limit: int = 50) -> tuple[int, bool]:
        """How many of the tenant's dead letters (jobs ``failed`` for good)
        failed at or after *since*, counted among its *limit* newest dead
        letters (by creation), and whether that count reached *limit* (more
        may have failed). One page of the filtered list, so the cost does not
        grow with the dead letters kept; a job created before the newest
        *limit* dead letters that failed since goes uncounted. Large dead
        letters count among fewer: the page stops at
        :attr:`max_answer_bytes`, as a listing does."""
        page = await self.store.jobs_page(
            tenant=tenant, status=Status.FAILED, limit=limit, max_bytes=self.max_answer_bytes
        )
        at = to_datetime(since)
        failed = sum(1 for job in page.items if job.updated_at >= at)
        return failed, failed == len(page.items) and (failed >= limit or page.next is not None)

    async def jobs_scheduled(self, tenant: str, *, queue: str | None = None, limit: int = 100) -> list[Job]:
        """The tenant's pending jobs whose time has not come (delayed,
        waiting for a retry, snoozed), next to run first, at most *limit*."""
        return await self.store.jobs_scheduled(tenant=tenant, now=self.clock(), queue=queue, limit=limit)

    async def workers(self, tenant: str) -> list[WorkerInfo]:
        """The workers the tenant sees (docs/operations.md): those holding
        its running jobs, and those whose lease calls in the last
        :attr:`WORKERS_SEEN_SECS` named a queue holding its jobs, idle ones
        included; most jobs first, then the latest seen, at most
        :attr:`MAX_WORKERS_LISTED`. Costs O(running jobs + sightings), both
        bounded."""
        seen_since = self.clock() - self.WORKERS_SEEN_SECS
        workers = await self.store.workers(tenant=tenant, seen_since=seen_since)
        return workers[: self.MAX_WORKERS_LISTED]

    async def _write_sightings(self, pairs: list[tuple[str, str]]) -> list[None]:
        await self.store.workers_seen(sorted(set(pairs)), now=self.clock())
        return [None] * len(pairs)

    # -- dashboard sessions --------------------------------------------------

    async def session_create(self, tenant: str, token: str) -> tuple[str, DashboardSession]:
        """A new dashboard session of *tenant*, signed in with *token*
        (:meth:`Sessions.create <qftrio.server.sessions.Sessions.create>`)."""
        return await self.sessions.create(tenant, token)

    async def session_get(
        self, session_id: str, tokens_of: Callable[[str], Iterable[bytes]]
    ) -> DashboardSession | None:
        """The valid session of *session_id*, or None
        (:meth:`Sessions.get <qftrio.server.sessions.Sessions.get>`)."""
        return await self.sessions.get(session_id, tokens_of)

    async def session_delete(self, session_id: str) -> None:
        """Sign the session out (idempotent): its id is worth nothing from now on."""
        await self.sessions.delete(session_id)

    # -- workflows -----------------------------------------------------------

    async def workflow_create(self, tenant: str, body: WorkflowCreateRequest) -> Workflow:
        """Check the step graph (422 naming the problem, nothing stored),
        then store the workflow and enqueue its first steps in one
        transaction."""
        workflow = await self.store.workflow_create(new_workflow(tenant, body), now=self.clock())
        started = {s.job.queue for s in workflow.steps if s.job is not None}
        self._count_enqueued((s.job.queue, s.job.kind) for s in workflow.steps if s.job is not None)
        for queue in started:
            self.waker.notify(queue)
        return workflow

    async def steps_add(self, job_id: str, body: StepsAddRequest) -> Workflow:
        """Add steps to the workflow of the running step *job_id* (DESIGN §4,
        "Steps added at run time"): 404 for an unknown job, 409 when the
        lease is lost or the step added other steps of these names, 422 for
        steps that do not fit the workflow; nothing added then. Added steps
        get their jobs once the adding step completes, so nobody is woken."""
        workflow = await self.store.steps_add(new_steps(job_id, body), now=self.clock())
        if workflow is None:
            raise errors.NotFound("job not found")
        return workflow

    async def workflow_get(self, tenant: str, workflow_id: str) -> Workflow:
        workflow = await self.store.workflow_get(workflow_id, tenant=tenant)
        if workflow is None:
            raise errors.NotFound(f"workflow {workflow_id} not found")
        return workflow

    async def workflows_list(
        self, tenant: str, *, status: WorkflowStatus | None = None, limit: int = 50, cursor: str | None = None
    ) -> tuple[list[Workflow], str | None]:
        """A page of workflows, newest first (steps without their jobs), and
        the cursor of the next page (None on the last page): *limit*
        workflows, or fewer where more would pass :attr:`max_answer_bytes`."""
        before = decode_cursor(cursor) if cursor else None
        page = await self.store.workflows_page(
            tenant=tenant, status=status, limit=limit, before=before, max_bytes=self.max_answer_bytes
        )
        return page.items, None if page.next is None else encode_cursor(page.next)

    async def workflow_cancel(self, tenant: str, workflow_id: str) -> Workflow:
        workflow = await self.store.workflow_cancel(workflow_id, tenant=tenant, now=self.clock())
        if workflow is None:
            raise errors.NotFound(f"workflow {workflow_id} not found")
        return workflow

    # -- schedules -----------------------------------------------------------

    #: Due schedules per transaction of a janitor round.
    SCHEDULES_BATCH = schedule_firing.SCHEDULES_BATCH

    async def _check_rate_limits(self, tenant: str, configs: Sequence[JobConfig], field: str, now: float) -> None:
        """Refuse (422 naming *field*) a job config naming a rate limit the
        tenant has not declared: it would hold nothing back."""
        named = {cfg.rate_limit for cfg in configs if cfg.rate_limit is not None}
        if named:
            known = {r.name for r in await self.store.rate_limits_list(tenant=tenant, now=now, names=sorted(named))}
            if named - known:
                raise errors.InvalidInput(f"{field}: no rate limit named {min(named - known)!r}")

    async def schedule_put(self, tenant: str, name: str, body: ScheduleRequest) -> tuple[Schedule, bool]:
        """Create or replace the tenant's schedule *name*; whether it was
        created. Refused (422 naming the field, nothing stored): a cron that
        cannot fire, an unknown time zone, a job enqueue would refuse, and a
        job config with ``scheduled_at`` or ``idempotency_key`` (each tick is
        due at its own time, and enqueues a job of its own)."""
        schedules.check(body.cron, body.timezone)
        cfg = body.job.config
        if cfg.scheduled_at is not None:
            raise errors.InvalidInput("job.config.scheduled_at: a schedule's job is due at each tick (give delay_secs)")
        if cfg.idempotency_key is not None:
            raise errors.InvalidInput("job.config.idempotency_key: each tick of a schedule enqueues a job of its own")
        await self._check_rate_limits(tenant, [cfg], "job.config.rate_limit", self.clock())
        new = NewSchedule(
            tenant=tenant, name=name, cron=body.cron, timezone=body.timezone,
            job=body.job.model_dump(mode="json", exclude_none=True), paused=body.paused, catch_up=body.catch_up,
        )  # fmt: skip
        return await self.store.schedule_put(new, now=self.clock())

    async def schedule_get(self, tenant: str, name: str) -> Schedule:
        schedule = await self.store.schedule_get(tenant, name)
        if schedule is None:
            raise errors.NotFound(f"schedule {name} not found")
        return schedule

    async def schedules_list(self, tenant: str, *, limit: int = 100, cursor: str | None = None) -> tuple[list[Schedule], str | None]:
        """A page of the tenant's schedules by name, and the cursor of the
        next page (the last name; None on the last page)."""
        found = await self.store.schedules_list(tenant, limit=limit + 1, after=cursor)
        if len(found) > limit:
            found = found[:limit]
            return found, found[-1].name
        return found, None

    async def schedule_delete(self, tenant: str, name: str) -> None:
        """Delete the schedule; the jobs it enqueued stay."""
        if not await self.store.schedule_delete(tenant, name):
            raise errors.NotFound(f"schedule {name} not found")

    async def schedule_pause(self, tenant: str, name: str) -> Schedule:
        """Pause the schedule (idempotent): no tick fires until resumed."""
        return await self._schedule_set_paused(tenant, name, True)

    async def schedule_resume(self, tenant: str, name: str) -> Schedule:
        """Resume the schedule (idempotent) from its next tick: the ticks
        of the pause are not caught up."""
        return await self._schedule_set_paused(tenant, name, False)

    async def _schedule_set_paused(self, tenant: str, name: str, paused: bool) -> Schedule:
        schedule = await self.store.schedule_set_paused(tenant, name, paused=paused, now=self.clock())
        if schedule is None:
            raise errors.NotFound(f"schedule {name} not found")
        return schedule

    async def schedule_trigger(self, tenant: str, name: str) -> tuple[Schedule, Job]:
        """Enqueue one job of the schedule now, besides its ticks (paused or
        not); its next run stays."""
        triggered = await self.store.schedule_trigger(
            tenant, name, now=self.clock(), job_of=schedule_firing.job_of_schedule
        )
        if triggered is None:
            raise errors.NotFound(f"schedule {name} not found")
        schedule, inserted = triggered
        self._enqueued_by_schedules([inserted])
        return schedule, inserted.job

    async def fire_schedules(self) -> int:
        """Fire every due tick of every schedule (the janitor's round, on
        every server: each tick enqueues one job whichever server wins it),
        :attr:`SCHEDULES_BATCH` schedules per transaction. Returns how many
        jobs it enqueued."""
        return await schedule_firing.fire_due(
            self.store, self.clock, self._enqueued_by_schedules, batch=self.SCHEDULES_BATCH
        )

    def _enqueued_by_schedules(self, inserted: Sequence[Inserted]) -> None:
        self._count_enqueued((i.new.queue, i.new.kind) for i in inserted)
        for queue in {i.new.queue for i in inserted}:
            self.waker.notify(queue)

    # -- worker side -------------------------------------------------------

    async def lease(
        self,
        queue: str,
        *,
        max_jobs: int = 1,
        lease_secs: float = 60,
        wait_secs: float = 0,
        worker_id: str | None = None,
    ) -> list[Lease]:
        """Claim up to *max_jobs*, waiting up to *wait_secs* for the first.

        Returns as soon as anything is claimed, when the wait runs out (empty),
        or when the server begins shutting down (empty). Cancelling the
        calling task (a disconnected client) abandons the wait; a claim that
        already committed is not rolled back, and its lease simply expires.
        """
        started = trio.current_time()
        deadline = started + wait_secs
        unseen = worker_id is not None
        while True:
            # Parked before the claim: work made ready while the claim is
            # under way, which it may not see, wakes this poll all the same.
            parked = self.waker.park(
                ClaimRequest(queue=queue, limit=max_jobs, lease_secs=lease_secs, worker_id=worker_id)
            )
            try:
                leases = await self._claim(queue, max_jobs, float(lease_secs), worker_id)
                if unseen and worker_id is not None:
                    # Recorded after the first claim, so that it never delays one.
                    unseen = False
                    if self.sightings.due(worker_id, queue, self.clock()):
                        await self._sighted([(worker_id, queue)])
                if leases:
                    self._count_leased(leases)
                    return leases
                remaining = deadline - trio.current_time()
                if remaining <= 0 or self.closing:
                    return []
                parked.waiting = True
                # Listening before the check: work another server makes
                # ready after it is notified to this poll.
                await self.store.notifications_wanted(remaining)
                now = self.clock()
                next_at = await self.store.queue_next_available_at(queue, now=now)
                timeout = min(remaining, self.safety_poll_secs)
                if next_at is not None:
                    timeout = min(timeout, max(0.0, next_at - now) + 0.001)
                with trio.move_on_after(timeout):
                    await parked.event.wait()
                if parked.taken and not parked.event.is_set():
                    # An enqueue is claiming for this poll; its transaction
                    # ends moments from now. (Once it has, no schedule point
                    # before the answer: see enqueue.)
                    await parked.event.wait()
            finally:
                self.waker.unpark(parked)
            if parked.leases:
                self._count_leased(parked.leases)
                return parked.leases

    async def _claim(self, queue: str, limit: int, lease_secs: float, worker_id: str | None) -> list[Lease]:
        """Claim for one long-poll; polls of the same queue, lease length
        and worker id that claim at the same time share a store call, the
        jobs dealt out in lease order, oldest poll first."""
        key = (queue, lease_secs, worker_id)
        coalescer = self._claims.get(key)
        if coalescer is None:
            coalescer = self._claims[key] = Batcher(functools.partial(self._claim_batch, key))
        try:
            (leases,) = await coalescer([limit])
        finally:
            if coalescer.idle and self._claims.get(key) is coalescer:
                del self._claims[key]
        return leases

    async def _claim_batch(self, key: tuple[str, float, str | None], limits: list[int]) -> list[list[Lease]]:
        queue, lease_secs, worker_id = key
        leases = await self.store.jobs_claim(
            queue, limit=sum(limits), lease_secs=lease_secs, worker_id=worker_id, now=self.clock()
        )
        dealt = []
        for limit in limits:
            dealt.append(leases[:limit])
            leases = leases[limit:]
        return dealt

    async def heartbeat(self, items: Sequence[HeartbeatItem]) -> list[HeartbeatResult]:
        results = await self._heartbeats(items)
        # The progress a batch carries is recorded after the leases are
        # extended, for the jobs still running: one more transaction, only
        # for a batch that has any.
        beats = [
            ProgressItem(item.job_id, item.lease_token, item.progress)
            for item, result in zip(items, results)
            if item.progress is not None and result.status is Status.RUNNING
        ]
        if beats:
            await self.store.jobs_progress(beats, now=self.clock())
        await self._count_conflicts(items, results)
        return results

    async def progress(self, items: Sequence[ProgressItem]) -> list[HeartbeatResult]:
        """Record handlers' progress under their leases (a heartbeat's
        answers, extending nothing)."""
        results = await self.store.jobs_progress(items, now=self.clock())
        await self._count_conflicts(items, results)
        return results

    async def complete(self, items: Sequence[CompleteItem]) -> list[ReportResult]:
        results = await self._completes(items)
        self._count_ended(results, self.clock())
        wake_after_reports(self.waker, results, retried=False)
        await self._count_conflicts(items, results)
        return results

    async def fail(self, items: Sequence[FailItem]) -> list[ReportResult]:
        results = await self._fails(items)
        self._count_ended(results, self.clock())
        wake_after_reports(self.waker, results, retried=True)
        await self._count_conflicts(items, results)
        return results

    async def snooze(self, items: Sequence[SnoozeItem]) -> list[ReportResult]:
        """Put running jobs back to pending for a while without using up
        their attempt (:func:`~qftrio.server.transitions.snooze`)."""
        results = await self._snoozes(items)
        # parked long-polls recompute their wait
        wake_after_reports(self.waker, results, retried=True)
        await self._count_conflicts(items, results)
        return results

    async def _count_conflicts(
        self,
        items: Sequence[HeartbeatItem | CompleteItem | FailItem | SnoozeItem],
        results: Sequence[HeartbeatResult | ReportResult],
    ) -> None:
        """Count the stale-token refusals by their jobs' queue and kind. A
        refusal's result carries neither, and refusals are rare (a worker
        that lost its lease), so each one's job is looked up here rather
        than the hot report statements returning them for every item."""
        for item, result in zip(items, results):
            if result.outcome is Outcome.CONFLICT:
                job = await self.store.job_get(item.job_id)
                queue, kind = (job.queue, job.kind) if job is not None else ("", "")
                self.metrics.of(self.metrics.stale_token, queue, kind).inc()

    # -- janitor -----------------------------------------------------------

    async def reap_expired(self) -> int:
        """Take back the jobs whose lease ran out (:func:`~qftrio.server.janitor.reap_expired`)."""
        return await janitor.reap_expired(self)

    async def run_janitor(
        self,
        *,
        interval_secs: float = 1.0,
        retention_secs: float | None = None,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
    ) -> None:
        """Fire due schedules, reap expired leases and compact the store's
        counts every *interval_secs*; with *retention_secs*, also prune
        completed and cancelled jobs older than that; every
        :attr:`PURGE_EVERY_SECS`, forget old worker sightings and expired
        dashboard sessions. Runs until cancelled; store errors are
        logged and retried next round."""
        await janitor.run_janitor(
            self, interval_secs=interval_secs, retention_secs=retention_secs, task_status=task_status
        )

    async def run_listener(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Forward the store's cross-process wake-ups to parked long-polls."""

        def on_notify(queue: str) -> None:
            if queue == ALL_QUEUES:
                self.waker.notify_all()
            else:
                self.waker.notify(queue)

        await self.store.run_listener(on_notify, task_status=task_status)
