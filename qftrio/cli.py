"""The ``qftrio`` command: ``serve | worker | enqueue | jobs | workflows | schedules | queues | rate-limits |
stats | workers | migrate``.

Options and positional arguments go in any order (``qftrio enqueue KIND
--queue Q PAYLOAD``). Answers are JSON. The listings an operator reads (``queues``, ``workers``,
``stats`` of every queue) are a table on a terminal and JSON when stdout is
not one.

Every failure is one line on stderr and a non-zero exit: 1 for an error
answer or an unreachable server, 2 for bad usage or configuration, 130 when
interrupted.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import math
import signal
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import aclosing
from typing import Any, NoReturn

import trio

from . import __version__, errors
from ._env import env

__all__ = ["main"]

DEFAULT_URL = "http://127.0.0.1:8000"


class _Parser(argparse.ArgumentParser):
    """Options and positional arguments in any order (``qftrio enqueue KIND
    --queue Q PAYLOAD``): argparse alone gives an optional positional nothing
    once an option comes between, and the next one is "unrecognized"."""

    _intermixing = False

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> Any:
        # parse_known_intermixed_args refuses a parser with subcommands, and
        # calls parse_known_args itself: a command's own parser intermixes,
        # once, and the parsers above it hand it their remaining words.
        if self._subparsers is not None or self._intermixing:
            return super().parse_known_args(args, namespace)
        self._intermixing = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._intermixing = False


_LOG_LEVELS = ["DEBUG", "INFO", "WARNING", "ERROR"]


class _LoggingParser(_Parser):
    """A subcommand's parser: takes ``--log-level`` too, after the command."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.add_argument("--log-level", choices=_LOG_LEVELS, default=argparse.SUPPRESS, help="default INFO")


def _print_json(data: Any) -> None:
    print(json.dumps(data, indent=2, ensure_ascii=False))


def _json_object(text: str, what: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise errors.ConfigError(f"{what} is not valid JSON: {exc.msg}") from None
    if not isinstance(value, dict):
        raise errors.ConfigError(f"{what} must be a JSON object")
    return value


# -- serve -------------------------------------------------------------------


def _serve_command(sub: Any) -> None:
    p = sub.add_parser("serve", help="run the job server")
    p.add_argument("--database-url", help="postgresql://... (QFTRIO_DATABASE_URL); default: the embedded store")
    p.add_argument("--db", help="the embedded store's SQLite file (default ./qftrio.db)")
    p.add_argument("--bind", help="HOST:PORT to listen on (default 127.0.0.1:8000)")
    p.add_argument("--mode", choices=["api", "worker", "all"], help="what to run (default all)")
    p.add_argument("--handlers", metavar="MODULE:REGISTRY", help="run this registry's handlers in-process")
    p.add_argument("--queue", action="append", help="queue the in-process handlers lease from (repeatable; default 'default')")
    p.add_argument("--lanes", type=_positive_int, help="in-process jobs at a time per queue (default: as qftrio worker)")
    p.add_argument("--worker-token", help="the worker credential (QFTRIO_WORKER_TOKEN)")
    p.add_argument(
        "--tenant", action="append", metavar="NAME=TOKEN", help="a tenant credential (repeatable; QFTRIO_TENANTS)"
    )
    p.add_argument("--dev", action="store_true", help="development mode (QFTRIO_DEV=1): never on an open network")
    p.add_argument("--max-body-bytes", type=_positive_int, help="request body cap (default 1 MiB)")
    p.add_argument("--max-answer-bytes", type=_positive_int, help="a page of jobs or workflows stops before passing this size (default 8 MiB)")
    p.add_argument("--pool-size", type=_positive_int, help="PostgreSQL connections (default 10)")
    p.add_argument("--retention-secs", type=_non_negative, help="keep completed and cancelled jobs this long (default 7 days)")
    p.add_argument("--metrics-token", help="the token GET /metrics asks for (QFTRIO_METRICS_TOKEN; default: none)")
    p.add_argument("--metrics-queues", type=_positive_int, help="queue names with series of their own in /metrics (default 50)")
    p.add_argument("--metrics-kinds", type=_positive_int, help="kind names with series of their own in /metrics (default 100)")
    p.add_argument("--max-connections-per-address", type=_positive_int, help="connections open at once from one client address (default 256)")
    p.add_argument("--trusted-proxy", action="append", metavar="ADDR", help="a proxy whose X-Forwarded-For names the client (address or network; repeatable)")
    p.add_argument("--failed-credentials-burst", type=_positive_int, help="wrong credentials from one address before it gets 429 (default 20)")
    p.add_argument("--failed-credentials-refill-secs", type=_non_negative, help="one more wrong credential allowed every this many seconds (default 3)")
    p.add_argument("--session-idle-secs", type=_positive_float, help="a dashboard session ends after this long without a request (default 8 hours)")
    p.add_argument("--session-lifetime-secs", type=_positive_float, help="a dashboard session ends this long after sign-in (default 7 days)")
    p.add_argument("--schedules", metavar="FILE.toml", help="cron schedules to create or replace at start (docs/schedules.md)")
    p.set_defaults(func=_serve)


def _serve(args: argparse.Namespace) -> int:
    from ._gc import settle_after_imports
    from .server.config import Config, parse_tenants
    from .server.serve import serve

    if not args.handlers:
        given = [flag for flag, value in (("--queue", args.queue), ("--lanes", args.lanes)) if value]
        if given:
            raise errors.ConfigError(f"{' and '.join(given)} configure in-process handlers: pass --handlers too")
    if args.db and (args.database_url or env("DATABASE_URL")):
        raise errors.ConfigError("--db names the embedded store's file, which PostgreSQL (--database-url) does not use")
    config = Config.from_env(
        database_url=args.database_url,
        sqlite_path=args.db,
        bind=args.bind,
        mode=args.mode,
        handlers=args.handlers,
        handler_queues=tuple(args.queue) if args.queue else None,
        handler_lanes=args.lanes,
        worker_token=args.worker_token,
        tenants=parse_tenants(args.tenant) if args.tenant else None,
        dev=True if args.dev else None,
        max_body_bytes=args.max_body_bytes,
        max_answer_bytes=args.max_answer_bytes,
        pool_size=args.pool_size,
        retention_secs=args.retention_secs,
        metrics_token=args.metrics_token,
        metrics_queues=args.metrics_queues,
        metrics_kinds=args.metrics_kinds,
        max_connections_per_address=args.max_connections_per_address,
        trusted_proxies=tuple(args.trusted_proxy) if args.trusted_proxy else None,
        failed_credentials_burst=args.failed_credentials_burst,
        failed_credentials_refill_secs=args.failed_credentials_refill_secs,
        session_idle_secs=args.session_idle_secs,
        session_lifetime_secs=args.session_lifetime_secs,
        schedules_file=args.schedules,
    )
    settle_after_imports()
    trio.run(functools.partial(serve, config, shutdown_trigger=_wait_for_signal))
    return 0


async def _wait_for_signal() -> None:
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async for signum in signals:
            logging.getLogger("qftrio.server").info("%s: shutting down", signal.Signals(signum).name)
            return


# -- worker ------------------------------------------------------------------


def _worker_command(sub: Any) -> None:
    p = sub.add_parser("worker", help="run a worker pool process")
    p.add_argument(
        "queue", metavar="QUEUE[,QUEUE...]",
        help="the queue to lease from; several, comma-separated (images,default), each get lanes of their own",
    )  # fmt: skip
    p.add_argument("registry", metavar="MODULE:REGISTRY", help="where the handlers are, e.g. handlers:registry")
    p.add_argument("--url", default=env("URL") or DEFAULT_URL, help="server URL (QFTRIO_URL)")
    p.add_argument("--token", help="the worker token (QFTRIO_WORKER_TOKEN)")
    p.add_argument("--lanes", type=_positive_int, default=None, help="jobs run at a time, per queue (default 200)")
    p.add_argument(
        "--batch", type=_positive_int, default=None, help="jobs leased per call at most (default: the free lanes)"
    )
    p.add_argument("--lease-secs", type=_positive_int, default=60, help="lease length (default 60)")
    p.add_argument("--wait-secs", type=_non_negative, default=20, help="long-poll wait (default 20)")
    p.add_argument("--worker-id", help="this process's id (default host-pid)")
    p.add_argument(
        "--shutdown-timeout", type=_positive_float, metavar="SECS",
        help="after the first SIGINT/SIGTERM, held jobs get this long to finish, then are cancelled (default: none)",
    )  # fmt: skip
    p.add_argument(
        "--warn-blocked-secs", type=_non_negative, metavar="SECS",
        help="warn when an async handler blocks the event loop this long (default 1; 0: never)",
    )  # fmt: skip
    p.set_defaults(func=_worker)


def _worker(args: argparse.Namespace) -> int:
    from .worker.process import run_worker_process

    token = args.token or env("WORKER_TOKEN")
    if not token:
        raise errors.ConfigError("no worker token: pass --token or set QFTRIO_WORKER_TOKEN")
    return run_worker_process(
        url=args.url,
        token=token,
        queues=args.queue.split(","),
        registry_ref=args.registry,
        lanes=args.lanes,
        batch=args.batch,
        lease_secs=args.lease_secs,
        wait_secs=args.wait_secs,
        worker_id=args.worker_id,
        shutdown_timeout=args.shutdown_timeout,
        # not given: the runtime's default; 0: no watchdog
        **({} if args.warn_blocked_secs is None else {"warn_blocked_secs": args.warn_blocked_secs or None}),
    )


# -- application commands ----------------------------------------------------


def _client_call(args: argparse.Namespace, call: Callable[[Any], Awaitable[Any]]) -> int:
    from .client import Client

    token = args.token or env("TOKEN")
    if not token:
        raise errors.ConfigError("no tenant token: pass --token or set QFTRIO_TOKEN")

    async def run() -> Any:
        async with Client(args.url, token) as client:
            return await call(client)

    result = trio.run(run)
    if result is not None:
        _print_json(result)
    return 0


def _job_config(args: argparse.Namespace, keys: Sequence[str]) -> dict[str, Any]:
    """A job's config from the flags *keys* given (``--queue`` always)."""
    config: dict[str, Any] = {"queue": args.queue}
    for key in keys:
        value = getattr(args, key)
        if value is not None:
            config[key] = value
    return config


def _enqueue_command(sub: Any) -> None:
    p = sub.add_parser("enqueue", help="enqueue a job")
    p.add_argument("kind")
    p.add_argument("payload", nargs="?", help="a JSON object (default {}); @FILE reads it from a file, - from stdin")
    p.add_argument("--queue", default="default")
    p.add_argument("--priority", type=int)
    p.add_argument("--max-attempts", type=_positive_int)
    p.add_argument("--delay-secs", type=_non_negative)
    p.add_argument("--scheduled-at", help="RFC 3339 time")
    p.add_argument("--idempotency-key")
    p.add_argument(
        "--timeout-secs", type=_positive_int, metavar="SECS",
        help="each attempt ends this long after its claim, whatever the worker does (at most 7 days)",
    )  # fmt: skip
    _add_client_options(p)
    p.set_defaults(func=_enqueue)


def _enqueue(args: argparse.Namespace) -> int:
    payload = _read_payload(args.payload) if args.payload else {}
    config = _job_config(args, ("priority", "max_attempts", "delay_secs", "scheduled_at", "idempotency_key", "timeout_secs"))

    async def call(client: Any) -> Any:
        return (await client.enqueue(args.kind, payload, **config)).to_wire()

    return _client_call(args, call)


_FILTERS = ("queue", "status", "kind", "created_after", "created_before")


def _jobs_command(sub: Any) -> None:
    p = sub.add_parser("jobs", help="inspect and manage jobs")
    jobs = p.add_subparsers(dest="jobs_command", required=True, parser_class=_LoggingParser)
    q = jobs.add_parser("get", help="show a job")
    q.add_argument("id")
    _add_client_options(q)
    q = jobs.add_parser(
        "wait", help="wait for a job to end, then show it",
        description="Wait for a job to end, then show it. Exit status: 0 completed, 1 failed, 3 cancelled, "
        "124 not ended when --timeout ran out.",
    )  # fmt: skip
    q.add_argument("id")
    q.add_argument("--timeout", type=_non_negative, metavar="SECS", help="give up after this long (default: wait until it ends)")
    _add_client_options(q)
    for name, text in (
        ("cancel", "cancel a job, or every pending or running job matching the filters"),
        ("retry", "retry a failed or cancelled job, or every one matching the filters"),
    ):
        q = jobs.add_parser(name, help=text, description=f"{text[0].upper()}{text[1:]}; prints how many changed.")
        q.add_argument("id", nargs="?", help="one job; without it, the filters choose")
        _add_filters(q)
        _add_client_options(q)
    text = "delete every completed, failed or cancelled job matching the filters (a workflow's steps stay)"
    q = jobs.add_parser("delete", help=text, description=f"{text[0].upper()}{text[1:]}; prints how many.")
    _add_filters(q)
    _add_client_options(q)
    q = jobs.add_parser("list", help="list jobs, newest first")
    q.add_argument("--queue")
    q.add_argument("--status", choices=_STATUSES)
    q.add_argument("--kind")
    q.add_argument("--limit", type=_positive_int, default=50)
    q.add_argument("--cursor")
    _add_client_options(q)
    p.set_defaults(func=_jobs)


def _jobs(args: argparse.Namespace) -> int:
    if args.jobs_command in ("retry", "cancel", "delete"):
        given = [f"--{name.replace('_', '-')}" for name in _FILTERS if getattr(args, name) is not None]
        if getattr(args, "id", None) is None:
            if not given and not args.all:
                one = "a job id or " if args.jobs_command != "delete" else ""
                raise errors.ConfigError(
                    f"jobs {args.jobs_command} needs {one}at least one filter: "
                    "--queue, --status, --kind, --created-after, --created-before (or --all)"
                )
            return _client_call(args, _bulk_call(args))
        if given or args.limit is not None or args.all:
            raise errors.ConfigError(
                f"give a job id or filters, not both ({', '.join(given) or ('--all' if args.all else '--limit')})"
            )

    if args.jobs_command == "wait":
        return _job_wait(args)

    async def call(client: Any) -> Any:
        if args.jobs_command == "list":
            jobs, cursor = await client.jobs_list(
                queue=args.queue, status=args.status, kind=args.kind, limit=args.limit, cursor=args.cursor
            )
            return {"jobs": [j.to_wire() for j in jobs], "next_cursor": cursor}
        method = {"get": client.job_get, "cancel": client.job_cancel, "retry": client.job_retry}[args.jobs_command]
        return (await method(args.id)).to_wire()

    return _client_call(args, call)


#: ``qftrio jobs wait``'s exit status by the job's status when it answers
#: (124, as timeout(1), for a job that has not ended).
_WAIT_EXIT = {"completed": 0, "failed": 1, "cancelled": 3}


def _job_wait(args: argparse.Namespace) -> int:
    from .models import MAX_JOB_WAIT_SECS

    ended: list[str] = []

    async def call(client: Any) -> Any:
        # One wait holds at most MAX_JOB_WAIT_SECS: wait again until the
        # job ends or --timeout runs out.
        deadline = None if args.timeout is None else trio.current_time() + args.timeout
        while True:
            left = MAX_JOB_WAIT_SECS if deadline is None else max(0.0, deadline - trio.current_time())
            job = await client.job_wait(args.id, timeout_secs=min(left, MAX_JOB_WAIT_SECS))
            if job.status.value in _WAIT_EXIT or (deadline is not None and trio.current_time() >= deadline):
                ended.append(job.status.value)
                return job.to_wire()

    _client_call(args, call)
    return _WAIT_EXIT.get(ended[0], 124)


def _bulk_call(args: argparse.Namespace) -> Callable[[Any], Awaitable[Any]]:
    async def call(client: Any) -> Any:
        filters = {name: getattr(args, name) for name in _FILTERS}
        count = await client.jobs_bulk(args.jobs_command, **filters, limit=args.limit, all=args.all)
        return {"count": count}

    return call


def _read_object(path: str, what: str) -> dict[str, Any]:
    """A JSON object from the file *path*, or stdin for ``-``."""
    if path == "-":
        try:
            text = sys.stdin.read()
        except UnicodeDecodeError:
            raise errors.ConfigError(f"cannot read {what} on stdin: not UTF-8 text") from None
        return _json_object(text, f"{what} on stdin")
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise errors.ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise errors.ConfigError(f"cannot read {path}: not UTF-8 text") from None
    return _json_object(text, path)


def _read_payload(arg: str) -> dict[str, Any]:
    """The payload argument: JSON itself, ``@FILE``, or ``-`` for stdin
    (a command line holds no more than about 128 KiB)."""
    if arg == "-":
        return _read_object("-", "the payload")
    if arg.startswith("@"):
        return _read_object(arg[1:], "the payload")
    return _json_object(arg, "the payload")


def _read_workflow(path: str) -> dict[str, Any]:
    """A workflow definition from a JSON file, or stdin for ``-``."""
    from .client import InvalidArgument

    spec = _read_object(path, "the workflow")
    unknown = sorted(set(spec) - {"name", "context", "steps"})
    if unknown:
        raise InvalidArgument(f"{unknown[0]}: unknown field")
    if not isinstance(spec.get("steps"), list):
        raise InvalidArgument("steps: must be a list of steps")
    return spec


def _workflows_command(sub: Any) -> None:
    p = sub.add_parser("workflows", help="create, inspect and cancel workflows")
    workflows = p.add_subparsers(dest="workflows_command", required=True, parser_class=_LoggingParser)
    q = workflows.add_parser("create", help="create a workflow from a JSON file")
    q.add_argument("file", metavar="FILE", help='{"name", "context", "steps": [...]} as JSON; - reads stdin')
    _add_client_options(q)
    for name, text in (("get", "show a workflow, its steps and their jobs"), ("cancel", "cancel a workflow")):
        q = workflows.add_parser(name, help=text)
        q.add_argument("id")
        _add_client_options(q)
    q = workflows.add_parser("list", help="list workflows, newest first")
    q.add_argument("--status", choices=["running", "completed", "failed", "cancelled"])
    q.add_argument("--limit", type=_positive_int, default=50)
    q.add_argument("--cursor")
    _add_client_options(q)
    p.set_defaults(func=_workflows)


def _workflows(args: argparse.Namespace) -> int:
    spec = _read_workflow(args.file) if args.workflows_command == "create" else {}

    async def call(client: Any) -> Any:
        if args.workflows_command == "create":
            workflow = await client.workflow_create(spec.get("name"), spec["steps"], context=spec.get("context"))
            return workflow.to_wire()
        if args.workflows_command == "list":
            workflows, cursor = await client.workflows_list(status=args.status, limit=args.limit, cursor=args.cursor)
            return {"workflows": [w.to_wire() for w in workflows], "next_cursor": cursor}
        method = {"get": client.workflow_get, "cancel": client.workflow_cancel}[args.workflows_command]
        return (await method(args.id)).to_wire()

    return _client_call(args, call)


def _schedules_command(sub: Any) -> None:
    p = sub.add_parser("schedules", help="cron schedules: each tick enqueues one job")
    schedules = p.add_subparsers(dest="schedules_command", required=True, parser_class=_LoggingParser)
    q = schedules.add_parser("list", help="list schedules by name")
    q.add_argument("--limit", type=_positive_int, default=100)
    q.add_argument("--cursor")
    _add_client_options(q)
    q = schedules.add_parser("set", help="create or replace a schedule")
    q.add_argument("name")
    q.add_argument("cron", help="five cron fields (or six, seconds first), e.g. '30 2 * * *'")
    q.add_argument("kind")
    q.add_argument("payload", nargs="?", help="a JSON object (default {}); @FILE reads it from a file, - from stdin")
    q.add_argument("--timezone", default="UTC", help="an IANA time zone (default UTC)")
    q.add_argument("--catch-up", choices=["latest", "none", "all"], default="latest", help="ticks missed while no server ran (default latest)")
    q.add_argument("--paused", action="store_true", help="store it paused")
    q.add_argument("--queue", default="default")
    q.add_argument("--priority", type=int)
    q.add_argument("--max-attempts", type=_positive_int)
    q.add_argument("--delay-secs", type=_non_negative, help="each job is due this long after its tick")
    _add_client_options(q)
    for name, text in (
        ("get", "show a schedule: next and last run, last job"),
        ("delete", "delete a schedule (its jobs stay)"),
        ("pause", "pause a schedule: no tick fires until resumed"),
        ("resume", "resume a schedule from its next tick"),
        ("trigger", "enqueue one job of a schedule now"),
    ):
        q = schedules.add_parser(name, help=text)
        q.add_argument("name")
        _add_client_options(q)
    p.set_defaults(func=_schedules)


def _schedules(args: argparse.Namespace) -> int:
    command = args.schedules_command
    if command == "set":
        payload = _read_payload(args.payload) if args.payload else {}
        job = {"kind": args.kind, "payload": payload, "config": _job_config(args, ("priority", "max_attempts", "delay_secs"))}

    async def call(client: Any) -> Any:
        if command == "list":
            found, cursor = await client.schedules_list(limit=args.limit, cursor=args.cursor)
            return {"schedules": [s.to_wire() for s in found], "next_cursor": cursor}
        if command == "set":
            schedule = await client.schedule_set(
                args.name, args.cron, job, timezone=args.timezone, paused=args.paused, catch_up=args.catch_up
            )
            return schedule.to_wire()
        if command == "delete":
            await client.schedule_delete(args.name)
            return {"deleted": args.name}
        if command == "trigger":
            schedule, job_ = await client.schedule_trigger(args.name)
            return {"schedule": schedule.to_wire(), "job": job_.to_wire()}
        method = {"get": client.schedule_get, "pause": client.schedule_pause, "resume": client.schedule_resume}[command]
        return (await method(args.name)).to_wire()

    return _client_call(args, call)


def _duration(secs: float) -> str:
    """*secs* for a table cell: ``42s``, ``3m07s``, ``5h02m``, ``2d04h``."""
    secs = max(0, round(secs))
    for unit, size, sub, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "m", 60), ("m", 60, "s", 1)):
        if secs >= size:
            return f"{secs // size}{unit}{secs % size // sub_size:02d}{sub}"
    return f"{secs}s"


def _table(header: Sequence[str], rows: Sequence[Sequence[str]], *, left: Sequence[int] = (0,)) -> str:
    """Columns padded to their widest cell: those in *left* left-aligned,
    the others (figures) right-aligned."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]

    def line(row: Sequence[str]) -> str:
        cells = (cell.ljust(width) if i in left else cell.rjust(width) for i, (cell, width) in enumerate(zip(row, widths)))
        return "  ".join(cells).rstrip()

    return "\n".join(line(row) for row in [header, *rows])


_STATUS_COLUMNS = ("pending", "running", "completed", "failed", "cancelled")


def _queues_table(stats: Sequence[Any], *, now: float, rates: dict[str, float | None] | None = None) -> str:
    """Every queue's backlog as a table: counts, how long the oldest ready job
    has waited, when more work comes due, paused, and with *rates* the
    completions per second."""
    from .models import elapsed

    header = ["QUEUE", *(name.upper() for name in _STATUS_COLUMNS), "OLDEST READY", "NEXT AVAILABLE"]
    if rates is not None:
        header.append("DONE/S")
    header.append("STATE")
    rows = []
    for s in stats:
        row = [s.queue, *(str(s.counts.get(name, 0)) for name in _STATUS_COLUMNS)]
        row.append("-" if s.oldest_ready_at is None else _duration(elapsed(s.oldest_ready_at, now)))
        if s.next_available_at is None:
            row.append("-")
        else:
            due = -elapsed(s.next_available_at, now)
            row.append("now" if due <= 0 else f"in {_duration(due)}")
        if rates is not None:
            rate = rates.get(s.queue)
            row.append("-" if rate is None else f"{rate:.1f}")
        row.append("paused" if s.paused else "")
        rows.append(row)
    return _table(header, rows, left=(0, len(header) - 1)) if rows else "no queues"


def _workers_table(workers: Sequence[Any], *, now: float) -> str:
    from .models import elapsed

    rows = [
        [w.worker_id, str(w.jobs) if w.jobs else "idle", ",".join(w.queues), f"{_duration(elapsed(w.last_seen_at, now))} ago"]
        for w in workers
    ]
    return _table(["WORKER", "JOBS", "QUEUES", "LAST SEEN"], rows, left=(0, 2)) if rows else "no workers seen lately"


def _show(wire: Any, table: Callable[[], str]) -> None:
    """A listing: *table* on a terminal, else *wire* as JSON."""
    if sys.stdout.isatty():
        print(table())
    else:
        _print_json(wire)


async def _all_queues(client: Any) -> list[Any]:
    """Every queue's stats, a page a request: a page's answer is bounded,
    the list is not."""
    from .models import MAX_QUEUES_PAGE

    stats: list[Any] = []
    cursor = None
    while True:
        page, cursor = await client.queues_page(limit=MAX_QUEUES_PAGE, cursor=cursor)
        stats += page
        if cursor is None:
            return stats


def _queues_command(sub: Any) -> None:
    p = sub.add_parser("queues", help="every queue's backlog; pause and resume a queue")
    _add_client_options(p)
    p.set_defaults(func=_queues, queues_command=None)
    queues = p.add_subparsers(dest="queues_command", metavar="{pause,resume}", parser_class=_LoggingParser)
    for name, text in (
        ("pause", "pause a queue on every server: leases hand out none of its jobs; running jobs go on"),
        ("resume", "resume a paused queue"),
    ):
        q = queues.add_parser(name, help=text)
        q.add_argument("queue")
        _add_client_options(q, inherited=True)


def _say_if_empty(stats: Any, then: str) -> None:
    """On stderr, that the queue of *stats* holds no job: a name misspelt
    is no error to the server, which answers zeros."""
    if not any(stats.counts.values()):
        print(f"qftrio: queue {stats.queue!r} holds no jobs (`qftrio queues` lists those that do); {then}", file=sys.stderr)


def _queues(args: argparse.Namespace) -> int:
    async def call(client: Any) -> Any:
        if args.queues_command is not None:
            method = {"pause": client.queue_pause, "resume": client.queue_resume}[args.queues_command]
            stats = await method(args.queue)
            _say_if_empty(stats, f"{args.queues_command}d all the same")
            return stats.to_wire()
        stats = await _all_queues(client)
        _show({"queues": [s.to_wire() for s in stats]}, lambda: _queues_table(stats, now=time.time()))
        return None

    return _client_call(args, call)


def _workers_command(sub: Any) -> None:
    p = sub.add_parser("workers", help="the workers seen in the last few minutes, idle ones included: jobs held, queues, last seen")
    _add_client_options(p)
    p.set_defaults(func=_workers)


def _workers(args: argparse.Namespace) -> int:
    async def call(client: Any) -> Any:
        workers = await client.workers()
        _show({"workers": [w.to_wire() for w in workers]}, lambda: _workers_table(workers, now=time.time()))

    return _client_call(args, call)


def _rate_limits_command(sub: Any) -> None:
    p = sub.add_parser("rate-limits", help="list, declare and delete the tenant's rate limits")
    _add_client_options(p)
    p.set_defaults(func=_rate_limits, rate_limits_command="list")
    limits = p.add_subparsers(dest="rate_limits_command", metavar="{list,set,delete}", parser_class=_LoggingParser)
    q = limits.add_parser("list", help="every rate limit, with when held-back jobs can next run")
    _add_client_options(q, inherited=True)
    q = limits.add_parser("set", help="declare or change a rate limit: at most --limit claims in any --per-secs window")
    q.add_argument("name")
    q.add_argument("--limit", type=_positive_int, required=True, help="claims allowed in any window")
    q.add_argument("--per-secs", type=_positive_float, required=True, help="the window, in seconds")
    _add_client_options(q, inherited=True)
    q = limits.add_parser("delete", help="forget a rate limit: its jobs are no longer held back")
    q.add_argument("name")
    _add_client_options(q, inherited=True)


def _rate_limits(args: argparse.Namespace) -> int:
    async def call(client: Any) -> Any:
        if args.rate_limits_command == "set":
            return (await client.rate_limit_set(args.name, args.limit, args.per_secs)).to_wire()
        if args.rate_limits_command == "delete":
            await client.rate_limit_delete(args.name)
            return {"deleted": args.name}
        return {"rate_limits": [r.to_wire() for r in await client.rate_limits_list()]}

    return _client_call(args, call)


class _Rates:
    """Completions per second of each queue, from successive polls."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[float, int]] = {}

    def update(self, stats: Sequence[Any], at: float) -> dict[str, float | None]:
        rates: dict[str, float | None] = {}
        for s in stats:
            done = s.counts.get("completed", 0)
            last = self._last.get(s.queue)
            # Completed jobs leave with retention and bulk deletes: a
            # shrinking count is no negative rate.
            rates[s.queue] = None if last is None or at <= last[0] else max(0.0, (done - last[1]) / (at - last[0]))
            self._last[s.queue] = (at, done)
        return rates


def _stats_command(sub: Any) -> None:
    p = sub.add_parser("stats", help="the backlog of a queue, or of every queue; --watch for a live table")
    p.add_argument("queue", nargs="?", help="one queue (default: every queue)")
    p.add_argument(
        "--watch", action="store_true",
        help="every --interval seconds (one queue: pushed on the event stream; every queue: polled), a live table on a "
        "terminal with completions per second, else a JSON line",
    )  # fmt: skip
    p.add_argument("--interval", type=_non_negative, default=2.0)
    _add_client_options(p)
    p.set_defaults(func=_stats)


def _stats(args: argparse.Namespace) -> int:
    async def poll(client: Any) -> list[Any]:
        return [await client.queue_stats(args.queue)] if args.queue else await _all_queues(client)

    def wire(stats: list[Any], rates: dict[str, float | None] | None = None) -> Any:
        items = [s.to_wire() | ({} if rates is None else {"completed_per_sec": rates[s.queue]}) for s in stats]
        return items[0] if args.queue else {"queues": items}

    async def call(client: Any) -> Any:
        if not args.watch:
            stats = await poll(client)
            if args.queue:
                _say_if_empty(stats[0], "its figures are all zero")
            _show(wire(stats), lambda: _queues_table(stats, now=time.time()))
            return None
        terminal = sys.stdout.isatty()
        rates = _Rates()

        def show(stats: list[Any]) -> None:
            per_sec = rates.update(stats, trio.current_time())
            if terminal:
                now = time.time()
                heading = f"every {args.interval:g}s, at {time.strftime('%H:%M:%S', time.localtime(now))}"
                # home and clear, then the table: the terminal shows one live table
                print(f"\x1b[H\x1b[J{heading}\n\n{_queues_table(stats, now=now, rates=per_sec)}", flush=True)
            else:
                print(json.dumps(wire(stats, per_sec)), flush=True)

        while True:
            try:
                if args.queue:
                    # One queue: its stats come on the event stream, pushed
                    # by the server every interval (whole seconds, 1..60).
                    from .models.limits import MAX_EVENT_STATS_SECS

                    secs = max(1, min(MAX_EVENT_STATS_SECS, math.ceil(args.interval)))
                    async with aclosing(client.events(queue=args.queue, stats_secs=secs)) as stream:
                        async for event in stream:
                            if event.kind == "stats":
                                show([event.stats])
                    # the server ended the stream (a restart, an overflow): open another
                else:
                    show(await poll(client))
            except (errors.TransportError, errors.Unavailable) as exc:
                # a restarting server: say so and keep watching
                print(f"qftrio: {exc.message if isinstance(exc, errors.ApiError) else exc}; retrying", file=sys.stderr)
            await trio.sleep(args.interval)

    return _client_call(args, call)


def _events_command(sub: Any) -> None:
    p = sub.add_parser(
        "events", help="the tenant's job changes as they happen, one JSON line each, until the server ends the stream",
        description="Print every change of the tenant's jobs (enqueued, claimed, progress, retried, ended), made on "
        "any server, as one JSON line {\"event\": ..., \"data\": ...} each. Nothing from before is replayed. "
        "Exits 0 when the server ends the stream, 1 after an overflow (this reader fell behind).",
    )  # fmt: skip
    p.add_argument("--queue", help="only this queue's jobs")
    p.add_argument("--kind", help="only jobs of this kind")
    p.add_argument("--job", help="only this job")
    p.add_argument("--stats", type=int, metavar="SECS", help="each queue's stats too, every SECS seconds (1..60)")
    _add_client_options(p)
    p.set_defaults(func=_events)


def _events(args: argparse.Namespace) -> int:
    async def call(client: Any) -> Any:
        async with aclosing(client.events(queue=args.queue, kind=args.kind, job=args.job, stats_secs=args.stats)) as stream:
            async for event in stream:
                print(json.dumps({"event": event.kind, "data": event.data}), flush=True)
                if event.kind == "overflow":
                    raise errors.QftrioError("the stream ended: this reader fell behind (read the jobs for what it missed)")
        return None

    return _client_call(args, call)


def _migrate_command(sub: Any) -> None:
    p = sub.add_parser("migrate", help="apply the PostgreSQL schema")
    p.add_argument("--database-url", help="postgresql://... (QFTRIO_DATABASE_URL)")
    p.set_defaults(func=_migrate)


def _migrate(args: argparse.Namespace) -> int:
    url = args.database_url or env("DATABASE_URL")
    if not url:
        raise errors.ConfigError("no database: pass --database-url or set QFTRIO_DATABASE_URL")

    async def run() -> list[str]:
        from .server.store.postgres import migrate

        return await migrate(url)

    applied = trio.run(run)
    print(f"applied {len(applied)} migration(s)" + (f": {', '.join(applied)}" if applied else ""))
    return 0


# -- parser ------------------------------------------------------------------


def _add_client_options(parser: argparse.ArgumentParser, *, inherited: bool = False) -> None:
    """``--url`` and ``--token``. *inherited*: the parser is a subcommand of
    one that takes them too, whose values stand unless given again."""
    url_default = argparse.SUPPRESS if inherited else env("URL") or DEFAULT_URL
    parser.add_argument("--url", default=url_default, help="server URL (QFTRIO_URL)")
    parser.add_argument("--token", default=argparse.SUPPRESS if inherited else None, help="tenant token (QFTRIO_TOKEN)")


_STATUSES = ["pending", "running", "completed", "failed", "cancelled"]


def _add_filters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--queue")
    parser.add_argument("--status", choices=_STATUSES)
    parser.add_argument("--kind")
    parser.add_argument("--created-after", metavar="TIME", help="RFC 3339: jobs created at or after")
    parser.add_argument("--created-before", metavar="TIME", help="RFC 3339: jobs created before")
    parser.add_argument("--limit", type=_positive_int, help="change at most this many jobs (default 10000)")
    parser.add_argument(
        "--all", action="store_true", help="with no filter: every job of the tenant the action applies to"
    )


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {value}")
    return value


def _positive_float(text: str) -> float:
    value = _non_negative(text)
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number: {text!r}")
    return value


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {value}")
    return value


#: Each command's parser, in the order ``--help`` lists them.
_COMMANDS: tuple[Callable[[Any], None], ...] = (
    _serve_command,
    _worker_command,
    _enqueue_command,
    _jobs_command,
    _workflows_command,
    _schedules_command,
    _queues_command,
    _rate_limits_command,
    _stats_command,
    _events_command,
    _workers_command,
    _migrate_command,
)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="qftrio", description="A durable job server and a Trio worker runtime.")
    parser.add_argument("--log-level", default="INFO", choices=_LOG_LEVELS, help="default INFO")
    parser.add_argument("--version", action="version", version=f"qftrio {__version__}")
    # not required=True: argparse would then report a missing command before
    # an unknown flag, and `qftrio --nope` would not name --nope
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_LoggingParser)
    for add in _COMMANDS:
        add(sub)
    return parser


def _single_leaf(group: BaseExceptionGroup) -> BaseException:
    """The one exception a nursery wrapped, or the group if there are several."""
    leaves: list[BaseException] = []

    def walk(exc: BaseException) -> None:
        if isinstance(exc, BaseExceptionGroup):
            for inner in exc.exceptions:
                walk(inner)
        else:
            leaves.append(exc)

    walk(group)
    return leaves[0] if len(leaves) == 1 else group


def _refused_here(exc: errors.ApiError) -> bool:
    """Whether the client refused *exc*'s request before sending it: then
    no server answered anything."""
    from .client import InvalidArgument  # loaded already by whatever raised it

    return isinstance(exc, InvalidArgument)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.error("a command is required")
    logging.basicConfig(
        level=getattr(logging, args.log_level), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        try:
            return args.func(args)
        except BaseExceptionGroup as group:
            raise _single_leaf(group) from None
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return 1
    except errors.ConfigError as exc:
        print(f"qftrio: {exc}", file=sys.stderr)
        return 2
    except errors.Unavailable as exc:
        print(f"qftrio: unavailable: {exc.message}", file=sys.stderr)
        return 1
    except errors.ApiError as exc:
        if _refused_here(exc):
            print(f"qftrio: invalid argument: {exc.message}", file=sys.stderr)
            return 2
        print(f"qftrio: {exc.status_code} {exc.code}: {exc.message}", file=sys.stderr)
        return 1
    except errors.TransportError as exc:
        print(f"qftrio: cannot reach the server: {exc}", file=sys.stderr)
        return 1
    except errors.QftrioError as exc:
        print(f"qftrio: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:
        print(f"qftrio: {exc.strerror or exc}", file=sys.stderr)
        return 1
    except Exception as exc:
        logging.getLogger("qftrio").debug("unexpected error", exc_info=exc)
        print(f"qftrio: unexpected error: {exc!r} (run with --log-level DEBUG for details)", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
