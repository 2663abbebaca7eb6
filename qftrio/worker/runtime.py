"""The worker runtime: lease jobs, run their handlers, heartbeat, report.

Task tree of one :meth:`Worker.run` (docs/worker.md)::

    run                               cancel scope: Worker.cancel()
    └── worker nursery
        ├── heartbeat scheduler       renews every held job that is due, in
        │   └── one task per call       one batch call; cancels the scopes of
        │                               jobs lost or about to run out of lease
        ├── reporter                  sends the reports of finished jobs in
        │   └── one task per call       batch calls, retried until each
        │                               job's lease ends
        ├── drain deadline            (shutdown_timeout) cancel() that long
        │                               after stop()
        ├── watchdog                  (warn_blocked_secs) watch_blocking:
        │                               warns when the loop was blocked
        └── jobs nursery
            ├── lease loop            cancel scope: Worker.stop()
            └── one task per job      until its handler is done
                └── the job's scope   cancelled by the scheduler on a 409 or
                    └── wait for a      a status other than ``running``
                        lane, then
                        the handler

A job has one task, and one cancel scope, for its handler; its heartbeats and
its report need none of their own. The scheduler keeps, for each held job,
when its next renewal falls due and sleeps until the first one does; the
reporter gathers the reports made within a few milliseconds into one call.
Most jobs end before their first heartbeat falls due: their whole cost is
one task, one scope, and their share of a lease call and of a report call.

Rules (docs/worker.md, "What the runtime guarantees"):

* A job is heartbeated from the moment it is claimed, every ``lease_secs/2``,
  also while it waits for a lane (a batch lease may hold more jobs than lanes).
* A ``409``, a ``404``, or any status but ``running`` cancels the job's scope:
  the handler is cancelled at its next checkpoint and nothing is reported.
* Heartbeats that cannot land are retried; shortly before the lease runs out
  the handler is cancelled and a retryable fail is attempted.
* Reports are retried with backoff until the lease runs out, then given up
  (``unreported``): the job then runs again elsewhere, which is why handlers
  must be idempotent. A report the server refuses as malformed or too large
  is not retried: a refused result fails the job, not retryably, saying why.
* Lease calls back off with jitter on transport errors and answers that may
  change (``502``/``503``/``504``, ``429``; ``waiting``), forever: a server
  restart is ridden out. Answers that never change (``401``/``403``, a
  refused request, a ``404``, ``405`` or ``501`` from something that is not
  qftrio's worker route, an answer that is not qftrio's) stop the worker,
  whichever call gets them.
* After :meth:`Worker.stop`, held jobs get ``shutdown_timeout`` seconds at
  most; then they are cancelled as by :meth:`Worker.cancel`.
* A watchdog (:func:`watch_blocking`) warns when the Trio loop did not run
  for ``warn_blocked_secs``: a handler that blocks it stops every heartbeat
  and report of the worker with it.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import heapq
import logging
import math
import os
import socket
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any, Literal

import pydantic
import trio

from .. import _progress, errors
from .._backoff import backoff
from .._tracing import handler_span
from .._json import dumps_strict as json_dumps
from .._batching import Batcher, BatcherClosed
from ..models import (
    MAX_BATCH,
    MAX_ERROR,
    MAX_LEASE_JOBS,
    MAX_LEASE_SECS,
    MAX_PROGRESS_BYTES,
    MAX_WAIT_SECS,
    MAX_WORKER_ID,
    CompleteItem,
    FailItem,
    HeartbeatItem,
    Job,
    Lease,
    Outcome,
    SnoozeItem,
    StepsAddRequest,
    Workflow,
    field_errors,
    timeout_error,
    valid_name,
)
from .registry import Handler, Registry
from ..errors import UnexpectedAnswer
from .transport import HeartbeatReply, Transport

__all__ = [
    "Worker",
    "validate_options",
    "WorkerEvent",
    "WorkerStatistics",
    "open_worker",
    "default_worker_id",
    "watch_blocking",
]

log = logging.getLogger("qftrio.worker")

EventType = Literal["claimed", "completed", "failed", "snoozed", "lost", "unreported", "waiting", "stopping"]

_LEVELS = {
    "claimed": logging.INFO,
    "completed": logging.INFO,
    "failed": logging.WARNING,
    "snoozed": logging.INFO,
    "lost": logging.WARNING,
    "unreported": logging.WARNING,
    "waiting": logging.WARNING,
    "stopping": logging.INFO,
}

# Backoff of retried calls (seconds, :func:`qftrio._backoff.backoff`): the
# first retry comes after about ``base``, doubling up to ``cap``; each wait is
# scaled by a random factor in [0.5, 1] so that a fleet of workers does not
# retry in lockstep.
LEASE_BACKOFF = {"base": 0.5, "cap": 15.0}
REPORT_BACKOFF = {"base": 0.25, "cap": 5.0}
#: A handler's progress goes with a heartbeat batch at most this many
#: seconds after ``job.progress(obj)`` (DESIGN §7): the reports of every job
#: made within it share one call.
PROGRESS_SECS = 1.0

#: Lanes of a worker unless told otherwise.
DEFAULT_LANES = 200

#: Bytes of a report body besides the result (id, token, keys).
RESULT_ROOM = 1024

#: Lease calls in flight at once while the queue has a backlog.
LEASES_IN_FLIGHT = 2

#: Seconds the Trio loop may go without running before the watchdog warns,
#: unless told otherwise.
DEFAULT_WARN_BLOCKED_SECS = 1.0

#: Jobs a blocked-loop warning names; it counts the others.
BLOCKED_NAMED = 5

#: Seconds allowed between the server claiming a job and the worker getting
#: the answer; the worker reckons its lease from then.
CLAIM_SLACK = 0.1


def default_worker_id() -> str:
    """``host-pid``: unique per process, and says where a job runs."""
    return f"{socket.gethostname()}-{os.getpid()}"


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class WorkerEvent:
    """Something the worker did, for logs and dashboards.

    Attributes:
        type: ``claimed`` (a job was leased), ``completed``, ``failed`` (the
            fail report landed; *retryable* says which kind), ``snoozed``
            (the handler raised :class:`~qftrio.Snooze`; *delay* says for
            how long), ``lost`` (the
            server took the job back: cancelled, lease lost; nothing was or
            will be reported), ``unreported`` (the report could not land
            before the lease ran out), ``waiting`` (a lease call failed; the
            next try comes after *delay* seconds), ``stopping``.
        job_id, kind, attempt: the job's, when the event is about one.
        lane: the lane (1..lanes) running it; ``None`` while it waits for one.
        error: what went wrong, in words.
        retryable: for ``failed``, whether the job will be retried (if
            attempts are left).
        final: for ``failed``, whether the job is dead-lettered now: not
            retryable, or its last attempt.
        delay: for ``waiting``, seconds until the next lease call; for
            ``snoozed`` and a ``failed`` of :class:`~qftrio.RetryIn`, until
            the job runs again.
    """

    type: EventType
    job_id: str | None = None
    kind: str | None = None
    attempt: int | None = None
    lane: int | None = None
    error: str | None = None
    retryable: bool | None = None
    final: bool | None = None
    delay: float | None = None

    def __str__(self) -> str:
        parts: list[str] = [self.type]
        if self.job_id is not None:
            parts.append(f"job {self.job_id} ({self.kind}, attempt {self.attempt})")
        if self.lane is not None:
            parts.append(f"lane {self.lane}")
        if self.retryable is not None:
            if not self.retryable:
                parts.append("not retryable: dead-lettered")
            elif self.final:
                parts.append("its last attempt: dead-lettered")
            else:
                parts.append("retryable")
        if self.delay is not None:
            parts.append(f"{'retrying' if self.type == 'waiting' else 'runs again'} in {self.delay:.1f} s")
        if self.error:
            parts.append(f"- {self.error}")
        return " ".join(parts)


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class WorkerStatistics:
    """Held jobs (running or waiting for a lane), those running, whether
    the worker is draining, and whether it cancelled its held jobs (a hard
    stop, or a drain that outlasted ``shutdown_timeout``)."""

    held: int
    running: int
    lanes: int
    stopping: bool
    cancelled: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class _Outcome:
    result: dict[str, Any] | None = None
    error: str | None = None
    retryable: bool = True
    #: The handler asked for the job to run again in this many seconds:
    #: a snooze (no error), or a failure's retry (``RetryIn``).
    again_in: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.again_in is None


@dataclasses.dataclass(eq=False, slots=True)
class _Held:
    """One leased job, from claim to report: what changes while it is held."""

    lease: Lease
    deadline: float  # Trio time at which our lease ends, by our own reckoning
    next_beat: float  # Trio time at which its next renewal falls due
    #: Trio time of the job's own deadline (``timeout_secs`` after its
    #: claim, by our reckoning), at which its handler is cancelled.
    timeout_at: float = math.inf
    #: The job's cancel scope: its handler runs in it, and the heartbeat
    #: scheduler cancels it when the job is lost or its lease about to end.
    scope: trio.CancelScope = dataclasses.field(default_factory=trio.CancelScope)
    beating: bool = True  # renewed until its handler is done, or it is given up
    in_call: bool = False  # a renewal of it is in flight
    failures: int = 0  # renewals, then reports, failed in a row
    outcome: _Outcome | None = None  # what its handler came to
    report: CompleteItem | FailItem | SnoozeItem | None = None  # the report of it to send
    lane: int | None = None  # the lane it was given (kept after it left it)
    lane_ready: trio.Event | None = None  # made only when the job must wait for a lane
    lost: str | None = None  # why the server took it back: nothing is reported
    last_error: str | None = None  # of the last heartbeat or report that failed
    progress: dict[str, Any] | None = None  # reported by its handler, not yet sent

    @property
    def job(self) -> Job:
        return self.lease.job


class _Lanes:
    """Lanes handed out in lease order (a Trio semaphore wakes waiters in
    FIFO order too, but tasks started together reach it in no set order)."""

    def __init__(self, n: int) -> None:
        self._free = list(range(1, n + 1))  # a heap: the lowest free lane first
        self._waiting: collections.deque[_Held] = collections.deque()
        self.busy = 0

    @property
    def occupied(self) -> int:
        """Jobs running or waiting for a lane."""
        return self.busy + len(self._waiting)

    def enqueue(self, held: _Held) -> None:
        if self._free:
            self._give(held, heapq.heappop(self._free))
        else:
            self._waiting.append(held)

    def _give(self, held: _Held, lane: int) -> None:
        held.lane = lane
        self.busy += 1
        if held.lane_ready is not None:
            held.lane_ready.set()

    def leave(self, held: _Held) -> None:
        """*held* no longer needs its lane (or its place in line). Called
        once per job."""
        if held.lane is None:
            self._waiting.remove(held)
            return
        self.busy -= 1
        if self._waiting:
            self._give(self._waiting.popleft(), held.lane)
        else:
            heapq.heappush(self._free, held.lane)


#: Stands in for a timeout scope when a handler has none.
_NO_TIMEOUT = contextlib.nullcontext()

_TRUNCATED = "\n[truncated: {} characters in all]"


def truncate_error(text: str) -> str:
    """*text*, cut to the longest error the server takes
    (:data:`~qftrio.models.MAX_ERROR`) with a note saying so."""
    if len(text) <= MAX_ERROR:
        return text
    note = _TRUNCATED.format(len(text))
    return text[: MAX_ERROR - len(note)] + note


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _is_fatal(exc: BaseException) -> bool:
    """An answer that no call of the worker would get otherwise if sent
    again: a credential refused, or a server that is not qftrio's (a
    whole-call ``404``, ``405``, ``501``: no qftrio route answered; a qftrio
    server answers a job it does not know item by item). The request's own
    refusals (400, 413, 422) are :func:`_is_refusal`'s."""
    if isinstance(exc, UnexpectedAnswer):
        return True
    return isinstance(exc, errors.ApiError) and not _is_refusal(exc) and not errors.is_transient(exc.status_code)


def _is_refusal(exc: BaseException) -> bool:
    """The server refused the request itself: sending it again cannot help."""
    return isinstance(exc, (errors.BadRequest, errors.PayloadTooLarge, errors.InvalidInput))


def _one_line(text: str, limit: int = 200) -> str:
    """The first line of *text*, at most *limit* characters: an answer may
    be a whole web page."""
    line = text.strip().split("\n", 1)[0].strip()
    return line if len(line) <= limit else line[: limit - 3] + "..."


def validate_options(
    queue: str,
    registry: Registry,
    *,
    lanes: int | None,
    batch: int | None,
    lease_secs: int,
    wait_secs: float,
    worker_id: str | None = None,
    shutdown_timeout: float | None = None,
    warn_blocked_secs: float | None = None,
) -> None:
    """Raise :class:`~qftrio.errors.ConfigError` for a :class:`Worker`
    option out of range, or a registry with no handler. ``None`` lanes
    stand for the default."""
    if not valid_name(queue):
        raise errors.ConfigError(f"queue {queue!r}: use 1-128 characters of A-Z a-z 0-9 _ . -")
    if not isinstance(registry, Registry):
        raise errors.ConfigError(f"registry: expected a qftrio Registry, not {type(registry).__name__}")
    if not registry.kinds:
        raise errors.ConfigError("the registry has no handlers: the worker would fail every job it leases")
    if lanes is not None and not (isinstance(lanes, int) and lanes >= 1):
        raise errors.ConfigError(f"lanes must be a positive integer, not {lanes!r}")
    if batch is not None and not (isinstance(batch, int) and 1 <= batch <= MAX_LEASE_JOBS):
        raise errors.ConfigError(f"batch must be an integer from 1 to {MAX_LEASE_JOBS}, not {batch!r}")
    if not (isinstance(lease_secs, int) and 1 <= lease_secs <= MAX_LEASE_SECS):
        raise errors.ConfigError(f"lease_secs must be an integer from 1 to {MAX_LEASE_SECS}, not {lease_secs!r}")
    if not (0 <= wait_secs <= MAX_WAIT_SECS):
        raise errors.ConfigError(f"wait_secs must be from 0 to {MAX_WAIT_SECS}, not {wait_secs!r}")
    if worker_id is not None and not (1 <= len(worker_id) <= MAX_WORKER_ID):
        raise errors.ConfigError(f"worker_id must have 1 to {MAX_WORKER_ID} characters, not {len(worker_id)}")
    for name, secs in (("shutdown_timeout", shutdown_timeout), ("warn_blocked_secs", warn_blocked_secs)):
        if secs is not None and not (isinstance(secs, (int, float)) and 0 < secs < math.inf):
            raise errors.ConfigError(f"{name} must be a positive number of seconds, not {secs!r}")


class Worker:
    """Runs the handlers of *registry* for jobs leased from *queue*.

    Args:
        transport: :class:`~qftrio.worker.transport.HttpTransport` (a
            :class:`~qftrio.Client` with a worker token) or
            :class:`~qftrio.server.inprocess.EngineTransport` (in-process).
        queue: the queue to lease from.
        registry: the handlers, by job kind (at least one).
        lanes: jobs run at once; :data:`DEFAULT_LANES` when not given (or
            ``None``).
        batch: jobs leased per call at most (1..100). By default a lease asks
            for as many jobs as there are free lanes, so that no job waits
            for a lane; above that, jobs may wait for one, heartbeated
            meanwhile.
        lease_secs: the lease asked for, and each renewal's extension.
            Heartbeats go every ``lease_secs/2``; a crashed worker's jobs
            wait up to this long before running elsewhere.
        wait_secs: the long-poll of each lease call (0..60).
        worker_id: recorded on every job it holds; ``host-pid`` by default.
        on_event: called with every :class:`WorkerEvent` (also logged to the
            ``qftrio.worker`` logger). It must not block; what it raises is
            logged and ignored.
        shutdown_timeout: after :meth:`stop`, seconds the held jobs get to
            finish; then they are cancelled as by :meth:`cancel` (nothing is
            reported; their leases expire and other workers run them).
            ``None`` (the default): as long as they take.
        warn_blocked_secs: warn (``qftrio.worker`` logger) when the Trio
            loop did not run for this long, naming the jobs running then: a
            blocking call in an async handler holds up every other job's
            heartbeats and reports (see :func:`watch_blocking`). ``None``
            turns the watchdog off.

    Raises:
        ConfigError: an argument out of range, or a registry with no handler.
    """

    def __init__(
        self,
        transport: Transport,
        queue: str,
        registry: Registry,
        *,
        lanes: int | None = None,
        batch: int | None = None,
        lease_secs: int = 60,
        wait_secs: float = 20,
        worker_id: str | None = None,
        on_event: Callable[[WorkerEvent], object] | None = None,
        shutdown_timeout: float | None = None,
        warn_blocked_secs: float | None = DEFAULT_WARN_BLOCKED_SECS,
    ) -> None:
        validate_options(
            queue,
            registry,
            lanes=lanes,
            batch=batch,
            lease_secs=lease_secs,
            wait_secs=wait_secs,
            worker_id=worker_id,
            shutdown_timeout=shutdown_timeout,
            warn_blocked_secs=warn_blocked_secs,
        )
        self.transport = transport
        self.queue = queue
        self.registry = registry
        self.lanes = DEFAULT_LANES if lanes is None else lanes
        self.batch = batch
        self.lease_secs = lease_secs
        self.wait_secs = wait_secs
        self.worker_id = worker_id or default_worker_id()
        self.on_event = on_event
        self.shutdown_timeout = shutdown_timeout
        self.warn_blocked_secs = warn_blocked_secs
        #: Heartbeat period.
        self.heartbeat_secs = lease_secs / 2
        #: How long before the lease ends a job whose renewals fail is given
        #: up: time left for the retryable fail to land.
        self.abort_margin_secs = min(5.0, lease_secs * 0.2)

        self._ran = False
        self._stopping = False
        self._cancelled = False
        self._stop_requested = trio.Event()  # set by stop(): the drain's clock starts
        # Jobs whose async handler started since the watchdog last looked;
        # None while no watchdog looks.
        self._async_started: list[Job] | None = None
        self._fatal: BaseException | None = None
        self._root_scope: trio.CancelScope | None = None
        self._lease_scope = trio.CancelScope()
        self._leasing = 0  # lease calls in flight
        self._asked = 0  # jobs they asked for
        self._backlog = False  # the last answer came full: lease ahead
        self._poll: trio.CancelScope | None = None  # the long poll in flight (one at most)
        self._lease_failures = 0  # lease calls failed in a row
        self._lease_retry_at = -math.inf  # no lease call before then (backing off)
        self._held: dict[str, _Held] = {}
        self._lanes = _Lanes(self.lanes)
        self._changed: trio.Event | None = None  # set up by the lease loop when it waits
        self._beat_wake: trio.CancelScope | None = None  # the heartbeat scheduler's sleep
        # Reports to send, by kind, in the order the handlers finished, and
        # those that failed and go again later (a heap by retry time).
        self._to_complete: list[_Held] = []
        self._to_fail: list[_Held] = []
        self._to_snooze: list[_Held] = []
        self._retries: list[tuple[float, int, _Held]] = []
        self._retry_seq = 0
        self._report_wake: trio.Event | None = None  # set up by the reporter when it waits
        self._report_linger: trio.CancelScope | None = None
        # No linger: the heartbeat scheduler gathers the jobs due together.
        self._heartbeats: Batcher[HeartbeatItem, HeartbeatReply] = Batcher(
            transport.heartbeat, limit=transport.max_inflight, max_items=MAX_BATCH, split_on=_is_refusal
        )

    def __repr__(self) -> str:
        return f"<Worker {self.worker_id} queue={self.queue!r} lanes={self.lanes}>"

    # -- control -----------------------------------------------------------

    def stop(self) -> None:
        """Graceful stop: lease nothing more, finish the jobs held, then let
        :meth:`run` return. An in-flight long-poll is abandoned (should the
        server have claimed a job for it meanwhile, that job's lease expires
        and it runs elsewhere); a lease call made ahead of it, which does not
        wait, is let land, and its jobs run. Idempotent."""
        if self._stopping or self._cancelled:
            return
        self._stopping = True
        within = "" if self.shutdown_timeout is None else f" within {self.shutdown_timeout:g} s"
        self._emit(WorkerEvent(type="stopping", error=f"finishing {len(self._held)} held job(s){within}"))
        self._stop_requested.set()
        self._lease_scope.cancel()
        if self._poll is not None:
            self._poll.cancel()

    def cancel(self) -> None:
        """Hard stop: cancel every handler now and report nothing. The jobs'
        leases expire and other workers take them over. Idempotent."""
        if self._cancelled:
            return
        if not self._stopping:
            self._emit(WorkerEvent(type="stopping", error=f"cancelling {len(self._held)} held job(s)"))
        self._stopping = self._cancelled = True
        self._lease_scope.cancel()
        self._heartbeats.close()
        if self._root_scope is not None:
            self._root_scope.cancel()

    def statistics(self) -> WorkerStatistics:
        return WorkerStatistics(
            held=len(self._held),
            running=self._lanes.busy,
            lanes=self.lanes,
            stopping=self._stopping,
            cancelled=self._cancelled,
        )

    # -- main --------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[Worker] = trio.TASK_STATUS_IGNORED) -> None:
        """Run until stopped (:meth:`stop` or :meth:`cancel`) or cancelled.

        ``await nursery.start(worker.run)`` returns the worker itself, the
        handle with :meth:`stop` and :meth:`cancel`.

        Raises:
            Unauthorized, Forbidden: the server refused the worker's
                credential; held jobs were abandoned.
            UnexpectedAnswer: the server does not speak qftrio's protocol.
            ApiError: the server refused the lease request itself (400,
                404, 413, 422): it would refuse it again.
        """
        if self._ran:
            raise RuntimeError("a Worker runs once; make a new one")
        self._ran = True
        log.info(
            "worker %s on queue %r: lanes=%d batch=%s lease=%ds kinds=%s",
            self.worker_id,
            self.queue,
            self.lanes,
            self.batch or "free lanes",
            self.lease_secs,
            ",".join(self.registry.kinds),
        )
        with trio.CancelScope() as self._root_scope:
            if self._cancelled:
                self._root_scope.cancel()
            try:
                async with trio.open_nursery() as worker:
                    worker.start_soon(self._heartbeat_loop)
                    worker.start_soon(self._report_loop)
                    if self.shutdown_timeout is not None:
                        worker.start_soon(self._drain_deadline, self.shutdown_timeout)
                    if self.warn_blocked_secs is not None:
                        worker.start_soon(watch_blocking, self.warn_blocked_secs, [self])
                    async with trio.open_nursery() as jobs:
                        jobs.start_soon(self._lease_loop, jobs)
                        task_status.started(self)
                    # Leasing has stopped and every handler is done: wait
                    # for the last reports.
                    while self._held:
                        await self._wait_changed()
                    # Nothing is left to renew: a renewal still in flight
                    # (of a job that finished during it) is not waited for.
                    self._heartbeats.close()
                    worker.cancel_scope.cancel()
            finally:
                self._held.clear()  # after a hard stop: abandoned, their leases run out
        if self._fatal is not None:
            raise self._fatal

    async def _drain_deadline(self, timeout: float) -> None:
        """Once :meth:`stop` is called, give the held jobs *timeout*
        seconds, then cancel them: a handler that never returns must not
        hold the worker for ever."""
        await self._stop_requested.wait()
        await trio.sleep(timeout)
        log.warning(
            "worker %s: the shutdown timeout (%g s) ran out: cancelling %d held job(s); "
            "their leases expire and other workers run them",
            self.worker_id,
            timeout,
            len(self._held),
        )
        self.cancel()

    def _blocking_suspects(self) -> list[Job]:
        """The jobs whose async handler ran since the last call: those
        running now, and those that started since (they may be done
        already). Synchronous handlers run in threads and cannot block the
        loop. For :func:`watch_blocking`."""
        jobs = self._async_started or []
        self._async_started = []
        for held in self._held.values():
            if held.lane is not None and held.outcome is None:
                handler = self.registry.get(held.job.kind)
                if handler is not None and handler.is_async:
                    jobs.append(held.job)
        return jobs

    def _die(self, exc: BaseException) -> None:
        """Stop everything because of *exc*, which :meth:`run` raises."""
        if self._fatal is None:
            self._fatal = exc
            log.error("worker %s stopping: %s", self.worker_id, _one_line(str(exc)))
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
        if type == "failed":
            # The server dead-letters a failure of the last attempt, whatever
            # the handler said: the log must not promise a retry.
            kw["final"] = not kw.get("retryable", True) or job.attempt >= job.max_attempts
        self._emit(WorkerEvent(type=type, job_id=job.id, kind=job.kind, attempt=job.attempt, lane=held.lane, **kw))

    async def _wait_changed(self) -> None:
        """Until a lane is freed or a held job is gone."""
        self._changed = changed = trio.Event()
        await changed.wait()

    def _notify_changed(self) -> None:
        # Only the lease loop waits for a change, when every lane is taken,
        # and run() for the last reports: no Event is made (and none set)
        # while nobody waits.
        changed = self._changed
        if changed is not None:
            self._changed = None
            changed.set()

    # -- leasing -----------------------------------------------------------

    async def _lease_loop(self, jobs: trio.Nursery) -> None:
        """Lease while lanes are free, each call in a task of its own.

        One call at a time, the long poll, while the queue keeps up with the
        worker. Once an answer came full (the queue has a backlog), a second
        call, which does not wait, goes while the first is on its way, so
        that the lanes do not idle for a round trip per batch; together the
        calls never ask for more jobs than there are free lanes.
        """
        most = min(MAX_LEASE_JOBS, self.batch or self.lanes)
        async with trio.open_nursery() as calls:
            with self._lease_scope:
                while not self._stopping:
                    # Count jobs whose handler finished as gone: their reports
                    # travel in the background, and waiting for them would
                    # idle the lanes. The second bound keeps reports that lag
                    # from piling up without end.
                    while (
                        self._leasing >= (LEASES_IN_FLIGHT if self._backlog else 1)
                        or self._lanes.occupied + self._asked >= self.lanes
                        or len(self._held) + self._asked >= self.lanes + 2 * most
                    ):
                        await self._wait_changed()
                    if self._lease_retry_at > trio.current_time():
                        await trio.sleep_until(self._lease_retry_at)
                        continue
                    max_jobs = self.batch or min(MAX_LEASE_JOBS, self.lanes - self._lanes.occupied - self._asked)
                    self._leasing += 1
                    self._asked += max_jobs
                    scope = trio.CancelScope()
                    if self._leasing == 1:
                        # The only call in flight long-polls; one made ahead
                        # of it does not wait. stop() abandons the long poll
                        # (registered here, before its task starts) and lets
                        # a call that does not wait land.
                        self._poll = scope
                    calls.start_soon(self._lease, jobs, max_jobs, scope)

    async def _lease(self, jobs: trio.Nursery, max_jobs: int, scope: trio.CancelScope) -> None:
        """One lease call in *scope*, the long poll or one that does not
        wait: start the jobs it brings, or back off."""
        wait_secs = self.wait_secs if scope is self._poll else 0
        sent_at = trio.current_time()
        leases: list[Lease] = []
        try:
            with scope:
                leases = await self.transport.lease(
                    self.queue,
                    max_jobs=max_jobs,
                    lease_secs=self.lease_secs,
                    wait_secs=wait_secs,
                    worker_id=self.worker_id,
                )
            if scope.cancelled_caught:
                return  # the long poll, abandoned by stop()
        except errors.QftrioError as exc:
            if _is_fatal(exc) or _is_refusal(exc):
                self._die(exc)
                return
            self._lease_failures += 1
            self._backlog = False
            delay = backoff(self._lease_failures, **LEASE_BACKOFF)
            self._lease_retry_at = max(self._lease_retry_at, trio.current_time() + delay)
            self._emit(WorkerEvent(type="waiting", error=_one_line(str(exc)), delay=delay))
            return
        finally:
            if self._poll is scope:
                self._poll = None
            self._leasing -= 1
            self._asked -= max_jobs
            self._notify_changed()
        if self._lease_failures:
            log.info("worker %s: the server answers again", self.worker_id)
            self._lease_failures = 0
        self._backlog = len(leases) >= max_jobs
        if not leases and wait_secs > 0 and trio.current_time() - sent_at < min(wait_secs, 1.0) / 2:
            # An empty answer that did not wait: a server shutting down
            # answers long polls at once. Do not spin on it.
            self._lease_retry_at = max(self._lease_retry_at, trio.current_time() + backoff(1, **LEASE_BACKOFF))
            return
        # No checkpoint from the lease's answer to here: a stop() cannot
        # drop jobs we were handed.
        #
        # When did the server claim them? A long poll may have waited long
        # before anything came, so not when we asked; just before it
        # answered, allowing CLAIM_SLACK for the answer's way back (never
        # before we asked).
        claimed = max(sent_at, trio.current_time() - CLAIM_SLACK)
        deadline = claimed + self.lease_secs
        next_beat = deadline - self.heartbeat_secs
        for lease in leases:
            timeout = lease.job.timeout_secs
            held = _Held(
                lease=lease, deadline=deadline, next_beat=next_beat,
                timeout_at=math.inf if timeout is None else claimed + timeout,
            )  # fmt: skip
            self._held[lease.lease_token] = held
            self._lanes.enqueue(held)
            self._job_event("claimed", held)
            jobs.start_soon(self._hold, held, name=f"qftrio job {lease.job.id}")
        if leases:
            self._wake_heartbeats_by(next_beat)

    # -- heartbeats --------------------------------------------------------

    def _wake_heartbeats_by(self, when: float) -> None:
        """Have the heartbeat scheduler look again at *when* at the latest."""
        wake = self._beat_wake
        if wake is not None and when < wake.deadline:
            wake.deadline = when

    async def _heartbeat_loop(self) -> None:
        """Renew the lease of every held job whose handler is not done, every
        ``heartbeat_secs`` from its claim; give up a job (cancel its scope)
        shortly before its lease ends when renewals keep failing.

        One task for all jobs: it sleeps until the first renewal or give-up
        falls due, and renews every job due by then (or within the
        transport's ``coalesce_secs``) in one batch call, run in a task of
        its own so that a slow call delays no give-up.
        """
        async with trio.open_nursery() as calls:
            while True:
                now = trio.current_time()
                soon = now + self.transport.coalesce_secs
                due: list[_Held] = []
                wake = math.inf
                for held in self._held.values():
                    if not held.beating:
                        continue
                    abort_at = held.deadline - self.abort_margin_secs
                    if now >= abort_at:
                        # Renewals kept failing and the lease is about to
                        # end: stop the handler while there is still time
                        # to say so.
                        held.beating = False
                        held.scope.cancel()
                        continue
                    wake = min(wake, abort_at)
                    if held.in_call:
                        continue
                    if held.next_beat <= soon:
                        held.in_call = True
                        due.append(held)
                    else:
                        wake = min(wake, held.next_beat)
                for start in range(0, len(due), MAX_BATCH):
                    calls.start_soon(self._renew, due[start : start + MAX_BATCH])
                with trio.move_on_at(wake) as self._beat_wake:
                    await trio.sleep_forever()

    async def _renew(self, due: list[_Held]) -> None:
        """One batch renewal of *due*: extend the leases that are still ours,
        cancel the scopes of the jobs that are not."""
        sent_at = trio.current_time()
        items = [HeartbeatItem(held.job.id, held.lease.lease_token, self.lease_secs, held.progress) for held in due]
        for held in due:
            held.progress = None
        try:
            replies = await self._heartbeats(items)
        except (errors.QftrioError, BatcherClosed) as exc:
            for held, item in zip(due, items):
                if held.progress is None:  # nothing newer since: send it again
                    held.progress = item.progress
            if _is_fatal(exc):
                self._die(exc)
                return
            error = _one_line(str(exc))
            log.debug("heartbeat of %d job(s) failed (%s); retrying", len(due), error)
            now = trio.current_time()
            for held in due:
                held.failures += 1
                held.last_error = error
                held.next_beat = now + backoff(held.failures, **REPORT_BACKOFF)
        else:
            for held, reply in zip(due, replies):
                if reply.outcome is Outcome.OK and reply.status == "running":
                    held.deadline = sent_at + self.lease_secs
                    held.failures = 0
                    held.next_beat = sent_at + self.heartbeat_secs
                    continue
                if not held.beating:
                    continue  # its handler is done: its report learns the same
                if reply.outcome is Outcome.OK:
                    held.lost = f"the job is {reply.status}"
                elif reply.outcome is Outcome.CONFLICT:
                    held.lost = "lease lost (409): the job was taken back"
                else:
                    held.lost = "the server no longer knows the job (404)"
                held.beating = False
                held.scope.cancel()
        finally:
            soon = trio.current_time() + PROGRESS_SECS
            for held in due:
                held.in_call = False
                if held.progress is not None:
                    held.next_beat = min(held.next_beat, soon)
            self._wake_heartbeats_by(min(held.next_beat for held in due))

    def _progress_of(self, held: _Held, job_id: str, progress: dict[str, Any]) -> None:
        """``job.progress(obj)`` in *held*'s handler (its task, or the
        thread of a synchronous handler): checked here, where the handler
        can see the error, then sent with a heartbeat batch within
        ``PROGRESS_SECS``, the latest winning."""
        if job_id != held.job.id:
            raise RuntimeError("job.progress() reports the progress of the job whose handler calls it")
        if not isinstance(progress, dict):
            raise TypeError(f"progress must be a dict, not {type(progress).__name__}")
        size = len(json_dumps(progress))  # ValueError for what JSON cannot hold
        if size > MAX_PROGRESS_BYTES:
            raise ValueError(f"progress holds {size} bytes of JSON, over the {MAX_PROGRESS_BYTES} allowed")
        try:
            trio.lowlevel.current_task()
        except RuntimeError:  # a synchronous handler's thread
            trio.from_thread.run_sync(self._take_progress, held, progress)
        else:
            self._take_progress(held, progress)

    async def _add_steps_of(
        self, held: _Held, job_id: str, steps: Sequence[Mapping[str, Any]], collect: str | None
    ) -> Workflow:
        """``await job.add_steps(...)`` in *held*'s handler: checked here as
        the server would (a bad argument fails at once), then sent, and sent
        again after a transport error with the reports' backoff until the
        lease is about to end (a repeat of a landed add changes nothing)."""
        if job_id != held.job.id:
            raise RuntimeError("job.add_steps() adds steps to the workflow of the job whose handler calls it")
        try:
            body = StepsAddRequest.model_validate(
                {"lease_token": held.lease.lease_token, "steps": [dict(step) for step in steps], "collect": collect}
            )
        except pydantic.ValidationError as exc:
            raise errors.InvalidInput(field_errors(exc, "body")) from None
        failures = 0
        while True:
            try:
                return await self.transport.steps_add(job_id, body)
            except errors.TransportError:
                failures += 1
                retry_at = trio.current_time() + backoff(failures, **REPORT_BACKOFF)
                if retry_at >= held.deadline:
                    raise
                await trio.sleep_until(retry_at)

    def _take_progress(self, held: _Held, progress: dict[str, Any]) -> None:
        if not held.beating:
            return  # its handler is done or the job was given up: nothing to renew
        held.progress = progress
        due = trio.current_time() + PROGRESS_SECS
        if not held.in_call and held.next_beat > due:
            held.next_beat = due
            self._wake_heartbeats_by(due)

    # -- one job -----------------------------------------------------------

    async def _hold(self, held: _Held) -> None:
        """Run *held*'s handler in the job's scope, then hand its outcome to
        the reporter (or, the job lost, say so and forget it)."""
        outcome: _Outcome | None = None
        try:
            with held.scope:
                outcome = await self._execute(held)
        except BaseException:
            # Cancelled from outside (a hard stop): nothing is reported.
            held.beating = False
            self._forget(held)
            raise
        held.beating = False
        if held.lost is not None:
            self._job_event("lost", held, error=held.lost)
            self._forget(held)
            return
        if outcome is None:
            # The heartbeat scheduler cancelled the handler: renewals
            # failed and the lease is about to end. Say so while it lasts.
            reason = f": {held.last_error}" if held.last_error else ""
            outcome = _Outcome(error=f"lease about to expire: heartbeats failed{reason}", retryable=True)
        held.failures = 0
        self._queue_report(held, outcome)

    def _forget(self, held: _Held) -> None:
        del self._held[held.lease.lease_token]
        self._notify_changed()

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
            # job.progress(obj) in this task (and a thread it starts) reports here.
            _progress.sink.set(functools.partial(self._progress_of, held))
            _progress.steps_sink.set(functools.partial(self._add_steps_of, held))
            if handler is None:
                # The lease protocol has no kind filter: a job of a kind this
                # worker lacks is failed, so that it does not run again and again.
                known = ", ".join(self.registry.kinds)
                return _Outcome(
                    error=f"no handler for kind {job.kind!r} on this worker (it handles: {known})",
                    retryable=False,
                )
            return await self._call(handler, job, held.timeout_at)
        finally:
            # Free the lane for the next job now: the report need not hold it.
            self._lanes.leave(held)
            self._notify_changed()

    async def _call(self, handler: Handler, job: Job, timeout_at: float = math.inf) -> _Outcome:
        # The handler's own timeout, or the job's deadline, whichever comes first.
        handler_at = trio.current_time() + handler.timeout if handler.timeout is not None else math.inf
        ends = min(handler_at, timeout_at)
        with trio.move_on_at(ends) if ends < math.inf else _NO_TIMEOUT as timer:
            try:
                # The span (with OpenTelemetry in use) sees the handler's
                # exception before it becomes the job's outcome; a thread
                # runs in a copy of this task's context, the span's too.
                with handler_span(job):
                    if handler.is_async:
                        if self._async_started is not None:
                            self._async_started.append(job)
                        result = await handler.fn(job)
                    else:
                        # A thread cannot be interrupted: on cancel it is left to
                        # finish on its own and its result is dropped.
                        result = await trio.to_thread.run_sync(handler.fn, job, abandon_on_cancel=True)
            except errors.PermanentError as exc:
                return _Outcome(error=str(exc) or "PermanentError", retryable=False)
            except errors.Snooze as exc:
                return _Outcome(again_in=exc.seconds)
            except errors.RetryIn as exc:
                return _Outcome(error=exc.error or "RetryIn", again_in=exc.seconds)
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
            if timeout_at < handler_at:
                return _Outcome(error=timeout_error(job.timeout_secs), retryable=True)
            return _Outcome(error=f"handler timed out after {handler.timeout:g} s", retryable=True)
        if result is None:
            result = {}
        if not isinstance(result, dict):
            return _Outcome(error=f"handler returned {type(result).__name__}; expected a dict or None", retryable=False)
        try:
            size = len(json_dumps(result))
        except (TypeError, ValueError) as exc:
            return _Outcome(error=f"handler result is not JSON: {exc}", retryable=False)
        cap = self.transport.max_body_bytes
        if cap is not None and size > cap - RESULT_ROOM:
            return _Outcome(
                error=f"handler result too large: {size} bytes of JSON, over the {cap - RESULT_ROOM} the server takes",
                retryable=False,
            )
        return _Outcome(result=result)

    # -- reports -----------------------------------------------------------

    def _queue_report(self, held: _Held, outcome: _Outcome) -> None:
        """Have the reporter send *outcome*, the lease permitting."""
        held.outcome = outcome
        job, token = held.job, held.lease.lease_token
        if outcome.ok:
            held.report = CompleteItem(job.id, token, outcome.result or {})
        elif outcome.error is None:
            assert outcome.again_in is not None
            held.report = SnoozeItem(job.id, token, outcome.again_in)
        else:
            error = truncate_error(outcome.error)
            held.report = FailItem(job.id, token, error, outcome.retryable, outcome.again_in)
        queue = self._queue_of(held)
        if trio.current_time() >= held.deadline:
            self._give_up(held)
            return
        queue.append(held)
        if len(queue) >= MAX_BATCH and self._report_linger is not None:
            self._report_linger.cancel()  # a full batch need not linger
        self._wake_reporter()

    def _queue_of(self, held: _Held) -> list[_Held]:
        """The reports waiting to go that *held*'s report goes with."""
        if isinstance(held.report, CompleteItem):
            return self._to_complete
        return self._to_fail if isinstance(held.report, FailItem) else self._to_snooze

    def _wake_reporter(self) -> None:
        # The reporter waits on an Event only when it has nothing to send:
        # none is made (and none set) for each report.
        wake = self._report_wake
        if wake is not None:
            self._report_wake = None
            wake.set()

    def _give_up(self, held: _Held) -> None:
        self._job_event("unreported", held, error=held.last_error or "the lease ran out before the report landed")
        self._forget(held)

    def _take_due_retries(self) -> None:
        now = trio.current_time()
        while self._retries and self._retries[0][0] <= now:
            _, _, held = heapq.heappop(self._retries)
            if now >= held.deadline:
                self._give_up(held)
            else:
                self._queue_of(held).append(held)

    async def _report_loop(self) -> None:
        """Send the reports of finished jobs: those made within the
        transport's ``coalesce_secs`` go as one batch call (up to
        :data:`MAX_BATCH`), at most ``max_inflight`` calls at once, each run
        in a task of its own. Reports are retried with backoff until their
        lease ends (a call in flight then is let finish, within the
        transport's timeout), then given up.
        """
        turns = trio.Semaphore(self.transport.max_inflight)
        async with trio.open_nursery() as calls:
            while True:
                self._take_due_retries()
                if not (self._to_complete or self._to_fail or self._to_snooze):
                    self._report_wake = wake = trio.Event()
                    with trio.move_on_at(self._retries[0][0] if self._retries else math.inf):
                        await wake.wait()
                    self._report_wake = None
                    continue
                if max(len(self._to_complete), len(self._to_fail), len(self._to_snooze)) < MAX_BATCH:
                    # Let the reports of jobs finishing about now join in.
                    with trio.move_on_after(self.transport.coalesce_secs) as self._report_linger:
                        await trio.sleep_forever()
                    self._report_linger = None
                # While it waits for a turn in flight, a batch keeps growing.
                for queue in (self._to_complete, self._to_fail, self._to_snooze):
                    while queue:
                        await turns.acquire()
                        batch = queue[:MAX_BATCH]
                        del queue[:MAX_BATCH]
                        calls.start_soon(self._send_reports, batch, turns)

    async def _send_reports(self, batch: list[_Held], turns: trio.Semaphore) -> None:
        try:
            await self._send_batch(batch)
        finally:
            turns.release()

    async def _send_batch(self, batch: list[_Held]) -> None:
        """One report call for *batch* (all completions, failures or snoozes)."""
        items = [held.report for held in batch]
        try:
            if isinstance(items[0], CompleteItem):
                replies = await self.transport.complete(items)  # type: ignore[arg-type]
            elif isinstance(items[0], FailItem):
                replies = await self.transport.fail(items)  # type: ignore[arg-type]
            else:
                replies = await self.transport.snooze(items)  # type: ignore[arg-type]
        except errors.QftrioError as exc:
            if _is_fatal(exc):
                self._die(exc)
            elif _is_refusal(exc) and len(batch) > 1:
                # One report's result, say, is too large for the server:
                # send them one by one, so that it fails alone.
                for held in batch:
                    await self._send_batch([held])
            else:
                self._report_failed(batch, exc)
            return
        for held, reply in zip(batch, replies):
            outcome = held.outcome
            assert outcome is not None
            if reply.outcome is Outcome.OK:
                if outcome.ok:
                    self._job_event("completed", held)
                elif outcome.error is None:
                    self._job_event("snoozed", held, delay=outcome.again_in)
                else:
                    self._job_event(
                        "failed", held, error=outcome.error, retryable=outcome.retryable, delay=outcome.again_in
                    )
            else:
                if reply.outcome is Outcome.CONFLICT:
                    held.lost = "lease lost (409): the report was refused"
                else:
                    held.lost = "the server no longer knows the job (404)"
                self._job_event("lost", held, error=held.lost)
            self._forget(held)

    def _report_failed(self, batch: list[_Held], exc: errors.QftrioError) -> None:
        """The report call of *batch* failed: send each again later, until
        its lease ends."""
        error = _one_line(str(exc))
        now = trio.current_time()
        for held in batch:
            held.last_error = error
            if _is_refusal(exc):
                if not isinstance(held.report, CompleteItem):
                    self._give_up(held)  # the server refuses this fail or snooze; nothing else to say
                else:
                    # The server refuses this result (a smaller body cap than
                    # ours, say): fail the job, saying why, rather than run it again.
                    self._queue_report(held, _Outcome(error=f"the server refused the result: {error}", retryable=False))
            elif now >= held.deadline:
                self._give_up(held)
            else:
                held.failures += 1
                log.debug("report of job %s failed (%s); retrying", held.job.id, error)
                self._retry_seq += 1
                retry_at = min(now + backoff(held.failures, **REPORT_BACKOFF), held.deadline)
                heapq.heappush(self._retries, (retry_at, self._retry_seq, held))
        self._wake_reporter()


async def watch_blocking(threshold: float, workers: Sequence[Worker]) -> None:
    """Warn when the Trio loop did not run for *threshold* seconds, naming
    the jobs of *workers* running then. Runs until cancelled.

    A blocking call in an async handler (``time.sleep``, a synchronous HTTP
    client, a long computation) stops the whole loop: no heartbeat, report
    or other handler runs meanwhile, so leases run out and jobs that did
    nothing wrong are lost. The watchdog sleeps in short steps and measures
    how late each wake-up comes, which costs one task step a step. It names
    the async handlers that ran before or during the gap, those done within
    it included. One watchdog serves every worker of a process, so that one
    gap gives one warning.
    """
    step = min(threshold / 4, 0.25)
    for worker in workers:
        worker._async_started = []
    before: list[Job] = []
    try:
        while True:
            due = trio.current_time() + step
            await trio.sleep_until(due)
            late = trio.current_time() - due
            now = [job for worker in workers for job in worker._blocking_suspects()]
            if late >= threshold:
                suspects = list({job.id: job for job in [*before, *now]}.values())
                log.warning("%s", _blocked_message(late, threshold, suspects))
            before = now
    finally:
        for worker in workers:
            worker._async_started = None  # nobody looks: record nothing


def _blocked_message(late: float, threshold: float, jobs: Sequence[Job]) -> str:
    blocked = f"the Trio loop was blocked for {late:.1f} s (more than {threshold:g} s)"
    meanwhile = "Meanwhile no heartbeat or report of this process was sent."
    if not jobs:
        return (
            f"{blocked} while no async handler ran: other code of this process blocked it, or the process "
            f"was stopped. {meanwhile}"
        )
    named = ", ".join(f"job {job.id} ({job.kind})" for job in jobs[:BLOCKED_NAMED])
    more = f" and {len(jobs) - BLOCKED_NAMED} more" if len(jobs) > BLOCKED_NAMED else ""
    return (
        f"{blocked}; async handlers running then: {named}{more}. A blocking call in an async handler is "
        "the likely cause (time.sleep, a synchronous client, a long computation): make the handler "
        f"synchronous (it then runs in a thread) or run the call in trio.to_thread.run_sync. {meanwhile}"
    )


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
