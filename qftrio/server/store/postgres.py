"""The PostgreSQL store: several ``qftrio serve`` processes on one database.

PostgreSQL is spoken to from Trio itself, through libpq's non-blocking calls (see :mod:`.pgtrio`).
Open the store with :func:`open_postgres_store`; apply the schema with :func:`migrate` (which
``open_postgres_store`` does by default).

How the rules of :mod:`.base` are kept with many servers at once:

* Claims are one statement: candidates are picked with ``FOR UPDATE SKIP
  LOCKED``, so concurrent claimers never wait on each other and never take the
  same row; the partial index ``qftrio_jobs_claim_idx`` keeps a claim's cost
  independent of how many finished jobs the table holds.
* Every outcome is decided by :mod:`qftrio.server.transitions`; the
  statements of ``queries/postgres.sql`` are the guarded writes that execute
  it ("if the job is running under this token"). The changes written once
  in :mod:`.changes` (cancel, retry, workflows, bulk actions, the janitor,
  fail batches) run over them in one transaction each (:func:`_drive`, on
  one pooled connection); the claim, the inserts and the
  heartbeat and complete batches are this module's own statements, whose
  answers :mod:`~qftrio.server.transitions` decides on.
* Heartbeats and completions are one statement per batch (``unnest``
  arrays), so one transaction: the current leases are changed without being
  locked first, the other items' rows read for their outcome. A workflow
  step, and an item that raced another change of its job, is decided once,
  under the row lock (its workflow's first), in a transaction of its own. Failures lock the rows (``SELECT ...
  FOR UPDATE``), ask the engine's ``retry_at`` through
  :func:`~qftrio.server.transitions.fail`, and update, in one transaction
  (:func:`.changes.jobs_fail`).
  Batches lock rows in id order, so two batches never deadlock.
* The janitor (``jobs_reap_expired``, ``jobs_prune``) skips rows another
  server is working on (``SKIP LOCKED``), so janitors do not collide.
* Workflows (migration 0002) advance inside the job transactions that cause
  it, as :mod:`.base` requires. A transaction that touches a workflow locks
  its row (``FOR UPDATE``, in id order) *before* any of its jobs; heartbeats
  and claims lock jobs only and never wait for a workflow, so no cycle of
  waits can form. Concurrent completions of one workflow's steps thus take
  turns on its row, which keeps the context merge and the counts exact.
* Whatever makes work ready (an insert, a retry, a fail with a retry, a reap,
  a workflow step unblocked) sends ``NOTIFY qftrio_jobs, '<queue>'`` in its own transaction, so the
  notification is delivered if and only if the change commits. Each server
  holds one LISTEN connection (:meth:`PostgresStore.run_listener`).

Times are ``double precision`` epoch seconds: the floats the interface passes,
stored exactly.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import psycopg.errors
import orjson
import trio

from ... import _json, errors
from ..._backoff import backoff
from ...models import (
    JOB_FORM,
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
from .. import transitions
from . import changes, pgtrio, sql
from .base import (
    ALL_QUEUES,
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
    issued,
    new_ids,
    new_job_row,
    unique_since,
    workers_of,
)

__all__ = ["PostgresStore", "open_postgres_store", "migrate", "pending_migrations", "CHANNEL", "ALL_QUEUES"]

log = logging.getLogger("qftrio.store.postgres")

T = TypeVar("T")

#: The NOTIFY channel; the payload is a queue name.
CHANNEL = "qftrio_jobs"
#: The prefix of a notification on CHANNEL that a job ended (migration 0018);
#: a queue's name cannot hold its colon.
ENDED = "ended:"
#: The prefix of a job change's notification, its JSON after (migration 0021).
EVENT = "event:"

#: What :meth:`PostgresStore.run_listener` passes to ``on_notify`` when it may
#: have missed notifications (its connection was lost and came back): wake
#: every queue.

#: ``pg_advisory_lock`` key held while migrating (any constant unique to qftrio).
MIGRATION_LOCK_KEY = 0x71F7_0001

Q = sql.load("postgres")
assert f"'{CHANNEL}'" in Q["notify_queues"]


# -- helpers ------------------------------------------------------------------


def _uuid_param(value: str) -> str | None:
    """:func:`_uuid` for values only passed as ``uuid`` parameters (the
    text is sent as it is): the reports' hot path, without building UUID objects."""
    return value if issued(value) else None


def _uuid(value: str | None) -> uuid.UUID | None:
    """*value* as a UUID if it is one in canonical form, else None: ids and
    tokens are compared as the strings qftrio issued."""
    if not isinstance(value, str):
        return None
    try:
        parsed = uuid.UUID(value)
    except ValueError:
        return None
    return parsed if str(parsed) == value else None


def _errors(history: list[dict[str, Any]]) -> tuple[ErrorEntry, ...]:
    # no generator for an empty history: one per claimed job
    if not history:
        return ()
    return tuple(map(ErrorEntry.from_stored, history))


def _str_or_none(value: Any) -> str | None:
    return None if value is None else str(value)


def _job_value(name: str) -> str:
    # Each of Job's fields read by name (job_columns); a dict lookup for the
    # status, ids read as strings.
    special = {
        "id": 'str(row["id"])',
        "status": 'STATUS_OF[row["status"]]',
        "errors": '_errors(row["errors"])',
        "attempts": (
            'attempt_history(row["attempts"], row["status"], row["attempt"], row["worker_id"], row["claimed_at"], '
            'row["updated_at"])'
        ),
        "workflow_id": '_str_or_none(row["workflow_id"])',
    }
    return special.get(name) or f"row[{JOB_FORM.wire[name]!r}]"


#: A job of a row of ``job_columns``.
_job: Callable[[pgtrio.Record], Job] = JOB_FORM.builder(
    "_job",
    "row",
    _job_value,
    {"STATUS_OF": STATUS_OF, "_errors": _errors, "attempt_history": attempt_history, "_str_or_none": _str_or_none},
)


def _insert_batch(ids: Sequence[str], jobs: Sequence[NewJob]) -> str:
    """The rows of ``jobs_insert``, one JSON array per job, as one JSON text.
    A dozen array parameters of a thousand jobs cost more to adapt element
    by element than writing the batch once with orjson, each payload as the
    jsonb dumper would write it.

    Raises:
        InvalidInput: a value that JSON (so jsonb) cannot hold, as the dumper
            would refuse it.
    """
    try:
        return orjson.dumps([_insert_row(job_id, new) for job_id, new in zip(ids, jobs)]).decode()
    except (TypeError, ValueError) as exc:
        raise errors.InvalidInput(f"a value cannot be stored: {exc}", code="unstorable") from None


def _json_fragment(value: Any) -> orjson.Fragment:
    return orjson.Fragment(_json.dumps_strict(value))


#: One job of ``jobs_insert``: its id and fields, each JSON value as the
#: jsonb dumper would write it.
_insert_row = new_job_row(_json_fragment)


async def _notify(conn: pgtrio.Connection, queues: Sequence[str] | set[str]) -> None:
    # inside the caller's transaction, so it is delivered on commit only
    await _drive(conn, changes.notify(queues))


def _inserter(
    jobs: Sequence[NewJob], now: float, *, locked: bool = False
) -> Callable[[pgtrio.Connection], Awaitable[list[Inserted]]]:
    """The body of :meth:`PostgresStore.jobs_insert`, to
    run in a transaction (a plan's insert too: :data:`.changes.Want.INSERTED`;
    *locked*: the unique keys of *jobs* are locked already)."""
    if not locked and any(new.unique is not None for new in jobs):
        return _unique_inserter(jobs, now)
    # Within a batch, a repeated (tenant, key) stands for its first occurrence.
    first_of: dict[tuple[str, str], int] = {}
    alias: dict[int, int] = {}
    fresh: list[int] = []
    for i, new in enumerate(jobs):
        if new.idempotency_key is not None:
            key = (new.tenant, new.idempotency_key)
            if key in first_of:
                alias[i] = first_of[key]
                continue
            first_of[key] = i
        fresh.append(i)
    ids = new_ids(len(fresh), now)
    rows = [jobs[i] for i in fresh]
    for new in rows:
        if new.workflow_id is not None and _uuid(new.workflow_id) is None:
            raise errors.InvalidInput(f"workflow_id: not a UUID: {new.workflow_id!r}")
    batch = _insert_batch(ids, rows)

    async def insert(conn: pgtrio.Connection) -> list[Inserted]:
        # The NOTIFY of the new jobs' queues is part of the statement
        # (delivered when it commits): no round trip of its own.
        created = {row[0] for row in await conn.fetch(Q["jobs_insert"], batch, now, CHANNEL)}
        existing: dict[tuple[str, str], Job] = {}
        missing = [n for job_id, n in zip(ids, rows) if job_id not in created]
        if missing:
            # Their keys were taken (maybe by a transaction that committed
            # while we waited on it): return those jobs.
            found = await conn.fetch(
                Q["jobs_by_idempotency_keys"],
                [n.tenant for n in missing],
                [n.idempotency_key for n in missing],
            )
            for row in found:
                existing[(row["tenant"], row["idempotency_key"])] = _job(row)
            if len(existing) < len(missing):
                # the conflicting job vanished before we could read it (pruned)
                raise errors.Unavailable("an idempotency key changed hands during the insert; try again")
        out_fresh: dict[int, Inserted] = {}
        for i, job_id, new in zip(fresh, ids, rows):
            if job_id in created:
                out_fresh[i] = Inserted(job_id, new, now)
            else:
                assert new.idempotency_key is not None
                job = existing[(new.tenant, new.idempotency_key)]
                out_fresh[i] = Inserted(job.id, new, now, job)
        out = []
        for i, new in enumerate(jobs):
            if i in out_fresh:
                out.append(out_fresh[i])
            else:
                first = out_fresh[alias[i]]
                out.append(Inserted(first.id, new, now, first.job))
        return out

    return insert


def _unique_inserter(jobs: Sequence[NewJob], now: float) -> Callable[[pgtrio.Connection], Awaitable[list[Inserted]]]:
    """:func:`_inserter` for a batch with unique jobs: the (tenant, key)
    pairs are locked first (advisory, until the transaction ends, in
    order), then each job is looked up and inserted in turn, so that
    concurrent inserts of one key on any server take turns and a repeat
    later in the batch finds the first."""

    async def insert(conn: pgtrio.Connection) -> list[Inserted]:
        keys = sorted({(new.tenant, new.unique["key"]) for new in jobs if new.unique is not None})
        await conn.execute(Q["unique_lock"], [t for t, _ in keys], [k for _, k in keys])
        out: list[Inserted] = []
        for new in jobs:
            if new.unique is not None:
                row = await conn.fetchrow(
                    Q["job_by_unique_key"], new.tenant, new.unique["key"], new.unique["statuses"],
                    unique_since(new.unique, now),
                )  # fmt: skip
                if row is not None:
                    job = _job(row)
                    out.append(Inserted(job.id, new, now, job))
                    continue
            out += await _inserter([new], now, locked=True)(conn)
        return out

    return insert


# -- the executor of changes (changes.py) --------------------------------------------


def _plain(value: Any) -> Any:
    return str(value) if isinstance(value, uuid.UUID) else value  # ids are read as UUIDs


async def _drive(conn: pgtrio.Connection, plan: changes.Plan[T]) -> T:
    """Run *plan* on *conn*, in the caller's transaction."""
    answer: Any = None
    try:
        while True:
            answer = await _answer(conn, plan.send(answer))
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


async def _answer(conn: pgtrio.Connection, call: changes.Call) -> Any:
    want = call.want
    if want is changes.Want.INSERTED:
        return await _inserter(*call.args)(conn)
    statement = Q[call.name]
    if not statement:
        return [] if want in (changes.Want.ROWS, changes.Want.JOBS) else None
    if call.many:
        await conn.executemany(statement, call.args)
        return None
    if want is changes.Want.NOTHING:
        await conn.execute(statement, *call.args)
        return None
    rows = await conn.fetch(statement, *call.args)
    if want is changes.Want.JOB:
        return _job(rows[0]) if rows else None
    if want is changes.Want.JOBS:
        return [_job(row) for row in rows]
    if want is changes.Want.VALUE:
        return _plain(rows[0][0]) if rows else None
    if want is changes.Want.ROW:
        return tuple(map(_plain, rows[0])) if rows else None
    return [tuple(map(_plain, row)) for row in rows]


async def _run_plan(db: pgtrio.Database, make: Callable[[], changes.Plan[T]]) -> T:
    """The plan *make* builds, run in one transaction (built again for each
    try, should a conflict make :meth:`pgtrio.Database.run` try again)."""

    async def run(conn: pgtrio.Connection) -> T:
        return await _drive(conn, make())

    return await db.run(run)


# -- migrations -------------------------------------------------------------------


#: The functions (``migrations/postgres/functions.sql``, its bounds written
#: from the models), and what the ledger records of them: a digest, so that
#: a qftrio whose functions differ from the schema's applies its own.
FUNCTIONS = sql.functions("postgres")
FUNCTIONS_DIGEST = "functions " + hashlib.sha256(FUNCTIONS.encode()).hexdigest()[:16]


async def _applied_versions(conn: pgtrio.Connection) -> set[str] | None:
    """The versions the ledger holds (``functions`` when the functions are
    this qftrio's), or None with no ledger."""
    if not await conn.fetchval(Q["migrations_table_exists"]):
        return None
    applied = {r["version"] for r in await conn.fetch(Q["migrations_applied"])}
    if "functions" in applied and await conn.fetchval(Q["functions_applied"]) != FUNCTIONS_DIGEST:
        applied.discard("functions")
    return applied


def _pending_of(applied: set[str]) -> list[tuple[str, str, str]]:
    """``(version, name, script)`` of what *applied* lacks, in order: the
    numbered migrations, then the functions."""
    shipped = [*sql.migrations("postgres"), ("functions", "functions", FUNCTIONS)]
    return [migration for migration in shipped if migration[0] not in applied]


async def _migrate_on(conn: pgtrio.Connection) -> list[str]:
    # The advisory lock serialises concurrent migrators
    # (several servers starting at once); the second one finds nothing to do,
    # and runs no DDL: it may be a data-only role that waited for the owner.
    await conn.execute(Q["migration_settings"])
    await conn.execute(Q["migration_lock"], MIGRATION_LOCK_KEY)
    try:
        applied = await _applied_versions(conn)
        if applied is None:
            await conn.execute(Q["migrations_table"])
            applied = set()
        pending = _pending_of(applied)
        # One transaction: the functions are never older or newer than the
        # tables they read.
        async with conn.transaction():
            for version, name, script in pending:
                await conn.execute(script)
                if version == "functions":
                    await conn.execute(Q["functions_record"], FUNCTIONS_DIGEST)
                else:
                    await conn.execute(Q["migration_record"], version, name)
        for _, name, _ in pending:
            log.info("applied migration %s", name)
        unknown = applied - {version for version, _, _ in _pending_of(set())}
        if unknown:
            log.warning("the database has migrations this qftrio does not know: %s", ", ".join(sorted(unknown)))
        return [name for _, name, _ in pending]
    finally:
        await conn.execute(Q["migration_unlock"], MIGRATION_LOCK_KEY)
        await conn.execute(Q["migration_settings_reset"])


async def _pending_on(conn: pgtrio.Connection) -> list[str]:
    return [name for _, name, _ in _pending_of(await _applied_versions(conn) or set())]


async def _migrate_when_behind(db: pgtrio.Database, url: str) -> list[str]:
    """Apply the migrations the schema lacks, once a read-only look at the
    ledger found some: on a current schema nothing runs that needs more than
    the data-only role's privileges (docs/deploy.md).

    Raises:
        ConfigError: the role may not read the ledger, or the schema is behind
            and the role may not migrate it.
    """
    missing = await _pending(db, url)
    if not missing:
        return []
    try:
        return await db.run(_migrate_on, transaction=False)
    except psycopg.errors.InsufficientPrivilege as exc:
        raise errors.ConfigError(
            f"the database schema is behind (missing {', '.join(missing)}) and role"
            f" {pgtrio.read_url(url).user!r} may not migrate it ({str(exc).splitlines()[0]}; migrating needs"
            " CREATE on the schema and ownership of the qftrio_* tables): run `qftrio migrate` as the schema's owner"
        ) from None


async def _pending(db: pgtrio.Database, url: str) -> list[str]:
    try:
        return await db.run(_pending_on, transaction=False)
    except psycopg.errors.InsufficientPrivilege as exc:
        raise errors.ConfigError(
            f"role {pgtrio.read_url(url).user!r} may not read the schema's migrations ({str(exc).splitlines()[0]}):"
            " grant it SELECT, INSERT, UPDATE, DELETE on the qftrio_* tables"
        ) from None


async def migrate(url: str, *, timeout: float | None = 10.0) -> list[str]:
    """Apply the migrations *url* lacks; return their names (e.g.
    ``["0001_init"]``), empty when the schema is current.

    Safe to run from several processes at once: a PostgreSQL advisory lock
    makes them take turns.

    Raises:
        ConfigError: a URL that cannot work, or a role that may not migrate.
        Unavailable: the database cannot be reached.
    """
    async with pgtrio.open_database(url, max_size=1, timeout=timeout, statement_timeout=None) as db:
        return await _migrate_when_behind(db, url)


async def pending_migrations(url: str, *, timeout: float | None = 10.0) -> list[str]:
    """The names of the migrations *url* lacks."""
    async with pgtrio.open_database(url, max_size=1, timeout=timeout, statement_timeout=None) as db:
        return await _pending(db, url)


# -- the store ----------------------------------------------------------------------


def _leases(rows: Sequence[pgtrio.Record]) -> list[Lease]:
    """Claimed rows as leases, in lease order."""
    ordered = sorted(rows, key=lambda row: transitions.lease_order(row["priority"], row["scheduled_at"], row["created_at"]))
    return [Lease(job=_job(row), lease_token=str(row["lease_token"])) for row in ordered]


def _claimed(rows: Sequence[pgtrio.Record]) -> list[Lease]:
    """The rows of a claim as leases, in the order it hands them out
    (transitions.fair_order: each tenant's first job in turn, then each one's
    second, ...)."""
    rows = sorted(rows, key=lambda row: (row["rank"], row["turn"], row["tenant"]))
    return [Lease(job=_job(row), lease_token=str(row["lease_token"])) for row in rows]


async def _claim(
    fetch: Callable[..., Awaitable[list[pgtrio.Record]]],
    queue: str,
    *,
    limit: int,
    lease_secs: float,
    worker_id: str | None,
    now: float,
    turn: int,
) -> list[Lease]:
    """A lease: each tenant's share in turn, and while tenants or held-back
    jobs leave it short, the rest after (one claim each)."""
    leases: list[Lease] = []
    while len(leases) < limit:
        rows = await fetch(
            Q["claim"], queue, now, limit - len(leases), float(lease_secs), worker_id, transitions.LOST_ATTEMPT, turn
        )
        leases += _claimed(rows)
        if not rows or not rows[0]["more"]:
            break
    return leases


def _page_keys_where(
    *,
    queue: str | None,
    statuses: Sequence[str] | None,
    kind: str | None,
    before: tuple[float, str] | None,
    created_after: float | None = None,
    created_before: float | None = None,
    limit: int,
    args: list[Any],
) -> dict[str, str]:
    """The ``{combos}``, ``{running}``, ``{keys}`` and ``{limit}`` of
    ``page_keys``; appends the values to *args*, which hold the tenant
    already."""

    def arg(value: Any) -> str:
        args.append(value)
        return f"${len(args)}"

    combos = []
    running = []
    if queue is not None:
        mark = arg(queue)
        combos.append(f"AND queue = {mark}")
        running.append(f"AND j.queue = {mark}")
    if statuses is not None:
        combos.append(f"AND status = ANY({arg(list(statuses))}::text[])")
    if kind is not None:
        mark = arg(kind)
        combos.append(f"AND kind = {mark}")
        running.append(f"AND j.kind = {mark}")
    keys = []
    if before is not None:
        key = _uuid(before[1])
        if key is None:
            raise errors.InvalidInput("cursor: not a cursor this server issued", code="invalid_cursor")
        keys.append(f"AND (j.created_at, j.id) < ({arg(float(before[0]))}::float8, {arg(key)}::uuid)")
    if created_after is not None:
        keys.append(f"AND j.created_at >= {arg(float(created_after))}::float8")
    if created_before is not None:
        keys.append(f"AND j.created_at < {arg(float(created_before))}::float8")
    return {
        "combos": " ".join(combos), "running": " ".join(running), "keys": " ".join(keys), "limit": arg(limit)
    }  # fmt: skip


def _stats_row(row: pgtrio.Record) -> QueueStats:
    counts = row["counts"]
    return QueueStats(
        queue=row["queue"],
        counts={s.value: int(counts.get(s.value, 0)) for s in Status},
        oldest_ready_at=to_datetime(row["oldest_ready_at"]),
        next_available_at=to_datetime(row["next_available_at"]),
        scheduled=row["scheduled"],
        held_back=HeldBack(concurrency=row["held_concurrency"], rate_limit=row["held_rate_limit"]),
        paused=row["paused"],
    )


async def _lock_workflows_of_jobs(conn: pgtrio.Connection, job_ids: Sequence[Any]) -> None:
    """Lock the workflows of *job_ids* before the jobs themselves are locked
    (a job's workflow never changes, so reading it unlocked is safe)."""
    keys = [k for k in job_ids if k is not None]
    if keys:
        await conn.execute(Q["lock_workflows_of_jobs"], keys)


class PostgresStore(Store):
    """See the module docstring. Open it with :func:`open_postgres_store`.

    Args:
        db: the connection pool.
        url: the database, for the LISTEN connection.
        timeout: client-side network timeout (connecting, waiting for a pooled
            connection, closing); None disables it.
        listener_keepalive_secs: how often an idle LISTEN connection is checked.
        listen_idle_secs: how long the LISTEN connection goes on listening
            after the last long-poll that may wait has ended.
    """

    def __init__(
        self,
        db: pgtrio.Database,
        *,
        url: str,
        timeout: float | None = 10.0,
        listener_keepalive_secs: float = 30.0,
        listen_idle_secs: float = 60.0,
    ) -> None:
        self._db = db
        # Each claim serves a queue's tenants from the next one in turn.
        self._turns = Turns()
        self._url = url
        self._timeout = timeout
        self._keepalive = listener_keepalive_secs
        self._listen_idle = listen_idle_secs
        #: Backend pid of the current LISTEN connection (None when there is
        #: none); for operators and tests.
        self.listener_pid: int | None = None
        self._listener: pgtrio.Listener | None = None
        #: Until when (Trio's clock) notifications are wanted.
        self._wanted_until = -math.inf
        #: Set while the listener listens.
        self._listening = trio.Event()

    # -- lifecycle ---------------------------------------------------------

    async def aclose(self) -> None:
        await self._db.aclose()

    async def ping(self) -> None:
        await self._db.fetchval("SELECT 1")

    async def run_listener(
        self,
        on_notify: Callable[[str], None],
        *,
        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
        min_backoff_secs: float = 0.1,
        max_backoff_secs: float = 5.0,
    ) -> None:
        """Call ``on_notify(queue)`` for the queues other servers make work
        ready on, through one dedicated LISTEN connection, while
        notifications are wanted (:meth:`notifications_wanted`); runs until
        cancelled. What this store's own connections notify is not passed
        on: the engine wakes its own long-polls for what it changes, as on a
        store with no other servers.

        The connection LISTENs only from a :meth:`notifications_wanted` until
        ``listen_idle_secs`` after the wait it announced: a server that no
        long-poll waits on (one that only takes enqueues, or whose workers
        find work at every lease) costs the database no wake-up of its
        backend, and itself none of its thread, for every enqueue elsewhere.

        Whatever was notified while the connection did not listen reached no
        one, so each time it begins to listen it calls
        ``on_notify(ALL_QUEUES)`` (``"*"``): every queue's polls claim again.
        A poll that found nothing and then had the connection listen for it
        thus sees work made ready between its claim and the ``LISTEN``.
        When the connection is lost (a restart, a failover,
        ``pg_terminate_backend``) it reconnects by itself, with exponential
        backoff and jitter, and listens again if notifications are wanted.
        Notifications are coalesced while ``on_notify`` catches up; a flood
        of distinct queues also collapses into ``"*"``.

        ``task_status.started()`` is called once the first attempt to connect
        is over, successful or not: a server can start while the database is
        down, its long-polls falling back on their safety poll.
        """
        started = False
        failures = 0  # connections lost (or refused) in a row

        async def listen(listener: pgtrio.Listener) -> None:
            await listener.listen()
            on_notify(ALL_QUEUES)

        while True:
            try:
                async with pgtrio.open_listener(
                    self._url, CHANNEL, timeout=self._timeout, ignore=self._db.backends, watchdog=self._db.watchdog,
                    always=lambda payload: payload.startswith((ENDED, EVENT)),
                ) as listener:
                    if self._wanted():
                        await listen(listener)
                    self._listener = listener
                    self.listener_pid = listener.backend_pid
                    log.debug("connected for LISTEN on %s (backend %s)", CHANNEL, self.listener_pid)
                    if not started:
                        task_status.started()
                        started = True
                    failures = 0
                    while True:
                        if listener.listening:
                            self._listening.set()
                        with trio.move_on_at(self._wanted_until if listener.listening else math.inf):
                            # In the order they came: a job's changes in the order they were made.
                            for payload in await listener.receive(keepalive_secs=self._keepalive):
                                self._notified(payload, on_notify)
                        if self._wanted() and not listener.listening:
                            await listen(listener)
                        elif listener.listening and not self._wanted():
                            self._listening = trio.Event()
                            await listener.unlisten()
            except errors.Unavailable as exc:
                failures += 1
                delay = backoff(failures, base=min_backoff_secs, cap=max_backoff_secs)
                log.warning("LISTEN connection lost (%s); reconnecting in %.1fs", exc, delay)
            finally:
                self.listener_pid = None
                self._listener = None
                # What is committed until it listens again reaches no
                # stream: each ends, and its client reads what it missed.
                if self.on_event is not None:
                    self.on_event({"lost": True})
                # Waiters go back to their safety poll.
                self._listening.set()
                self._listening = trio.Event()
            if not started:
                task_status.started()
                started = True
            await trio.sleep(delay)

    def _notified(self, payload: str, on_notify: Callable[[str], None]) -> None:
        """A notification's payload: a queue made ready, ``*`` (anything may
        have been missed), or ``ended:<job id>`` (a job a wait is parked on
        ended: migration 0018)."""
        if payload.startswith(ENDED):
            if self.on_ended is not None:
                self.on_ended(payload[len(ENDED) :])
            return
        if payload.startswith(EVENT):
            if self.on_event is not None:
                self.on_event(orjson.loads(payload[len(EVENT) :]))
            return
        on_notify(payload)
        if payload == ALL_QUEUES:
            if self.on_ended is not None:
                self.on_ended(ALL_QUEUES)
            if self.on_event is not None:
                self.on_event({"lost": True})

    def _wanted(self) -> bool:
        return trio.current_time() < self._wanted_until

    async def notifications_wanted(self, wait_secs: float) -> None:
        self._wanted_until = max(self._wanted_until, trio.current_time() + wait_secs + self._listen_idle)
        listener = self._listener
        if listener is None or listener.listening:
            return
        listener.poke()
        # Never longer than the poll would wait, nor than a query may take.
        with trio.move_on_after(min(wait_secs, self._timeout if self._timeout is not None else 10.0)):
            await self._listening.wait()

    # -- application side --------------------------------------------------

    async def jobs_insert(self, jobs: Sequence[NewJob], *, now: float) -> list[Inserted]:
        if not jobs:
            return []
        # One statement (and, for keys taken already, a read of their jobs):
        # no transaction around it, which would cost two more round trips;
        # unique jobs need one, for their locks.
        unique = any(new.unique is not None for new in jobs)
        return await self._db.run(_inserter(jobs, now), transaction=unique)

    async def jobs_insert_claiming(
        self, jobs: Sequence[NewJob], *, now: float, claims: Sequence[ClaimRequest]
    ) -> tuple[list[Inserted], list[list[Lease]]]:
        if (
            jobs
            and len(claims) == 1
            and claims[0].limit > 0
            and all(
                j.queue == claims[0].queue
                and j.idempotency_key is None
                and j.workflow_id is None
                and j.schedule is None
                and j.unique is None
                and not j.flow_controlled
                for j in jobs
            )
        ):
            return await self._insert_handing_over(jobs, now=now, claim=claims[0])
        insert = _inserter(jobs, now) if jobs else None

        async def insert_claiming(conn: pgtrio.Connection) -> tuple[list[Inserted], list[list[Lease]]]:
            inserted = await insert(conn) if insert is not None else []
            claimed = []
            for c in claims:
                claimed.append(
                    await _claim(
                        conn.fetch, c.queue, limit=c.limit, lease_secs=c.lease_secs, worker_id=c.worker_id, now=now,
                        turn=self._turns.take(c.queue),
                    )  # fmt: skip
                )
            return inserted, claimed

        return await self._db.run(insert_claiming)

    async def _insert_handing_over(
        self, jobs: Sequence[NewJob], *, now: float, claim: ClaimRequest
    ) -> tuple[list[Inserted], list[list[Lease]]]:
        """:meth:`jobs_insert_claiming` for one long-poll and jobs of its
        queue, in one statement (one round trip): the due jobs it takes are
        inserted claimed already. Only when nothing else in the queue is
        claimable, which is what a parked poll leaves behind; otherwise the
        jobs are inserted pending and the claim runs after, as a claim."""
        ids = new_ids(len(jobs), now)
        rows = await self._db.fetch(
            Q["insert_handing_over"],
            ids,
            [j.tenant for j in jobs],
            claim.queue,
            now,
            [j.kind for j in jobs],
            [j.payload for j in jobs],
            [j.priority for j in jobs],
            [j.max_attempts for j in jobs],
            [j.scheduled_at for j in jobs],
            claim.limit,
            float(claim.lease_secs),
            claim.worker_id,
            CHANNEL,
            [j.timeout_secs for j in jobs],
            [j.backoff for j in jobs],
            [j.headers for j in jobs],
        )
        inserted = [Inserted(job_id, new, now) for job_id, new in zip(ids, jobs)]
        if rows and rows[0]["older_found"]:
            claimed = await _claim(
                self._db.fetch, claim.queue, limit=claim.limit, lease_secs=claim.lease_secs,
                worker_id=claim.worker_id, now=now, turn=self._turns.take(claim.queue),
            )  # fmt: skip
            return inserted, [claimed]
        return inserted, [_leases([row for row in rows if row["status"] == Status.RUNNING.value])]

    async def job_get(self, job_id: str, *, tenant: str | None = None) -> Job | None:
        key = _uuid(job_id)
        if key is None:
            return None
        if tenant is None:
            rows = await self._db.fetch(Q["job_get"], key)
        else:
            rows = await self._db.fetch(Q["job_get_owned"], key, tenant)
        return _job(rows[0]) if rows else None

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
        args: list[Any] = [tenant]
        page = _page_keys_where(
            queue=queue,
            statuses=None if status is None else [Status(status).value],
            kind=kind,
            before=before,
            limit=limit + 1,
            args=args,
        )
        statement = Q["page_keys"].format(**page)

        async def read(conn: pgtrio.Connection) -> Page[Job]:
            # One snapshot: the sizes are those of the jobs then loaded.
            async with conn.transaction(isolation="repeatable_read", readonly=True):
                keys = [(row["created_at"], str(row["id"])) for row in await conn.fetch(statement, *args)]
                return await _drive(conn, changes.jobs_page(keys, limit, max_bytes))

        return await self._db.run(read, transaction=False)

    async def job_cancel(self, job_id: str, *, tenant: str, now: float) -> Job | None:
        return await _run_plan(self._db, lambda: changes.job_cancel(job_id, tenant, now))

    async def job_retry(self, job_id: str, *, tenant: str, now: float) -> Job | None:
        return await _run_plan(self._db, lambda: changes.job_retry(job_id, tenant, now))

    async def queues_stats(self, *, tenant: str, now: float, queue: str | None = None) -> list[QueueStats]:
        if queue is None:
            rows = await self._db.fetch(Q["queues_stats"].format(where="AND tenant = $2"), now, tenant)
        else:
            rows = await self._db.fetch(
                Q["queues_stats"].format(where="AND tenant = $2 AND queue = $3"), now, tenant, queue
            )
        out = [_stats_row(row) for row in rows]
        if queue is not None and not out:
            zero = {s.value: 0 for s in Status}
            out = [QueueStats(queue=queue, counts=zero, oldest_ready_at=None, next_available_at=None)]
        return out

    async def queues_page(self, *, tenant: str, now: float, limit: int, after: str | None = None) -> list[QueueStats]:
        return [_stats_row(row) for row in await self._db.fetch(Q["queues_page"], now, tenant, after or "", limit)]

    async def queues_overview(self, *, now: float) -> list[tuple[str, QueueStats]]:
        rows = await self._db.fetch(Q["queues_stats"].format(where=""), now)
        return [(row["tenant"], _stats_row(row)) for row in rows]

    async def queue_set_paused(self, *, tenant: str, queue: str, paused: bool, now: float) -> None:
        if paused:
            await self._db.fetch(Q["queue_pause"], queue, tenant, now)
        else:
            await self._db.fetch(Q["queue_resume"], queue, tenant, CHANNEL)

    async def counts_fold(self) -> None:
        await self._db.fetch(Q["counts_fold"])

    async def jobs_bulk(
        self, action: BulkAction, where: BulkFilter, *, limit: int, after: tuple[float, str] | None, now: float
    ) -> BulkBatch:
        args: list[Any] = [where.tenant]
        page = _page_keys_where(
            queue=where.queue,
            statuses=[s.value for s in where.statuses],
            kind=where.kind,
            before=after,
            created_after=where.created_after,
            created_before=where.created_before,
            limit=limit,
            args=args,
        )
        statement = Q["page_keys"].format(**page)

        async def bulk(conn: pgtrio.Connection) -> BulkBatch:
            keys = [(row["created_at"], str(row["id"])) for row in await conn.fetch(statement, *args)]
            plan = changes.jobs_bulk(action, keys, tenant=where.tenant, statuses=where.statuses, limit=limit, now=now)
            return await _drive(conn, plan)

        return await self._db.run(bulk)

    async def jobs_scheduled(
        self, *, tenant: str, now: float, queue: str | None = None, limit: int = 100
    ) -> list[Job]:
        return [_job(row) for row in await self._db.fetch(Q["jobs_scheduled"], tenant, now, queue, limit)]

    async def workers(self, *, tenant: str, seen_since: float) -> list[WorkerInfo]:
        rows = await self._db.fetch(Q["workers"], tenant, seen_since)
        return workers_of((row["worker_id"], row["queue"], row["job_id"], row["seen"]) for row in rows)

    async def workers_seen(self, sightings: Sequence[tuple[str, str]], *, now: float) -> None:
        await self._db.fetch(Q["workers_seen"], [w for w, _ in sightings], [q for _, q in sightings], now)

    async def sightings_purge(self, *, before: float) -> None:
        await self._db.fetch(Q["sightings_purge"], before)

    async def session_create(self, key: str, session: DashboardSession) -> None:
        s = session
        await self._db.fetch(
            Q["session_create"], key, s.tenant, s.secret, s.token_mac, s.created_at, s.idle_until, s.expires_at
        )

    async def session_get(self, key: str, *, now: float) -> DashboardSession | None:
        rows = await self._db.fetch(Q["session_get"], key, now)
        return DashboardSession(**dict(rows[0])) if rows else None

    async def session_touch(self, key: str, *, idle_until: float) -> None:
        await self._db.fetch(Q["session_touch"], key, idle_until)

    async def session_delete(self, key: str) -> None:
        await self._db.fetch(Q["session_delete"], key)

    async def sessions_purge(self, *, now: float) -> None:
        await self._db.fetch(Q["sessions_purge"], now)

    # -- schedules ---------------------------------------------------------

    async def schedule_put(self, schedule: NewSchedule, *, now: float) -> tuple[Schedule, bool]:
        return await _run_plan(self._db, lambda: changes.schedule_put(schedule, now))

    async def schedule_get(self, tenant: str, name: str) -> Schedule | None:
        return await _run_plan(self._db, lambda: changes.schedule_get(tenant, name))

    async def schedules_list(self, tenant: str, *, limit: int, after: str | None = None) -> list[Schedule]:
        return await _run_plan(self._db, lambda: changes.schedules_page(tenant, after, limit))

    async def schedule_delete(self, tenant: str, name: str) -> bool:
        return await _run_plan(self._db, lambda: changes.schedule_delete(tenant, name))

    async def schedule_set_paused(self, tenant: str, name: str, *, paused: bool, now: float) -> Schedule | None:
        return await _run_plan(self._db, lambda: changes.schedule_set_paused(tenant, name, paused, now))

    async def schedule_trigger(
        self, tenant: str, name: str, *, now: float, job_of: JobOfSchedule
    ) -> tuple[Schedule, Inserted] | None:
        return await _run_plan(self._db, lambda: changes.schedule_trigger(tenant, name, now, job_of))

    async def schedules_fire(self, *, now: float, limit: int, job_of: JobOfSchedule) -> tuple[int, list[Inserted]]:
        return await _run_plan(self._db, lambda: changes.schedules_fire(now, limit, job_of))

    async def rate_limit_set(self, *, tenant: str, name: str, limit: int, per_secs: float) -> bool:
        return bool(await self._db.fetchval(Q["rate_limit_set"], tenant, name, limit, float(per_secs)))

    async def rate_limits_list(self, *, tenant: str, now: float, names: Sequence[str] | None = None) -> list[RateLimit]:
        rows = await self._db.fetch(Q["rate_limits_of"], tenant, None if names is None else list(names))
        return [
            RateLimit(
                name=row["name"], limit=row["limit"], per_secs=row["per_secs"],
                next_available_at=to_datetime(transitions.rate_window(row["stamps"], row["limit"], row["per_secs"], now)[2]),
            )  # fmt: skip
            for row in rows
        ]

    async def rate_limit_delete(self, *, tenant: str, name: str) -> bool:
        return await self._db.fetchval(Q["rate_limit_delete"], tenant, name) is not None

    # -- worker side -------------------------------------------------------

    async def jobs_claim(
        self, queue: str, *, limit: int, lease_secs: float, worker_id: str | None, now: float
    ) -> list[Lease]:
        if limit <= 0:
            return []
        return await _claim(
            self._db.fetch, queue, limit=limit, lease_secs=lease_secs, worker_id=worker_id, now=now,
            turn=self._turns.take(queue),
        )  # fmt: skip

    async def queue_next_available_at(self, queue: str, *, now: float) -> float | None:
        return await self._db.fetchval(Q["next_available"], queue, now)

    async def jobs_heartbeat(self, items: Sequence[HeartbeatItem], *, now: float) -> list[HeartbeatResult]:
        if not items:
            return []
        unique, slot = transitions.one_per_lease(items)
        ids = [_uuid_param(i.job_id) for i in unique]
        tokens = [_uuid_param(i.lease_token) for i in unique]
        extends = [float(i.extend_secs) for i in unique]
        rows: list[Any] = [None] * len(unique)
        for row in await self._db.fetch(Q["heartbeat"], ids, tokens, extends, now):
            rows[row["ord"] - 1] = row
        # Each item is decided once: by the statement, which extended the
        # current leases; else by transitions.heartbeat on the row it read,
        # unless that lease would be extended yet was not (it raced another
        # change of its job): those are decided under the lock, once.
        out: list[HeartbeatResult] = []
        raced: list[int] = []
        for k, row in enumerate(rows):
            result = self._beat(row, extends[k], now)
            if row["changed"]:
                result = dataclasses.replace(result, locked_until=row["locked_until"])
            elif result.locked_until is not None:
                raced.append(k)
            out.append(result)
        if raced:
            some = [ids[k] for k in raced], [tokens[k] for k in raced], [extends[k] for k in raced]

            async def beat(conn: pgtrio.Connection) -> list[HeartbeatResult]:
                return await self._heartbeat_locked(conn, *some, now=now)

            for k, result in zip(raced, await self._db.run(beat), strict=True):
                out[k] = result
        return transitions.answers(out, slot)

    @staticmethod
    async def _heartbeat_locked(
        conn: pgtrio.Connection, ids: list[Any], tokens: list[Any], extends: list[float], *, now: float
    ) -> list[HeartbeatResult]:
        """The heartbeats of *ids*, decided under the lock of their rows:
        the leases transitions.heartbeat extends are written as it decided."""
        decided = [
            transitions.heartbeat(
                None if row["status"] is None else STATUS_OF[row["status"]],
                row["current"],
                extend_secs=extend,
                now=now,
                deadline=row["deadline"],
            )
            for row, extend in zip(await conn.fetch(Q["heartbeat_lock"], ids, tokens, now), extends, strict=True)
        ]
        write = [k for k, result in enumerate(decided) if result.locked_until is not None]
        if write:
            until = [decided[k].locked_until for k in write]
            await conn.execute(Q["heartbeat_write"], [ids[k] for k in write], until, now)
        return decided

    @staticmethod
    def _beat(row: pgtrio.Record, extend: float, now: float) -> HeartbeatResult:
        """:func:`transitions.heartbeat` of a row of ``heartbeat`` (the
        status it read, and whether the token was current)."""
        status = None if row["status"] is None else STATUS_OF[row["status"]]
        return transitions.heartbeat(status, row["current"], extend_secs=extend, now=now)

    async def job_wait_begin(self, job_id: str, *, now: float, wait_secs: float) -> str:
        wait_id = uuid.uuid4()
        # Kept a minute past its time, so that a wait of a server that died
        # cannot be taken for a live one, nor a live one removed too soon.
        await self._db.fetch(Q["job_wait_begin"], wait_id, _uuid_param(job_id), now, wait_secs + 60.0)
        return str(wait_id)

    async def job_wait_end(self, wait_id: str) -> None:
        await self._db.fetch(Q["job_wait_end"], uuid.UUID(wait_id))

    async def events_begin(self, tenant: str, *, now: float, until: float) -> str:
        stream_id = uuid.uuid4()
        await self._db.fetch(Q["events_begin"], stream_id, tenant, now, until)
        return str(stream_id)

    async def events_renew(self, stream_id: str, *, until: float) -> None:
        await self._db.fetch(Q["events_renew"], uuid.UUID(stream_id), until)

    async def events_end(self, stream_id: str) -> None:
        await self._db.fetch(Q["events_end"], uuid.UUID(stream_id))

    async def jobs_progress(self, items: Sequence[ProgressItem], *, now: float) -> list[HeartbeatResult]:
        if not items:
            return []
        # One statement updates a row once: a lease reported twice in the
        # batch is written with its last item, which every one of its items
        # is answered from.
        last = {(i.job_id, i.lease_token): k for k, i in enumerate(items)}
        unique = [items[k] for k in last.values()]
        rows = await self._db.fetch(
            Q["progress"],
            [_uuid_param(i.job_id) for i in unique],
            [_uuid_param(i.lease_token) for i in unique],
            [i.progress for i in unique],
            now,
        )
        decided = {}
        for item, row in zip(unique, sorted(rows, key=lambda row: row["ord"]), strict=True):
            status = None if row["status"] is None else STATUS_OF[row["status"]]
            decided[item.job_id, item.lease_token] = transitions.progress(status, row["current"])
        return [decided[i.job_id, i.lease_token] for i in items]

    async def jobs_complete(self, items: Sequence[CompleteItem], *, now: float) -> list[ReportResult]:
        if not items:
            return []
        unique, slot = transitions.one_per_lease(items)
        ids = [_uuid_param(i.job_id) for i in unique]
        tokens = [_uuid_param(i.lease_token) for i in unique]
        results_of = [i.result for i in unique]
        rows: list[Any] = [None] * len(unique)
        for row in await self._db.fetch(Q["complete"], ids, tokens, results_of, now):
            rows[row["ord"] - 1] = row
        results: list[ReportResult] = []
        # Each item is decided once: by the statement, which completed the
        # current leases outside workflows (the jobs of a batch are mostly of
        # one queue and kind, claimed together: one result serves each such
        # group); else by transitions.complete on the row it read, unless
        # that row is a workflow step, or would be completed yet was not (it
        # changed between the statement's read and its write): those are
        # decided under the lock, once, by _complete_locked.
        applied_in: dict[tuple[str, str, float | None, bool], ReportResult] = {}
        undecided: list[int] = []
        for k, row in enumerate(rows):
            result = self._completion(row)
            if row["applied"]:
                group = (row["queue"], row["kind"], row["claimed_at"], row["keyed"])
                result = applied_in.get(group) or applied_in.setdefault(
                    group, dataclasses.replace(result, kind=row["kind"], claimed_at=row["claimed_at"], keyed=row["keyed"])
                )
            elif row["step"] or result.applied:
                undecided.append(k)
            results.append(result)
        if undecided:
            some = [ids[k] for k in undecided], [tokens[k] for k in undecided], [results_of[k] for k in undecided]

            async def complete(conn: pgtrio.Connection) -> list[ReportResult]:
                return await self._complete_locked(conn, *some, now=now)

            locked = await self._db.run(complete)
            for k, result in zip(undecided, locked, strict=True):
                results[k] = result
        return transitions.answers(results, slot)

    async def _complete_locked(
        self, conn: pgtrio.Connection, ids: list[Any], tokens: list[Any], results_of: list[Any], *, now: float
    ) -> list[ReportResult]:
        """The completions of *ids*, decided under the lock of their rows
        (their workflows' first): what transitions.complete applies is
        written, and the workflows of the steps completed advance."""
        await _lock_workflows_of_jobs(conn, ids)
        decided = [self._completion(row) for row in await conn.fetch(Q["complete_lock"], ids, tokens, now)]
        write = [k for k, result in enumerate(decided) if result.applied]
        if not write:
            return decided
        done = await conn.fetch(
            Q["complete_write"], [ids[k] for k in write], [results_of[k] for k in write], [k + 1 for k in write], now
        )
        unblocked = await self._after_complete(conn, done, now=now)
        for row in done:
            k = row["ord"] - 1
            decided[k] = dataclasses.replace(
                decided[k],
                kind=row["kind"],
                claimed_at=row["claimed_at"],
                keyed=row["keyed"],
                ready_queues=(WORKFLOW_QUEUE,) if row["ord"] in unblocked else (),
            )
        return decided

    @staticmethod
    def _completion(row: pgtrio.Record) -> ReportResult:
        """:func:`transitions.complete` of a row of ``complete`` (the status
        it read, and whether the token was current)."""
        status = None if row["status"] is None else STATUS_OF[row["status"]]
        return transitions.complete(status, row["current"], queue=row["queue"])

    async def _after_complete(
        self, conn: pgtrio.Connection, completed: list[pgtrio.Record], *, now: float
    ) -> set[int]:
        """Asyncio-flavoured, run in the completing transaction (the steps'
        workflows already locked) with the rows just completed (columns
        ``ord, workflow_id, step, result``, in batch order): advance their
        workflows. Returns the ``ord`` of the completions that enqueued
        steps."""
        unblocked = set()
        for row in completed:
            if row["workflow_id"] is not None:
                if await _drive(conn, changes.step_completed(str(row["workflow_id"]), row["step"], row["result"], now)):
                    unblocked.add(row["ord"])
        if unblocked:
            await _notify(conn, [WORKFLOW_QUEUE])
        return unblocked

    async def jobs_fail(self, items: Sequence[FailItem], *, now: float, retry_at: RetryAt) -> list[ReportResult]:
        if not items:
            return []
        return await _run_plan(self._db, lambda: changes.jobs_fail(items, now, retry_at))

    async def jobs_snooze(self, items: Sequence[SnoozeItem], *, now: float) -> list[ReportResult]:
        return await _run_plan(self._db, lambda: changes.jobs_snooze(items, now))

    async def jobs_reap_expired(
        self, *, now: float, limit: int = 1000, retry_at: RetryAt = RetryPolicy().retry_at
    ) -> list[Reaped]:
        return await _run_plan(self._db, lambda: changes.reap_expired(now, limit, retry_at))

    async def jobs_prune(self, *, before: float, limit: int = 10000) -> int:
        return await _run_plan(self._db, lambda: changes.prune(before, limit))

    # -- workflows ---------------------------------------------------------

    async def workflow_create(self, workflow: NewWorkflow, *, now: float) -> Workflow:
        return await _run_plan(self._db, lambda: changes.workflow_create(workflow, now))

    async def steps_add(self, added: NewSteps, *, now: float) -> Workflow | None:
        return await _run_plan(self._db, lambda: changes.steps_add(added, now))

    async def workflow_get(self, workflow_id: str, *, tenant: str | None = None, jobs: bool = True) -> Workflow | None:
        return await self._read(lambda: changes.workflow_get(workflow_id, tenant=tenant, jobs=jobs))

    async def workflows_page(
        self,
        *,
        tenant: str,
        status: WorkflowStatus | None = None,
        limit: int = 50,
        before: tuple[float, str] | None = None,
        max_bytes: int | None = None,
    ) -> Page[Workflow]:
        if before is not None and _uuid(before[1]) is None:
            raise errors.InvalidInput("cursor: not a cursor this server issued", code="invalid_cursor")
        return await self._read(lambda: changes.workflows_page(tenant, status, limit, before, max_bytes))

    async def _read(self, make: Callable[[], changes.Plan[T]]) -> T:
        """The plan *make* builds, reading one snapshot (a workflow, its
        steps and its jobs)."""

        async def read(conn: pgtrio.Connection) -> T:
            async with conn.transaction(isolation="repeatable_read", readonly=True):
                return await _drive(conn, make())

        return await self._db.run(read, transaction=False)

    async def workflow_cancel(self, workflow_id: str, *, tenant: str, now: float) -> Workflow | None:
        return await _run_plan(self._db, lambda: changes.workflow_cancel(workflow_id, tenant, now))


@asynccontextmanager
async def open_postgres_store(
    url: str,
    *,
    pool_size: int = 10,
    migrate: bool = True,
    timeout: float | None = 10.0,
    statement_timeout: float | None = 30.0,
    listen_idle_secs: float = 60.0,
) -> AsyncIterator[PostgresStore]:
    """Open the PostgreSQL store on *url*.

    Args:
        url: ``postgresql://user:password@host:port/database``.
        pool_size: the most connections this store opens (the LISTEN
            connection of :meth:`~PostgresStore.run_listener` comes on top).
        migrate: apply missing migrations first (under an advisory lock, so
            servers starting together are safe); a current schema is only
            read, so a role without DDL privileges can open it. With False, a
            schema that is not current is a :class:`~qftrio.errors.ConfigError`.
        timeout: client-side network timeout in real seconds (connect,
            wait for a pooled connection, each query, close); None disables it
            (see :mod:`.pgtrio`).
        statement_timeout: server-side bound on each statement.
        listen_idle_secs: how long the LISTEN connection goes on listening
            after the last long-poll wait (:meth:`PostgresStore.run_listener`).

    Raises:
        Unavailable: the database cannot be reached.
        ConfigError: a URL or credentials that cannot work, or an outdated
            schema with ``migrate=False`` or a role that may not migrate it.
    """
    async with pgtrio.open_database(
        url, max_size=pool_size, timeout=timeout, statement_timeout=statement_timeout
    ) as db:
        if migrate:
            await _migrate_when_behind(db, url)
        else:
            missing = await _pending(db, url)
            if missing:
                raise errors.ConfigError(
                    f"the database schema is not up to date (missing {', '.join(missing)}): run `qftrio migrate`"
                )
        store = PostgresStore(db, url=url, timeout=timeout, listen_idle_secs=listen_idle_secs)
        try:
            yield store
        finally:
            await store.aclose()
