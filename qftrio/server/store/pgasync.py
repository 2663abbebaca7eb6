"""asyncpg on Trio: an asyncio loop on a thread of its own.

API is not stable. DO NOT USE outside :mod:`qftrio.server.store.postgres`.

asyncpg is an asyncio library. A :class:`Database` runs its connections on a
:class:`LoopThread`, and a :class:`Listener` on the database's or on its own:
an asyncio event loop (uvloop's where it is installed) on a thread of its own, to which Trio tasks hand
coroutines and from which results come back through Trio's token. A call
costs two wake-ups between the threads; running the loop inside Trio
(trio-asyncio) cost a Trio scheduling round for every step of every asyncpg
coroutine, several times the CPU per call (docs/performance.md).

Each database operation is one asyncio coroutine that takes a connection
from the :class:`ConnectionPool`, optionally opens a transaction, runs an
asyncio-flavoured function ``fn(conn, *args)`` and gives the connection back:
one hop between the two threads per operation, not one per query. ``fn`` runs on the loop's
thread: it must not call Trio, and it shares nothing with Trio tasks but its
arguments and its result.

Failures of the database itself (refused or broken connections, a server
shutting down or starting up, a read-only standby after a failover, a
statement timeout, a connection refused its credentials) become
:class:`~qftrio.errors.Unavailable`, so the HTTP layer answers 503.

Opening a pool is where settings are checked: a URL asyncpg cannot read, or a
password, role or database the server refuses, is a
:class:`~qftrio.errors.ConfigError`; a server that cannot be reached is
:class:`~qftrio.errors.Unavailable`; either says where it connected, never
with the password.

Timeouts: asyncio's timers run on the loop's thread, in real time, whatever
clock Trio runs on (tests run Trio on a virtual clock). ``timeout`` bounds
connecting, waiting for a pooled connection and closing, and with
asyncpg's ``command_timeout`` each query; statements are also bounded on the
server (``statement_timeout``).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import getpass
import logging
import os
import threading
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, TypeVar

import asyncpg
import outcome
import trio

from ... import errors
from ..._backoff import backoff
from ..._json import dumps_strict, loads

__all__ = [
    "ConnectionPool",
    "Database",
    "Listener",
    "LoopThread",
    "Target",
    "open_database",
    "open_listener",
    "open_loop_thread",
    "read_url",
    "translate_error",
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
        database: the database it opens.
    """

    where: str
    user: str
    database: str


#: libpq's ``sslmode`` values, which asyncpg takes.
SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")

#: Where libpq (and asyncpg) looks for a server when no host is given.
_DEFAULT_HOSTS = ["/run/postgresql", "/var/run/postgresql", "/tmp", "/private/tmp", "localhost"]


def read_url(url: str) -> Target:
    """Read *url* as :func:`asyncpg.connect` will, without connecting: the
    rules of libpq's connection URIs (``postgresql://user@host:port,host2/db
    ?host=/socket/dir&port=5433&sslmode=require``), then the ``PGHOST``,
    ``PGPORT`` and ``PGUSER`` environment variables, then the defaults.

    Raises:
        ConfigError: a URL that cannot work (a scheme other than
            ``postgresql``, an unknown ``sslmode``, a port that is not a
            number or out of range, ...). The message never holds the password.
    """
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError as exc:
        raise errors.ConfigError(f"the database URL is not usable: {_redacted(str(exc), url)}") from None
    if parts.scheme not in ("postgresql", "postgres"):
        raise errors.ConfigError(
            f'the database URL is not usable: its scheme must be "postgresql" or "postgres", not {parts.scheme!r}'
        )
    query = {k: v[-1] for k, v in urllib.parse.parse_qs(parts.query, keep_blank_values=True).items()}
    sslmode = query.get("sslmode") or os.environ.get("PGSSLMODE")
    if sslmode is not None and sslmode not in SSL_MODES:
        raise errors.ConfigError(
            f"the database URL is not usable: `sslmode` parameter must be one of: {', '.join(SSL_MODES)}"
        )
    # A password holding @ / ? or # ends the user part early (asyncpg, like
    # libpq, splits at the first @): the rest of it becomes the host, or a
    # port that is not a number.
    hint = "; percent-encode @ / ? # in the password (@ as %40, / as %2F, ? as %3F, # as %23)" if "@" in url else ""
    auth, _, hostspec = parts.netloc.partition("@") if "@" in parts.netloc else ("", "", parts.netloc)
    if "@" in hostspec:
        raise errors.ConfigError(f"the database URL has more than one @ before its host{hint}")
    user = urllib.parse.unquote(auth.partition(":")[0]) or query.get("user") or os.environ.get("PGUSER") or getpass.getuser()
    # The URL's hosts first, then its query's, then PGHOST. A host naming no
    # port takes PGPORT's (or 5432); the query's port serves its hosts only.
    ports = os.environ.get("PGPORT") or "5432"
    if hostspec:
        hosts = [urllib.parse.unquote(h) for h in hostspec.split(",")]
    else:
        hosts = [h for h in (query.get("host") or os.environ.get("PGHOST") or "").split(",") if h] or _DEFAULT_HOSTS
        ports = query.get("port") or ports
    default_ports = ports.split(",")
    if len(default_ports) not in (1, len(hosts)):
        raise errors.ConfigError(
            f"the database URL is not usable: could not match {len(default_ports)} port numbers to {len(hosts)} hosts"
        )
    where = []
    for i, host in enumerate(hosts):
        default_port = default_ports[i if len(default_ports) > 1 else 0]
        if host.startswith("/"):  # a Unix socket's directory
            where.append(host if ".s.PGSQL." in host else f"{host}/.s.PGSQL.{_port(default_port, url, hint)}")
            continue
        if host.startswith("["):  # [IPv6]:port
            address, _, rest = host[1:].partition("]")
            port = rest.removeprefix(":") or default_port
        else:
            address, _, port = host.partition(":")
            port = port or default_port
        number = _port(port, url, hint)
        where.append(f"[{address}]:{number}" if ":" in address else f"{address}:{number}")
    database = urllib.parse.unquote(parts.path.lstrip("/")) or query.get("dbname") or os.environ.get("PGDATABASE") or user
    return Target(where=", ".join(where), user=user, database=database)


def _port(text: str, url: str, hint: str = "") -> int:
    try:
        port = int(text)
    except ValueError:
        message = _redacted(repr(text), url)
        raise errors.ConfigError(f"the database URL has a port that is not a number: {message}{hint}") from None
    if not 0 < port < 65536:
        raise errors.ConfigError(f"the database URL's port {port} is out of range (1 to 65535)")
    return port


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


class LoopThread:
    """An asyncio event loop running on a thread of its own. Open with
    :func:`open_loop_thread`; Trio tasks run coroutines on it with
    :meth:`run`."""

    def __init__(self, loop: asyncio.AbstractEventLoop, token: trio.lowlevel.TrioToken) -> None:
        self._loop = loop
        self._token = token

    async def run(self, fn: Callable[..., Awaitable[T]], *args: Any) -> T:
        """``await fn(*args)`` on the loop; its result or its exception.

        Not interrupted by cancellation: the coroutine runs to its end, and
        then :class:`trio.Cancelled` is raised instead of its result (asyncpg
        cancelled mid-query opens a connection to cancel it with, which is
        not worth having for statements the server bounds anyway).
        """
        task = trio.lowlevel.current_task()
        token = self._token

        def done(future: asyncio.Future[T]) -> None:
            # on the loop's thread
            result = outcome.capture(future.result)
            token.run_sync_soon(trio.lowlevel.reschedule, task, result)

        def start() -> None:
            # on the loop's thread
            asyncio.ensure_future(fn(*args), loop=self._loop).add_done_callback(done)

        self._loop.call_soon_threadsafe(start)
        result: T = await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)
        await trio.lowlevel.checkpoint_if_cancelled()
        return result

    def in_trio(self, fn: Callable[..., Any], *args: Any) -> None:
        """From the loop's thread: run the plain function ``fn(*args)`` in Trio, soon."""
        self._token.run_sync_soon(fn, *args)


def _new_event_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    # the thread's body: run until stopped, then close what is left
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
        leftover = asyncio.all_tasks(loop)
        for task in leftover:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*leftover, return_exceptions=True))
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        loop.close()


#: How long closing waits for the loop's thread to end.
_STOP_SECS = 10.0


@asynccontextmanager
async def open_loop_thread(name: str = "qftrio-asyncio") -> AsyncIterator[LoopThread]:
    """Start an asyncio loop on a thread of its own; stop it, and wait for
    the thread (shielded, at most ten seconds), on the way out."""
    loop = _new_event_loop()
    thread = threading.Thread(target=_run_loop, args=(loop,), name=name, daemon=True)
    thread.start()
    try:
        yield LoopThread(loop, trio.lowlevel.current_trio_token())
    finally:
        with trio.CancelScope(shield=True):
            loop.call_soon_threadsafe(loop.stop)
            # bounded in real time: a virtual clock would not wait at all
            await trio.to_thread.run_sync(thread.join, _STOP_SECS)


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


def _connection_setup(backends: set[int]) -> Callable[[asyncpg.Connection], Awaitable[None]]:
    """Every new pooled connection's set-up: JSON codecs, and the
    connection's backend in *backends* for as long as it is open."""

    async def init(conn: asyncpg.Connection) -> None:
        # on the loop's thread, for every new pooled connection, reconnects included
        await conn.set_type_codec("jsonb", encoder=_dumps, decoder=loads, schema="pg_catalog")
        await conn.set_type_codec("json", encoder=_dumps, decoder=loads, schema="pg_catalog")
        pid = conn.get_server_pid()
        backends.add(pid)
        conn.add_termination_listener(lambda _: backends.discard(pid))

    return init


class ConnectionPool:
    """At most *max_size* asyncpg connections, opened by *connect* when
    needed and kept open between calls; used on the loop's thread only.

    asyncpg's own pool spends more of a store call than its query does
    (docs/performance.md, "One job per call"): every acquire waits inside a
    task of its own (``wait_for``) and every release inside another
    (``shield``), each under a timeout, with a proxy and a future per
    acquire. Here a free connection is taken from a list, and given back to
    it or straight to the oldest waiting caller.

    A connection goes back only in a known state: the call ended, or ended
    with an error PostgreSQL answered (the connection is then idle), and it
    is open and outside a transaction. Anything else (a broken connection, a
    client-side timeout with the query maybe still running, a cancelled
    call) closes it, and the next caller opens another. qftrio's operations
    leave no other session state behind (the listener has a connection of
    its own, and migrations reset their settings and release their lock), so
    nothing is reset between calls.

    Args:
        connect: opens one connection, ready for use; its argument is the
            time left to do so (None: no bound).
        max_size: connections open at once, at most.
    """

    def __init__(self, connect: Callable[[float | None], Awaitable[asyncpg.Connection]], max_size: int) -> None:
        if max_size < 1:
            raise ValueError("a pool holds at least one connection")
        self._connect = connect
        self._max_size = max_size
        self._free: list[asyncpg.Connection] = []  # the last given back on top: its buffers are warm
        self._busy: set[asyncpg.Connection] = set()
        #: Opened or being opened, free or busy.
        self._size = 0
        #: Callers waiting for a connection; each is given one, or None to
        #: open one itself, or the pool's closing.
        self._waiters: collections.deque[asyncio.Future[asyncpg.Connection | None]] = collections.deque()
        self._closing = False
        self._all_back: asyncio.Future[None] | None = None

    @property
    def size(self) -> int:
        """Connections opened or being opened."""
        return self._size

    async def acquire(self, timeout: float | None) -> asyncpg.Connection:
        """A connection for the caller alone, until :meth:`release`.

        Raises:
            TimeoutError: none came free, or a new one could not be opened,
                within *timeout* seconds.
            asyncpg.InterfaceError: the pool is closing.
        """
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            if self._closing:
                raise asyncpg.InterfaceError("the pool is closing")
            while self._free:
                conn = self._free.pop()
                if not conn.is_closed():
                    self._busy.add(conn)
                    return conn
                self._size -= 1  # closed while it was free (the server went away)
            if self._size < self._max_size:
                return await self._open(deadline)
            waiter: asyncio.Future[asyncpg.Connection | None] = loop.create_future()
            self._waiters.append(waiter)
            try:
                async with asyncio.timeout_at(deadline):
                    conn = await waiter
            except BaseException:
                if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
                    handed = waiter.result()  # given just as the wait ended: pass it on
                    if handed is None:
                        self._hand_over(None)
                    else:
                        self._busy.add(handed)
                        self.release(handed, reusable=True)
                else:
                    waiter.cancel()
                raise
            if conn is not None:
                self._busy.add(conn)
                return conn
            # a connection was closed: there is room to open one

    async def _open(self, deadline: float | None) -> asyncpg.Connection:
        self._size += 1
        try:
            left = None if deadline is None else max(0.0, deadline - asyncio.get_running_loop().time())
            conn = await self._connect(left)
        except BaseException:
            self._size -= 1
            self._hand_over(None)  # a waiter may try in its turn
            raise
        if self._closing:
            conn.terminate()
            self._size -= 1
            raise asyncpg.InterfaceError("the pool is closing")
        self._busy.add(conn)
        return conn

    def release(self, conn: asyncpg.Connection, *, reusable: bool) -> None:
        """Give back a connection :meth:`acquire` returned; with *reusable*
        False (or when it is closed or inside a transaction), it is closed."""
        self._busy.discard(conn)
        if not reusable or self._closing or conn.is_closed() or conn.is_in_transaction():
            conn.terminate()
            self._size -= 1
            self._hand_over(None)
        else:
            self._hand_over(conn)
        if self._all_back is not None and not self._busy and not self._all_back.done():
            self._all_back.set_result(None)

    def _hand_over(self, conn: asyncpg.Connection | None) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(conn)
                return
        if conn is not None:
            self._free.append(conn)

    async def close(self, timeout: float | None) -> None:
        """Refuse new callers, wait for the connections in use to come back
        and close every connection; past *timeout* seconds, cut those left."""
        self._closing = True
        for waiter in self._waiters:
            if not waiter.done():
                waiter.set_exception(asyncpg.InterfaceError("the pool is closing"))
        self._waiters.clear()
        free, self._free = self._free, []
        self._size -= len(free)
        try:
            async with asyncio.timeout(timeout):
                if self._busy:
                    self._all_back = asyncio.get_running_loop().create_future()
                    await self._all_back
                await asyncio.gather(*(conn.close() for conn in free))
        except Exception as exc:  # closing a broken pool is not worth a traceback
            log.debug("closing the pool: %r", exc)
        for conn in [*free, *self._busy]:
            if not conn.is_closed():
                conn.terminate()


def _connector(
    url: str, command_timeout: float | None, settings: dict[str, str], backends: set[int]
) -> Callable[[float | None], Awaitable[asyncpg.Connection]]:
    """How the pool opens a connection: *url*, each query bounded by
    *command_timeout*, with *settings*, set up by :func:`_connection_setup`."""
    setup = _connection_setup(backends)

    async def connect(timeout: float | None) -> asyncpg.Connection:
        # on the loop's thread
        conn = await asyncpg.connect(
            dsn=url, timeout=timeout, command_timeout=command_timeout, server_settings=settings
        )
        try:
            await setup(conn)
        except BaseException:
            conn.terminate()
            raise
        return conn

    return connect


async def _run_on_pool(
    pool: ConnectionPool,
    acquire_timeout: float | None,
    transaction: bool,
    fn: Callable[..., Awaitable[T]],
    args: tuple[Any, ...],
) -> T:
    # on the loop's thread
    conn = await pool.acquire(acquire_timeout)
    reusable = False
    try:
        if transaction:
            async with conn.transaction():
                result = await fn(conn, *args)
        else:
            result = await fn(conn, *args)
        reusable = True
        return result
    except (asyncpg.PostgresError, errors.QftrioError):
        # PostgreSQL's own answer, or qftrio's refusal between statements:
        # the connection waits for its next statement
        reusable = True
        raise
    finally:
        pool.release(conn, reusable=reusable)


async def _connect_once(pool: ConnectionPool, timeout: float | None) -> None:
    # on the loop's thread
    pool.release(await pool.acquire(timeout), reusable=True)


class Database:
    """A pool of asyncpg connections used from Trio. Open with
    :func:`open_database`."""

    def __init__(self, pool: ConnectionPool, loop: LoopThread, backends: set[int], *, timeout: float | None) -> None:
        self._pool = pool
        self._loop = loop
        self._timeout = timeout
        self._closed = False
        #: The server process ids of the pool's open connections.
        self.backends: Collection[int] = backends

    @property
    def loop(self) -> LoopThread:
        """The loop thread the pool runs on."""
        return self._loop

    async def run(self, fn: Callable[..., Awaitable[T]], *args: Any, transaction: bool = True) -> T:
        """Run the asyncio-flavoured ``fn(conn, *args)`` on a pooled connection,
        inside a transaction unless *transaction* is False.

        ``fn`` must not call Trio. A deadlock or serialization failure runs it
        again (up to three tries); database failures raise
        :class:`~qftrio.errors.Unavailable`.

        Cancellation waits for the operation to finish (see
        :meth:`LoopThread.run`): a transaction that started commits or rolls
        back as it would have, and the caller sees :class:`trio.Cancelled`
        afterwards (or the operation's error, if it failed). The wait is
        bounded by ``statement_timeout`` on the server and, with a client
        timeout set, by asyncpg's ``command_timeout``.
        """
        if self._closed:
            raise errors.Unavailable("the database pool is closed")
        call = (_run_on_pool, self._pool, self._timeout, transaction, fn, args)
        with database_errors():
            try:
                # uninterrupted by cancellation as it is (LoopThread.run): no
                # cancel scope for a call that ends at its first try
                return await self._loop.run(*call)
            except _RETRY as exc:
                conflict = exc
            # The tries again, and the waits before them, are shielded alike.
            try:
                with trio.CancelScope(shield=True):
                    return await self._run_again(call, conflict)
            finally:
                # deliver a cancellation that arrived meanwhile (no-op otherwise)
                await trio.lowlevel.checkpoint_if_cancelled()

    async def _run_again(self, call: tuple[Any, ...], conflict: BaseException) -> Any:
        for attempt in range(1, _RETRIES):
            log.info("transaction conflict (%s); running it again", type(conflict).__name__)
            await trio.sleep(backoff(attempt, base=0.02, cap=0.1))  # 10-20 ms, then 20-40 ms
            try:
                return await self._loop.run(*call)
            except _RETRY as exc:
                conflict = exc
        raise errors.Unavailable("the database is too busy (transaction conflicts)") from conflict

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
        with trio.CancelScope(shield=True):
            await self._loop.run(self._pool.close, self._timeout)


@asynccontextmanager
async def open_database(
    url: str,
    *,
    max_size: int = 10,
    timeout: float | None = 10.0,
    statement_timeout: float | None = 30.0,
    application_name: str = "qftrio",
) -> AsyncIterator[Database]:
    """Open a connection pool on *url*.

    Args:
        url: ``postgresql://user:password@host:port/database``, or anything
            asyncpg's ``dsn`` accepts.
        max_size: connections open at once, at most (opened when needed,
            then kept).
        timeout: client-side bound, in seconds of Trio's clock, on connecting,
            on waiting for a free pooled connection, and on closing; None
            disables it (tests running on a virtual clock must).
        statement_timeout: server-side bound on each statement.

    Raises:
        ConfigError: asyncpg cannot read *url*, or the server refuses its
            password, role or database.
        Unavailable: the database cannot be reached.
    """
    target = read_url(url)
    # Client-side bound on each query: past the server's own, so that it only
    # fires when the server cannot answer at all (a dead network path).
    command_timeout = None if timeout is None else (statement_timeout or 30.0) + timeout
    # No JIT: a claim is one short statement whose plan PostgreSQL may cost
    # high (a walk per tenant with a limit it cannot know), and compiling it
    # would take seconds for a millisecond's work.
    settings = _defaults_unless_in_url(
        url,
        {"application_name": application_name, "jit": "off"}
        if statement_timeout is None
        else {
            "application_name": application_name,
            "jit": "off",
            "statement_timeout": str(int(statement_timeout * 1000)),
            "idle_in_transaction_session_timeout": str(int(statement_timeout * 2000)),
        },
    )
    backends: set[int] = set()
    pool = ConnectionPool(_connector(url, command_timeout, settings, backends), max_size)
    async with open_loop_thread("qftrio-postgres") as loop:
        db = Database(pool, loop, backends, timeout=timeout)
        try:
            # a first connection now, so that settings the server refuses are
            # told at once, and as such; the pool keeps it for the first caller
            with _connect_errors(target, url):
                await loop.run(_connect_once, pool, timeout)
            yield db
        finally:
            await db.aclose()


class Listener:
    """A dedicated connection that LISTENs on one channel while told to.
    Open with :func:`open_listener`; :meth:`listen` and :meth:`unlisten`
    subscribe and unsubscribe.

    asyncpg calls back on the loop's thread; the callbacks hand what they
    got to Trio, where it is kept until :meth:`receive`. Notifications sent
    by the backends in *ignore* are dropped there, without waking Trio.
    """

    #: More distinct payloads than this between two receives collapse to "*".
    MAX_PENDING = 1000

    def __init__(
        self,
        conn: asyncpg.Connection,
        loop: LoopThread,
        channel: str,
        *,
        timeout: float | None,
        ignore: Collection[int] = (),
    ) -> None:
        self._conn = conn
        self._loop = loop
        self._channel = channel
        self._timeout = timeout
        self._ignore = ignore
        self._pending: set[str] = set()
        self._lost = False
        self._poked = False
        self._wakeup = trio.Event()
        #: Whether the connection LISTENs on the channel now.
        self.listening = False

    @property
    def backend_pid(self) -> int:
        return self._conn.get_server_pid()

    # asyncpg's callbacks, on the loop's thread ---------------------------------

    def _on_notification(self, conn: Any, pid: int, channel: str, payload: str) -> None:
        if pid not in self._ignore:
            self._loop.in_trio(self._notified, payload)

    def _on_termination(self, conn: Any) -> None:
        self._loop.in_trio(self._terminated)

    # trio side ----------------------------------------------------------------

    def _notified(self, payload: str) -> None:
        if len(self._pending) >= self.MAX_PENDING:
            self._pending = {"*"}
        else:
            self._pending.add(payload)
        self._wakeup.set()

    def _terminated(self) -> None:
        self._lost = True
        self._wakeup.set()

    def poke(self) -> None:
        """Make a :meth:`receive` waiting now (or the next one) return, with
        whatever it has, perhaps nothing."""
        self._poked = True
        self._wakeup.set()

    async def listen(self) -> None:
        """LISTEN on the channel; notifications committed from now on arrive.

        Raises:
            Unavailable: the connection is lost.
        """
        with database_errors():
            await self._loop.run(self._conn.add_listener, self._channel, self._on_notification)
        self.listening = True

    async def unlisten(self) -> None:
        """Stop listening (UNLISTEN); the database no longer wakes this
        connection's backend for each notification.

        Raises:
            Unavailable: the connection is lost.
        """
        self.listening = False
        with database_errors():
            await self._loop.run(self._conn.remove_listener, self._channel, self._on_notification)

    async def receive(self, *, keepalive_secs: float = 30.0) -> set[str]:
        """Wait for notifications, or a :meth:`poke`, and return the
        notifications' payloads (deduplicated).

        Every *keepalive_secs* without any, the connection is checked with a
        query, so that a silently dead connection is noticed.

        Raises:
            Unavailable: the connection is lost.
        """
        while not (self._pending or self._poked):
            if self._lost or self._conn.is_closed():
                raise errors.Unavailable("the LISTEN connection was lost")
            self._wakeup = trio.Event()
            with trio.move_on_after(keepalive_secs):
                await self._wakeup.wait()
                continue
            await self._ping()
        self._poked = False
        pending, self._pending = self._pending, set()
        return pending

    async def _ping(self) -> None:
        with database_errors():
            await self._loop.run(_ping, self._conn, self._timeout)

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            await self._loop.run(_close_connection, self._conn, self._timeout)


async def _close_connection(conn: asyncpg.Connection, timeout: float | None) -> None:
    # on the loop's thread
    if conn.is_closed():
        return
    try:
        await conn.close(timeout=timeout)
    except Exception as exc:
        log.debug("closing the LISTEN connection: %r", exc)
    if not conn.is_closed():
        conn.terminate()


@asynccontextmanager
async def open_listener(
    url: str,
    channel: str,
    *,
    loop: LoopThread,
    timeout: float | None = 10.0,
    application_name: str = "qftrio-listener",
    ignore: Collection[int] = (),
) -> AsyncIterator[Listener]:
    """Connect to *url* for LISTENing on *channel* (not yet listening: see
    :meth:`Listener.listen`), ignoring what the backends *ignore* (a live
    collection of process ids, such as :attr:`Database.backends`) send.

    The connection runs on *loop*, a database's (:attr:`Database.loop`): the
    notifications its own statements send (one per enqueue) are dropped by
    the thread that is awake for the statement's answer anyway, rather than
    by a third thread woken for each (docs/performance.md, "One job per
    call"). The listener is closed before the database: its calls cannot end
    once that loop has stopped.

    Raises:
        Unavailable: the database cannot be reached.
    """
    settings = _defaults_unless_in_url(url, {"application_name": application_name})
    with database_errors():
        conn = await loop.run(_connect, url, timeout, settings)
    listener = Listener(conn, loop, channel, timeout=timeout, ignore=ignore)
    try:
        await loop.run(_watch, conn, listener)
        yield listener
    finally:
        await listener.aclose()


async def _watch(conn: asyncpg.Connection, listener: Listener) -> None:
    # on the loop's thread, where asyncpg calls its termination listeners
    conn.add_termination_listener(listener._on_termination)


async def _ping(conn: asyncpg.Connection, timeout: float | None) -> None:
    # on the loop's thread
    await conn.fetchval("SELECT 1", timeout=timeout)


async def _connect(url: str, timeout: float | None, settings: dict[str, str]) -> asyncpg.Connection:
    # on the loop's thread
    return await asyncpg.connect(dsn=url, timeout=timeout, server_settings=settings)
