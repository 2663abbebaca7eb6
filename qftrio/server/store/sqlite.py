"""The embedded store: one SQLite file, WAL, synchronous commits.

qftrio's default backend, so that ``qftrio serve`` works on a bare machine.
One connection serves every call, one call at a time, in a thread of the
store's own, so the event loop never blocks on disk. Each store
method is one ``BEGIN IMMEDIATE`` ... ``COMMIT`` transaction; with
``journal_mode=WAL`` and ``synchronous=FULL`` a commit is on disk before the
call returns, which is what lets the server acknowledge a job.

Every outcome is decided by :mod:`qftrio.server.transitions`. The changes
written once in :mod:`.changes` run here over the statements of
``queries/sqlite.sql`` (:func:`_drive`, synchronously on the store's
thread, inside the call's transaction); the claim, the inserts, the
heartbeat and complete batches, the stats and the pages are this module's
own. The schema is ``migrations/sqlite/``, its version in
``PRAGMA user_version``.

A single process owns the file: several servers on one SQLite file are not
supported (use PostgreSQL to scale out).
"""

from __future__ import annotations

import contextlib
import dataclasses
import heapq
import os
import re
import sqlite3
import threading
import uuid
import typing
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from queue import SimpleQueue
from typing import Any, TypeVar

import outcome
import trio

from ... import _json, errors
from ...models import (
    JOB_FORM,
    MAX_SCHEDULED_COUNT,
    STATUS_OF,
    attempt_history,
    ErrorEntry,
    HeldBack,
    Job,
    Lease,
    QueueStats,
    RateLimit,
    Schedule,
    Status,
    WorkerInfo,
    to_datetime,
    Workflow,
    WorkflowStatus,
)
from ..._batching import Batcher
from .. import transitions
from . import changes, sql
from .base import (
    WORKFLOW_QUEUE,
    BulkAction,
    BulkBatch,
    BulkFilter,
    ClaimRequest,
    CompleteItem,
    DashboardSession,
    FailItem,
    HeartbeatItem,
    ProgressItem,
    HeartbeatResult,
    Inserted,
    JobOfSchedule,
    NewJob,
    NewSchedule,
    NewSteps,
    NewWorkflow,
    Page,
    Reaped,
    ReportResult,
    RetryAt,
    RetryPolicy,
    SnoozeItem,
    Store,
    Turns,
    new_ids,
    new_job_row,
    new_tokens,
    unique_since,
    workers_of,
)

__all__ = ["SqliteStore", "open_sqlite_store"]

T = TypeVar("T")

Q = sql.load("sqlite")
_MIGRATIONS = sql.migrations("sqlite")
_SESSION_FIELDS = [f.name for f in dataclasses.fields(DashboardSession)]


def _marks(n: int) -> str:
    return ",".join("?" * n)


def _loads(text: str | None) -> Any:
    return None if text is None else _json.loads(text)


def _dumps(value: Any) -> str | None:
    return None if value is None else _json.dumps_str(value)


def _errors(text: str) -> tuple[ErrorEntry, ...]:
    if text == "[]":  # no decoding for an empty history: one per claimed job
        return ()
    return tuple(map(ErrorEntry.from_stored, _json.loads(text)))


def _job_values() -> dict[str, str]:
    # Each of Job's fields by its place in job_columns (Job's order), JSON
    # columns decoded.
    out = {}
    for i, name in enumerate(JOB_FORM.kinds):
        kind, inner, optional = JOB_FORM.kinds[name]
        value = f"row[{i}]"
        if name == "status":
            value = f"STATUS_OF[{value}]"
        elif name == "errors":
            value = f"_errors({value})"
        elif name == "attempts":  # with the row's status, attempt, worker_id, claimed_at (after Job's fields) and updated_at
            at = list(JOB_FORM.kinds).index
            value = (
                f"attempt_history(None if {value} == '[]' else _json.loads({value}), row[{at('status')}], "
                f"row[{at('attempt')}], row[{at('worker_id')}], row[{len(JOB_FORM.kinds)}], row[{at('updated_at')}])"
            )
        elif typing.get_origin(inner) is dict:
            value = f"_loads({value})" if optional else f"_json.loads({value})"
        out[name] = value
    return out


#: A job of a row of ``job_columns``.
_row_to_job: Callable[[sqlite3.Row | tuple[Any, ...]], Job] = JOB_FORM.builder(
    "_row_to_job",
    "row",
    _job_values().__getitem__,
    {"STATUS_OF": STATUS_OF, "_errors": _errors, "attempt_history": attempt_history, "_loads": _loads, "_json": _json},
)

#: The arguments of ``job_insert`` but the last (``now``).
_insert_row = new_job_row(_json.dumps_str)


@dataclasses.dataclass(slots=True)
class _Row:
    """A job as a report batch sees it."""

    status: Status
    token: str | None
    queue: str
    attempt: int
    max_attempts: int
    workflow_id: str | None
    step: str | None
    kind: str
    claimed_at: float | None
    deadline: float | None
    keyed: bool

    def applied(self, result: ReportResult) -> ReportResult:
        """*result* (applied to this job) with what the metrics and the
        wake-ups need."""
        return dataclasses.replace(result, kind=self.kind, claimed_at=self.claimed_at, keyed=bool(self.keyed))


def _report_rows(conn: sqlite3.Connection, ids: Sequence[str]) -> dict[str, _Row]:
    """The jobs among *ids* that exist, in as few queries as the batch allows."""
    out: dict[str, _Row] = {}
    unique = list(dict.fromkeys(ids))
    for start in range(0, len(unique), 500):
        chunk = unique[start : start + 500]
        for id_, status, token, *rest in conn.execute(Q["reports_of"].format(marks=_marks(len(chunk))), chunk):
            out[id_] = _Row(STATUS_OF[status], token, *rest)
    return out


def _state(rows: dict[str, _Row], job_id: str, token: str, now: float) -> tuple[_Row | None, Status | None, bool]:
    """A report's row, its status, and whether *token* is current: the
    job's token, and the attempt not over (transitions.attempt_over)."""
    row = rows.get(job_id)
    if row is None:
        return None, None, False
    current = row.token == token and not transitions.attempt_over(row.status, row.deadline, now)
    return row, row.status, current


def _insert_jobs(conn: sqlite3.Connection, jobs: Sequence[NewJob], now: float) -> list[Inserted]:
    out: list[Inserted] = []
    rows: list[tuple[Any, ...]] = []
    for job_id, new in zip(new_ids(len(jobs), now), jobs):
        keyed = new.idempotency_key is not None or new.unique is not None
        if keyed:
            row = None
            if new.idempotency_key is not None:
                row = conn.execute(Q["job_by_idempotency_key"], (new.tenant, new.idempotency_key)).fetchone()
            if row is None and new.unique is not None:
                since = unique_since(new.unique, now)
                row = conn.execute(
                    Q["job_by_unique_key"], (new.tenant, new.unique["key"], _dumps(new.unique["statuses"]), since)
                ).fetchone()
            if row is not None:
                job = _row_to_job(row)
                out.append(Inserted(job.id, new, now, job))
                continue
        rows.append((*_insert_row(job_id, new), now))
        out.append(Inserted(job_id, new, now))
        if keyed:
            # A repeat of the key later in the batch must find this job:
            # it goes in now, after what came before it, in order (one
            # writer owns the file: nothing comes between the read and this).
            conn.executemany(Q["job_insert"], rows)
            rows = []
    conn.executemany(Q["job_insert"], rows)
    return out


_CLAIM_EXPIRED = Q["claim_expired"].format(paused="")


def _paused(conn: sqlite3.Connection, queue: str) -> tuple[str, list[str]]:
    """The ``{paused}`` clause of a claim of *queue*, and its arguments:
    the tenants that paused it are left out."""
    tenants = [row[0] for row in conn.execute(Q["paused_tenants"], (queue,))]
    return (f"AND tenant NOT IN ({_marks(len(tenants))})" if tenants else ""), tenants


def _claim(
    conn: sqlite3.Connection, queue: str, *, limit: int, lease_secs: float, worker_id: str | None, now: float, turn: int
) -> list[Lease]:
    """A lease: each tenant's share in turn (transitions.fair_order), and
    while tenants or held-back jobs leave it short, the rest after."""
    leases: list[Lease] = []
    while len(leases) < limit:
        got, more = _claim_once(
            conn, queue, limit=limit - len(leases), lease_secs=lease_secs, worker_id=worker_id, now=now, turn=turn
        )
        leases += got
        if not got or not more:
            break
    return leases


def _claim_once(
    conn: sqlite3.Connection, queue: str, *, limit: int, lease_secs: float, worker_id: str | None, now: float, turn: int
) -> tuple[list[Lease], bool]:
    """One claim, and whether a claim after it may find more (several
    tenants shared it, or concurrency limits held jobs back)."""
    paused, tenants = _paused(conn, queue)
    served = transitions.turns(
        [t for (t,) in conn.execute(Q["claim_tenants"], (queue,)) if t not in tenants], turn
    )[:limit]
    each = transitions.share(limit, len(served))
    candidates = [c for tenant in served for c in conn.execute(Q["claim_ready"], (queue, tenant, now, each))]
    if tenants:
        candidates += conn.execute(Q["claim_expired"].format(paused=paused), (queue, now, *tenants, limit)).fetchall()
    else:
        candidates += conn.execute(_CLAIM_EXPIRED, (queue, now, limit)).fetchall()
    if not candidates:
        return [], False
    running: dict[tuple[str, str], int] = {}
    for tenant in {c[1] for c in candidates if c[5] is not None}:
        keys = _dumps(sorted({c[5] for c in candidates if c[1] == tenant and c[5] is not None}))
        running.update(((tenant, key), n) for key, n in conn.execute(Q["concurrency_running"], (tenant, keys)))
    windows: dict[tuple[str, str], tuple[list[float], int]] = {}
    units: dict[tuple[str, str], int] = {}
    for tenant in {c[1] for c in candidates if c[7] is not None}:
        names = _dumps(sorted({c[7] for c in candidates if c[1] == tenant and c[7] is not None}))
        for name, most, per_secs, stamps in conn.execute(Q["rate_limits_of"], (tenant, names)):
            kept, units[tenant, name], _ = transitions.rate_window(_json.loads(stamps), most, per_secs, now)
            windows[tenant, name] = (kept, most)
    chosen, held = transitions.within_limits(transitions.fair_order(candidates, served), running, units)
    chosen = chosen[:limit]
    ids = [c[0] for c in chosen]
    if not ids:
        return [], False
    spent = Counter((c[1], c[7]) for c in chosen if (c[1], c[7]) in windows)
    for (tenant, name), n in spent.items():
        kept, most = windows[tenant, name]
        conn.execute(Q["rate_limit_stamps"], (tenant, name, _dumps(sorted(kept + [now] * n)[-most:])))
    tokens = dict(zip(ids, new_tokens(len(ids))))
    rows = conn.execute(
        Q["claim"].format(tokens=" ".join("WHEN ? THEN ?" for _ in ids), marks=_marks(len(ids))),
        (
            now + lease_secs, now + lease_secs, now, now, worker_id, now, now, *[x for job_id in ids for x in (job_id, tokens[job_id])],
            transitions.LOST_ATTEMPT, transitions.LOST_ATTEMPT, now, now, transitions.LOST_ATTEMPT, *ids,
        ),  # fmt: skip
    ).fetchall()
    by_id = {row[0]: row for row in rows}
    return [Lease(job=_row_to_job(by_id[job_id]), lease_token=tokens[job_id]) for job_id in ids], len(served) > 1 or held


# -- the executor of changes (changes.py) --------------------------------------


def _arity(statement: str) -> int:
    statement = "\n".join(line for line in statement.splitlines() if not line.lstrip().startswith("--"))
    numbered = [int(n) for n in re.findall(r"\?(\d+)", statement)]
    return max(numbered) if numbered else statement.count("?")


#: How many arguments each statement takes: a plan's trailing arguments a
#: statement here does not use are not passed.
_ARITY = {name: _arity(statement) for name, statement in Q.items()}


def _arg(value: Any) -> Any:
    # an array (read with json_each) or a JSON value: JSON text either way
    return _json.dumps_str(value) if isinstance(value, (dict, list)) else value


def _drive(conn: sqlite3.Connection, plan: changes.Plan[T]) -> T:
    """Run *plan* on *conn*, in the caller's transaction."""
    answer: Any = None
    try:
        while True:
            answer = _answer(conn, plan.send(answer))
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def _answer(conn: sqlite3.Connection, call: changes.Call) -> Any:
    want = call.want
    if want is changes.Want.INSERTED:
        return _insert_jobs(conn, *call.args)
    statement = Q[call.name]
    if not statement:
        return [] if want in (changes.Want.ROWS, changes.Want.JOBS) else None
    n = _ARITY[call.name]
    if call.many:
        conn.executemany(statement, [[_arg(v) for v in args[:n]] for args in call.args])
        return None
    cursor = conn.execute(statement, [_arg(v) for v in call.args[:n]])
    if want is changes.Want.NOTHING:
        return None
    if want is changes.Want.JOB:
        row = cursor.fetchone()
        return None if row is None else _row_to_job(row)
    if want is changes.Want.JOBS:
        return [_row_to_job(row) for row in cursor]
    if want is changes.Want.VALUE:
        row = cursor.fetchone()
        return None if row is None else row[0]
    rows = cursor.fetchall()
    if call.json:
        rows = [tuple(_loads(v) if i in call.json else v for i, v in enumerate(row)) for row in rows]
    if want is changes.Want.ROW:
        return rows[0] if rows else None
    return rows


def _merge(context: str, update: str) -> str:
    """``qftrio_merge(context, update)``: the top-level merge of two JSON
    objects, later wins (PostgreSQL's ``jsonb || jsonb``)."""
    merged = _json.loads(context)
    merged.update(_json.loads(update))
    return _json.dumps_str(merged)


# -- stats and pages ------------------------------------------------------------
# Module-level helpers that run inside the caller's transaction.


def _where(conditions: dict[str, Any]) -> tuple[str, list[Any]]:
    """``AND column = ?`` (``IN (...)`` for a tuple) for each of
    *conditions* that is not None, and the arguments."""
    where = []
    args: list[Any] = []
    for column, value in conditions.items():
        if value is None:
            continue
        if isinstance(value, tuple):
            where.append(f"AND {column} IN ({_marks(len(value))})")
            args += value
        else:
            where.append(f"AND {column} = ?")
            args.append(value)
    return " ".join(where), args


def _page_keys(
    conn: sqlite3.Connection,
    tenant: str,
    *,
    queue: str | None,
    statuses: tuple[str, ...] | None,
    kind: str | None,
    before: tuple[float, str] | None,
    created_after: float | None = None,
    created_before: float | None = None,
    limit: int,
) -> list[tuple[float, str]]:
    """The keys ``(created_at, id)`` of the first *limit* jobs of a page,
    newest first, merged from one range of ``jobs_by_filter`` for each
    (queue, status, kind) combination the filter matches (listed by
    ``job_counts``). Each combination's newest job comes first; the
    *limit*-th newest of those is an edge no job of the page is older than,
    so only the combinations at or above it are read further, at most
    *limit* keys each: O(combinations + limit²) keys, whatever the table
    holds."""
    combos_where, combos_args = _where({"queue": queue, "status": statuses, "kind": kind})
    combos = conn.execute(Q["page_combos"].format(where=combos_where), (tenant, *combos_args)).fetchall()
    where = []
    args: list[Any] = []
    if before is not None:
        where.append("AND (created_at, id) < (?, ?)")
        args += [float(before[0]), str(before[1])]
    if created_after is not None:
        where.append("AND created_at >= ?")
        args.append(created_after)
    if created_before is not None:
        where.append("AND created_at < ?")
        args.append(created_before)
    first = Q["combo_page"].format(where=" ".join(where))
    newest = []
    for combo in combos:
        key = conn.execute(first, (tenant, *combo, *args, 1)).fetchone()
        if key is not None:
            newest.append((tuple(key), combo))
    if len(newest) >= limit:
        edge = heapq.nlargest(limit, (key for key, _ in newest))[-1]
        newest = [(key, combo) for key, combo in newest if key >= edge]
        statement = Q["combo_page"].format(where=" ".join([*where, "AND (created_at, id) >= (?, ?)"]))
        args += list(edge)
    else:
        statement = first
    keys: list[tuple[float, str]] = []
    for _, combo in newest:
        keys += [tuple(key) for key in conn.execute(statement, (tenant, *combo, *args, limit))]
    return heapq.nlargest(limit, keys)


def _held_keys(conn: sqlite3.Connection) -> dict[str, list[list[Any]]]:
    """The concurrency keys with running jobs, by tenant: ``[key, running]``."""
    keys: dict[str, list[list[Any]]] = {}
    for tenant, key, running in conn.execute(Q["held_keys"]):
        keys.setdefault(tenant, []).append([key, running])
    return keys


def _spent(conn: sqlite3.Connection, now: float) -> dict[str, dict[str, float]]:
    """The rate limits with no unit left at *now*, by tenant, with the time
    their next unit frees."""
    spent: dict[str, dict[str, float]] = {}
    for tenant, name, next_at in conn.execute(Q["rate_limits_spent"], (now,)):
        spent.setdefault(tenant, {})[name] = next_at
    return spent


def _rate_held(
    conn: sqlite3.Connection, tenant: str, queue: str, spent: dict[str, float], now: float
) -> dict[float, int]:
    """The ready jobs of the tenant's *queue* that its *spent* rate limits
    hold back, by the time each limit's next unit frees (counted up to
    :data:`MAX_SCHEDULED_COUNT` each)."""
    if not spent:
        return {}
    held: dict[float, int] = {}
    args = (tenant, _dumps(sorted(spent)), queue, now, MAX_SCHEDULED_COUNT)
    for name, n in conn.execute(Q["queue_held_rate_limits"], args):
        if n:
            held[spent[name]] = held.get(spent[name], 0) + n
    return held


def _stats(
    conn: sqlite3.Connection, *, tenant: str | None, queue: str | tuple[str, ...] | None, now: float
) -> list[tuple[str, QueueStats]]:
    """``(tenant, stats)`` of the queues with jobs or paused (of one tenant,
    one queue or some, when given), sorted: counts from ``job_counts``,
    times from one probe of an index each."""
    where, args = _where({"tenant": tenant, "queue": queue})
    counts: dict[tuple[str, str], dict[str, int]] = {}
    for t, q, status, n in conn.execute(Q["counts"].format(where=where), args):
        if n:
            counts.setdefault((t, q), {})[status] = n
    paused = {(t, q) for t, q in conn.execute(Q["pauses"].format(where=where), args)}
    pairs = sorted(counts.keys() | paused)
    if not pairs and tenant is not None and isinstance(queue, str):
        pairs = [(tenant, queue)]
    keys, spent = _held_keys(conn), _spent(conn, now)
    out = []
    for t, q in pairs:
        oldest = conn.execute(Q["queue_oldest_ready"], (t, q, now)).fetchone()
        scheduled = conn.execute(Q["queue_next_scheduled"], (t, q, now)).fetchone()
        (waiting,) = conn.execute(Q["queue_scheduled"], (t, q, now, MAX_SCHEDULED_COUNT)).fetchone()
        (lease,) = conn.execute(Q["queue_next_lease"], (q, t)).fetchone()
        held_concurrency = 0
        if t in keys:
            args = (t, _dumps(keys[t]), q, now, MAX_SCHEDULED_COUNT)
            (held_concurrency,) = conn.execute(Q["queue_held_concurrency"], args).fetchone()
        rated = _rate_held(conn, t, q, spent.get(t, {}), now)
        nexts = [x for x in (scheduled[0] if scheduled else None, lease, *rated) if x is not None]
        found = counts.get((t, q), {})
        out.append(
            (
                t,
                QueueStats(
                    queue=q,
                    counts={status.value: found.get(status.value, 0) for status in Status},
                    oldest_ready_at=to_datetime(oldest[0]) if oldest else None,
                    next_available_at=to_datetime(min(nexts)) if nexts else None,
                    paused=(t, q) in paused,
                    scheduled=waiting,
                    held_back=HeldBack(
                        concurrency=held_concurrency, rate_limit=min(sum(rated.values()), MAX_SCHEDULED_COUNT)
                    ),
                ),
            )
        )
    return out


def _database_error(exc: Exception) -> Exception:
    if isinstance(exc, errors.QftrioError):
        return exc
    return errors.Unavailable(f"the database failed: {exc}")


class _StoreThread:
    """The thread that runs the store's SQLite calls, one at a time.

    Cheaper per call than ``trio.to_thread.run_sync`` (a one-``SELECT``
    transaction: 97–111 against 117–156 µs of CPU, ``benchmarks/store_call.py``):
    one queue put to hand a call over, one ``run_sync_soon`` to hand it back. A call is not abandoned when its
    caller is cancelled: a transaction that started finishes.
    """

    def __init__(self) -> None:
        self._calls: SimpleQueue[tuple[Callable[[], T], Callable[[outcome.Outcome[T]], None]] | None] = SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="qftrio sqlite", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while (call := self._calls.get()) is not None:
            fn, done = call
            result = outcome.capture(fn)
            with contextlib.suppress(trio.RunFinishedError):
                done(result)

    async def run(self, fn: Callable[[], T]) -> T:
        """*fn*'s result, run in the thread (its exception, if it raises)."""
        token = trio.lowlevel.current_trio_token()
        task = trio.lowlevel.current_task()

        def done(result: outcome.Outcome[T]) -> None:
            token.run_sync_soon(trio.lowlevel.reschedule, task, result)

        self._calls.put((fn, done))
        return await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)  # type: ignore[no-any-return]

    async def stop(self) -> None:
        self._calls.put(None)
        await trio.to_thread.run_sync(self._thread.join)


#: The waits on jobs of one connection (SqliteStore): its own TEMP table and
#: trigger, gone with it.
_WAITS_SCHEMA = """
CREATE TEMP TABLE job_waits (id TEXT PRIMARY KEY, job_id TEXT NOT NULL);
CREATE INDEX temp.job_waits_job ON job_waits (job_id);
CREATE TEMP TRIGGER jobs_ended AFTER UPDATE OF status ON main.jobs
WHEN NEW.status IN ('completed', 'failed', 'cancelled')
    AND EXISTS (SELECT 1 FROM temp.job_waits WHERE job_id = NEW.id)
BEGIN
    SELECT qftrio_ended(NEW.id);
END;
"""

#: The event streams of one connection (SqliteStore): its own TEMP table and
#: triggers, gone with it. An enqueue, or a new status, attempt or progress,
#: of a job whose tenant has a stream open is noted; a heartbeat that
#: changes none of these is not.
_EVENTS_SCHEMA = """
CREATE TEMP TABLE event_streams (id TEXT PRIMARY KEY, tenant TEXT NOT NULL);
CREATE INDEX temp.event_streams_tenant ON event_streams (tenant);
CREATE TEMP TRIGGER jobs_inserted_event AFTER INSERT ON main.jobs
WHEN EXISTS (SELECT 1 FROM temp.event_streams WHERE tenant = NEW.tenant)
BEGIN
    SELECT qftrio_event(json_object('id', NEW.id, 'tenant', NEW.tenant, 'queue', NEW.queue, 'kind', NEW.kind,
        'status', NEW.status, 'attempt', NEW.attempt, 'progress', json(NEW.progress), 'at', NEW.updated_at));
END;
CREATE TEMP TRIGGER jobs_updated_event AFTER UPDATE ON main.jobs
WHEN (NEW.status IS NOT OLD.status OR NEW.attempt IS NOT OLD.attempt OR NEW.progress_at IS NOT OLD.progress_at)
    AND EXISTS (SELECT 1 FROM temp.event_streams WHERE tenant = NEW.tenant)
BEGIN
    SELECT qftrio_event(json_object('id', NEW.id, 'tenant', NEW.tenant, 'queue', NEW.queue, 'kind', NEW.kind,
        'status', NEW.status, 'attempt', NEW.attempt, 'progress', json(NEW.progress), 'at', NEW.updated_at));
END;
"""


class SqliteStore(Store):
    """See the module docstring. Build it with :func:`open_sqlite_store`.

    Args:
        path: the database file (``":memory:"`` for a private in-memory one).
        threaded: run SQLite calls in the store's own thread (the default). ``False``
            runs them inline on the event loop: only for tests that need
            Trio's mock clock, which a thread would let jump.
    """

    def __init__(self, path: str, *, threaded: bool = True) -> None:
        self.path = path
        self._threaded = threaded
        self._lock = trio.Lock()
        # Group commit: one batch at a time, the calls that arrive meanwhile
        # going together in the next.
        self._group: Batcher[Callable[[sqlite3.Connection], Any], outcome.Outcome[Any]] = Batcher(
            self._execute_group, limit=1, split_on=lambda exc: False
        )
        self._thread: _StoreThread | None = None
        # Each claim serves a queue's tenants from the next one in turn.
        self._turns = Turns()
        self._conn: sqlite3.Connection | None = sqlite3.connect(
            path, isolation_level=None, check_same_thread=False
        )
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=FULL")
        self._conn.execute("PRAGMA busy_timeout=5000")
        self._conn.create_function("qftrio_merge", 2, _merge, deterministic=True)
        self._migrate()
        # Waits on jobs: the ids of the jobs a transaction ends that a wait
        # is parked on, noted by a trigger of this connection's own (the
        # schema knows nothing of it), passed on once the transaction has
        # committed (_execute_group). A status change nobody waits on pays
        # one look at an empty table.
        self._ended_now: list[str] = []  # in the transaction under way
        self._ended: list[str] = []  # committed, not yet passed on
        self._conn.create_function("qftrio_ended", 1, self._ended_now.append)
        self._conn.executescript(_WAITS_SCHEMA)
        # Event streams: the same, for every change of a job of a tenant
        # with a stream open (the changes as JSON text, in order).
        self._events_now: list[str] = []
        self._events: list[str] = []
        self._conn.create_function("qftrio_event", 1, self._events_now.append)
        self._conn.executescript(_EVENTS_SCHEMA)

    def on_ended_committed(self) -> None:
        ended, self._ended = self._ended, []
        if self.on_ended is not None:
            for job_id in dict.fromkeys(ended):
                self.on_ended(job_id)
        events, self._events = self._events, []
        if self.on_event is not None:
            for event in events:
                self.on_event(_json.loads(event))

    def _migrate(self) -> None:
        conn = self._require()
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        for number, (_, _, script) in enumerate(_MIGRATIONS[version:], start=version + 1):
            conn.executescript(f"BEGIN IMMEDIATE;\n{script}\nPRAGMA user_version = {number};\nCOMMIT;")

    def _require(self) -> sqlite3.Connection:
        if self._conn is None:
            raise errors.Unavailable("the store is closed")
        return self._conn

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run *fn* in a transaction of its own, atomically.

        Group commit (:class:`~qftrio._batching.Batcher`, one batch at a
        time): calls that arrive while a commit is under way wait,
        and the next of them to get the connection runs every waiting call
        in one transaction, each inside a savepoint of its own (a call that
        raises rolls back only itself). One commit, so one sync to disk, then
        serves the whole group; each call still applies fully or not at all,
        and none returns before its commit is on disk.
        """
        (result,) = await self._group([fn])
        return result.unwrap()  # type: ignore[no-any-return]

    async def _execute_group(self, batch: list[Callable[[sqlite3.Connection], Any]]) -> list[outcome.Outcome[Any]]:
        # The batcher runs a batch shielded, so a transaction that started
        # finishes: no request leaves half a change behind.
        async with self._lock:
            if self._threaded:
                if self._thread is None:
                    self._thread = _StoreThread()
                results = await self._thread.run(lambda: self._execute(batch))
            else:
                results = self._execute(batch)
            if self._ended or self._events:
                self.on_ended_committed()
            return results

    def _execute(self, batch: list[Callable[[sqlite3.Connection], Any]]) -> list[outcome.Outcome[Any]]:
        self._ended_now.clear()
        self._events_now.clear()
        try:
            conn = self._require()
            conn.execute("BEGIN IMMEDIATE")
        except Exception as exc:
            return [outcome.Error(_database_error(exc)) for _ in batch]
        results: list[outcome.Outcome[Any]] = []
        try:
            if len(batch) == 1:
                results.append(outcome.Value(batch[0](conn)))
            else:
                for fn in batch:
                    conn.execute("SAVEPOINT call")
                    noted = len(self._events_now)
                    try:
                        results.append(outcome.Value(fn(conn)))
                    except Exception as exc:
                        conn.execute("ROLLBACK TO call")
                        del self._events_now[noted:]  # changes that never were
                        results.append(outcome.Error(exc))
                    conn.execute("RELEASE call")
            conn.execute("COMMIT")
            self._ended.extend(self._ended_now)
            self._events.extend(self._events_now)
        except Exception as exc:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            if len(batch) == 1:
                return [outcome.Error(exc)]
            # the whole group is lost: each call that had succeeded fails
            # with the database's error, one that had raised keeps its own
            return [r if isinstance(r, outcome.Error) else outcome.Error(_database_error(exc)) for r in results] + [
                outcome.Error(_database_error(exc)) for _ in batch[len(results):]
            ]
        return results

    async def aclose(self) -> None:
        async with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
            if self._thread is not None:
                await self._thread.stop()
                self._thread = None

    async def ping(self) -> None:
        await self._run(lambda conn: conn.execute("SELECT 1").fetchone())

    # -- application side --------------------------------------------------

    # -- application side --------------------------------------------------

    async def jobs_insert(self, jobs: Sequence[NewJob], *, now: float) -> list[Inserted]:
        return await self._run(lambda conn: _insert_jobs(conn, jobs, now))

    async def jobs_insert_claiming(
        self, jobs: Sequence[NewJob], *, now: float, claims: Sequence[ClaimRequest]
    ) -> tuple[list[Inserted], list[list[Lease]]]:
        def insert_claiming(conn: sqlite3.Connection) -> tuple[list[Inserted], list[list[Lease]]]:
            inserted = _insert_jobs(conn, jobs, now)
            return inserted, [
                _claim(
                    conn, c.queue, limit=c.limit, lease_secs=c.lease_secs, worker_id=c.worker_id, now=now,
                    turn=self._turns.take(c.queue),
                )
                for c in claims
            ]

        return await self._run(insert_claiming)

    async def job_get(self, job_id: str, *, tenant: str | None = None) -> Job | None:
        def get(conn: sqlite3.Connection) -> Job | None:
            row = conn.execute(Q["job_get"], (job_id,)).fetchone()
            if row is None:
                return None
            job = _row_to_job(row)
            return job if tenant is None or job.tenant == tenant else None

        return await self._run(get)

    async def jobs_page(
        self,
        *,
        tenant: str,
        queue: str | None = None,
        status: Status | None = None,
        kind: str | None = None,
        limit: int = 50,
        before: tuple[float, str] | None = None,
        max_bytes: int | None = None,
    ) -> Page[Job]:
        def page(conn: sqlite3.Connection) -> Page[Job]:
            keys = _page_keys(
                conn,
                tenant,
                queue=queue,
                statuses=None if status is None else (Status(status).value,),
                kind=kind,
                before=before,
                limit=limit + 1,
            )
            return _drive(conn, changes.jobs_page(keys, limit, max_bytes))

        return await self._run(page)

    async def job_cancel(self, job_id: str, *, tenant: str, now: float) -> Job | None:
        return await self._run(lambda conn: _drive(conn, changes.job_cancel(job_id, tenant, now)))

    async def job_retry(self, job_id: str, *, tenant: str, now: float) -> Job | None:
        return await self._run(lambda conn: _drive(conn, changes.job_retry(job_id, tenant, now)))

    async def queues_stats(self, *, tenant: str, now: float, queue: str | None = None) -> list[QueueStats]:
        return await self._run(
            lambda conn: [stats for _, stats in _stats(conn, tenant=tenant, queue=queue, now=now)]
        )

    async def queues_page(self, *, tenant: str, now: float, limit: int, after: str | None = None) -> list[QueueStats]:
        def page(conn: sqlite3.Connection) -> list[QueueStats]:
            names = tuple(queue for (queue,) in conn.execute(Q["queues_page"], (tenant, after or "", limit)))
            return [stats for _, stats in _stats(conn, tenant=tenant, queue=names, now=now)] if names else []

        return await self._run(page)

    async def queues_overview(self, *, now: float) -> list[tuple[str, QueueStats]]:
        return await self._run(lambda conn: _stats(conn, tenant=None, queue=None, now=now))

    async def queue_set_paused(self, *, tenant: str, queue: str, paused: bool, now: float) -> None:
        if paused:
            await self._run(lambda conn: conn.execute(Q["queue_pause"], (queue, tenant, now)))
        else:
            await self._run(lambda conn: conn.execute(Q["queue_resume"], (queue, tenant)))

    async def jobs_bulk(
        self, action: BulkAction, where: BulkFilter, *, limit: int, after: tuple[float, str] | None, now: float
    ) -> BulkBatch:
        def bulk(conn: sqlite3.Connection) -> BulkBatch:
            keys = _page_keys(
                conn,
                where.tenant,
                queue=where.queue,
                statuses=tuple(s.value for s in where.statuses),
                kind=where.kind,
                before=after,
                created_after=where.created_after,
                created_before=where.created_before,
                limit=limit,
            )
            return _drive(
                conn,
                changes.jobs_bulk(action, keys, tenant=where.tenant, statuses=where.statuses, limit=limit, now=now),
            )

        return await self._run(bulk)

    async def jobs_scheduled(
        self, *, tenant: str, now: float, queue: str | None = None, limit: int = 100
    ) -> list[Job]:
        def scheduled(conn: sqlite3.Connection) -> list[Job]:
            where, args = _where({"queue": queue})
            queues = [q for (q,) in conn.execute(Q["pending_queues"].format(where=where), (tenant, *args))]
            rows = [
                row for q in queues for row in conn.execute(Q["queue_scheduled_jobs"], (tenant, q, now, limit))
            ]
            return [_row_to_job(row) for row in heapq.nsmallest(limit, rows, key=lambda row: (row[9], row[0]))]

        return await self._run(scheduled)

    async def workers(self, *, tenant: str, seen_since: float) -> list[WorkerInfo]:
        return await self._run(lambda conn: workers_of(conn.execute(Q["workers"], (tenant, seen_since)).fetchall()))

    async def workers_seen(self, sightings: Sequence[tuple[str, str]], *, now: float) -> None:
        pairs = _dumps([list(pair) for pair in sightings])
        await self._run(lambda conn: conn.execute(Q["workers_seen"], (pairs, now)))

    async def sightings_purge(self, *, before: float) -> None:
        await self._run(lambda conn: conn.execute(Q["sightings_purge"], (before,)))

    async def session_create(self, key: str, session: DashboardSession) -> None:
        s = session
        row = (key, s.tenant, s.secret, s.token_mac, s.created_at, s.idle_until, s.expires_at)
        await self._run(lambda conn: conn.execute(Q["session_create"], row))

    async def session_get(self, key: str, *, now: float) -> DashboardSession | None:
        row = await self._run(lambda conn: conn.execute(Q["session_get"], (key, now)).fetchone())
        return None if row is None else DashboardSession(**dict(zip(_SESSION_FIELDS, row)))

    async def session_touch(self, key: str, *, idle_until: float) -> None:
        await self._run(lambda conn: conn.execute(Q["session_touch"], (key, idle_until)))

    async def session_delete(self, key: str) -> None:
        await self._run(lambda conn: conn.execute(Q["session_delete"], (key,)))

    async def sessions_purge(self, *, now: float) -> None:
        await self._run(lambda conn: conn.execute(Q["sessions_purge"], (now,)))

    # -- schedules ---------------------------------------------------------

    async def schedule_put(self, schedule: NewSchedule, *, now: float) -> tuple[Schedule, bool]:
        return await self._run(lambda conn: _drive(conn, changes.schedule_put(schedule, now)))

    async def schedule_get(self, tenant: str, name: str) -> Schedule | None:
        return await self._run(lambda conn: _drive(conn, changes.schedule_get(tenant, name)))

    async def schedules_list(self, tenant: str, *, limit: int, after: str | None = None) -> list[Schedule]:
        return await self._run(lambda conn: _drive(conn, changes.schedules_page(tenant, after, limit)))

    async def schedule_delete(self, tenant: str, name: str) -> bool:
        return await self._run(lambda conn: _drive(conn, changes.schedule_delete(tenant, name)))

    async def schedule_set_paused(self, tenant: str, name: str, *, paused: bool, now: float) -> Schedule | None:
        return await self._run(lambda conn: _drive(conn, changes.schedule_set_paused(tenant, name, paused, now)))

    async def schedule_trigger(
        self, tenant: str, name: str, *, now: float, job_of: JobOfSchedule
    ) -> tuple[Schedule, Inserted] | None:
        return await self._run(lambda conn: _drive(conn, changes.schedule_trigger(tenant, name, now, job_of)))

    async def schedules_fire(self, *, now: float, limit: int, job_of: JobOfSchedule) -> tuple[int, list[Inserted]]:
        return await self._run(lambda conn: _drive(conn, changes.schedules_fire(now, limit, job_of)))

    async def rate_limit_set(self, *, tenant: str, name: str, limit: int, per_secs: float) -> bool:
        def set_(conn: sqlite3.Connection) -> bool:
            new = not conn.execute(Q["rate_limits_of"], (tenant, _dumps([name]))).fetchall()
            conn.execute(Q["rate_limit_set"], (tenant, name, limit, per_secs))
            return new

        return await self._run(set_)

    async def rate_limits_list(self, *, tenant: str, now: float, names: Sequence[str] | None = None) -> list[RateLimit]:
        named = None if names is None else _dumps(list(names))
        rows = await self._run(lambda conn: conn.execute(Q["rate_limits_of"], (tenant, named)).fetchall())
        return [
            RateLimit(
                name=name, limit=most, per_secs=per_secs,
                next_available_at=to_datetime(transitions.rate_window(_json.loads(stamps), most, per_secs, now)[2]),
            )  # fmt: skip
            for name, most, per_secs, stamps in rows
        ]

    async def rate_limit_delete(self, *, tenant: str, name: str) -> bool:
        return await self._run(lambda conn: conn.execute(Q["rate_limit_delete"], (tenant, name)).fetchone() is not None)

    # -- worker side -------------------------------------------------------

    async def jobs_claim(
        self, queue: str, *, limit: int, lease_secs: float, worker_id: str | None, now: float
    ) -> list[Lease]:
        return await self._run(
            lambda conn: _claim(
                conn, queue, limit=limit, lease_secs=lease_secs, worker_id=worker_id, now=now,
                turn=self._turns.take(queue),
            )  # fmt: skip
        )

    async def queue_next_available_at(self, queue: str, *, now: float) -> float | None:
        def next_at(conn: sqlite3.Connection) -> float | None:
            paused, tenants = _paused(conn, queue)
            (scheduled,) = conn.execute(Q["next_scheduled"].format(paused=paused), (queue, now, *tenants)).fetchone()
            (lease,) = conn.execute(Q["next_lease"].format(paused=paused), (queue, *tenants)).fetchone()
            spent = _spent(conn, now)
            rated = [t for tenant in spent.keys() - set(tenants) for t in _rate_held(conn, tenant, queue, spent[tenant], now)]
            times = [t for t in (scheduled, lease, *rated) if t is not None]
            return min(times) if times else None

        return await self._run(next_at)

    async def jobs_heartbeat(self, items: Sequence[HeartbeatItem], *, now: float) -> list[HeartbeatResult]:
        unique, slot = transitions.one_per_lease(items)

        def heartbeat(conn: sqlite3.Connection) -> list[HeartbeatResult]:
            rows = _report_rows(conn, [i.job_id for i in unique])
            updates = []
            out = []
            for item in unique:
                row, status, current = _state(rows, item.job_id, item.lease_token, now)
                result = transitions.heartbeat(
                    status, current, extend_secs=item.extend_secs, now=now, deadline=row.deadline if row else None
                )
                if result.locked_until is not None:
                    updates.append((result.locked_until, now, item.job_id, item.lease_token))
                out.append(result)
            conn.executemany(Q["heartbeat"], updates)
            return transitions.answers(out, slot)

        return await self._run(heartbeat)

    async def job_wait_begin(self, job_id: str, *, now: float, wait_secs: float) -> str:
        wait_id = str(uuid.uuid4())
        await self._run(lambda conn: conn.execute(Q["job_wait_begin"], (wait_id, job_id)))
        return wait_id

    async def job_wait_end(self, wait_id: str) -> None:
        await self._run(lambda conn: conn.execute(Q["job_wait_end"], (wait_id,)))

    async def events_begin(self, tenant: str, *, now: float, until: float) -> str:
        stream_id = str(uuid.uuid4())
        await self._run(lambda conn: conn.execute(Q["events_begin"], (stream_id, tenant)))
        return stream_id

    async def events_renew(self, stream_id: str, *, until: float) -> None:
        """Nothing to do: the streams live in this process's own table."""

    async def events_end(self, stream_id: str) -> None:
        await self._run(lambda conn: conn.execute(Q["events_end"], (stream_id,)))

    async def jobs_progress(self, items: Sequence[ProgressItem], *, now: float) -> list[HeartbeatResult]:
        def progress(conn: sqlite3.Connection) -> list[HeartbeatResult]:
            rows = _report_rows(conn, [i.job_id for i in items])
            writes = []
            out = []
            for item in items:
                _, status, current = _state(rows, item.job_id, item.lease_token, now)
                result = transitions.progress(status, current)
                if result.status is Status.RUNNING:
                    writes.append((_dumps(item.progress), now, item.job_id, item.lease_token))
                out.append(result)
            conn.executemany(Q["progress"], writes)  # in order: the last of a lease wins
            return out

        return await self._run(progress)

    async def jobs_complete(self, items: Sequence[CompleteItem], *, now: float) -> list[ReportResult]:
        unique, slot = transitions.one_per_lease(items)

        def complete(conn: sqlite3.Connection) -> list[ReportResult]:
            rows = _report_rows(conn, [i.job_id for i in unique])
            updates = []
            out = []
            for item in unique:
                row, status, current = _state(rows, item.job_id, item.lease_token, now)
                result = transitions.complete(status, current, queue=row.queue if row else None)
                if result.applied:
                    assert row is not None
                    result = row.applied(result)
                    write = (_dumps(item.result), now, item.job_id, item.lease_token)
                    if row.workflow_id is None:
                        updates.append(write)
                    else:
                        conn.execute(Q["complete"], write)
                        if _drive(conn, changes.step_completed(row.workflow_id, row.step, item.result, now)):
                            result = dataclasses.replace(result, ready_queues=(WORKFLOW_QUEUE,))
                out.append(result)
            conn.executemany(Q["complete"], updates)
            return transitions.answers(out, slot)

        return await self._run(complete)

    async def jobs_fail(self, items: Sequence[FailItem], *, now: float, retry_at: RetryAt) -> list[ReportResult]:
        return await self._run(lambda conn: _drive(conn, changes.jobs_fail(items, now, retry_at)))

    async def jobs_snooze(self, items: Sequence[SnoozeItem], *, now: float) -> list[ReportResult]:
        return await self._run(lambda conn: _drive(conn, changes.jobs_snooze(items, now)))

    async def jobs_reap_expired(
        self, *, now: float, limit: int = 1000, retry_at: RetryAt = RetryPolicy().retry_at
    ) -> list[Reaped]:
        return await self._run(lambda conn: _drive(conn, changes.reap_expired(now, limit, retry_at)))

    async def jobs_prune(self, *, before: float, limit: int = 10000) -> int:
        return await self._run(lambda conn: _drive(conn, changes.prune(before, limit)))

    # -- workflows ---------------------------------------------------------

    async def workflow_create(self, workflow: NewWorkflow, *, now: float) -> Workflow:
        return await self._run(lambda conn: _drive(conn, changes.workflow_create(workflow, now)))

    async def steps_add(self, added: NewSteps, *, now: float) -> Workflow | None:
        return await self._run(lambda conn: _drive(conn, changes.steps_add(added, now)))

    async def workflow_get(self, workflow_id: str, *, tenant: str | None = None, jobs: bool = True) -> Workflow | None:
        return await self._run(lambda conn: _drive(conn, changes.workflow_get(workflow_id, tenant=tenant, jobs=jobs)))

    async def workflows_page(
        self,
        *,
        tenant: str,
        status: WorkflowStatus | None = None,
        limit: int = 50,
        before: tuple[float, str] | None = None,
        max_bytes: int | None = None,
    ) -> Page[Workflow]:
        return await self._run(
            lambda conn: _drive(conn, changes.workflows_page(tenant, status, limit, before, max_bytes))
        )

    async def workflow_cancel(self, workflow_id: str, *, tenant: str, now: float) -> Workflow | None:
        return await self._run(lambda conn: _drive(conn, changes.workflow_cancel(workflow_id, tenant, now)))


@contextlib.asynccontextmanager
async def open_sqlite_store(path: str | os.PathLike[str], *, threaded: bool = True) -> AsyncIterator[SqliteStore]:
    """Open (creating and migrating if needed) the SQLite store at *path*."""
    try:
        if threaded:
            store = await trio.to_thread.run_sync(lambda: SqliteStore(os.fspath(path), threaded=True))
        else:
            store = SqliteStore(os.fspath(path), threaded=False)
    except sqlite3.Error as exc:
        raise errors.ConfigError(f"cannot open the database {os.fspath(path)!r}: {exc}") from None
    try:
        yield store
    finally:
        with trio.move_on_after(10, shield=True):
            await store.aclose()
