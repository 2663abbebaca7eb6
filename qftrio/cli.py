"""The ``qftrio`` command: ``serve | worker | enqueue | jobs | workflows | stats | migrate``.

Every failure is one line on stderr and a non-zero exit: 1 for an error
answer or an unreachable server, 2 for bad usage or configuration, 130 when
interrupted.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, NoReturn

import trio

from . import __version__, errors

__all__ = ["main"]

DEFAULT_URL = "http://127.0.0.1:8000"


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


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


def _serve(args: argparse.Namespace) -> int:
    from ._gc import settle_after_imports
    from .server.config import Config, parse_tenants
    from .server.serve import serve

    if not args.handlers:
        given = [flag for flag, value in (("--queue", args.queue), ("--lanes", args.lanes)) if value]
        if given:
            raise errors.ConfigError(f"{' and '.join(given)} configure in-process handlers: pass --handlers too")
    if args.db and (args.database_url or os.environ.get("QUEUEFLOW_DATABASE_URL")):
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
        pool_size=args.pool_size,
        retention_secs=args.retention_secs,
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


def _worker(args: argparse.Namespace) -> int:
    from .worker.process import run_worker_process

    token = args.token or os.environ.get("QUEUEFLOW_WORKER_TOKEN")
    if not token:
        raise errors.ConfigError("no worker token: pass --token or set QUEUEFLOW_WORKER_TOKEN")
    lanes = {} if args.lanes is None else {"lanes": args.lanes}
    return run_worker_process(
        url=args.url,
        token=token,
        queue=args.queue,
        registry_ref=args.registry,
        **lanes,
        batch=args.batch,
        lease_secs=args.lease_secs,
        wait_secs=args.wait_secs,
        worker_id=args.worker_id,
    )


# -- application commands ----------------------------------------------------


def _client_call(args: argparse.Namespace, call: Callable[[Any], Awaitable[Any]]) -> int:
    from .client import Client

    token = args.token or os.environ.get("QUEUEFLOW_TOKEN")
    if not token:
        raise errors.ConfigError("no tenant token: pass --token or set QUEUEFLOW_TOKEN")

    async def run() -> Any:
        async with Client(args.url, token) as client:
            return await call(client)

    result = trio.run(run)
    if result is not None:
        _print_json(result)
    return 0


def _enqueue(args: argparse.Namespace) -> int:
    payload = _json_object(args.payload, "the payload") if args.payload else {}
    config: dict[str, Any] = {"queue": args.queue}
    for key in ("priority", "max_attempts", "delay_secs", "scheduled_at", "idempotency_key"):
        value = getattr(args, key)
        if value is not None:
            config[key] = value

    async def call(client: Any) -> Any:
        return (await client.enqueue(args.kind, payload, **config)).to_wire()

    return _client_call(args, call)


def _jobs(args: argparse.Namespace) -> int:
    async def call(client: Any) -> Any:
        if args.jobs_command == "list":
            jobs, cursor = await client.jobs_list(
                queue=args.queue, status=args.status, kind=args.kind, limit=args.limit, cursor=args.cursor
            )
            return {"jobs": [j.to_wire() for j in jobs], "next_cursor": cursor}
        method = {"get": client.job_get, "cancel": client.job_cancel, "retry": client.job_retry}[args.jobs_command]
        return (await method(args.id)).to_wire()

    return _client_call(args, call)


def _read_workflow(path: str) -> dict[str, Any]:
    """A workflow definition from a JSON file, or stdin for ``-``."""
    if path == "-":
        text, what = sys.stdin.read(), "the workflow on stdin"
    else:
        try:
            with open(path, encoding="utf-8") as f:
                text = f.read()
        except OSError as exc:
            raise errors.ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
        except UnicodeDecodeError:
            raise errors.ConfigError(f"cannot read {path}: not UTF-8 text") from None
        what = path
    spec = _json_object(text, what)
    unknown = sorted(set(spec) - {"name", "context", "steps"})
    if unknown:
        raise errors.InvalidInput(f"{unknown[0]}: unknown field")
    return spec


def _workflows(args: argparse.Namespace) -> int:
    spec = _read_workflow(args.file) if args.workflows_command == "create" else {}

    async def call(client: Any) -> Any:
        if args.workflows_command == "create":
            steps = spec.get("steps")
            if not isinstance(steps, list):
                raise errors.InvalidInput("steps: must be a list of steps")
            return (await client.workflow_create(spec.get("name"), steps, context=spec.get("context"))).to_wire()
        if args.workflows_command == "list":
            workflows, cursor = await client.workflows_list(status=args.status, limit=args.limit, cursor=args.cursor)
            return {"workflows": [w.to_wire() for w in workflows], "next_cursor": cursor}
        method = {"get": client.workflow_get, "cancel": client.workflow_cancel}[args.workflows_command]
        return (await method(args.id)).to_wire()

    return _client_call(args, call)


def _stats(args: argparse.Namespace) -> int:
    async def call(client: Any) -> Any:
        if not args.watch:
            return (await client.queue_stats(args.queue)).to_wire()
        while True:
            try:
                print(json.dumps((await client.queue_stats(args.queue)).to_wire()), flush=True)
            except (errors.TransportError, errors.Unavailable) as exc:
                # a restarting server: say so and keep watching
                print(f"qftrio: {exc.message if isinstance(exc, errors.ApiError) else exc}; retrying", file=sys.stderr)
            await trio.sleep(args.interval)

    return _client_call(args, call)


def _migrate(args: argparse.Namespace) -> int:
    url = args.database_url or os.environ.get("QUEUEFLOW_DATABASE_URL")
    if not url:
        raise errors.ConfigError("no database: pass --database-url or set QUEUEFLOW_DATABASE_URL")

    async def run() -> list[str]:
        import trio_asyncio

        from .server.store.postgres import migrate

        async with trio_asyncio.open_loop():
            return await migrate(url)

    applied = trio.run(run)
    print(f"applied {len(applied)} migration(s)" + (f": {', '.join(applied)}" if applied else ""))
    return 0


# -- parser ------------------------------------------------------------------


def _add_client_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=os.environ.get("QUEUEFLOW_URL", DEFAULT_URL), help="server URL (QUEUEFLOW_URL)")
    parser.add_argument("--token", help="tenant token (QUEUEFLOW_TOKEN)")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {value}")
    return value


def _non_negative(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must not be negative: {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="qftrio", description="A durable job server and a Trio worker runtime.")
    parser.add_argument("--log-level", default="INFO", choices=_LOG_LEVELS, help="default INFO")
    parser.add_argument("--version", action="version", version=f"qftrio {__version__}")
    # not required=True: argparse would then report a missing command before
    # an unknown flag, and `qftrio --nope` would not name --nope
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_LoggingParser)

    p = sub.add_parser("serve", help="run the job server")
    p.add_argument("--database-url", help="postgresql://... (QUEUEFLOW_DATABASE_URL); default: the embedded store")
    p.add_argument("--db", help="the embedded store's SQLite file (default ./qftrio.db)")
    p.add_argument("--bind", help="HOST:PORT to listen on (default 127.0.0.1:8000)")
    p.add_argument("--mode", choices=["api", "worker", "all"], help="what to run (default all)")
    p.add_argument("--handlers", metavar="MODULE:REGISTRY", help="run this registry's handlers in-process")
    p.add_argument("--queue", action="append", help="queue the in-process handlers lease from (repeatable; default 'default')")
    p.add_argument("--lanes", type=_positive_int, help="in-process jobs at a time per queue (default 4)")
    p.add_argument("--worker-token", help="the worker credential (QUEUEFLOW_WORKER_TOKEN)")
    p.add_argument("--tenant", action="append", metavar="NAME=TOKEN", help="a tenant credential (repeatable; QUEUEFLOW_TENANTS)")
    p.add_argument("--dev", action="store_true", help="development mode (QUEUEFLOW_DEV=1): never on an open network")
    p.add_argument("--max-body-bytes", type=_positive_int, help="request body cap (default 1 MiB)")
    p.add_argument("--pool-size", type=_positive_int, help="PostgreSQL connections (default 10)")
    p.add_argument("--retention-secs", type=_non_negative, help="keep completed and cancelled jobs this long (default 7 days)")
    p.set_defaults(func=_serve)

    p = sub.add_parser("worker", help="run a worker pool process")
    p.add_argument("queue", help="the queue to lease from")
    p.add_argument("registry", metavar="MODULE:REGISTRY", help="where the handlers are, e.g. handlers:registry")
    p.add_argument("--url", default=os.environ.get("QUEUEFLOW_URL", DEFAULT_URL), help="server URL (QUEUEFLOW_URL)")
    p.add_argument("--token", help="the worker token (QUEUEFLOW_WORKER_TOKEN)")
    p.add_argument("--lanes", type=_positive_int, default=None, help="jobs run at a time (default 200)")
    p.add_argument(
        "--batch", type=_positive_int, default=None, help="jobs leased per call at most (default: the free lanes)"
    )
    p.add_argument("--lease-secs", type=_positive_int, default=60, help="lease length (default 60)")
    p.add_argument("--wait-secs", type=_non_negative, default=20, help="long-poll wait (default 20)")
    p.add_argument("--worker-id", help="this process's id (default host-pid)")
    p.set_defaults(func=_worker)

    p = sub.add_parser("enqueue", help="enqueue a job")
    p.add_argument("kind")
    p.add_argument("payload", nargs="?", help="a JSON object (default {})")
    p.add_argument("--queue", default="default")
    p.add_argument("--priority", type=int)
    p.add_argument("--max-attempts", type=_positive_int)
    p.add_argument("--delay-secs", type=_non_negative)
    p.add_argument("--scheduled-at", help="RFC 3339 time")
    p.add_argument("--idempotency-key")
    _add_client_options(p)
    p.set_defaults(func=_enqueue)

    p = sub.add_parser("jobs", help="inspect and manage jobs")
    jobs = p.add_subparsers(dest="jobs_command", required=True, parser_class=_LoggingParser)
    for name, text in (("get", "show a job"), ("cancel", "cancel a job"), ("retry", "retry a failed or cancelled job")):
        q = jobs.add_parser(name, help=text)
        q.add_argument("id")
        _add_client_options(q)
        q.set_defaults(func=_jobs)
    q = jobs.add_parser("list", help="list jobs, newest first")
    q.add_argument("--queue")
    q.add_argument("--status", choices=["pending", "running", "completed", "failed", "cancelled"])
    q.add_argument("--kind")
    q.add_argument("--limit", type=_positive_int, default=50)
    q.add_argument("--cursor")
    _add_client_options(q)
    q.set_defaults(func=_jobs)

    p = sub.add_parser("workflows", help="create, inspect and cancel workflows")
    workflows = p.add_subparsers(dest="workflows_command", required=True, parser_class=_LoggingParser)
    q = workflows.add_parser("create", help="create a workflow from a JSON file")
    q.add_argument("file", metavar="FILE", help='{"name", "context", "steps": [...]} as JSON; - reads stdin')
    _add_client_options(q)
    q.set_defaults(func=_workflows)
    for name, text in (("get", "show a workflow, its steps and their jobs"), ("cancel", "cancel a workflow")):
        q = workflows.add_parser(name, help=text)
        q.add_argument("id")
        _add_client_options(q)
        q.set_defaults(func=_workflows)
    q = workflows.add_parser("list", help="list workflows, newest first")
    q.add_argument("--status", choices=["running", "completed", "failed", "cancelled"])
    q.add_argument("--limit", type=_positive_int, default=50)
    q.add_argument("--cursor")
    _add_client_options(q)
    q.set_defaults(func=_workflows)

    p = sub.add_parser("stats", help="a queue's backlog")
    p.add_argument("queue")
    p.add_argument("--watch", action="store_true", help="print a line every --interval seconds")
    p.add_argument("--interval", type=_non_negative, default=2.0)
    _add_client_options(p)
    p.set_defaults(func=_stats)

    p = sub.add_parser("migrate", help="apply the PostgreSQL schema")
    p.add_argument("--database-url", help="postgresql://... (QUEUEFLOW_DATABASE_URL)")
    p.set_defaults(func=_migrate)
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
