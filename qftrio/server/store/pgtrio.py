"""PostgreSQL from Trio: libpq's non-blocking calls, waited on by Trio itself.

API is not stable. DO NOT USE outside :mod:`qftrio.server.store.postgres`.

A :class:`Connection` is one libpq connection (psycopg 3's ``PGconn``)
driven by psycopg's non-blocking generators (``psycopg.generators``), whose
waits for the socket are Trio's own (``trio.lowlevel.wait_readable`` and
``wait_writable``): no thread, no other event loop, no hop between them.
Parameters and results go through psycopg's adapters (a ``Transformer`` over
:data:`ADAPTERS`), JSON through orjson. A statement with parameters is
prepared once per connection, named, and its parameters are written as the
types PostgreSQL says it takes (``$1`` placeholders, as written). A statement
without parameters goes as a simple query (migrations are scripts of many).

Each database operation takes a connection from the :class:`ConnectionPool`,
optionally opens a transaction, runs ``fn(conn, *args)`` (a Trio coroutine
function) and gives the connection back.

Failures of the database itself (refused or broken connections, a server
shutting down or starting up, a read-only standby after a failover, a
statement timeout, a connection refused its credentials) become
:class:`~qftrio.errors.Unavailable`, so the HTTP layer answers 503; they are
told apart by SQLSTATE class (08, 57, 53, 25006, 40 after the store's
retries, 55P03, 28, 3D000).

Opening a pool is where settings are checked: a URL libpq cannot read, or a
password, role or database the server refuses, is a
:class:`~qftrio.errors.ConfigError`; a server that cannot be reached is
:class:`~qftrio.errors.Unavailable`; either says where it connected, never
with the password. libpq keeps no SQLSTATE for a failed connection: which
refusal it was is read from the server's words (:data:`_REFUSALS`).

Timeouts are real time, whatever clock Trio runs on: tests run Trio on a
virtual clock that jumps ahead whenever every task waits, a socket included,
so a Trio deadline around a database wait would fire at once there. A
:class:`Watchdog` thread looks every tenth of a second at the deadlines of
the waits under way (connecting, each statement, waiting for a pooled
connection, closing) and ends the ones past theirs through Trio's token:
a connection's socket is closed under its waiting task (``notify_closing``),
which sees ``TimeoutError``. ``timeout`` bounds connecting, waiting for a
pooled connection and closing; each statement is bounded by the server's
``statement_timeout`` and, past it by ``timeout``, by the watchdog (a dead
network path, a server that stopped answering).

Cancellation: a task cancelled while its statement is in flight waits,
shielded, for the statement's answer (bounded as every statement is), then
raises :class:`trio.Cancelled`; a transaction it was in is rolled back. The
connection goes back to the pool idle, or closed when that failed: never
with a statement in flight.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import getpass
import logging
import os
import re
import threading
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterable, Iterator, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any, TypeVar

import psycopg
import psycopg.errors
import trio
from psycopg import generators, pq
from psycopg.pq import PGnotify
from psycopg.pq.abc import PGconn, PGresult
from psycopg.adapt import AdaptersMap, Dumper, Transformer
from psycopg._conninfo_attempts import conninfo_attempts  # psycopg is pinned: a private module is safe
from psycopg.conninfo import make_conninfo
from psycopg.types.json import set_json_dumps, set_json_loads
from psycopg.types.string import TextLoader
from psycopg.waiting import Ready, Wait

from ... import errors
from ..._backoff import backoff
from ..._json import dumps_strict, loads

__all__ = [
    "ADAPTERS",
    "Connection",
    "ConnectionPool",
    "Database",
    "Listener",
    "DictRow",
    "Record",
    "TupleRow",
    "Target",
    "Watchdog",
    "connect",
    "database_errors",
    "open_database",
    "open_listener",
    "open_watchdog",
    "read_url",
    "translate_error",
]

log = logging.getLogger("qftrio.store.postgres")

T = TypeVar("T")

_OK = pq.ConnStatus.OK
_BAD = pq.ConnStatus.BAD
_WAIT_W = Wait.W
_READY_R = Ready.R
_READY_W = Ready.W
_TEXT = pq.Format.TEXT
_TUPLES_OK = pq.ExecStatus.TUPLES_OK
_COMMAND_OK = pq.ExecStatus.COMMAND_OK
_FATAL_ERROR = pq.ExecStatus.FATAL_ERROR
_IDLE = pq.TransactionStatus.IDLE

# -- errors --------------------------------------------------------------------------------

# SQLSTATEs (classes of two characters, or whole codes) that mean "the
# database cannot serve us right now", not "the request is wrong".
_UNAVAILABLE_STATES = (
    "08",  # connection exceptions
    "57",  # operator intervention: shutdown, starting up, statement timeout
    "53",  # insufficient resources: too many connections, disk full
    "25006",  # read-only transaction: a standby after a failover
    "40",  # deadlock or serialization failure, after the retries
    "55P03",  # lock_timeout
    # a new pooled connection refused (a password rotated, a role or
    # database dropped) while the server runs
    "28",
    "3D000",
)

# Transient conflicts between transactions: safe to run the whole transaction again.
_RETRY: tuple[type[BaseException], ...] = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)
_RETRIES = 3


class ConnectionLost(psycopg.OperationalError):
    """The connection broke, or was closed under a wait (no answer in time,
    or the pool closing)."""


def _sqlstate(exc: BaseException) -> str | None:
    return getattr(exc, "sqlstate", None)


def translate_error(exc: BaseException) -> errors.ApiError | None:
    """The qftrio error for an exception raised talking to PostgreSQL, or
    None when it is not a database failure (a bug, or an error of qftrio's own)."""
    if isinstance(exc, errors.QftrioError):
        return None
    state = _sqlstate(exc) or ""
    if isinstance(exc, psycopg.DataError) and (state.startswith("22") or not state):
        # class 22, e.g. "\u0000" in a JSON string, which jsonb cannot store,
        # or a value no parameter of its type can hold
        return errors.InvalidInput(f"a value cannot be stored: {_first_line(exc)}", code="unstorable")
    if state.startswith(_UNAVAILABLE_STATES) or (
        not state and isinstance(exc, (OSError, psycopg.OperationalError, psycopg.InterfaceError))
    ):
        if isinstance(exc, psycopg.InterfaceError):
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


# -- URLs ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Target:
    """Where a database URL connects, as libpq reads it.

    Attributes:
        where: ``host:port`` (or a socket path) of each host, comma-separated.
        user: the role it logs in as.
        database: the database it opens.
    """

    where: str
    user: str
    database: str


#: libpq's ``sslmode`` values.
SSL_MODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")

#: Where qftrio tells a server was looked for when no host is given.
_DEFAULT_HOSTS = ["/run/postgresql", "/var/run/postgresql", "/tmp", "/private/tmp", "localhost"]


def read_url(url: str) -> Target:
    """Read *url* as libpq will connect with it, without connecting: the
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
    # A password holding @ / ? or # ends the user part early (libpq splits at
    # the first @): the rest of it becomes the host, or a port that is not a number.
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


@functools.cache
def _libpq_keywords() -> frozenset[str]:
    return frozenset(option.keyword.decode() for option in pq.Conninfo.get_defaults())


def _conninfo(url: str, settings: dict[str, str]) -> str:
    """libpq's connection string for *url*, with the server *settings* the URL
    does not set itself. As with asyncpg before, a URL's query parameters
    that libpq does not know (``?search_path=qftrio&statement_timeout=60000``)
    are server settings.

    Raises:
        ConfigError: libpq cannot read *url*.
    """
    given: dict[str, str] = {}
    if "://" in url:
        parts = urllib.parse.urlsplit(url)
        pairs = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
        given = {k: v for k, v in pairs if k not in _libpq_keywords()}
        url = parts._replace(query=urllib.parse.urlencode([(k, v) for k, v in pairs if k not in given])).geturl()
    params: dict[str, Any] = {"client_encoding": "UTF8"}
    server = {k: v for k, v in settings.items() if k not in given} | given
    if "application_name" in server:
        name = server.pop("application_name")
        if "application_name=" not in url:
            params["application_name"] = name
    try:
        existing = psycopg.conninfo.conninfo_to_dict(url).get("options") or ""
        options = " ".join(f"-c {k}={_escaped(v)}" for k, v in server.items())
        if options:
            params["options"] = f"{existing} {options}".strip()
        return make_conninfo(url, **params)
    except psycopg.ProgrammingError as exc:
        raise errors.ConfigError(f"the database URL is not usable: {_redacted(_first_line(exc), url)}") from None


def _escaped(value: str) -> str:
    # libpq's options: spaces and backslashes escaped with a backslash
    return value.replace("\\", "\\\\").replace(" ", "\\ ")


class ClientConfigurationError(psycopg.OperationalError):
    """libpq itself refused to connect with these settings (no password
    given where one is asked, SSL required one way or the other)."""


# A server's refusal of these settings, as libpq words it when connecting
# (it keeps no SQLSTATE for a connection's failure): the SQLSTATE the server
# sent, for the error of that class to be raised.
_REFUSALS: list[tuple[re.Pattern[str], str | None]] = [
    (re.compile(r"password authentication failed"), "28P01"),
    (re.compile(r"role \S+ does not exist|is not permitted to log in|pg_hba\.conf|authentication failed"), "28000"),
    (re.compile(r"database \S+ does not exist"), "3D000"),
    (re.compile(r"permission denied for database"), "42501"),
    (re.compile(r"no password supplied|SSL was required|does not support SSL"), None),
]

# What the server answers when it refuses these settings: a wrong password
# (28P01, a subclass of 28000), an unknown or NOLOGIN role or no pg_hba.conf
# entry (28000), an unknown database (3D000), no CONNECT privilege (42501).
_REFUSED: tuple[type[BaseException], ...] = (
    psycopg.errors.InvalidAuthorizationSpecification,
    psycopg.errors.InvalidPassword,
    psycopg.errors.InvalidCatalogName,
    psycopg.errors.InsufficientPrivilege,
    ClientConfigurationError,
)


def _connect_failure(pgconn: PGconn) -> psycopg.Error:
    """Why *pgconn* could not connect, as an error of the SQLSTATE the
    server answered (a refusal), or an OperationalError (no server to talk to)."""
    text = pgconn.get_error_message("utf-8").strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    reason = lines[0] if lines else "connection failed"
    # 'connection to server at "h", port 5432 failed: FATAL:  password ...'
    reason = reason.rpartition(" failed: ")[2] if " failed: " in reason else reason
    reason = re.sub(r"^(FATAL|ERROR):\s+", "", reason)
    if reason[:1].isupper() and reason[1:2].islower():
        reason = reason[0].lower() + reason[1:]
    for pattern, state in _REFUSALS:
        if pattern.search(text):
            return ClientConfigurationError(reason) if state is None else psycopg.errors.lookup(state)(reason)
    return psycopg.OperationalError(reason)


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
        except (OSError, psycopg.OperationalError) as exc:
            reason = "timed out" if isinstance(exc, TimeoutError) else _first_line(exc)
            message = _redacted(reason, url)
            raise errors.Unavailable(f"cannot connect to PostgreSQL at {target.where}: {message}") from None


# -- real-time deadlines -------------------------------------------------------------------


class _Timed:
    """A wait the :class:`Watchdog` ends at its :attr:`deadline` (a
    ``time.monotonic()`` value, or None while nothing waits)."""

    __slots__ = ("deadline", "_on_expiry")

    def __init__(self, on_expiry: Callable[[], None]) -> None:
        self.deadline: float | None = None
        self._on_expiry = on_expiry

    def _fire(self) -> None:
        # in Trio, soon after the watchdog saw the deadline pass: still due?
        deadline = self.deadline
        if deadline is not None and deadline <= time.monotonic():
            self.deadline = None
            self._on_expiry()


class Watchdog:
    """A thread ending Trio's waits on the database at real-time deadlines.
    Open with :func:`open_watchdog`.

    Trio's clock may be virtual (tests); the database's answers take real
    time. What is watched is a :class:`_Timed` per connection (its current
    statement) or per wait; setting its deadline is an attribute write, so a
    statement pays no more than two reads of the clock for its bound.
    """

    #: How often the thread looks, in seconds: a deadline fires this late at most.
    TICK = 0.1

    def __init__(self, token: trio.lowlevel.TrioToken) -> None:
        self._token = token
        self._watched: set[_Timed] = set()
        self._stop = threading.Event()

    def watch(self, on_expiry: Callable[[], None]) -> _Timed:
        timed = _Timed(on_expiry)
        self._watched.add(timed)
        return timed

    def unwatch(self, timed: _Timed) -> None:
        timed.deadline = None
        self._watched.discard(timed)

    @contextmanager
    def bound(self, seconds: float | None, on_expiry: Callable[[], None]) -> Iterator[None]:
        """Call *on_expiry* in Trio should the block last more than *seconds* (None: no bound)."""
        if seconds is None:
            yield
            return
        timed = self.watch(on_expiry)
        timed.deadline = time.monotonic() + seconds
        try:
            yield
        finally:
            self.unwatch(timed)

    def _run(self) -> None:
        # the thread's body
        while not self._stop.wait(self.TICK):
            now = time.monotonic()
            for timed in list(self._watched):
                deadline = timed.deadline
                if deadline is not None and deadline <= now:
                    try:
                        self._token.run_sync_soon(timed._fire)
                    except trio.RunFinishedError:
                        return


@asynccontextmanager
async def open_watchdog() -> AsyncIterator[Watchdog]:
    """Start a :class:`Watchdog`'s thread; stop it, and wait for it, on the way out."""
    watchdog = Watchdog(trio.lowlevel.current_trio_token())
    thread = threading.Thread(target=watchdog._run, name="qftrio-postgres-watchdog", daemon=True)
    thread.start()
    try:
        yield watchdog
    finally:
        watchdog._stop.set()
        with trio.CancelScope(shield=True):
            # it wakes within a tick; bounded in real time all the same
            await trio.to_thread.run_sync(thread.join, 10.0)


# -- adapting values ------------------------------------------------------------------------


class _UUIDDumper(Dumper):
    """A ``uuid`` parameter from the string qftrio holds (or a UUID): the
    text PostgreSQL reads either way, no UUID object built."""

    oid = psycopg.postgres.types["uuid"].oid

    def dump(self, obj: Any) -> bytes:
        return str(obj).encode()


class _IntDumper(Dumper):
    """An integer parameter from any number, truncated as asyncpg did
    (``int(value)``): statements compare integer columns with the float
    times qftrio passes."""

    def dump(self, obj: Any) -> bytes:
        return b"%d" % int(obj)


def _int_dumper(name: str) -> type[Dumper]:
    return type(f"_{name.capitalize()}Dumper", (_IntDumper,), {"oid": psycopg.postgres.types[name].oid})


class _ArrayDumper(Dumper):
    """A one-dimensional array parameter, each element written by its type's
    dumper and quoted. psycopg's own list dumper (Python, for nested lists
    too, choosing the quoting of each element) cost a report batch's
    arrays of ids, tokens and results a tenth of the server's time."""

    element_oid = 0

    def __init__(self, cls: type, context: Any = None) -> None:
        super().__init__(cls, context)
        self._element = ADAPTERS.get_dumper_by_oid(self.element_oid, _TEXT)(object, context)

    def dump(self, obj: Any) -> bytes:
        dump = self._element.dump
        return b"{%s}" % b",".join(b"NULL" if x is None else _quoted(dump(x)) for x in obj)


def _quoted(element: Any) -> bytes:
    # an array element in double quotes, its backslashes and quotes escaped
    return b'"%s"' % bytes(element).replace(b"\\", b"\\\\").replace(b'"', b'\\"')


def _array_dumper(name: str) -> type[Dumper]:
    array = psycopg.postgres.types[name]
    return type(
        f"_{name.capitalize()}ArrayDumper", (_ArrayDumper,), {"oid": array.array_oid, "element_oid": array.oid}
    )


def _json_dumps(value: Any) -> bytes:
    # Strict: PostgreSQL's jsonb has no NaN; the ValueError becomes a DataError, so a 422.
    return dumps_strict(value)


#: psycopg's adapters, with orjson for JSON, ``uuid`` as strings, and arrays
#: written at the cost of their elements.
ADAPTERS = AdaptersMap(psycopg.postgres.adapters)
ADAPTERS.register_dumper(None, _UUIDDumper)
for _name in ("int2", "int4", "int8"):
    ADAPTERS.register_dumper(None, _int_dumper(_name))
set_json_dumps(_json_dumps, ADAPTERS)
set_json_loads(loads, ADAPTERS)
for _name in ("uuid", "text", "float8", "int4", "int8", "jsonb"):
    ADAPTERS.register_dumper(None, _array_dumper(_name))
# ids are read as the strings qftrio passes around: PostgreSQL writes a uuid
# as str(uuid.UUID(...)) would, without an object built and formatted per row
ADAPTERS.register_loader("uuid", TextLoader)


class _Context:
    """What a psycopg ``Transformer`` reads its adapters from."""

    adapters = ADAPTERS
    connection = None


class TupleRow(tuple[Any, ...]):
    """A row of a few columns: a tuple whose values are also read by column
    name (``row["id"]``), through a Python call each."""

    __slots__ = ()
    _index: dict[str, int] = {}

    def __getitem__(self, key: Any) -> Any:  # type: ignore[override]
        if isinstance(key, str):
            return tuple.__getitem__(self, self._index[key])
        return tuple.__getitem__(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        i = self._index.get(key)
        return default if i is None else tuple.__getitem__(self, i)

    def keys(self) -> Iterable[str]:
        return self._index.keys()

    def items(self) -> Iterable[tuple[str, Any]]:
        return zip(self._index, self)


class DictRow(dict[Any, Any]):
    """A row of many columns (a job's): its values by column name, read
    with no Python call (a job's two dozen reads cost 1 µs, not 20), and by
    position and in order too, as a tuple's."""

    __slots__ = ("_values",)
    _values: Sequence[Any]

    def __missing__(self, key: Any) -> Any:
        if key.__class__ is int:
            return self._values[key]
        raise KeyError(key)

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        return iter(self._values)


#: A row as :class:`Connection` returns it: ``row["name"]``, ``row[0]``,
#: ``tuple(row)``, ``dict(row)``.
Record = TupleRow | DictRow

#: Rows of more columns than this are :class:`DictRow`: read by name.
_NARROW = 3


@functools.lru_cache(maxsize=512)
def _row_maker(names: tuple[str, ...]) -> Callable[[Sequence[Any]], Record]:
    """How a row of columns *names* is made from its values."""
    if len(names) <= _NARROW:
        return type("TupleRow", (TupleRow,), {"__slots__": (), "_index": {n: i for i, n in enumerate(names)}})

    def make(values: Sequence[Any]) -> DictRow:
        row = DictRow(zip(names, values))
        row._values = values
        return row

    return make


def _status_error(result: PGresult) -> psycopg.Error:
    return psycopg.errors.error_from_result(result, encoding="utf-8")


def _dumper(oid: int, tx: Any) -> Any:
    """psycopg's dumper of values to the type *oid*, in text."""
    return ADAPTERS.get_dumper_by_oid(oid, _TEXT)(object, tx)


# -- connections ---------------------------------------------------------------------------------

#: Statements prepared per connection, at most; more are run unnamed.
_PREPARED_MAX = 500


@dataclasses.dataclass(slots=True)
class _Statement:
    name: bytes
    dumpers: list[Any]


class Connection:
    """One libpq connection driven from Trio. Open with :func:`connect`.

    One task at a time uses it (the pool sees to it).
    """

    def __init__(self, pgconn: PGconn, watchdog: Watchdog, command_timeout: float | None) -> None:
        self._pgconn = pgconn
        self._fileno = pgconn.socket
        self._watchdog = watchdog
        self._command_timeout = command_timeout
        self._timed = watchdog.watch(self._time_out)
        self._timed_out = False
        self._closed = False
        self._statements: dict[str, _Statement] = {}
        self._prepared = 0
        self._tx = Transformer(_Context())  # type: ignore[arg-type]
        self._pid = pgconn.backend_pid
        #: Called once, when the connection is closed.
        self.on_close: Callable[[], None] | None = None
        self._depth = 0  # open transaction blocks (savepoints beyond the first)

    # -- state ------------------------------------------------------------------------

    def get_server_pid(self) -> int:
        return self._pid

    def is_closed(self) -> bool:
        return self._closed or self._pgconn.status == _BAD

    def is_in_transaction(self) -> bool:
        return not self.is_closed() and self._pgconn.transaction_status != _IDLE

    def terminate(self) -> None:
        """Close the connection now (tasks waiting on it see it closed)."""
        if self._closed:
            return
        self._closed = True
        self._watchdog.unwatch(self._timed)
        trio.lowlevel.notify_closing(self._fileno)
        self._pgconn.finish()
        if self.on_close is not None:
            self.on_close()

    def _time_out(self) -> None:
        self._timed_out = True
        self.terminate()

    # -- driving libpq ------------------------------------------------------------------

    async def _wait(self, gen: Any) -> Any:
        """Run one of psycopg's non-blocking generators on this connection's
        socket.

        Cancelled, it runs the generator to its end all the same, shielded
        (bounded by the statement's deadline), so that the connection is
        left idle, then raises :class:`trio.Cancelled`: a statement in
        flight finishes as it would have. Whatever else interrupts it (a
        broken connection, the watchdog) leaves the connection closed."""
        try:
            return await self._pump(gen)
        except trio.Cancelled:
            with trio.CancelScope(shield=True):
                try:
                    await self._pump(gen)
                except BaseException:
                    self.terminate()
            raise
        except trio.ClosedResourceError:
            if self._timed_out:
                raise TimeoutError(f"no answer from PostgreSQL within {self._command_timeout} s") from None
            raise ConnectionLost("the connection was closed") from None
        except BaseException:
            self.terminate()
            raise

    async def _pump(self, gen: Any) -> Any:
        """Wait for the socket as *gen* asks, until it returns. It is started
        (or, interrupted in a wait, asked again what it waits for) by
        sending None."""
        fileno = self._fileno
        try:
            state = gen.send(None)
            while True:
                if state & _WAIT_W:
                    await trio.lowlevel.wait_writable(fileno)
                    state = gen.send(_READY_W)
                else:
                    await trio.lowlevel.wait_readable(fileno)
                    state = gen.send(_READY_R)
        except StopIteration as done:
            return done.value

    async def _results(self) -> list[PGresult]:
        if self._closed:
            raise ConnectionLost("the connection is closed")
        timed = self._timed
        if self._command_timeout is not None:
            timed.deadline = time.monotonic() + self._command_timeout
        try:
            results: list[PGresult] = await self._wait(generators.execute(self._pgconn))
        finally:
            timed.deadline = None
        for result in results:
            if result.status not in (_TUPLES_OK, _COMMAND_OK):
                raise _status_error(result)
        return results

    @property
    def on_notify(self) -> Callable[[PGnotify], None] | None:
        """Called with each notification this connection receives (LISTEN),
        whether a statement's answer or :meth:`take_notifies` reads it:
        psycopg's generators hand what they read to it, or drop it."""
        return self._pgconn.notify_handler

    @on_notify.setter
    def on_notify(self, handler: Callable[[PGnotify], None] | None) -> None:
        self._pgconn.notify_handler = handler

    def take_notifies(self) -> None:
        """Hand the notifications libpq has read to :attr:`on_notify`."""
        pgconn = self._pgconn
        handler = pgconn.notify_handler
        while (n := pgconn.notifies()) is not None:
            if handler is not None:
                handler(n)

    async def _statement(self, query: str) -> _Statement:
        statement = self._statements.get(query)
        if statement is not None:
            return statement
        # a fresh name each time: one prepared before a cancellation cut
        # its description short exists on the server, unknown here
        self._prepared += 1
        name = f"q{self._prepared}".encode() if self._prepared <= _PREPARED_MAX else b""
        encoded = query.encode()
        self._pgconn.send_prepare(name, encoded)
        await self._results()
        self._pgconn.send_describe_prepared(name)
        (described,) = await self._results()
        dumpers = [_dumper(described.param_type(i), self._tx) for i in range(described.nparams)]
        statement = _Statement(name, dumpers)
        if name:
            self._statements[query] = statement
        return statement

    async def _query(self, query: str, args: Sequence[Any]) -> PGresult:
        """Run *query*: with *args*, as a prepared statement; without, as a
        simple query (several statements allowed). The last result."""
        if not args:
            self._pgconn.send_query(query.encode())
            return (await self._results())[-1]
        statement = await self._statement(query)
        self._pgconn.send_query_prepared(statement.name, self._dumped(statement, args))
        (result,) = await self._results()
        return result

    @staticmethod
    def _dumped(statement: _Statement, args: Sequence[Any]) -> list[bytes | None]:
        dumpers = statement.dumpers
        if len(dumpers) != len(args):
            raise psycopg.ProgrammingError(f"the statement takes {len(dumpers)} parameters, not {len(args)}")
        try:
            return [None if a is None else d.dump(a) for d, a in zip(dumpers, args)]
        except (TypeError, ValueError) as exc:
            raise psycopg.DataError(f"invalid input for a parameter: {exc}") from None

    def _rows(self, result: PGresult) -> list[Record]:
        if not result.ntuples:
            return []
        names = tuple(result.fname(i).decode() for i in range(result.nfields))  # type: ignore[union-attr]
        tx = self._tx
        tx.set_pgresult(result)
        return tx.load_rows(0, result.ntuples, _row_maker(names))

    # -- asyncpg's interface, as the store uses it -------------------------------------------

    async def execute(self, query: str, *args: Any) -> str:
        """Run *query*; its command status (``"UPDATE 3"``)."""
        result = await self._query(query, args)
        return (result.command_status or b"").decode()

    async def executemany(self, query: str, args: Iterable[Sequence[Any]]) -> None:
        """Run *query* once per item of *args*, in one round trip (libpq's
        pipeline mode, as asyncpg did): the first error is raised once all
        have been answered."""
        rows = [list(one) for one in args]
        if len(rows) < 2:
            for one in rows:
                await self._query(query, one)
            return
        statement = await self._statement(query)
        params = [self._dumped(statement, one) for one in rows]
        pgconn = self._pgconn
        timed = self._timed
        if self._command_timeout is not None:
            timed.deadline = time.monotonic() + self._command_timeout
        done = False
        try:
            pgconn.enter_pipeline_mode()
            for one in params:
                pgconn.send_query_prepared(statement.name, one)
            pgconn.pipeline_sync()
            await self._wait(generators.send(pgconn))
            answers = [await self._wait(generators.fetch_many(pgconn)) for _ in range(len(params) + 1)]
            pgconn.exit_pipeline_mode()
            done = True
        finally:
            timed.deadline = None
            if not done:
                self.terminate()  # a pipeline cut short: its state is not worth restoring
        for results in answers[:-1]:
            for result in results:
                if result.status == _FATAL_ERROR:
                    raise _status_error(result)

    async def fetch(self, query: str, *args: Any) -> list[Record]:
        return self._rows(await self._query(query, args))

    async def fetchrow(self, query: str, *args: Any) -> Record | None:
        rows = await self.fetch(query, *args)
        return rows[0] if rows else None

    async def fetchval(self, query: str, *args: Any) -> Any:
        rows = await self.fetch(query, *args)
        return rows[0][0] if rows else None

    def transaction(self, *, isolation: str | None = None, readonly: bool = False) -> Transaction:
        return Transaction(self, isolation=isolation, readonly=readonly)


class Transaction:
    """``async with conn.transaction():`` a transaction (a savepoint inside
    another); committed when the block ends, rolled back when it raises."""

    def __init__(self, conn: Connection, *, isolation: str | None, readonly: bool) -> None:
        self._conn = conn
        begin = "BEGIN"
        if isolation:
            begin += " ISOLATION LEVEL " + isolation.replace("_", " ").upper()
        if readonly:
            begin += " READ ONLY"
        self._begin = begin
        self._savepoint: str | None = None

    async def start(self) -> None:
        conn = self._conn
        if conn._depth:
            self._savepoint = f"qftrio_{conn._depth}"
            await conn.execute(f"SAVEPOINT {self._savepoint}")
        else:
            await conn.execute(self._begin)
        conn._depth += 1

    async def commit(self) -> None:
        self._conn._depth -= 1
        await self._conn.execute("COMMIT" if self._savepoint is None else f"RELEASE SAVEPOINT {self._savepoint}")

    async def rollback(self) -> None:
        self._conn._depth -= 1
        if self._savepoint is None:
            await self._conn.execute("ROLLBACK")
        else:
            await self._conn.execute(f"ROLLBACK TO SAVEPOINT {self._savepoint}")
            await self._conn.execute(f"RELEASE SAVEPOINT {self._savepoint}")

    async def __aenter__(self) -> Transaction:
        await self.start()
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if kind is None:
            await self.commit()
        elif self._conn.is_closed():
            self._conn._depth -= 1  # closing rolled back
        else:
            # shielded for a cancellation's sake (bounded by the statement's deadline)
            with trio.CancelScope(shield=not issubclass(kind, Exception)):
                await self.rollback()


async def connect(
    url: str,
    *,
    watchdog: Watchdog,
    timeout: float | None = None,
    command_timeout: float | None = None,
    settings: dict[str, str] | None = None,
) -> Connection:
    """Open a connection to *url* with the server *settings*, within
    *timeout* seconds of real time; each statement on it bounded by
    *command_timeout* seconds of real time.

    Host names are looked up in a worker thread first (libpq's own lookup
    would block the event loop), then each address is tried in turn, as
    libpq tries a URL's hosts; a server's refusal ends the attempts.

    Raises:
        ConfigError: libpq cannot read *url*.
        psycopg.OperationalError: the connection failed (see :func:`_connect_errors`).
        TimeoutError: it took longer than *timeout*.
    """
    conninfo = _conninfo(url, settings or {})
    deadline = None if timeout is None else time.monotonic() + timeout
    with trio.CancelScope() as lookup, watchdog.bound(timeout, lookup.cancel):
        attempts = await trio.to_thread.run_sync(
            conninfo_attempts, psycopg.conninfo.conninfo_to_dict(conninfo), abandon_on_cancel=True
        )
    if lookup.cancelled_caught:
        raise TimeoutError("looking up the host name timed out")
    failure: psycopg.OperationalError | None = None
    for attempt in attempts:
        left = None if deadline is None else max(deadline - time.monotonic(), 0.001)
        try:
            pgconn = await _connect_to(make_conninfo("", **attempt), watchdog, left)
        except _REFUSED:
            raise
        except psycopg.OperationalError as exc:
            failure = exc
            continue
        return Connection(pgconn, watchdog, command_timeout)
    assert failure is not None  # conninfo_attempts answers one attempt at least, or raises
    raise failure


async def _connect_to(conninfo: str, watchdog: Watchdog, timeout: float | None) -> PGconn:
    """One attempt of :func:`connect`: a non-blocking libpq connection to *conninfo*."""
    pgconn = pq.PGconn.connect_start(conninfo.encode())
    fileno = -1
    timed_out = False

    def expire() -> None:
        nonlocal timed_out
        timed_out = True
        if fileno >= 0:
            trio.lowlevel.notify_closing(fileno)

    try:
        with watchdog.bound(timeout, expire):
            while True:
                if pgconn.status == _BAD:
                    raise _connect_failure(pgconn)
                status = pgconn.connect_poll()
                if status == pq.PollingStatus.OK:
                    break
                if status == pq.PollingStatus.FAILED:
                    raise _connect_failure(pgconn)
                fileno = pgconn.socket  # it changes from one host to the next
                if timed_out:
                    raise TimeoutError("connecting timed out")
                try:
                    if status == pq.PollingStatus.READING:
                        await trio.lowlevel.wait_readable(fileno)
                    else:
                        await trio.lowlevel.wait_writable(fileno)
                except trio.ClosedResourceError:
                    raise TimeoutError("connecting timed out") from None
    except BaseException:
        pgconn.finish()
        raise
    pgconn.nonblocking = 1
    return pgconn


# -- the pool ------------------------------------------------------------------------------------


class _Waiter:
    __slots__ = ("event", "conn", "error", "done")

    def __init__(self) -> None:
        self.event = trio.Event()
        self.conn: Connection | None = None
        self.error: BaseException | None = None
        self.done = False

    def give(self, conn: Connection | None = None, error: BaseException | None = None) -> None:
        self.conn, self.error, self.done = conn, error, True
        self.event.set()

    def time_out(self) -> None:
        if not self.done:
            self.give(error=TimeoutError())


class ConnectionPool:
    """At most *max_size* connections, opened by *connect* when needed and
    kept open between calls.

    A free connection is taken from a list, and given back to it or straight
    to the oldest waiting caller. A connection goes back only in a known
    state: the call ended, or ended with an error PostgreSQL answered (the
    connection is then idle), and it is open and outside a transaction.
    Anything else (a broken connection, a statement cut by its timeout or a
    cancellation) closes it, and the next caller opens another. qftrio's
    operations leave no other session state behind (the listener has a
    connection of its own, and migrations reset their settings and release
    their lock), so nothing is reset between calls.

    Args:
        connect: opens one connection, ready for use; its argument is the
            time left to do so (None: no bound).
        max_size: connections open at once, at most.
        watchdog: bounds the waits for a free connection in real time.
    """

    def __init__(
        self, connect: Callable[[float | None], Awaitable[Connection]], max_size: int, watchdog: Watchdog
    ) -> None:
        if max_size < 1:
            raise ValueError("a pool holds at least one connection")
        self._connect = connect
        self._max_size = max_size
        self._watchdog = watchdog
        self._free: list[Connection] = []  # the last given back on top: its buffers are warm
        self._busy: set[Connection] = set()
        #: Opened or being opened, free or busy.
        self._size = 0
        #: Callers waiting for a connection; each is given one, or None to
        #: open one itself, or the pool's closing.
        self._waiters: collections.deque[_Waiter] = collections.deque()
        self._closing = False
        self._all_back: trio.Event | None = None

    @property
    def size(self) -> int:
        """Connections opened or being opened."""
        return self._size

    async def acquire(self, timeout: float | None) -> Connection:
        """A connection for the caller alone, until :meth:`release`.

        Raises:
            TimeoutError: none came free, or a new one could not be opened,
                within *timeout* seconds of real time.
            psycopg.InterfaceError: the pool is closing.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._closing:
                raise psycopg.InterfaceError("the pool is closing")
            while self._free:
                conn = self._free.pop()
                if not conn.is_closed():
                    self._busy.add(conn)
                    return conn
                self._size -= 1  # closed while it was free (the server went away)
            if self._size < self._max_size:
                return await self._open(deadline)
            waiter = _Waiter()
            self._waiters.append(waiter)
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            try:
                with self._watchdog.bound(left, waiter.time_out):
                    await waiter.event.wait()
            except BaseException:
                if waiter.done and waiter.error is None:
                    # given just as the wait ended: pass it on
                    if waiter.conn is None:
                        self._hand_over(None)
                    else:
                        self._busy.add(waiter.conn)
                        self.release(waiter.conn, reusable=True)
                waiter.done = True
                raise
            if waiter.error is not None:
                raise waiter.error
            if waiter.conn is not None:
                self._busy.add(waiter.conn)
                return waiter.conn
            # a connection was closed: there is room to open one

    async def _open(self, deadline: float | None) -> Connection:
        self._size += 1
        try:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            conn = await self._connect(left)
        except BaseException:
            self._size -= 1
            self._hand_over(None)  # a waiter may try in its turn
            raise
        if self._closing:
            conn.terminate()
            self._size -= 1
            raise psycopg.InterfaceError("the pool is closing")
        self._busy.add(conn)
        return conn

    def release(self, conn: Connection, *, reusable: bool) -> None:
        """Give back a connection :meth:`acquire` returned; with *reusable*
        False (or when it is closed or inside a transaction), it is closed."""
        self._busy.discard(conn)
        if not reusable or self._closing or conn.is_closed() or conn.is_in_transaction():
            conn.terminate()
            self._size -= 1
            self._hand_over(None)
        else:
            self._hand_over(conn)
        if self._all_back is not None and not self._busy:
            self._all_back.set()

    def _hand_over(self, conn: Connection | None) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done:
                waiter.give(conn)
                return
        if conn is not None:
            self._free.append(conn)

    async def close(self, timeout: float | None) -> None:
        """Refuse new callers, wait for the connections in use to come back
        and close every connection; past *timeout* seconds of real time, cut
        those left."""
        self._closing = True
        for waiter in self._waiters:
            if not waiter.done:
                waiter.give(error=psycopg.InterfaceError("the pool is closing"))
        self._waiters.clear()
        free, self._free = self._free, []
        self._size -= len(free)
        for conn in free:
            conn.terminate()
        if self._busy:
            self._all_back = all_back = trio.Event()
            with self._watchdog.bound(timeout, all_back.set):
                await all_back.wait()
        for conn in list(self._busy):
            conn.terminate()


async def _run_on_pool(
    pool: ConnectionPool,
    acquire_timeout: float | None,
    transaction: bool,
    fn: Callable[..., Awaitable[T]],
    args: tuple[Any, ...],
) -> T:
    conn = await pool.acquire(acquire_timeout)
    try:
        if transaction:
            async with conn.transaction():
                return await fn(conn, *args)
        return await fn(conn, *args)
    finally:
        # Idle, whatever happened (PostgreSQL's own error, qftrio's refusal
        # between statements, a cancellation once the statement finished),
        # or closed already; the pool closes one left inside a transaction.
        pool.release(conn, reusable=True)


class Database:
    """A pool of connections used from Trio. Open with :func:`open_database`."""

    def __init__(self, pool: ConnectionPool, watchdog: Watchdog, backends: set[int], *, timeout: float | None) -> None:
        self._pool = pool
        self._timeout = timeout
        self._closed = False
        #: Bounds the waits of this database (and of its listener) in real time.
        self.watchdog = watchdog
        #: The server process ids of the pool's open connections.
        self.backends: Collection[int] = backends

    async def run(self, fn: Callable[..., Awaitable[T]], *args: Any, transaction: bool = True) -> T:
        """Run ``fn(conn, *args)`` on a pooled connection, inside a
        transaction unless *transaction* is False.

        A deadlock or serialization failure runs it again (up to three
        tries); database failures raise :class:`~qftrio.errors.Unavailable`.
        Cancelled, the statement under way finishes first (see
        :meth:`Connection._wait`) and the transaction is rolled back.
        """
        if self._closed:
            raise errors.Unavailable("the database pool is closed")
        with database_errors():
            for attempt in range(1, _RETRIES + 1):
                try:
                    return await _run_on_pool(self._pool, self._timeout, transaction, fn, args)
                except _RETRY as exc:
                    if attempt == _RETRIES:
                        raise errors.Unavailable("the database is too busy (transaction conflicts)") from exc
                    log.info("transaction conflict (%s); running it again", type(exc).__name__)
                    await trio.sleep(backoff(attempt, base=0.02, cap=0.1))  # 10-20 ms, then 20-40 ms
        raise AssertionError("unreachable")

    async def fetch(self, query: str, *args: Any) -> list[Record]:
        """One statement outside an explicit transaction (it is its own)."""
        return await self.run(Connection.fetch, query, *args, transaction=False)

    async def fetchval(self, query: str, *args: Any) -> Any:
        return await self.run(Connection.fetchval, query, *args, transaction=False)

    async def aclose(self) -> None:
        """Close every connection; idempotent. Shielded; with a timeout set,
        connections still busy after it are cut."""
        if self._closed:
            return
        self._closed = True
        with trio.CancelScope(shield=True):
            await self._pool.close(self._timeout)


def _server_settings(application_name: str, statement_timeout: float | None) -> dict[str, str]:
    # No JIT: a claim is one short statement whose plan PostgreSQL may cost
    # high (a walk per tenant with a limit it cannot know), and compiling it
    # would take seconds for a millisecond's work.
    settings = {"application_name": application_name, "jit": "off"}
    if statement_timeout is not None:
        settings["statement_timeout"] = str(int(statement_timeout * 1000))
        settings["idle_in_transaction_session_timeout"] = str(int(statement_timeout * 2000))
    return settings


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
            libpq accepts; query parameters libpq does not know are server
            settings (``?search_path=qftrio``).
        max_size: connections open at once, at most (opened when needed,
            then kept).
        timeout: client-side bound, in seconds of real time, on connecting,
            on waiting for a free pooled connection, on closing and (past
            *statement_timeout*) on each statement; None disables it.
        statement_timeout: server-side bound on each statement.

    Raises:
        ConfigError: libpq cannot read *url*, or the server refuses its
            password, role or database.
        Unavailable: the database cannot be reached.
    """
    target = read_url(url)
    settings = _server_settings(application_name, statement_timeout)
    _conninfo(url, settings)  # a URL libpq cannot read is told now, as such
    # Client-side bound on each statement: past the server's own, so that it
    # only fires when the server cannot answer at all (a dead network path).
    command_timeout = None if timeout is None else (statement_timeout or 30.0) + timeout
    backends: set[int] = set()
    async with open_watchdog() as watchdog:

        async def open_one(left: float | None) -> Connection:
            conn = await connect(url, watchdog=watchdog, timeout=left, command_timeout=command_timeout, settings=settings)
            pid = conn.get_server_pid()
            backends.add(pid)
            conn.on_close = lambda: backends.discard(pid)
            return conn

        pool = ConnectionPool(open_one, max_size, watchdog)
        db = Database(pool, watchdog, backends, timeout=timeout)
        try:
            # a first connection now, so that settings the server refuses are
            # told at once, and as such; the pool keeps it for the first caller
            with _connect_errors(target, url):
                pool.release(await pool.acquire(timeout), reusable=True)
            yield db
        finally:
            await db.aclose()


# -- LISTEN ----------------------------------------------------------------------------------------


class Listener:
    """A dedicated connection that LISTENs on one channel while told to.
    Open with :func:`open_listener`; :meth:`listen` and :meth:`unlisten`
    subscribe and unsubscribe.

    Notifications are read from the connection's socket by :meth:`receive`
    (and by any statement on the connection), and kept until a receive
    returns them. Those sent by the backends in *ignore* are dropped.
    """

    #: More distinct payloads than this between two receives collapse to "*".
    MAX_PENDING = 1000

    def __init__(
        self, conn: Connection, channel: str, *, ignore: Collection[int] = (), always: Callable[[str], bool] | None = None
    ) -> None:
        self._conn = conn
        self._channel = '"' + channel.replace('"', '""') + '"'
        self._ignore = ignore
        self._always = always
        self._pending: set[str] = set()
        self._poked = False
        self._waiting: trio.CancelScope | None = None
        conn.on_notify = self._notified
        #: Whether the connection LISTENs on the channel now.
        self.listening = False

    @property
    def backend_pid(self) -> int:
        return self._conn.get_server_pid()

    def _notified(self, notify: PGnotify) -> None:
        payload = notify.extra.decode()
        if notify.be_pid in self._ignore and (self._always is None or not self._always(payload)):
            return
        if len(self._pending) >= self.MAX_PENDING:
            self._pending = {"*"}
        else:
            self._pending.add(payload)

    def poke(self) -> None:
        """Make a :meth:`receive` waiting now (or the next one) return, with
        whatever it has, perhaps nothing."""
        self._poked = True
        if self._waiting is not None:
            self._waiting.cancel()

    async def listen(self) -> None:
        """LISTEN on the channel; notifications committed from now on arrive.

        Raises:
            Unavailable: the connection is lost.
        """
        with database_errors():
            await self._conn.execute(f"LISTEN {self._channel}")
        self.listening = True

    async def unlisten(self) -> None:
        """Stop listening (UNLISTEN); the database no longer wakes this
        connection's backend for each notification.

        Raises:
            Unavailable: the connection is lost.
        """
        self.listening = False
        with database_errors():
            await self._conn.execute(f"UNLISTEN {self._channel}")

    async def receive(self, *, keepalive_secs: float = 30.0) -> set[str]:
        """Wait for notifications, or a :meth:`poke`, and return the
        notifications' payloads (deduplicated).

        Every *keepalive_secs* without any, the connection is checked with a
        query, so that a silently dead connection is noticed.

        Raises:
            Unavailable: the connection is lost.
        """
        conn = self._conn
        while not (self._pending or self._poked):
            if conn.is_closed():
                raise errors.Unavailable("the LISTEN connection was lost")
            with trio.CancelScope() as self._waiting:
                with trio.move_on_after(keepalive_secs) as idle:
                    try:
                        await trio.lowlevel.wait_readable(conn._fileno)
                    except trio.ClosedResourceError:
                        raise errors.Unavailable("the LISTEN connection was lost") from None
                    try:
                        conn._pgconn.consume_input()
                    except psycopg.OperationalError:
                        conn.terminate()
                        raise errors.Unavailable("the LISTEN connection was lost") from None
                    conn.take_notifies()
                    if conn._pgconn.status == _BAD:
                        conn.terminate()
            self._waiting = None
            if idle.cancelled_caught:
                with database_errors():
                    await conn.fetchval("SELECT 1")
        self._poked = False
        pending, self._pending = self._pending, set()
        return pending

    async def aclose(self) -> None:
        self._conn.terminate()


@asynccontextmanager
async def open_listener(
    url: str,
    channel: str,
    *,
    watchdog: Watchdog,
    timeout: float | None = 10.0,
    application_name: str = "qftrio-listener",
    ignore: Collection[int] = (),
    always: Callable[[str], bool] | None = None,
) -> AsyncIterator[Listener]:
    """Connect to *url* for LISTENing on *channel* (not yet listening: see
    :meth:`Listener.listen`), ignoring what the backends *ignore* (a live
    collection of process ids, such as :attr:`Database.backends`) send,
    but for the payloads *always* accepts.
    Its waits are bounded by *watchdog*, a database's (:attr:`Database.watchdog`).

    Raises:
        Unavailable: the database cannot be reached.
    """
    with database_errors():
        conn = await connect(
            url, watchdog=watchdog, timeout=timeout, command_timeout=timeout,
            settings={"application_name": application_name},
        )  # fmt: skip
    listener = Listener(conn, channel, ignore=ignore, always=always)
    try:
        yield listener
    finally:
        await listener.aclose()
