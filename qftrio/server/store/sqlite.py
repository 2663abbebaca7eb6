"""The embedded store: one SQLite file, WAL, synchronous commits.

qftrio's default backend, so that ``qftrio serve`` works on a bare machine.
One connection serves every call, one call at a time, in a thread of the
store's own, so the event loop never blocks on disk. Each store
method is one ``BEGIN IMMEDIATE`` ... ``COMMIT`` transaction; with
``journal_mode=WAL`` and ``synchronous=FULL`` a commit is on disk before the
call returns, which is what lets the server acknowledge a job.

A single process owns the file: several servers on one SQLite file are not
supported (use PostgreSQL to scale out).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import sqlite3
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from queue import SimpleQueue
from typing import Any, TypeVar

import outcome
import trio

from ... import _json, errors
from ...models import (
    STATUS_OF,
    ErrorEntry,
    Job,
    Lease,
    QueueStats,
    Status,
    StepStatus,
    Workflow,
    WorkflowStatus,
    WorkflowStep,
)
from .base import (
    LEASE_EXPIRED,
    WORKFLOW_QUEUE,
    ClaimRequest,
    CompleteItem,
    FailItem,
    HeartbeatItem,
    HeartbeatResult,
    Inserted,
    NewJob,
    NewWorkflow,
    Outcome,
    Reaped,
    ReportResult,
    RetryAt,
    Store,
)

__all__ = ["SqliteStore", "open_sqlite_store"]

T = TypeVar("T")

_MIGRATIONS: list[str] = [
    # 1: jobs
    """
    CREATE TABLE jobs (
        id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        queue TEXT NOT NULL,
        kind TEXT NOT NULL,
        payload TEXT NOT NULL,
        status TEXT NOT NULL,
        priority INTEGER NOT NULL,
        attempt INTEGER NOT NULL,
        max_attempts INTEGER NOT NULL,
        scheduled_at REAL NOT NULL,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL,
        locked_until REAL,
        worker_id TEXT,
        lease_token TEXT,
        result TEXT,
        error TEXT,
        errors TEXT NOT NULL DEFAULT '[]',
        idempotency_key TEXT,
        workflow_id TEXT,
        step TEXT,
        context TEXT
    );
    CREATE UNIQUE INDEX jobs_idempotency ON jobs (tenant, idempotency_key)
        WHERE idempotency_key IS NOT NULL;
    CREATE INDEX jobs_ready ON jobs (queue, priority DESC, scheduled_at, created_at)
        WHERE status = 'pending';
    CREATE INDEX jobs_leased ON jobs (queue, locked_until) WHERE status = 'running';
    CREATE INDEX jobs_by_tenant ON jobs (tenant, created_at DESC, id DESC);
    CREATE INDEX jobs_by_tenant_queue ON jobs (tenant, queue, status);
    CREATE INDEX jobs_finished ON jobs (updated_at) WHERE status IN ('completed', 'cancelled');
    """,
    # 2: workflows. A step's ``state`` is ``waiting`` until it has a job,
    # ``enqueued`` after (the job's status is then the step's), or
    # ``cancelled`` if its workflow ended before it had one. ``remaining``
    # counts its dependencies not completed yet; ``workflow_edges`` lets a
    # completion find the steps waiting for it without a scan.
    """
    CREATE TABLE workflows (
        id TEXT PRIMARY KEY,
        tenant TEXT NOT NULL,
        name TEXT NOT NULL,
        status TEXT NOT NULL,
        context TEXT NOT NULL,
        steps_total INTEGER NOT NULL,
        steps_completed INTEGER NOT NULL DEFAULT 0,
        created_at REAL NOT NULL,
        updated_at REAL NOT NULL
    );
    CREATE INDEX workflows_by_tenant ON workflows (tenant, created_at DESC, id DESC);
    CREATE INDEX workflows_finished ON workflows (updated_at) WHERE status IN ('completed', 'cancelled');
    CREATE TABLE workflow_steps (
        workflow_id TEXT NOT NULL,
        name TEXT NOT NULL,
        position INTEGER NOT NULL,
        kind TEXT NOT NULL,
        payload TEXT NOT NULL,
        depends_on TEXT NOT NULL,
        max_attempts INTEGER NOT NULL,
        state TEXT NOT NULL,
        remaining INTEGER NOT NULL,
        job_id TEXT,
        PRIMARY KEY (workflow_id, name)
    ) WITHOUT ROWID;
    CREATE UNIQUE INDEX workflow_steps_order ON workflow_steps (workflow_id, position);
    CREATE TABLE workflow_edges (
        workflow_id TEXT NOT NULL,
        step TEXT NOT NULL,
        dependent TEXT NOT NULL,
        PRIMARY KEY (workflow_id, step, dependent)
    ) WITHOUT ROWID;
    CREATE UNIQUE INDEX jobs_workflow_step ON jobs (workflow_id, step) WHERE workflow_id IS NOT NULL;
    """,
]

_COLUMNS = (
    "id, tenant, queue, kind, payload, status, priority, attempt, max_attempts, scheduled_at, created_at, "
    "updated_at, locked_until, worker_id, result, error, errors, workflow_id, step, context"
)


def _loads(text: str | None) -> Any:
    return None if text is None else _json.loads(text)


def _dumps(value: Any) -> str | None:
    return None if value is None else _json.dumps_str(value)


def _row_to_job(row: sqlite3.Row | tuple[Any, ...]) -> Job:
    (
        id_, tenant, queue, kind, payload, status, priority, attempt, max_attempts, scheduled_at, created_at,
        updated_at, locked_until, worker_id, result, error, errors_, workflow_id, step, context,
    ) = row  # fmt: skip
    return Job(
        id=id_,
        tenant=tenant,
        queue=queue,
        kind=kind,
        payload=_json.loads(payload),
        status=STATUS_OF[status],
        priority=priority,
        attempt=attempt,
        max_attempts=max_attempts,
        scheduled_at=scheduled_at,
        created_at=created_at,
        updated_at=updated_at,
        locked_until=locked_until,
        worker_id=worker_id,
        result=_loads(result),
        error=error,
        errors=()
        if errors_ == "[]"
        else tuple(ErrorEntry(attempt=e["attempt"], error=e["error"], at=e["at"]) for e in _json.loads(errors_)),
        workflow_id=workflow_id,
        step=step,
        context=_loads(context),
    )


_COMPLETE_SQL = "UPDATE jobs SET status = 'completed', result = ?, locked_until = NULL, updated_at = ? WHERE id = ?"


def _rows_by_id(conn: sqlite3.Connection, columns: str, ids: list[str]) -> dict[str, tuple[Any, ...]]:
    """``{id: (columns...)}`` of the jobs among *ids* that exist, in one query."""
    out: dict[str, tuple[Any, ...]] = {}
    unique = list(dict.fromkeys(ids))
    for start in range(0, len(unique), 500):
        chunk = unique[start : start + 500]
        sql = f"SELECT id, {columns} FROM jobs WHERE id IN ({','.join('?' * len(chunk))})"
        for row in conn.execute(sql, chunk):
            out[row[0]] = row[1:]
    return out


def _append_error(errors_json: str, attempt: int, error: str, at: float) -> str:
    history = _json.loads(errors_json)
    history.append({"attempt": attempt, "error": error, "at": at})
    return _json.dumps_str(history)


def _insert_jobs(conn: sqlite3.Connection, jobs: Sequence[NewJob], now: float) -> list[Inserted]:
    out: list[Inserted] = []
    for new in jobs:
        if new.idempotency_key is not None:
            row = conn.execute(
                f"SELECT {_COLUMNS} FROM jobs WHERE tenant = ? AND idempotency_key = ?",
                (new.tenant, new.idempotency_key),
            ).fetchone()
            if row is not None:
                out.append(Inserted(job=_row_to_job(row), created=False))
                continue
        out.append(Inserted(job=_insert_job(conn, new, now), created=True))
    return out


def _claim(
    conn: sqlite3.Connection, queue: str, *, limit: int, lease_secs: float, worker_id: str | None, now: float
) -> list[Lease]:
    candidates = conn.execute(
        """SELECT id, priority, scheduled_at, created_at, NULL FROM jobs INDEXED BY jobs_ready
        WHERE queue = ? AND status = 'pending' AND scheduled_at <= ?
        ORDER BY priority DESC, scheduled_at, created_at LIMIT ?""",
        (queue, now, limit),
    ).fetchall()
    candidates += conn.execute(
        """SELECT id, priority, scheduled_at, created_at, errors FROM jobs INDEXED BY jobs_leased
        WHERE queue = ? AND status = 'running' AND locked_until < ? AND attempt < max_attempts
        ORDER BY locked_until LIMIT ?""",
        (queue, now, limit),
    ).fetchall()
    if not candidates:
        return []
    candidates.sort(key=lambda c: (-c[1], c[2], c[3]))
    ids = [c[0] for c in candidates[:limit]]
    tokens = {job_id: str(uuid.uuid4()) for job_id in ids}
    # One statement for the whole batch. SET expressions see the row
    # as it was, so `status = 'running'` marks the expired leases,
    # whose lost attempt goes into the error history.
    rows = conn.execute(
        f"""UPDATE jobs SET status = 'running', attempt = attempt + 1, locked_until = ?,
            worker_id = ?, updated_at = ?,
            lease_token = CASE id {" ".join("WHEN ? THEN ?" for _ in ids)} END,
            error = CASE WHEN status = 'running' THEN ? ELSE error END,
            errors = CASE WHEN status = 'running' THEN json_insert(errors, '$[#]',
                json_object('attempt', attempt, 'error', ?, 'at', ?)) ELSE errors END
        WHERE id IN ({",".join("?" * len(ids))}) RETURNING {_COLUMNS}""",
        (
            now + lease_secs, worker_id, now, *[x for job_id in ids for x in (job_id, tokens[job_id])],
            LEASE_EXPIRED, LEASE_EXPIRED, now, *ids,
        ),  # fmt: skip
    ).fetchall()
    by_id = {row[0]: row for row in rows}
    return [Lease(job=_row_to_job(by_id[job_id]), lease_token=tokens[job_id]) for job_id in ids]


def _insert_job(conn: sqlite3.Connection, new: NewJob, now: float, job_id: str | None = None) -> Job:
    row = conn.execute(
        f"""INSERT INTO jobs (id, tenant, queue, kind, payload, status, priority, attempt,
            max_attempts, scheduled_at, created_at, updated_at, idempotency_key, workflow_id,
            step, context)
        VALUES (?, ?, ?, ?, ?, 'pending', ?, 0, ?, ?, ?, ?, ?, ?, ?, ?)
        RETURNING {_COLUMNS}""",
        (
            job_id or str(uuid.uuid4()), new.tenant, new.queue, new.kind, _dumps(new.payload), new.priority,
            new.max_attempts, new.scheduled_at, now, now, new.idempotency_key, new.workflow_id,
            new.step, _dumps(new.context),
        ),  # fmt: skip
    ).fetchone()
    return _row_to_job(row)


# -- workflows ------------------------------------------------------------
# Module-level helpers that run inside the caller's transaction.


def _enqueue_step(
    conn: sqlite3.Connection, workflow_id: str, tenant: str, step: str, context: dict[str, Any], now: float
) -> None:
    """Give a waiting step its job, carrying *context* as it stands."""
    kind, payload, max_attempts = conn.execute(
        "SELECT kind, payload, max_attempts FROM workflow_steps WHERE workflow_id = ? AND name = ?",
        (workflow_id, step),
    ).fetchone()
    job_id = str(uuid.uuid4())
    conn.execute(
        """INSERT INTO jobs (id, tenant, queue, kind, payload, status, priority, attempt, max_attempts,
            scheduled_at, created_at, updated_at, workflow_id, step, context)
        VALUES (?, ?, ?, ?, ?, 'pending', 0, 0, ?, ?, ?, ?, ?, ?, ?)""",
        (job_id, tenant, WORKFLOW_QUEUE, kind, payload, max_attempts, now, now, now, workflow_id, step, _dumps(context)),
    )
    conn.execute(
        "UPDATE workflow_steps SET state = 'enqueued', job_id = ? WHERE workflow_id = ? AND name = ?",
        (job_id, workflow_id, step),
    )


def _step_completed(
    conn: sqlite3.Connection, workflow_id: str, step: str, result: dict[str, Any], now: float
) -> tuple[str, ...]:
    """Record that *step*'s job completed with *result*: merge it into the
    context, unblock the steps waiting for it, finish the workflow after its
    last step. Returns the queues that got new jobs. Touches only the
    steps that depend on *step*."""
    row = conn.execute(
        "SELECT tenant, status, context, steps_total, steps_completed FROM workflows WHERE id = ?", (workflow_id,)
    ).fetchone()
    if row is None:
        return ()
    tenant, status, context_json, total, completed = row
    context = _json.loads(context_json)
    context.update(result)
    completed += 1
    unblocked = conn.execute(
        """UPDATE workflow_steps SET remaining = remaining - 1
        WHERE workflow_id = ? AND name IN (SELECT dependent FROM workflow_edges WHERE workflow_id = ? AND step = ?)
        RETURNING name, position, remaining, state""",
        (workflow_id, workflow_id, step),
    ).fetchall()
    running = status == WorkflowStatus.RUNNING.value
    ready = sorted((pos, name) for name, pos, remaining, state in unblocked if remaining == 0 and state == "waiting")
    if running:
        # A step that is not running cannot complete (its job was cancelled
        # with the workflow); were it to, its dependents wait for a resume.
        for _, name in ready:
            _enqueue_step(conn, workflow_id, tenant, name, context, now)
        if completed >= total:
            status = WorkflowStatus.COMPLETED.value
    conn.execute(
        "UPDATE workflows SET context = ?, steps_completed = ?, status = ?, updated_at = ? WHERE id = ?",
        (_dumps(context), completed, status, now, workflow_id),
    )
    return (WORKFLOW_QUEUE,) if running and ready else ()


def _end_workflow(conn: sqlite3.Connection, workflow_id: str, status: WorkflowStatus, now: float) -> None:
    """Fail or cancel a running workflow with its unfinished steps (a no-op
    if it is not running). A running step's worker learns it on its next
    heartbeat, as for any cancelled job."""
    cur = conn.execute(
        "UPDATE workflows SET status = ?, updated_at = ? WHERE id = ? AND status = 'running'",
        (status.value, now, workflow_id),
    )
    if cur.rowcount == 0:
        return
    conn.execute(
        """UPDATE jobs SET status = 'cancelled', updated_at = ?
        WHERE workflow_id = ? AND status IN ('pending', 'running')""",
        (now, workflow_id),
    )
    conn.execute(
        "UPDATE workflow_steps SET state = 'cancelled' WHERE workflow_id = ? AND state = 'waiting'", (workflow_id,)
    )


def _resume_workflow(conn: sqlite3.Connection, workflow_id: str, failed_job_id: str, now: float) -> None:
    """Run a failed workflow again from its failed step (see
    :meth:`SqliteStore.job_retry`)."""
    tenant, context_json = conn.execute(
        "SELECT tenant, context FROM workflows WHERE id = ?", (workflow_id,)
    ).fetchone()
    conn.execute("UPDATE workflows SET status = 'running', updated_at = ? WHERE id = ?", (now, workflow_id))
    # The failed step and those cancelled by the failure: their
    # dependencies had completed, so they are ready again at once.
    conn.execute(
        """UPDATE jobs SET status = 'pending', attempt = 0, scheduled_at = ?, updated_at = ?, context = ?,
            locked_until = NULL, lease_token = NULL, worker_id = NULL
        WHERE workflow_id = ? AND (status = 'cancelled' OR id = ?)""",
        (now, now, context_json, workflow_id, failed_job_id),
    )
    waiting = conn.execute(
        """UPDATE workflow_steps SET state = 'waiting' WHERE workflow_id = ? AND state = 'cancelled'
        RETURNING name, position, remaining""",
        (workflow_id,),
    ).fetchall()
    context = _json.loads(context_json)
    for _, name in sorted((pos, name) for name, pos, remaining in waiting if remaining == 0):
        _enqueue_step(conn, workflow_id, tenant, name, context, now)


def _load_workflow(conn: sqlite3.Connection, workflow_id: str, *, jobs: bool = True) -> Workflow | None:
    row = conn.execute(
        "SELECT id, tenant, name, status, context, created_at, updated_at FROM workflows WHERE id = ?",
        (workflow_id,),
    ).fetchone()
    if row is None:
        return None
    return _build_workflows(conn, [row], jobs=jobs)[0]


def _build_workflows(conn: sqlite3.Connection, rows: list[Any], *, jobs: bool) -> list[Workflow]:
    """Workflows from their rows, with their steps (and jobs), in three
    queries whatever the number of workflows."""
    if not rows:
        return []
    ids = [r[0] for r in rows]
    marks = ",".join("?" * len(ids))
    steps: dict[str, list[tuple[Any, ...]]] = {i: [] for i in ids}
    for step_row in conn.execute(
        f"""SELECT workflow_id, name, kind, payload, depends_on, max_attempts, state, job_id
        FROM workflow_steps WHERE workflow_id IN ({marks}) ORDER BY workflow_id, position""",
        ids,
    ):
        steps[step_row[0]].append(step_row)
    job_status: dict[str, Status] = {}
    full: dict[str, Job] = {}
    if jobs:
        for job_row in conn.execute(f"SELECT {_COLUMNS} FROM jobs WHERE workflow_id IN ({marks})", ids):
            job = _row_to_job(job_row)
            full[job.id] = job
            job_status[job.id] = job.status
    else:
        job_status = dict(conn.execute(f"SELECT id, status FROM jobs WHERE workflow_id IN ({marks})", ids).fetchall())
    out = []
    for id_, tenant, name, status, context, created_at, updated_at in rows:
        built = []
        for _, step, kind, payload, depends_on, max_attempts, state, job_id in steps[id_]:
            if job_id is not None:
                step_status = StepStatus(str(job_status.get(job_id, Status.PENDING)))
            else:
                step_status = StepStatus(state)
            built.append(
                WorkflowStep(
                    name=step,
                    kind=kind,
                    payload=_json.loads(payload),
                    depends_on=tuple(_json.loads(depends_on)),
                    max_attempts=max_attempts,
                    status=step_status,
                    job_id=job_id,
                    job=full.get(job_id) if job_id is not None else None,
                )
            )
        out.append(
            Workflow(
                id=id_,
                tenant=tenant,
                name=name,
                status=WorkflowStatus(status),
                context=_json.loads(context),
                steps=tuple(built),
                created_at=created_at,
                updated_at=updated_at,
            )
        )
    return out


@dataclasses.dataclass(eq=False, slots=True)
class _Call:
    """One store call waiting for (or done by) a group commit."""

    fn: Callable[[sqlite3.Connection], Any]
    taken: bool = False
    value: Any = None
    error: BaseException | None = None


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
        self._waiting: list[_Call] = []
        self._thread: _StoreThread | None = None
        self._conn: sqlite3.Connection | None = sqlite3.connect(
            path, isolation_level=None, check_same_thread=False
        )
        self._conn.execute("PRAGMA journal_mode=WAL")
        self._conn.execute("PRAGMA synchronous=FULL")
        self._conn.execute("PRAGMA busy_timeout=5000")
        self._migrate()

    def _migrate(self) -> None:
        conn = self._require()
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        for number, script in enumerate(_MIGRATIONS[version:], start=version + 1):
            conn.executescript(f"BEGIN IMMEDIATE;\n{script}\nPRAGMA user_version = {number};\nCOMMIT;")

    def _require(self) -> sqlite3.Connection:
        if self._conn is None:
            raise errors.Unavailable("the store is closed")
        return self._conn

    async def _run(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run *fn* in a transaction of its own, atomically.

        Group commit: calls that arrive while a commit is under way wait,
        and the next of them to get the connection runs every waiting call
        in one transaction, each inside a savepoint of its own (a call that
        raises rolls back only itself). One commit, so one sync to disk, then
        serves the whole group; each call still applies fully or not at all,
        and none returns before its commit is on disk.
        """
        call = _Call(fn)
        self._waiting.append(call)
        try:
            async with self._lock:
                if not call.taken:
                    batch, self._waiting = self._waiting, []
                    for taken in batch:
                        taken.taken = True
                    if self._threaded:
                        # Not abandoned on cancel: a transaction that started
                        # finishes, so no request leaves half a change behind.
                        if self._thread is None:
                            self._thread = _StoreThread()
                        await self._thread.run(lambda: self._execute(batch))
                    else:
                        self._execute(batch)
        except BaseException:
            if not call.taken:
                self._waiting.remove(call)
            raise
        if call.error is not None:
            raise call.error
        return call.value  # type: ignore[return-value]

    def _execute(self, batch: list[_Call]) -> None:
        try:
            conn = self._require()
            conn.execute("BEGIN IMMEDIATE")
        except Exception as exc:
            for call in batch:
                call.error = _database_error(exc)
            return
        try:
            if len(batch) == 1:
                batch[0].value = batch[0].fn(conn)
            else:
                for call in batch:
                    conn.execute("SAVEPOINT call")
                    try:
                        call.value = call.fn(conn)
                    except Exception as exc:
                        conn.execute("ROLLBACK TO call")
                        call.error = exc
                    conn.execute("RELEASE call")
            conn.execute("COMMIT")
        except Exception as exc:
            with contextlib.suppress(sqlite3.Error):
                conn.execute("ROLLBACK")
            for call in batch:
                if len(batch) == 1 or call.error is None:
                    call.error = exc if len(batch) == 1 else _database_error(exc)
                    call.value = None

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

    async def jobs_insert(self, jobs: Sequence[NewJob], *, now: float) -> list[Inserted]:
        return await self._run(lambda conn: _insert_jobs(conn, jobs, now))

    async def jobs_insert_claiming(
        self, jobs: Sequence[NewJob], *, now: float, claims: Sequence[ClaimRequest]
    ) -> tuple[list[Inserted], list[list[Lease]]]:
        def insert_claiming(conn: sqlite3.Connection) -> tuple[list[Inserted], list[list[Lease]]]:
            inserted = _insert_jobs(conn, jobs, now)
            return inserted, [
                _claim(conn, c.queue, limit=c.limit, lease_secs=c.lease_secs, worker_id=c.worker_id, now=now)
                for c in claims
            ]

        return await self._run(insert_claiming)

    async def job_get(self, job_id: str, *, tenant: str | None = None) -> Job | None:
        def get(conn: sqlite3.Connection) -> Job | None:
            row = conn.execute(f"SELECT {_COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone()
            if row is None:
                return None
            job = _row_to_job(row)
            return job if tenant is None or job.tenant == tenant else None

        return await self._run(get)

    async def jobs_list(
        self,
        *,
        tenant: str,
        queue: str | None = None,
        status: Status | None = None,
        kind: str | None = None,
        limit: int = 50,
        before: tuple[float, str] | None = None,
    ) -> list[Job]:
        where = ["tenant = ?"]
        args: list[Any] = [tenant]
        if queue is not None:
            where.append("queue = ?")
            args.append(queue)
        if status is not None:
            where.append("status = ?")
            args.append(Status(status).value)
        if kind is not None:
            where.append("kind = ?")
            args.append(kind)
        if before is not None:
            where.append("(created_at < ? OR (created_at = ? AND id < ?))")
            args += [before[0], before[0], before[1]]
        sql = (
            f"SELECT {_COLUMNS} FROM jobs WHERE {' AND '.join(where)} "
            "ORDER BY created_at DESC, id DESC LIMIT ?"
        )
        args.append(limit)
        return await self._run(lambda conn: [_row_to_job(r) for r in conn.execute(sql, args)])

    def _get_owned(self, conn: sqlite3.Connection, job_id: str, tenant: str) -> tuple[str, str, str | None] | None:
        return conn.execute(
            "SELECT status, queue, workflow_id FROM jobs WHERE id = ? AND tenant = ?", (job_id, tenant)
        ).fetchone()

    async def job_cancel(self, job_id: str, *, tenant: str, now: float) -> Job | None:
        def cancel(conn: sqlite3.Connection) -> Job | None:
            row = self._get_owned(conn, job_id, tenant)
            if row is None:
                return None
            if Status(row[0]) not in (Status.PENDING, Status.RUNNING):
                raise errors.Conflict(f"job {job_id} is {row[0]}; only pending or running jobs can be cancelled")
            row = conn.execute(
                f"UPDATE jobs SET status = 'cancelled', updated_at = ? WHERE id = ? RETURNING {_COLUMNS}",
                (now, job_id),
            ).fetchone()
            job = _row_to_job(row)
            if job.workflow_id is not None:  # a step cancelled by hand cancels its workflow
                _end_workflow(conn, job.workflow_id, WorkflowStatus.CANCELLED, now)
            return job

        return await self._run(cancel)

    async def job_retry(self, job_id: str, *, tenant: str, now: float) -> Job | None:
        def retry(conn: sqlite3.Connection) -> Job | None:
            row = self._get_owned(conn, job_id, tenant)
            if row is None:
                return None
            if Status(row[0]) not in (Status.FAILED, Status.CANCELLED):
                raise errors.Conflict(f"job {job_id} is {row[0]}; only failed or cancelled jobs can be retried")
            workflow_id = row[2]
            if workflow_id is not None:
                (wf_status,) = conn.execute("SELECT status FROM workflows WHERE id = ?", (workflow_id,)).fetchone()
                if wf_status == WorkflowStatus.CANCELLED.value:
                    raise errors.Conflict(
                        f"job {job_id} is a step of workflow {workflow_id}, which was cancelled; "
                        "a cancelled workflow does not resume"
                    )
                if wf_status == WorkflowStatus.FAILED.value:
                    if row[0] != Status.FAILED.value:
                        step, failed_id = conn.execute(
                            "SELECT step, id FROM jobs WHERE workflow_id = ? AND status = 'failed' LIMIT 1",
                            (workflow_id,),
                        ).fetchone()
                        raise errors.Conflict(
                            f"workflow {workflow_id} failed at step {step!r}; "
                            f"retry that step's job ({failed_id}) to resume it"
                        )
                    _resume_workflow(conn, workflow_id, job_id, now)
                    return _row_to_job(conn.execute(f"SELECT {_COLUMNS} FROM jobs WHERE id = ?", (job_id,)).fetchone())
            row = conn.execute(
                f"""UPDATE jobs SET status = 'pending', attempt = 0, scheduled_at = ?, updated_at = ?,
                    locked_until = NULL, lease_token = NULL, worker_id = NULL
                WHERE id = ? RETURNING {_COLUMNS}""",
                (now, now, job_id),
            ).fetchone()
            return _row_to_job(row)

        return await self._run(retry)

    async def queues_stats(self, *, tenant: str, now: float, queue: str | None = None) -> list[QueueStats]:
        def stats(conn: sqlite3.Connection) -> list[QueueStats]:
            if queue is None:
                queues = [r[0] for r in conn.execute("SELECT DISTINCT queue FROM jobs WHERE tenant = ?", (tenant,))]
            else:
                queues = [queue]
            out = []
            for q in sorted(queues):
                counts = dict(
                    conn.execute(
                        "SELECT status, count(*) FROM jobs WHERE tenant = ? AND queue = ? GROUP BY status",
                        (tenant, q),
                    ).fetchall()
                )
                (oldest,) = conn.execute(
                    """SELECT min(scheduled_at) FROM jobs
                    WHERE tenant = ? AND queue = ? AND status = 'pending' AND scheduled_at <= ?""",
                    (tenant, q, now),
                ).fetchone()
                (next_scheduled,) = conn.execute(
                    """SELECT min(scheduled_at) FROM jobs
                    WHERE tenant = ? AND queue = ? AND status = 'pending' AND scheduled_at > ?""",
                    (tenant, q, now),
                ).fetchone()
                (next_lease,) = conn.execute(
                    "SELECT min(locked_until) FROM jobs WHERE tenant = ? AND queue = ? AND status = 'running'",
                    (tenant, q),
                ).fetchone()
                nexts = [t for t in (next_scheduled, next_lease) if t is not None]
                out.append(
                    QueueStats(
                        queue=q,
                        counts={s.value: counts.get(s.value, 0) for s in Status},
                        oldest_ready_at=oldest,
                        next_available_at=min(nexts) if nexts else None,
                    )
                )
            return out

        return await self._run(stats)

    # -- worker side -------------------------------------------------------

    async def jobs_claim(
        self, queue: str, *, limit: int, lease_secs: float, worker_id: str | None, now: float
    ) -> list[Lease]:
        return await self._run(
            lambda conn: _claim(conn, queue, limit=limit, lease_secs=lease_secs, worker_id=worker_id, now=now)
        )

    async def queue_next_available_at(self, queue: str, *, now: float) -> float | None:
        def next_at(conn: sqlite3.Connection) -> float | None:
            (scheduled,) = conn.execute(
                """SELECT min(scheduled_at) FROM jobs INDEXED BY jobs_ready
                WHERE queue = ? AND status = 'pending' AND scheduled_at > ?""",
                (queue, now),
            ).fetchone()
            (lease,) = conn.execute(
                """SELECT min(locked_until) FROM jobs INDEXED BY jobs_leased
                WHERE queue = ? AND status = 'running' AND attempt < max_attempts""",
                (queue,),
            ).fetchone()
            times = [t for t in (scheduled, lease) if t is not None]
            return min(times) if times else None

        return await self._run(next_at)

    async def jobs_heartbeat(self, items: Sequence[HeartbeatItem], *, now: float) -> list[HeartbeatResult]:
        def heartbeat(conn: sqlite3.Connection) -> list[HeartbeatResult]:
            rows = _rows_by_id(conn, "status, lease_token", [i.job_id for i in items])
            updates = []
            out = []
            for item in items:
                row = rows.get(item.job_id)
                if row is None:
                    out.append(HeartbeatResult(outcome=Outcome.NOT_FOUND))
                elif row[1] is None or row[1] != item.lease_token:
                    out.append(HeartbeatResult(outcome=Outcome.CONFLICT))
                elif row[0] != Status.RUNNING.value:
                    out.append(HeartbeatResult(outcome=Outcome.OK, status=Status(row[0])))
                else:
                    until = now + item.extend_secs
                    updates.append((until, item.job_id))
                    out.append(HeartbeatResult(outcome=Outcome.OK, status=Status.RUNNING, locked_until=until))
            conn.executemany("UPDATE jobs SET locked_until = ? WHERE id = ?", updates)
            return out

        return await self._run(heartbeat)

    async def jobs_complete(self, items: Sequence[CompleteItem], *, now: float) -> list[ReportResult]:
        def complete(conn: sqlite3.Connection) -> list[ReportResult]:
            rows = _rows_by_id(conn, "status, lease_token, queue, workflow_id, step", [i.job_id for i in items])
            updates = []
            out = []
            for item in items:
                row = rows.get(item.job_id)
                if row is None:
                    out.append(ReportResult(outcome=Outcome.NOT_FOUND))
                    continue
                status, token, queue, workflow_id, step = row
                if token is None or token != item.lease_token:
                    out.append(ReportResult(outcome=Outcome.CONFLICT))
                elif status == Status.COMPLETED.value:
                    out.append(ReportResult(outcome=Outcome.OK, queue=queue, status=Status.COMPLETED))
                elif status != Status.RUNNING.value:
                    out.append(ReportResult(outcome=Outcome.CONFLICT))
                else:
                    rows[item.job_id] = (Status.COMPLETED.value, token, queue, workflow_id, step)
                    ready: tuple[str, ...] = ()
                    if workflow_id is None:
                        updates.append((_dumps(item.result), now, item.job_id))
                    else:
                        conn.execute(_COMPLETE_SQL, (_dumps(item.result), now, item.job_id))
                        ready = _step_completed(conn, workflow_id, step, item.result, now)
                    out.append(
                        ReportResult(
                            outcome=Outcome.OK, queue=queue, status=Status.COMPLETED, applied=True, ready_queues=ready
                        )
                    )
            conn.executemany(_COMPLETE_SQL, updates)
            return out

        return await self._run(complete)

    async def jobs_fail(self, items: Sequence[FailItem], *, now: float, retry_at: RetryAt) -> list[ReportResult]:
        def fail(conn: sqlite3.Connection) -> list[ReportResult]:
            out = []
            for item in items:
                row = conn.execute(
                    """SELECT status, lease_token, queue, attempt, max_attempts, errors, workflow_id
                    FROM jobs WHERE id = ?""",
                    (item.job_id,),
                ).fetchone()
                if row is None:
                    out.append(ReportResult(outcome=Outcome.NOT_FOUND))
                    continue
                status, token, queue, attempt, max_attempts, errors_json, workflow_id = row
                if token is None or token != item.lease_token:
                    out.append(ReportResult(outcome=Outcome.CONFLICT))
                elif status in (Status.PENDING.value, Status.FAILED.value):
                    out.append(ReportResult(outcome=Outcome.OK, queue=queue, status=Status(status)))
                elif status != Status.RUNNING.value:
                    out.append(ReportResult(outcome=Outcome.CONFLICT))
                else:
                    when = retry_at(attempt, max_attempts, item.retryable, now)
                    new_status = Status.FAILED if when is None else Status.PENDING
                    conn.execute(
                        """UPDATE jobs SET status = ?, scheduled_at = coalesce(?, scheduled_at),
                            locked_until = NULL, error = ?, errors = ?, updated_at = ? WHERE id = ?""",
                        (
                            new_status.value, when, item.error,
                            _append_error(errors_json, attempt, item.error, now), now, item.job_id,
                        ),  # fmt: skip
                    )
                    if new_status is Status.FAILED and workflow_id is not None:
                        _end_workflow(conn, workflow_id, WorkflowStatus.FAILED, now)
                    out.append(ReportResult(outcome=Outcome.OK, queue=queue, status=new_status, applied=True))
            return out

        return await self._run(fail)

    async def jobs_reap_expired(self, *, now: float, limit: int = 1000) -> list[Reaped]:
        def reap(conn: sqlite3.Connection) -> list[Reaped]:
            rows = conn.execute(
                """SELECT id, queue, attempt, max_attempts, workflow_id FROM jobs
                WHERE status = 'running' AND locked_until < ? LIMIT ?""",
                (now, limit),
            ).fetchall()
            out = []
            for job_id, queue, attempt, max_attempts, workflow_id in rows:
                status = Status.PENDING if attempt < max_attempts else Status.FAILED
                cur = conn.execute(
                    """UPDATE jobs SET status = ?, locked_until = NULL, lease_token = NULL, worker_id = NULL,
                        error = ?, errors = json_insert(errors, '$[#]',
                            json_object('attempt', attempt, 'error', ?, 'at', ?)),
                        updated_at = ?
                    WHERE id = ? AND status = 'running'""",
                    (status.value, LEASE_EXPIRED, LEASE_EXPIRED, now, now, job_id),
                )
                if cur.rowcount == 0:  # cancelled with its workflow earlier in this round
                    continue
                if status is Status.FAILED and workflow_id is not None:
                    _end_workflow(conn, workflow_id, WorkflowStatus.FAILED, now)
                out.append(Reaped(job_id=job_id, queue=queue, status=status))
            return out

        return await self._run(reap)

    async def jobs_prune(self, *, before: float, limit: int = 10000) -> int:
        def prune(conn: sqlite3.Connection) -> int:
            cur = conn.execute(
                """DELETE FROM jobs WHERE id IN (
                    SELECT id FROM jobs INDEXED BY jobs_finished
                    WHERE status IN ('completed', 'cancelled') AND updated_at < ? AND workflow_id IS NULL
                    LIMIT ?)""",
                (before, limit),
            )
            deleted = cur.rowcount
            # Workflows go whole, so that a workflow never shows a step whose
            # job has vanished; failed ones stay, like dead-lettered jobs.
            finished = conn.execute(
                """SELECT id FROM workflows INDEXED BY workflows_finished
                WHERE status IN ('completed', 'cancelled') AND updated_at < ? LIMIT 100""",
                (before,),
            ).fetchall()
            for (workflow_id,) in finished:
                if deleted >= limit:
                    break
                deleted += conn.execute("DELETE FROM jobs WHERE workflow_id = ?", (workflow_id,)).rowcount
                conn.execute("DELETE FROM workflow_edges WHERE workflow_id = ?", (workflow_id,))
                conn.execute("DELETE FROM workflow_steps WHERE workflow_id = ?", (workflow_id,))
                conn.execute("DELETE FROM workflows WHERE id = ?", (workflow_id,))
            return deleted

        return await self._run(prune)


    # -- workflows ---------------------------------------------------------

    async def workflow_create(self, workflow: NewWorkflow, *, now: float) -> Workflow:
        def create(conn: sqlite3.Connection) -> Workflow:
            workflow_id = str(uuid.uuid4())
            context = _dumps(workflow.context)
            conn.execute(
                """INSERT INTO workflows (id, tenant, name, status, context, steps_total, steps_completed,
                    created_at, updated_at)
                VALUES (?, ?, ?, 'running', ?, ?, 0, ?, ?)""",
                (workflow_id, workflow.tenant, workflow.name, context, len(workflow.steps), now, now),
            )
            roots = {s.name: str(uuid.uuid4()) for s in workflow.steps if not s.depends_on}
            conn.executemany(
                """INSERT INTO workflow_steps (workflow_id, name, position, kind, payload, depends_on,
                    max_attempts, state, remaining, job_id)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)""",
                [
                    (
                        workflow_id, s.name, i, s.kind, _dumps(s.payload), _dumps(list(s.depends_on)),
                        s.max_attempts, "enqueued" if s.name in roots else "waiting", len(s.depends_on),
                        roots.get(s.name),
                    )  # fmt: skip
                    for i, s in enumerate(workflow.steps)
                ],
            )
            conn.executemany(
                "INSERT INTO workflow_edges (workflow_id, step, dependent) VALUES (?, ?, ?)",
                [(workflow_id, dep, s.name) for s in workflow.steps for dep in s.depends_on],
            )
            conn.executemany(
                """INSERT INTO jobs (id, tenant, queue, kind, payload, status, priority, attempt, max_attempts,
                    scheduled_at, created_at, updated_at, workflow_id, step, context)
                VALUES (?, ?, ?, ?, ?, 'pending', 0, 0, ?, ?, ?, ?, ?, ?, ?)""",
                [
                    (
                        roots[s.name], workflow.tenant, WORKFLOW_QUEUE, s.kind, _dumps(s.payload), s.max_attempts,
                        now, now, now, workflow_id, s.name, context,
                    )  # fmt: skip
                    for s in workflow.steps
                    if s.name in roots
                ],
            )
            loaded = _load_workflow(conn, workflow_id)
            assert loaded is not None
            return loaded

        return await self._run(create)

    async def workflow_get(self, workflow_id: str, *, tenant: str | None = None, jobs: bool = True) -> Workflow | None:
        def get(conn: sqlite3.Connection) -> Workflow | None:
            row = conn.execute("SELECT tenant FROM workflows WHERE id = ?", (workflow_id,)).fetchone()
            if row is None or (tenant is not None and row[0] != tenant):
                return None
            return _load_workflow(conn, workflow_id, jobs=jobs)

        return await self._run(get)

    async def workflows_list(
        self,
        *,
        tenant: str,
        status: WorkflowStatus | None = None,
        limit: int = 50,
        before: tuple[float, str] | None = None,
    ) -> list[Workflow]:
        where = ["tenant = ?"]
        args: list[Any] = [tenant]
        if status is not None:
            where.append("status = ?")
            args.append(WorkflowStatus(status).value)
        if before is not None:
            where.append("(created_at < ? OR (created_at = ? AND id < ?))")
            args += [before[0], before[0], before[1]]
        sql = (
            "SELECT id, tenant, name, status, context, created_at, updated_at FROM workflows "
            f"WHERE {' AND '.join(where)} ORDER BY created_at DESC, id DESC LIMIT ?"
        )
        args.append(limit)
        return await self._run(lambda conn: _build_workflows(conn, conn.execute(sql, args).fetchall(), jobs=False))

    async def workflow_cancel(self, workflow_id: str, *, tenant: str, now: float) -> Workflow | None:
        def cancel(conn: sqlite3.Connection) -> Workflow | None:
            row = conn.execute(
                "SELECT status FROM workflows WHERE id = ? AND tenant = ?", (workflow_id, tenant)
            ).fetchone()
            if row is None:
                return None
            if row[0] != WorkflowStatus.RUNNING.value:
                raise errors.Conflict(f"workflow {workflow_id} is {row[0]}; only running workflows can be cancelled")
            _end_workflow(conn, workflow_id, WorkflowStatus.CANCELLED, now)
            return _load_workflow(conn, workflow_id)

        return await self._run(cancel)


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
