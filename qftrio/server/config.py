"""Server settings, with typed defaults and an environment constructor."""

from __future__ import annotations

import dataclasses
import ipaddress
import os
import tomllib
from collections.abc import Mapping
from typing import Any, Literal

import pydantic

from .. import errors
from .._env import env
from ..models import MAX_ANSWER_BYTES, NAME_PATTERN, ScheduleRequest, valid_name

__all__ = ["Config", "parse_tenants", "read_schedules"]

#: A schedule of ``--schedules FILE.toml``: its tenant, name and body.
FileSchedule = tuple[str, str, ScheduleRequest]

Mode = Literal["api", "worker", "all"]

#: Tokens shorter than this are refused at start, outside ``--dev``.
MIN_TOKEN_CHARS = 16


def parse_tenants(specs: list[str] | str | None) -> dict[str, str]:
    """``NAME=TOKEN`` items (a list, or one comma-separated string) to a dict."""
    if not specs:
        return {}
    items = specs.split(",") if isinstance(specs, str) else specs
    tenants: dict[str, str] = {}
    for item in items:
        item = item.strip()
        if not item:
            continue
        name, sep, token = item.partition("=")
        if not sep or not name.strip() or not token.strip():
            raise errors.ConfigError(f"tenant credential must look like NAME=TOKEN, got {name.strip()!r}=...")
        if name.strip() in tenants:
            raise errors.ConfigError(f"tenant {name.strip()!r} is given twice")
        tenants[name.strip()] = token.strip()
    return tenants


@dataclasses.dataclass(kw_only=True)
class Config:
    """Everything ``qftrio serve`` can be told."""

    #: ``postgresql://...`` for PostgreSQL; None for the embedded store.
    database_url: str | None = None
    #: The embedded store's file.
    sqlite_path: str = "qftrio.db"
    bind: str = "127.0.0.1:8000"
    mode: Mode = "all"
    #: ``module:attribute`` of a :class:`qftrio.Registry` run in-process.
    handlers: str | None = None
    #: Queues the in-process handlers lease from.
    handler_queues: tuple[str, ...] = ("default",)
    #: Jobs the in-process handlers run at a time per queue; None: the
    #: worker runtime's default, as for ``qftrio worker``.
    handler_lanes: int | None = None
    worker_token: str | None = None
    tenants: dict[str, str] = dataclasses.field(default_factory=dict)
    dev: bool = False
    max_body_bytes: int = 1 << 20
    #: A page of jobs or workflows stops before the item that would take it
    #: past this size (never before its first item).
    max_answer_bytes: int = MAX_ANSWER_BYTES
    pool_size: int = 10
    #: Completed and cancelled jobs are deleted this long after they ended.
    retention_secs: float | None = 7 * 86400
    janitor_interval_secs: float = 1.0
    safety_poll_secs: float = 5.0
    #: On shutdown, in-flight requests get this long to finish.
    graceful_timeout_secs: float = 5.0
    #: The token ``GET /metrics`` asks for; None: it asks for none.
    metrics_token: str | None = None
    #: Queue names, and kind names, that get series of their own in
    #: ``/metrics``; the rest are counted under ``other``.
    metrics_queues: int = 50
    metrics_kinds: int = 100
    #: Connections open at once from one client address.
    max_connections_per_address: int = 256
    #: Proxies (addresses or networks) whose ``X-Forwarded-For`` names the client.
    trusted_proxies: tuple[str, ...] = ()
    #: Wrong credentials one client address may give at once before it is
    #: answered 429; one more is allowed every ``failed_credentials_refill_secs``.
    failed_credentials_burst: int = 20
    failed_credentials_refill_secs: float = 3.0
    #: A dashboard session ends after this long without a request, and this
    #: long after sign-in whatever happens.
    session_idle_secs: float = 8 * 3600.0
    session_lifetime_secs: float = 7 * 86400.0
    #: ``--schedules FILE.toml``: schedules put at start (docs/schedules.md),
    #: read by :meth:`validate` into :attr:`schedules`.
    schedules_file: str | None = None
    schedules: tuple[FileSchedule, ...] = ()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] = os.environ, **overrides: object) -> Config:
        """Defaults, then ``QFTRIO_*`` variables (or the older
        ``QUEUEFLOW_*`` ones), then *overrides* (None values in *overrides*
        are ignored)."""
        values: dict[str, object] = {}
        if database_url := env("DATABASE_URL", environ):
            values["database_url"] = database_url
        if worker_token := env("WORKER_TOKEN", environ):
            values["worker_token"] = worker_token
        if tenants := env("TENANTS", environ):
            values["tenants"] = parse_tenants(tenants)
        if (env("DEV", environ) or "").lower() in ("1", "true", "yes", "on"):
            values["dev"] = True
        if metrics_token := env("METRICS_TOKEN", environ):
            values["metrics_token"] = metrics_token
        values.update({k: v for k, v in overrides.items() if v is not None})
        config = cls(**values)  # type: ignore[arg-type]
        config.validate()
        return config

    def validate(self) -> None:
        if self.mode not in ("api", "worker", "all"):
            raise errors.ConfigError(f"--mode must be api, worker or all, not {self.mode!r}")
        if self.mode == "worker" and not self.handlers:
            raise errors.ConfigError("--mode worker needs --handlers module:registry")
        host, sep, port = self.bind.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise errors.ConfigError(f"--bind must look like HOST:PORT, not {self.bind!r}")
        if int(port) > 65535:
            raise errors.ConfigError(f"--bind: port {int(port)} is out of range (0 to 65535)")
        if self.handlers and self.mode == "api":
            raise errors.ConfigError("--handlers runs in-process workers, which --mode api does not run")
        self._check_credentials()
        if self.max_body_bytes < 1024:
            raise errors.ConfigError("--max-body-bytes must be at least 1024")
        if self.max_answer_bytes < 1024:
            raise errors.ConfigError("--max-answer-bytes must be at least 1024")
        if self.pool_size < 1:
            raise errors.ConfigError("--pool-size must be at least 1")
        for flag, value in (("--metrics-queues", self.metrics_queues), ("--metrics-kinds", self.metrics_kinds)):
            if value < 1:
                raise errors.ConfigError(f"{flag} must be at least 1")
        if self.failed_credentials_burst < 1 or not 0 < self.failed_credentials_refill_secs < float("inf"):
            raise errors.ConfigError("--failed-credentials-burst and --failed-credentials-refill-secs must be positive")
        if not 0 < self.session_idle_secs < float("inf") or not 0 < self.session_lifetime_secs < float("inf"):
            raise errors.ConfigError("--session-idle-secs and --session-lifetime-secs must be positive")
        if self.max_connections_per_address < 1:
            raise errors.ConfigError("--max-connections-per-address must be at least 1")
        for proxy in self.trusted_proxies:
            try:
                ipaddress.ip_network(proxy, strict=False)
            except ValueError:
                raise errors.ConfigError(f"--trusted-proxy must be an IP address or network, not {proxy!r}") from None

        if self.schedules_file is not None:
            self.schedules = read_schedules(self.schedules_file, tenants=tuple(self.tenants), dev=self.dev)

    def _check_credentials(self) -> None:
        """Every credential names one caller: a token shared by the worker and
        a tenant, or by two tenants, would act for whichever is looked up
        first. Outside ``--dev``, each is long enough not to be guessed."""
        owners: dict[str, str] = {}
        if self.worker_token:
            owners[self.worker_token] = "the worker token"
        for name, token in self.tenants.items():
            if token in owners:
                raise errors.ConfigError(f"tenant {name!r} has the same token as {owners[token]}: give each its own")
            owners[token] = f"tenant {name!r}"
        if self.metrics_token:
            if self.metrics_token in owners:
                raise errors.ConfigError(f"the metrics token is the same as {owners[self.metrics_token]}: give it its own")
            owners[self.metrics_token] = "the metrics token"
        if self.dev:
            return
        for token, owner in owners.items():
            if len(token) < MIN_TOKEN_CHARS:
                raise errors.ConfigError(
                    f"{owner}: a token must be at least {MIN_TOKEN_CHARS} characters long (or --dev for development)"
                )


def read_schedules(path: str, *, tenants: tuple[str, ...], dev: bool) -> tuple[FileSchedule, ...]:
    """The schedules of a ``--schedules`` file: a table per schedule under
    ``[schedules.NAME]``, with the keys of ``PUT /api/v1/schedules/{name}``
    and ``tenant`` (which may be left out when one tenant is configured, or
    in ``--dev`` with none: ``default``).

    Raises:
        ConfigError: a file that cannot be read, or one with a schedule the
            API would refuse or a tenant no token acts for: every such
            error of the file, each naming the schedule and the field.
    """
    from . import schedules
    from .auth import DEV_TENANT

    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except OSError as exc:
        raise errors.ConfigError(f"--schedules: cannot read {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise errors.ConfigError(f"--schedules: {path} is not TOML: {exc}") from None
    unknown = sorted(set(data) - {"schedules"})
    if unknown or not isinstance(data.get("schedules"), dict):
        raise errors.ConfigError(f"--schedules: {path} holds a [schedules.NAME] table per schedule, and nothing else")
    # --dev with no credential serves DEV_TENANT alone: a schedule of any
    # other tenant would be stored where no token can see it.
    configured = tenants or ((DEV_TENANT,) if dev else ())
    implied = configured[0] if len(configured) == 1 else None
    out: list[FileSchedule] = []
    problems: list[str] = []
    for name, table in data["schedules"].items():
        where = f"schedules.{name}"
        if not valid_name(name):
            problems.append(f"{where}: a schedule's name must match {NAME_PATTERN}")
            continue
        if not isinstance(table, dict):
            problems.append(f"{where}: must be a table")
            continue
        body: dict[str, Any] = dict(table)
        tenant = body.pop("tenant", implied)
        if tenant not in configured:
            problems.append(f"{where}.tenant: name one of the configured tenants ({', '.join(configured) or 'none'})")
        try:
            request = ScheduleRequest.model_validate(body)
            schedules.check(request.cron, request.timezone)
        except pydantic.ValidationError as exc:
            for error in exc.errors(include_url=False):
                field = ".".join(str(part) for part in error["loc"])
                problems.append(f"{where}.{field}: {'unknown key' if error['type'] == 'extra_forbidden' else error['msg']}")
            continue
        except errors.InvalidInput as exc:
            problems.append(f"{where}.{exc}")
            continue
        out.append((tenant, name, request))
    if problems:
        raise errors.ConfigError(f"--schedules: {path}: {'; '.join(problems)}")
    return tuple(out)

