"""asyncpg on Trio, through trio-asyncio.

API is not stable. DO NOT USE outside :mod:`qftrio.server.store.postgres`.

asyncpg is an asyncio library; trio-asyncio runs an asyncio loop on top of
Trio, and :func:`trio_asyncio.aio_as_trio` runs an asyncio coroutine from a
Trio task. Everything here must therefore run inside
``async with trio_asyncio.open_loop():``. The loop is looked up once, when a
:class:`Database` or :class:`Listener` is opened, and used explicitly from
then on, so calls work from any Trio task of the program, whatever its
contextvars say.

Each database operation is one asyncio coroutine that acquires a pooled
connection, optionally opens a transaction, runs an asyncio-flavoured
function ``fn(conn, *args)`` and releases the connection: one hop between the
two worlds per operation, not one per query.

Failures of the database itself (refused or broken connections, a server
shutting down or starting up, a read-only standby after a failover, a
statement timeout, a connection refused its credentials) become
:class:`~qftrio.errors.Unavailable`, so the HTTP layer answers 503.

Opening a pool is where settings are checked: a URL asyncpg cannot read, or a
password, role or database the server refuses, is a
:class:`~qftrio.errors.ConfigError`; a server that cannot be reached is
:class:`~qftrio.errors.Unavailable`; either says where it connected, never
with the password.

Timeouts and Trio's clock: trio-asyncio's loop reads Trio's clock, so asyncio
timeouts are *Trio* timeouts. Under a virtual clock (``MockClock`` with
autojump, as tests use) a client-side timeout around network I/O fires at
once, because every task is blocked while PostgreSQL answers. Client-side
timeouts are therefore one option, ``timeout``, which tests set to ``None``;
statements are bounded on the server (``statement_timeout``), which keeps
real time whatever clock the client runs on.
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import random
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, TypeVar

import asyncpg
import trio
import trio_asyncio
from asyncpg import connect_utils

from ... import errors
from ..._json import dumps_strict, loads

__all__ = [
    "Database",
    "Listener",
    "Target",
    "open_database",
    "open_listener",
    "read_url",
    "translate_error",
    "running_loop",
]

log = logging.getLogger("qftrio.store.postgres")

T = TypeVar("T")

# Errors that mean "the database cannot serve us right now", not "the request
# is wrong". OSError covers refused and reset connections and (Python >= 3.10)
# TimeoutError. asyncpg's InterfaceError is mostly "connection is closed" or
# "pool is closing"; the rest of it would be a bug of ours, logged below.
_UNAVAILABLE: tuple[type[BaseException], ...] = (
    OSError,
    asyncpg.exceptions.PostgresConnectionError,  # class 08
    asyncpg.exceptions.OperatorInterventionError,  # class 57: shutdown, starting up, statement timeout
    asyncpg.exceptions.InsufficientResourcesError,  # class 53: too many connections, disk full
    asyncpg.exceptions.ReadOnlySQLTransactionError,  # a standby after a failover
    asyncpg.exceptions.TransactionRollbackError,  # deadlock or serialization failure, after retries
    asyncpg.exceptions.LockNotAvailableError,  # lock_timeout
    # class 28 and 3D000 when a new pooled connection is refused (a password
    # rotated, a role or database dropped) while the server runs
    asyncpg.exceptions.InvalidAuthorizationSpecificationError,
    asyncpg.exceptions.InvalidCatalogNameError,
    asyncpg.InterfaceError,
)

# What the server answers when it refuses these settings: a wrong password
# (28P01, a subclass of 28000), an unknown or NOLOGIN role or no pg_hba.conf
# entry (28000), an unknown database (3D000), no CONNECT privilege (42501).
_REFUSED: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.InvalidAuthorizationSpecificationError,
    asyncpg.exceptions.InvalidCatalogNameError,
    asyncpg.exceptions.InsufficientPrivilegeError,
    asyncpg.exceptions.ClientConfigurationError,
)

# Why a first connection found no server to talk to.
_UNREACHABLE: tuple[type[BaseException], ...] = (
    OSError,
    asyncpg.exceptions.PostgresConnectionError,
    asyncpg.exceptions.CannotConnectNowError,  # starting up, shutting down
    asyncpg.exceptions.TooManyConnectionsError,
)

# Why a server could not be reached, where the OS says it tersely.
_REASONS: dict[type[BaseException], str] = {
    ConnectionRefusedError: "connection refused",
    TimeoutError: "timed out",
}

# Transient conflicts between transactions: safe to run the whole transaction again.
_RETRY: tuple[type[BaseException], ...] = (
    asyncpg.exceptions.DeadlockDetectedError,
    asyncpg.exceptions.SerializationError,
)
_RETRIES = 3


def translate_error(exc: BaseException) -> errors.ApiError | None:
    """The qftrio error for an exception raised by asyncpg, or None when it
    is not a database failure (a bug, or an error of qftrio's own)."""
    if isinstance(exc, errors.QftrioError):
        return None
    if isinstance(exc, asyncpg.exceptions.DataError):
        # class 22, e.g. "\u0000" in a JSON string, which jsonb cannot store
        return errors.InvalidInput(f"a value cannot be stored: {_first_line(exc)}", code="unstorable")
    if isinstance(exc, _UNAVAILABLE):
        if isinstance(exc, asyncpg.InterfaceError):
            log.warning("database interface error", exc_info=exc)
        return errors.Unavailable(f"the database is unavailable ({type(exc).__name__})")
    return None


@contextmanager
def database_errors() -> Iterator[None]:
    """Raise what :func:`translate_error` maps as qftrio's errors; anything
    else unchanged."""
    try:
        yield
    except Exception as exc:
        mapped = translate_error(exc)
        if mapped is None:
            raise
        raise mapped from exc


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Target:
    """Where a database URL connects, as asyncpg reads it.

    Attributes:
        where: ``host:port`` (or a socket path) of each host, comma-separated.
        user: the role it logs in as.
    """

    where: str
    user: str


def read_url(url: str) -> Target:
    """Read *url* as :func:`asyncpg.connect` will, without connecting.

    Raises:
        ConfigError: asyncpg cannot read it (a scheme other than
            ``postgresql``, an unknown ``sslmode``, a port that is not a
            number or out of range, ...). The message never holds the password.
    """
    # asyncpg's own reading of a URL, the one connect() makes. It is private,
    # so it is called with whatever parameters this version of asyncpg takes,
    # each at connect()'s default (None) but the URL.
    parse = connect_utils._parse_connect_dsn_and_args
    arguments: dict[str, Any] = dict.fromkeys(inspect.signature(parse).parameters)
    try:
        addresses, params = parse(**{**arguments, "dsn": url})
    except asyncpg.exceptions.ClientConfigurationError as exc:
        raise errors.ConfigError(f"the database URL is not usable: {_redacted(str(exc), url)}") from None
    except ValueError as exc:  # int() of a port, the only plain ValueError it raises
        message = _redacted(str(exc), url)
        raise errors.ConfigError(f"the database URL has a port that is not a number: {message}") from None
    hosts = []
    for address in addresses:
        if isinstance(address, str):  # a Unix socket
            hosts.append(address)
            continue
        host, port = address
        if not 0 < port < 65536:
            raise errors.ConfigError(f"the database URL's port {port} is out of range (1 to 65535)")
        hosts.append(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
    return Target(where=", ".join(hosts), user=params.user)


def _redacted(text: str, url: str) -> str:
    """*text* without the password *url* holds, should any message quote it."""
    try:
        password = urllib.parse.urlsplit(url).password
    except ValueError:
        password = None
    if password:
        for form in (password, urllib.parse.unquote(password)):  # as written, and as sent
            text = text.replace(form, "***")
    return text


@contextmanager
def _connect_errors(target: Target, url: str) -> Iterator[None]:
    """Raise a first connection's failures as one sentence naming where it
    connected: :class:`~qftrio.errors.ConfigError` for settings the server
    refuses, :class:`~qftrio.errors.Unavailable` for a server that cannot
    be reached; anything else as :func:`database_errors` does."""
    with database_errors():
        try:
            yield
        except _REFUSED as exc:
            message = _redacted(_first_line(exc), url)
            raise errors.ConfigError(f"PostgreSQL at {target.where} refused the connection: {message}") from None
        except _UNREACHABLE as exc:
            reason = _REASONS.get(type(exc)) or getattr(exc, "strerror", None) or _first_line(exc)
            message = _redacted(reason, url)
            raise errors.Unavailable(f"cannot connect to PostgreSQL at {target.where}: {message}") from None


def running_loop() -> trio_asyncio.TrioEventLoop:
    """The trio-asyncio loop of the current context; raise if there is none."""
    loop = trio_asyncio.current_loop.get()
    if loop is None:
        raise errors.ConfigError(
            "the PostgreSQL store needs an asyncio loop: run it inside `async with trio_asyncio.open_loop():`"
        )
    return loop


def _dumps(value: Any) -> str:
    # Strict: PostgreSQL's jsonb has no NaN; asyncpg reports the ValueError
    # as a DataError, which becomes a 422.
    return dumps_strict(value).decode()


def _defaults_unless_in_url(url: str, settings: dict[str, str]) -> dict[str, str]:
    """*settings* minus those the URL's query sets: asyncpg passes unknown
    query parameters (``?search_path=qftrio&statement_timeout=60000``) as
    server settings, but lets explicit ``server_settings`` win over them."""
    given = urllib.parse.parse_qs(urllib.parse.urlsplit(url).query) if "://" in url else {}
    return {k: v for k, v in settings.items() if k not in given}


async def _init_connection(conn: asyncpg.Connection) -> None:
    # asyncio-flavoured: runs on every new pooled connection, reconnects included
    await conn.set_type_codec("jsonb", encoder=_dumps, decoder=loads, schema="pg_catalog")
    await conn.set_type_codec("json", encoder=_dumps, decoder=loads, schema="pg_catalog")


async def _run_on_pool(
    pool: asyncpg.Pool,
    acquire_timeout: float | None,
    transaction: bool,
    fn: Callable[..., Awaitable[T]],
    args: tuple[Any, ...],
) -> T:
    # asyncio-flavoured
    async with pool.acquire(timeout=acquire_timeout) as conn:
        if transaction:
            async with conn.transaction():
                return await fn(conn, *args)
        return await fn(conn, *args)


async def _connect_once(pool: asyncpg.Pool, timeout: float | None) -> None:
    # asyncio-flavoured
    async with pool.acquire(timeout=timeout):
        pass


async def _keep_session(conn: asyncpg.Connection) -> None:
    """What the pool does to a connection given back, beyond what asyncpg
    always does (end an open transaction, drop listeners): nothing.

    asyncpg's default runs a reset query (``pg_advisory_unlock_all()``,
    ``CLOSE ALL``, ``UNLISTEN *``, ``RESET ALL``) on every release: one more
    round trip per store call, 0.42 vs 0.18 ms per acquire + query + release
    here (docs/performance.md). qftrio's operations leave no session state
    behind: the listener has a connection of its own, and migrations reset
    their settings and release their lock."""


class Database:
    """A pool of asyncpg connections used from Trio. Open with
    :func:`open_database`."""

    def __init__(self, pool: asyncpg.Pool, loop: trio_asyncio.TrioEventLoop, *, timeout: float | None) -> None:
        self._pool = pool
        self._loop = loop
        self._timeout = timeout
        self._closed = False

    async def run(self, fn: Callable[..., Awaitable[T]], *args: Any, transaction: bool = True) -> T:
        """Run the asyncio-flavoured ``fn(conn, *args)`` on a pooled connection,
        inside a transaction unless *transaction* is False.

        ``fn`` must not call Trio. A deadlock or serialization failure runs it
        again (up to three tries); database failures raise
        :class:`~qftrio.errors.Unavailable`.

        Cancellation waits for the operation to finish: a transaction that
        started commits or rolls back as it would have, and the caller sees
        :class:`trio.Cancelled` afterwards. Interrupting asyncpg mid-query
        makes it send a CancelRequest over an extra connection, and under
        trio-asyncio that path can wait forever for its socket (seen with
        trio-asyncio 0.16 and asyncpg 0.32 when queries are cancelled in
        quick succession; compare python-trio/trio-asyncio#153). The wait is
        bounded by ``statement_timeout`` on the server and, with a client
        timeout set, by asyncpg's ``command_timeout``.
        """
        if self._closed:
            raise errors.Unavailable("the database pool is closed")
        try:
            with trio.CancelScope(shield=True):
                return await self._run_retrying(fn, args, transaction)
        finally:
            # deliver a cancellation that arrived meanwhile (no-op otherwise)
            await trio.lowlevel.checkpoint_if_cancelled()

    async def _run_retrying(self, fn: Callable[..., Awaitable[T]], args: tuple[Any, ...], transaction: bool) -> T:
        with database_errors():
            for attempt in range(_RETRIES):
                try:
                    return await trio_asyncio.aio_as_trio(_run_on_pool, loop=self._loop)(
                        self._pool, self._timeout, transaction, fn, args
                    )
                except _RETRY as exc:
                    if attempt + 1 == _RETRIES:
                        raise errors.Unavailable("the database is too busy (transaction conflicts)") from exc
                    log.info("transaction conflict (%s); running it again", type(exc).__name__)
                    await trio.sleep(0.01 * (attempt + 1) * (1 + random.random()))
        raise AssertionError("unreachable")

    async def fetch(self, query: str, *args: Any) -> list[asyncpg.Record]:
        """One statement outside an explicit transaction (it is its own)."""

        async def _fetch(conn: asyncpg.Connection) -> list[asyncpg.Record]:
            return await conn.fetch(query, *args)

        return await self.run(_fetch, transaction=False)

    async def fetchval(self, query: str, *args: Any) -> Any:
        async def _fetchval(conn: asyncpg.Connection) -> Any:
            return await conn.fetchval(query, *args)

        return await self.run(_fetchval, transaction=False)

    async def aclose(self) -> None:
        """Close every connection; idempotent. Shielded; with a timeout set,
        connections still busy after it are cut."""
        if self._closed:
            return
        self._closed = True
        with trio.CancelScope(shield=True) as scope:
            if self._timeout is not None:
                scope.deadline = trio.current_time() + self._timeout
            try:
                await trio_asyncio.aio_as_trio(self._pool.close, loop=self._loop)()
                return
            except Exception as exc:  # closing a broken pool is not worth a traceback
                log.debug("closing the pool: %r", exc)
        # timed out or failed: cut the connections still open
        self._pool.terminate()


@asynccontextmanager
async def open_database(
    url: str,
    *,
    min_size: int = 0,
    max_size: int = 10,
    timeout: float | None = 10.0,
    statement_timeout: float | None = 30.0,
    application_name: str = "qftrio",
) -> AsyncIterator[Database]:
    """Open a connection pool on *url*.

    Args:
        url: ``postgresql://user:password@host:port/database``, or anything
            asyncpg's ``dsn`` accepts.
        min_size, max_size: the pool's bounds.
        timeout: client-side bound, in seconds of Trio's clock, on connecting,
            on waiting for a free pooled connection, and on closing; None
            disables it (tests running on a virtual clock must).
        statement_timeout: server-side bound on each statement.

    Raises:
        ConfigError: asyncpg cannot read *url*, or the server refuses its
            password, role or database.
        Unavailable: the database cannot be reached.
    """
    loop = running_loop()
    target = read_url(url)
    # Client-side bound on each query: past the server's own, so that it only
    # fires when the server cannot answer at all (a dead network path).
    command_timeout = None if timeout is None else (statement_timeout or 30.0) + timeout
    settings = _defaults_unless_in_url(
        url,
        {"application_name": application_name}
        if statement_timeout is None
        else {
            "application_name": application_name,
            "statement_timeout": str(int(statement_timeout * 1000)),
            "idle_in_transaction_session_timeout": str(int(statement_timeout * 2000)),
        },
    )
    with database_errors():
        pool = await trio_asyncio.aio_as_trio(asyncpg.create_pool, loop=loop)(
            dsn=url,
            # No floor: asyncpg (>= 0.32) would restore it from a background
            # task of its own that logs a traceback per attempt while the
            # database is down. Idle connections are kept all the same.
            min_size=min(min_size, max_size),
            max_size=max_size,
            timeout=timeout,
            command_timeout=command_timeout,
            init=_init_connection,
            reset=_keep_session,
            server_settings=settings,
            # asyncio timers run on Trio's clock; keep them out of the I/O path
            max_inactive_connection_lifetime=0,
        )
    db = Database(pool, loop, timeout=timeout)
    try:
        # a first connection now, so that settings the server refuses are
        # told at once, and as such; the pool keeps it for the first caller
        with _connect_errors(target, url):
            await trio_asyncio.aio_as_trio(_connect_once, loop=loop)(pool, timeout)
        yield db
    finally:
        await db.aclose()


class Listener:
    """A dedicated connection that LISTENs on one channel. Open with
    :func:`open_listener`.

    asyncpg calls back from the asyncio loop, which runs inside Trio on the
    same thread, so its callbacks may set Trio events directly.
    """

    #: More distinct payloads than this between two receives collapse to "*".
    MAX_PENDING = 1000

    def __init__(self, conn: asyncpg.Connection, loop: trio_asyncio.TrioEventLoop, *, timeout: float | None) -> None:
        self._conn = conn
        self._loop = loop
        self._timeout = timeout
        self._pending: set[str] = set()
        self._lost = False
        self._wakeup = trio.Event()

    @property
    def backend_pid(self) -> int:
        return self._conn.get_server_pid()

    # asyncio callbacks ------------------------------------------------------

    def _on_notification(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        if len(self._pending) >= self.MAX_PENDING:
            self._pending = {"*"}
        else:
            self._pending.add(payload)
        self._wakeup.set()

    def _on_termination(self, conn: Any) -> None:
        self._lost = True
        self._wakeup.set()

    # trio side ----------------------------------------------------------------

    async def receive(self, *, keepalive_secs: float = 30.0) -> set[str]:
        """Wait for notifications and return their payloads (deduplicated).

        Every *keepalive_secs* without any, the connection is checked with a
        query, so that a silently dead connection is noticed.

        Raises:
            Unavailable: the connection is lost.
        """
        while not self._pending:
            if self._lost or self._conn.is_closed():
                raise errors.Unavailable("the LISTEN connection was lost")
            self._wakeup = trio.Event()
            with trio.move_on_after(keepalive_secs):
                await self._wakeup.wait()
                continue
            await self._ping()
        pending, self._pending = self._pending, set()
        return pending

    async def _ping(self) -> None:
        # shielded, as Database.run explains
        with database_errors(), trio.CancelScope(shield=True):
            await trio_asyncio.aio_as_trio(self._conn.fetchval, loop=self._loop)("SELECT 1", timeout=self._timeout)

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True) as scope:
            if self._timeout is not None:
                scope.deadline = trio.current_time() + self._timeout
            if not self._conn.is_closed():
                try:
                    await trio_asyncio.aio_as_trio(self._conn.close, loop=self._loop)()
                except Exception as exc:
                    log.debug("closing the LISTEN connection: %r", exc)
        if not self._conn.is_closed():
            self._conn.terminate()


@asynccontextmanager
async def open_listener(
    url: str, channel: str, *, timeout: float | None = 10.0, application_name: str = "qftrio-listener"
) -> AsyncIterator[Listener]:
    """Connect to *url* and LISTEN on *channel*.

    Raises:
        Unavailable: the database cannot be reached.
    """
    loop = running_loop()
    with database_errors():
        conn = await trio_asyncio.aio_as_trio(asyncpg.connect, loop=loop)(
            dsn=url,
            timeout=timeout,
            server_settings=_defaults_unless_in_url(url, {"application_name": application_name}),
        )
    listener = Listener(conn, loop, timeout=timeout)
    try:
        conn.add_termination_listener(listener._on_termination)
        with database_errors():
            await trio_asyncio.aio_as_trio(conn.add_listener, loop=loop)(channel, listener._on_notification)
        yield listener
    finally:
        await listener.aclose()
