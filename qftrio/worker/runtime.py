"""The worker runtime: lease jobs, run their handlers, heartbeat, report.

Task tree of one :meth:`Worker.run`::

    run                                   cancel scope: Worker.cancel()
    ├── reports                           Batchers of heartbeat/complete/fail,
    │                                     and the heartbeat starter
    └── jobs nursery
        ├── lease loop                    cancel scope: Worker.stop()
        └── one task per held job         its nursery, whose cancel scope is
            ├── heartbeat loop              the job's: it holds the heartbeat
            └── wait for a lane, handler    loop and the handler; then the
                then the report             report, bounded by the lease

The heartbeat loop of a job is started in the job's nursery when its first
heartbeat falls due (``lease_secs/2`` after the claim) by the heartbeat
starter, one task for the whole worker: most jobs are over long before, and
a task less per job is much of a short job's cost. Once started, it runs in
the job's cancel scope like the handler, as if it had been there all along.

Rules (DESIGN §7, and the protocol's "rules that keep at-least-once honest"):

* A job is heartbeated from the moment it is claimed, every ``lease_secs/2``,
  also while it waits for a lane (a batch lease holds more jobs than lanes).
* A ``409``, a ``404``, or any status but ``running`` cancels the job's scope:
  the handler is cancelled at its next checkpoint and nothing is reported.
* Heartbeats that cannot land are retried; shortly before the lease runs out
  the handler is cancelled and a retryable fail is attempted.
* Reports are retried with backoff until the lease runs out, then given up
  (``unreported``): the job then runs again elsewhere, which is why handlers
  must be idempotent.
* Lease calls back off with jitter on transport errors (``waiting``), forever:
  a server restart is ridden out. ``401``/``403`` stop the worker.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import math
import os
import random
import socket
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any, Literal

import trio

from .. import errors
from .._json import dumps_strict as json_dumps
from ..models import MAX_LEASE_JOBS, MAX_LEASE_SECS, MAX_WAIT_SECS, Job, Lease, valid_name
from .registry import Handler, Registry
from .transport import Batcher, CompleteItem, FailItem, HeartbeatItem, HeartbeatReply, ReportReply, Transport

__all__ = ["Worker", "validate_options", "WorkerEvent", "WorkerStatistics", "open_worker", "default_worker_id"]

log = logging.getLogger("qftrio.worker")

EventType = Literal["claimed", "completed", "failed", "lost", "unreported", "waiting", "stopping"]

_LEVELS = {
    "claimed": logging.INFO,
    "completed": logging.INFO,
    "failed": logging.WARNING,
    "lost": logging.WARNING,
    "unreported": logging.WARNING,
    "waiting": logging.WARNING,
    "stopping": logging.INFO,
}

# Backoff of retried calls (seconds): the first retry comes after about
# ``base``, doubling up to ``cap``; each wait is scaled by a random factor in
# [0.5, 1] so that a fleet of workers does not retry in lockstep.
LEASE_BACKOFF = (0.5, 15.0)
REPORT_BACKOFF = (0.25, 5.0)

#: Seconds allowed between the server claiming a job and the worker getting
#: the answer; the worker reckons its lease from then.
CLAIM_SLACK = 0.1


def backoff(failures: int, base: float, cap: float, rand: Callable[[], float] = random.random) -> float:
    raw = min(cap, base * 2 ** max(0, failures - 1))
    return raw * (0.5 + 0.5 * rand())


def default_worker_id() -> str:
    """``host-pid``: unique per process, and says where a job runs."""
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class WorkerEvent:
    """Something the worker did, for logs and dashboards.

    Attributes:
        type: ``claimed`` (a job was leased), ``completed``, ``failed`` (the
            fail report landed; *retryable* says which kind), ``lost`` (the
            server took the job back: cancelled, lease lost; nothing was or
            will be reported), ``unreported`` (the report could not land
            before the lease ran out), ``waiting`` (a lease call failed; the
            next try comes after *delay* seconds), ``stopping``.
        job_id, kind, attempt: the job's, when the event is about one.
        lane: the lane (1..lanes) running it; ``None`` while it waits for one.
        error: what went wrong, in words.
        retryable: for ``failed``, whether the job will be retried (if
            attempts are left).
        delay: for ``waiting``, seconds until the next lease call.
    """

    type: EventType
    job_id: str | None = None
    kind: str | None = None
    attempt: int | None = None
    lane: int | None = None
    error: str | None = None
    retryable: bool | None = None
    delay: float | None = None

    def __str__(self) -> str:
        parts: list[str] = [self.type]
        if self.job_id is not None:
            parts.append(f"job {self.job_id} ({self.kind}, attempt {self.attempt})")
        if self.lane is not None:
            parts.append(f"lane {self.lane}")
        if self.retryable is not None:
            parts.append("retryable" if self.retryable else "not retryable")
        if self.delay is not None:
            parts.append(f"retrying in {self.delay:.1f} s")
        if self.error:
            parts.append(f"- {self.error}")
        return " ".join(parts)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class WorkerStatistics:
    """Held jobs (running or waiting for a lane), those running, and
    whether the worker is draining."""

    held: int
    running: int
    lanes: int
    stopping: bool


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class _Outcome:
    result: dict[str, Any] | None = None
    error: str | None = None
    retryable: bool = True

    @property
    def ok(self) -> bool:
        return self.error is None


@dataclasses.dataclass(eq=False, slots=True)
class _Held:
    """One leased job, from claim to report."""

    lease: Lease
    claimed_at: float  # Trio time from which the first lease is reckoned
    deadline: float  # Trio time at which our lease ends, by our own reckoning
    # The job's cancel scope (its nursery's), and the nursery while the
    # handler may still run: the heartbeat starter starts the heartbeat loop
    # in it.
    scope: trio.CancelScope | None = None
    nursery: trio.Nursery | None = None
    beat_scope: trio.CancelScope | None = None  # the heartbeat loop's, once started
    beat_due: bool = False  # the first heartbeat fell due before the job's task ran
    lane: int | None = None  # the lane it holds now
    ran_in: int | None = None  # the lane it ran in, for events after it left
    lane_ready: trio.Event | None = None  # made only when the job must wait for a lane
    lost: str | None = None  # why the server took it back
    expiring: bool = False  # renewals failed and the lease is about to end
    finished: bool = False  # the handler is done: the job holds no lane
    last_error: str | None = None

    @property
    def job(self) -> Job:
        return self.lease.job


class _Lanes:
    """Lanes handed out in lease order (a Trio semaphore wakes waiters in
    FIFO order too, but tasks started together reach it in no set order)."""

    def __init__(self, n: int) -> None:
        self._free = list(range(n, 0, -1))  # pop() gives the lowest
        self._waiting: collections.deque[_Held] = collections.deque()
        self.busy = 0

    def enqueue(self, held: _Held) -> None:
        if self._free:
            self._give(held, self._free.pop())
        else:
            self._waiting.append(held)

    def _give(self, held: _Held, lane: int) -> None:
        held.lane = held.ran_in = lane
        self.busy += 1
        if held.lane_ready is not None:
            held.lane_ready.set()

    def leave(self, held: _Held) -> None:
        """*held* no longer needs its lane (or its place in line)."""
        if held.lane is None:
            with contextlib.suppress(ValueError):
                self._waiting.remove(held)
            return
        lane, held.lane = held.lane, None
        self.busy -= 1
        if self._waiting:
            self._give(self._waiting.popleft(), lane)
        else:
            self._free.append(lane)
            self._free.sort(reverse=True)


#: Stands in for a timeout scope when a handler has none: entering a cancel
#: scope per job costs more than the whole of a short handler.
_NO_TIMEOUT = contextlib.nullcontext()


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _is_fatal(exc: BaseException) -> bool:
    return isinstance(exc, (errors.Unauthorized, errors.Forbidden))


def validate_options(
    queue: str, registry: Registry, *, lanes: int, batch: int, lease_secs: int, wait_secs: float
) -> None:
    """Raise :class:`~qftrio.errors.ConfigError` for a :class:`Worker`
    option out of range."""
    if not valid_name(queue):
        raise errors.ConfigError(f"queue {queue!r}: use 1-128 characters of A-Z a-z 0-9 _ . -")
    if not isinstance(registry, Registry):
        raise errors.ConfigError(f"registry: expected a qftrio Registry, not {type(registry).__name__}")
    if not (isinstance(lanes, int) and lanes >= 1):
        raise errors.ConfigError(f"lanes must be a positive integer, not {lanes!r}")
    if not (isinstance(batch, int) and 1 <= batch <= MAX_LEASE_JOBS):
        raise errors.ConfigError(f"batch must be an integer from 1 to {MAX_LEASE_JOBS}, not {batch!r}")
    if not (isinstance(lease_secs, int) and 1 <= lease_secs <= MAX_LEASE_SECS):
        raise errors.ConfigError(f"lease_secs must be an integer from 1 to {MAX_LEASE_SECS}, not {lease_secs!r}")
    if not (0 <= wait_secs <= MAX_WAIT_SECS):
        raise errors.ConfigError(f"wait_secs must be from 0 to {MAX_WAIT_SECS}, not {wait_secs!r}")


class Worker:
    """Runs the handlers of *registry* for jobs leased from *queue*.

    Args:
        transport: :class:`~qftrio.worker.transport.HttpTransport` (a
            :class:`~qftrio.Client` with a worker token) or
            :class:`~qftrio.worker.transport.EngineTransport` (in-process).
        queue: the queue to lease from.
        registry: the handlers, by job kind.
        lanes: jobs run at once.
        batch: jobs leased per call (1..100). Above 1, jobs may wait for a
            lane; they are heartbeated meanwhile.
        lease_secs: the lease asked for, and each renewal's extension.
            Heartbeats go every ``lease_secs/2``; a crashed worker's jobs
            wait up to this long before running elsewhere.
        wait_secs: the long-poll of each lease call (0..60).
        worker_id: recorded on every job it holds; ``host-pid`` by default.
        on_event: called with every :class:`WorkerEvent` (also logged to the
            ``qftrio.worker`` logger). It must not block; what it raises is
            logged and ignored.

    Raises:
        ConfigError: an argument out of range.
    """

    def __init__(
        self,
        transport: Transport,
        queue: str,
        registry: Registry,
        *,
        lanes: int = 4,
        batch: int = 1,
        lease_secs: int = 60,
        wait_secs: float = 20,
        worker_id: str | None = None,
        on_event: Callable[[WorkerEvent], object] | None = None,
    ) -> None:
        validate_options(queue, registry, lanes=lanes, batch=batch, lease_secs=lease_secs, wait_secs=wait_secs)
        self.transport = transport
        self.queue = queue
        self.registry = registry
        self.lanes = lanes
        self.batch = batch
        self.lease_secs = lease_secs
        self.wait_secs = wait_secs
        self.worker_id = worker_id or default_worker_id()
        self.on_event = on_event
        #: Heartbeat period.
        self.heartbeat_secs = lease_secs / 2
        #: How long before the lease ends a job whose renewals fail is given
        #: up: time left for the retryable fail to land.
        self.abort_margin_secs = min(5.0, lease_secs * 0.2)

        self._ran = False
        self._stopping = False
        self._cancelled = False
        self._fatal: BaseException | None = None
        self._root_scope: trio.CancelScope | None = None
        self._lease_scope = trio.CancelScope()
        self._held: dict[str, _Held] = {}
        self._unfinished = 0  # held jobs whose handler has not finished
        self._lanes_pool = _Lanes(lanes)
        self._changed: trio.Event | None = None  # set up by the lease loop when it waits
        self._starter_idle: trio.Event | None = None  # set up by the heartbeat starter when it waits
        self._heartbeats: Batcher[HeartbeatItem, HeartbeatReply] | None = None
        self._completes: Batcher[CompleteItem, ReportReply] | None = None
        self._fails: Batcher[FailItem, ReportReply] | None = None

    def __repr__(self) -> str:
        return f"<Worker {self.worker_id} queue={self.queue!r} lanes={self.lanes}>"

    # -- control -----------------------------------------------------------

    def stop(self) -> None:
        """Graceful stop: lease nothing more, finish the jobs held, then let
        :meth:`run` return. An in-flight long-poll is abandoned (should the
        server have claimed a job for it meanwhile, that job's lease expires
        and it runs elsewhere). Idempotent."""
        if self._stopping or self._cancelled:
            return
        self._stopping = True
        self._emit(WorkerEvent(type="stopping", error=f"finishing {len(self._held)} held job(s)"))
        self._lease_scope.cancel()

    def cancel(self) -> None:
        """Hard stop: cancel every handler now and report nothing. The jobs'
        leases expire and other workers take them over. Idempotent."""
        if self._cancelled:
            return
        if not self._stopping:
            self._emit(WorkerEvent(type="stopping", error=f"cancelling {len(self._held)} held job(s)"))
        self._stopping = self._cancelled = True
        self._lease_scope.cancel()
        if self._root_scope is not None:
            self._root_scope.cancel()

    def statistics(self) -> WorkerStatistics:
        return WorkerStatistics(
            held=len(self._held), running=self._lanes_pool.busy, lanes=self.lanes, stopping=self._stopping
        )

    # -- main --------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[Worker] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until stopped (:meth:`stop` or :meth:`cancel`) or cancelled.

        ``await nursery.start(worker.run)`` returns the worker itself, the
        handle with :meth:`stop` and :meth:`cancel`.

        Raises:
            Unauthorized, Forbidden: the server refused the worker's
                credential; held jobs were abandoned.
        """
        if self._ran:
            raise RuntimeError("a Worker runs once; make a new one")
        self._ran = True
        t = self.transport
        self._heartbeats = Batcher(t.heartbeat, linger=t.coalesce_secs, max_inflight=t.max_inflight, name="heartbeat")
        self._completes = Batcher(t.complete, linger=t.coalesce_secs, max_inflight=t.max_inflight, name="complete")
        self._fails = Batcher(t.fail, linger=t.coalesce_secs, max_inflight=t.max_inflight, name="fail")
        log.info(
            "worker %s on queue %r: lanes=%d batch=%d lease=%ds kinds=%s",
            self.worker_id,
            self.queue,
            self.lanes,
            self.batch,
            self.lease_secs,
            ",".join(self.registry.kinds) or "-",
        )
        with trio.CancelScope() as self._root_scope:
            if self._cancelled:
                self._root_scope.cancel()
            async with trio.open_nursery() as reports:
                for batcher in (self._heartbeats, self._completes, self._fails):
                    await reports.start(batcher.run)
                reports.start_soon(self._heartbeat_starter, name="qftrio heartbeat starter")
                async with trio.open_nursery() as jobs:
                    jobs.start_soon(self._lease_loop, jobs)
                    task_status.started(self)
                # Every job has reported (or given up): the batchers can go.
                reports.cancel_scope.cancel()
        if self._fatal is not None:
            raise self._fatal

    def _die(self, exc: BaseException) -> None:
        """Stop everything because of *exc*, which :meth:`run` raises."""
        if self._fatal is None:
            self._fatal = exc
            log.error("worker %s stopping: %s", self.worker_id, exc)
        self.cancel()

    def _emit(self, event: WorkerEvent) -> None:
        level = _LEVELS[event.type]
        if log.isEnabledFor(level):
            log.log(level, "%s", event)
        if self.on_event is not None:
            try:
                self.on_event(event)
            except Exception:
                log.exception("on_event callback failed")

    def _job_event(self, type: EventType, held: _Held, **kw: Any) -> None:
        # Most workers have no listener and log events below the level
        # shown: then no event is built at all.
        if self.on_event is None and not log.isEnabledFor(_LEVELS[type]):
            return
        job = held.job
        self._emit(WorkerEvent(type=type, job_id=job.id, kind=job.kind, attempt=job.attempt, lane=held.ran_in, **kw))

    def _notify_changed(self) -> None:
        # Only the lease loop waits for a change, and only when every lane
        # is taken: no Event is made (and none set) while nobody waits.
        changed = self._changed
        if changed is not None:
            self._changed = None
            changed.set()

    # -- leasing -----------------------------------------------------------

    async def _lease_loop(self, jobs: trio.Nursery) -> None:
        failures = 0
        with self._lease_scope:
            while not self._stopping:
                # Lease when a lane is free (a batch may overfill), counting
                # jobs whose handler finished as gone: their reports travel
                # in the background, and waiting for them would idle the
                # lanes for a round trip per batch. The second bound keeps
                # reports that lag from piling up without end.
                while self._unfinished >= self.lanes or len(self._held) >= self.lanes + 2 * self.batch:
                    self._changed = changed = trio.Event()
                    await changed.wait()
                sent_at = trio.current_time()
                try:
                    leases = await self.transport.lease(
                        self.queue,
                        max_jobs=self.batch,
                        lease_secs=self.lease_secs,
                        wait_secs=self.wait_secs,
                        worker_id=self.worker_id,
                    )
                except errors.QftrioError as exc:
                    if _is_fatal(exc):
                        self._die(exc)
                        return
                    failures += 1
                    delay = backoff(failures, *LEASE_BACKOFF)
                    self._emit(WorkerEvent(type="waiting", error=str(exc), delay=delay))
                    await trio.sleep(delay)
                    continue
                if failures:
                    log.info("worker %s: the server answers again", self.worker_id)
                    failures = 0
                if not leases and self.wait_secs > 0 and trio.current_time() - sent_at < min(self.wait_secs, 1.0) / 2:
                    # An empty answer that did not wait: a server shutting
                    # down answers long polls at once. Do not spin on it.
                    await trio.sleep(backoff(1, *LEASE_BACKOFF))
                    continue
                # No checkpoint from the lease's answer to here: a stop()
                # cannot drop jobs we were handed.
                #
                # When did the server claim them? A long poll may have waited
                # long before anything came, so not when we asked; just before
                # it answered, allowing CLAIM_SLACK for the answer's way back
                # (never before we asked).
                received_at = trio.current_time()
                claimed_at = max(sent_at, received_at - CLAIM_SLACK)
                deadline = claimed_at + self.lease_secs
                for lease in leases:
                    held = _Held(lease=lease, claimed_at=claimed_at, deadline=deadline)
                    self._held[lease.lease_token] = held
                    self._unfinished += 1
                    self._lanes_pool.enqueue(held)
                    self._job_event("claimed", held)
                    jobs.start_soon(self._hold, held, name=f"qftrio job {lease.job.id}")
                if leases and self._starter_idle is not None:
                    self._starter_idle.set()
                    self._starter_idle = None

    # -- one job -----------------------------------------------------------

    async def _hold(self, held: _Held) -> None:
        outcome: _Outcome | None = None
        reporting = False
        try:
            async with trio.open_nursery() as nursery:
                # The job's cancel scope: it holds the handler (this task)
                # and the heartbeat loop, once started.
                held.scope = scope = nursery.cancel_scope
                held.nursery = nursery
                if held.beat_due:
                    self._start_heartbeat(held)
                outcome = await self._execute(held)
                if held.beat_scope is not None:
                    held.beat_scope.cancel()  # stop heartbeating
                if not scope.cancel_called:
                    # Retried until the lease ends. The loop watches the
                    # deadline itself: setting one on the job's scope cost
                    # 5 of the 30 µs the runtime spends per job.
                    reporting = True
                    landed = await self._report(held, outcome, until=held.deadline)
                    reporting = not landed
            if reporting:
                self._job_event(
                    "unreported", held, error=held.last_error or "the lease ran out before the report landed"
                )
            elif held.expiring:
                # Renewals failed and the handler was cancelled: say so
                # while the lease lasts.
                if outcome is None:
                    reason = f": {held.last_error}" if held.last_error else ""
                    outcome = _Outcome(error=f"lease about to expire: heartbeats failed{reason}", retryable=True)
                with trio.move_on_at(held.deadline) as timer:
                    await self._report(held, outcome)
                if timer.cancelled_caught:
                    self._job_event(
                        "unreported", held, error=held.last_error or "the lease ran out before the report landed"
                    )
            if held.lost is not None:
                self._job_event("lost", held, error=held.lost)
        finally:
            self._finished(held)
            del self._held[held.lease.lease_token]
            self._notify_changed()

    def _finished(self, held: _Held) -> None:
        """*held*'s handler is done (or will never run): free its lane, and
        start no heartbeat loop for it any more."""
        if not held.finished:
            held.finished = True
            held.nursery = None
            self._unfinished -= 1
            self._lanes_pool.leave(held)

    def _start_heartbeat(self, held: _Held) -> None:
        assert held.nursery is not None
        # Made here, not in the loop: cancelling it stops a loop that has
        # not run yet.
        held.beat_scope = trio.CancelScope()
        held.nursery.start_soon(self._heartbeat_loop, held, name=f"qftrio heartbeat {held.job.id}")

    async def _heartbeat_starter(self) -> None:
        """Start each held job's heartbeat loop, in the job's nursery, when
        its first heartbeat falls due: ``heartbeat_secs`` after the claim.

        ``self._held`` is in claim order, so jobs yet to start heartbeating
        fall due in that order: the first one not due yet says how long to
        sleep. It holds at most ``lanes + 3 * batch`` jobs."""
        heartbeat_secs = self.heartbeat_secs
        while True:
            now = trio.current_time()
            next_due = math.inf
            for held in self._held.values():
                if held.beat_scope is not None or held.beat_due or held.finished:
                    continue  # beating already, or its handler is done
                due = held.claimed_at + heartbeat_secs
                if due > now:
                    next_due = due
                    break
                if held.nursery is not None:
                    self._start_heartbeat(held)
                else:
                    held.beat_due = True  # its task has not run yet: it starts the loop
            if next_due == math.inf:
                self._starter_idle = idle = trio.Event()
                await idle.wait()  # until the lease loop claims jobs
            else:
                await trio.sleep_until(next_due)

    async def _heartbeat_loop(self, held: _Held) -> None:
        assert self._heartbeats is not None and held.beat_scope is not None and held.scope is not None
        job = held.job
        next_at = held.claimed_at + self.heartbeat_secs
        failures = 0
        with held.beat_scope:
            while True:
                # Sleeping until the earlier of the next heartbeat and the abort
                # point takes one cancel scope, where move_on_at around a sleep
                # would take two.
                abort_at = held.deadline - self.abort_margin_secs
                await trio.sleep_until(min(next_at, abort_at))
                if trio.current_time() >= abort_at:
                    # Renewals kept failing and the lease is about to end: stop
                    # the handler while there is still time to say so.
                    held.expiring = True
                    held.scope.cancel()
                    return
                sent_at = trio.current_time()
                with trio.move_on_at(abort_at) as call_scope:
                    try:
                        reply = await self._heartbeats.call(
                            HeartbeatItem(job.id, held.lease.lease_token, self.lease_secs)
                        )
                    except errors.QftrioError as exc:
                        if _is_fatal(exc):
                            self._die(exc)
                            return
                        failures += 1
                        held.last_error = str(exc)
                        log.debug("heartbeat of job %s failed (%s); retrying", job.id, exc)
                        next_at = trio.current_time() + backoff(failures, *REPORT_BACKOFF)
                        continue
                if call_scope.cancelled_caught:
                    continue  # the abort point passed during the call: handled above
                if reply.code == 200 and reply.status == "running":
                    held.deadline = sent_at + self.lease_secs
                    failures = 0
                    next_at = sent_at + self.heartbeat_secs
                    continue
                if reply.code == 200:
                    held.lost = f"the job is {reply.status}"
                elif reply.code == 409:
                    held.lost = "lease lost (409): the job was taken back"
                else:
                    held.lost = f"heartbeat answered {reply.code}"
                held.scope.cancel()
                return

    async def _execute(self, held: _Held) -> _Outcome:
        job = held.job
        try:
            if held.lane is None:
                # Wait in line for a lane (heartbeated meanwhile). A job
                # with a lane at once goes on without a schedule point.
                held.lane_ready = ready = trio.Event()
                await ready.wait()
            else:
                # But no handler starts in a cancelled scope (hard stop,
                # job lost): this checks, without yielding if not.
                await trio.lowlevel.checkpoint_if_cancelled()
            handler = self.registry.get(job.kind)
            if handler is None:
                known = ", ".join(self.registry.kinds) or "none"
                return _Outcome(
                    error=f"no handler for kind {job.kind!r} on this worker (it handles: {known})",
                    retryable=False,
                )
            return await self._call(handler, job)
        finally:
            # Free the lane for the next job now: the report need not hold it.
            self._finished(held)
            self._notify_changed()

    async def _call(self, handler: Handler, job: Job) -> _Outcome:
        timeout = handler.timeout if handler.timeout is not None else math.inf
        with trio.move_on_after(timeout) if handler.timeout is not None else _NO_TIMEOUT as timer:
            try:
                if handler.is_async:
                    result = await handler.fn(job)
                else:
                    # A thread cannot be interrupted: on cancel it is left to
                    # finish on its own and its result is dropped.
                    result = await trio.to_thread.run_sync(handler.fn, job, abandon_on_cancel=True)
            except errors.PermanentError as exc:
                return _Outcome(error=str(exc) or "PermanentError", retryable=False)
            except BaseExceptionGroup as group:
                if group.subgroup(trio.Cancelled) is not None:
                    raise  # we are being cancelled; the scopes above sort it out
                log.debug("handler of job %s raised", job.id, exc_info=True)
                _, others = group.split(errors.PermanentError)
                return _Outcome(error=_describe(group), retryable=others is not None)
            except Exception as exc:
                log.debug("handler of job %s raised", job.id, exc_info=True)
                return _Outcome(error=_describe(exc), retryable=True)
        if timer is not None and timer.cancelled_caught:
            return _Outcome(error=f"handler timed out after {timeout:g} s", retryable=True)
        if result is None:
            result = {}
        if not isinstance(result, dict):
            return _Outcome(error=f"handler returned {type(result).__name__}; expected a dict or None", retryable=False)
        try:
            json_dumps(result)
        except (TypeError, ValueError) as exc:
            return _Outcome(error=f"handler result is not JSON: {exc}", retryable=False)
        return _Outcome(result=result)

    async def _report(self, held: _Held, outcome: _Outcome, *, until: float = math.inf) -> bool:
        """Report *outcome*, retrying until it lands or *until* passes (a
        call in flight then is given the transport's timeout). Returns
        whether an answer came; the caller may also bound this by a scope."""
        assert self._completes is not None and self._fails is not None
        job, token = held.job, held.lease.lease_token
        failures = 0
        while True:
            if trio.current_time() >= until:
                return False
            try:
                if outcome.ok:
                    reply = await self._completes.call(CompleteItem(job.id, token, outcome.result or {}))
                else:
                    reply = await self._fails.call(
                        FailItem(job.id, token, outcome.error or "failed", outcome.retryable)
                    )
            except errors.QftrioError as exc:
                if _is_fatal(exc):
                    self._die(exc)
                    return True
                failures += 1
                held.last_error = str(exc)
                log.debug("report of job %s failed (%s); retrying", job.id, exc)
                await trio.sleep_until(min(trio.current_time() + backoff(failures, *REPORT_BACKOFF), until))
                continue
            if reply.code == 204:
                if outcome.ok:
                    self._job_event("completed", held)
                else:
                    self._job_event("failed", held, error=outcome.error, retryable=outcome.retryable)
            elif reply.code == 409:
                held.lost = "lease lost (409): the report was refused"
            else:
                held.lost = f"report answered {reply.code}"
            return True


@contextlib.asynccontextmanager
async def open_worker(
    transport: Transport,
    queue: str,
    registry: Registry,
    **options: Any,
) -> AsyncIterator[Worker]:
    """Run a :class:`Worker` for the duration of an ``async with`` block.

    Leaving the block normally stops it gracefully and waits for held jobs;
    leaving it by an exception cancels it at once. The options are
    :class:`Worker`'s.

    ::

        async with qftrio.open_worker(HttpTransport(client), "images", registry, lanes=8) as worker:
            await trio.sleep_forever()
    """
    worker = Worker(transport, queue, registry, **options)
    with unwrap_single():
        async with trio.open_nursery() as nursery:
            await nursery.start(worker.run)
            try:
                yield worker
            except BaseException:
                worker.cancel()
                raise
            worker.stop()


@contextlib.contextmanager
def unwrap_single() -> Iterator[None]:
    """A nursery held across a ``yield`` wraps what the caller's block
    raised in an exception group; give the caller back the one exception it
    would have seen without us."""
    try:
        yield
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise
