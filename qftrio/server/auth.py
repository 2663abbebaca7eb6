"""Credentials: the worker token, the tenants' tokens and the metrics token.

Tokens are compared in constant time (every configured token is compared on
every request, so timing says nothing about which one nearly matched) and are
never logged. A credential that is given but wrong is logged (the client's
address, the route, whether it was malformed or unknown) and counted against
the client's address (:mod:`qftrio.server.throttle`): past a burst, that
address is answered ``429`` without its credentials being checked, until it
has waited.
"""

from __future__ import annotations

import dataclasses
import hmac
import logging
import math

from .. import errors
from .throttle import Throttle, current_client, route_of

__all__ = ["Credentials", "Principal"]

log = logging.getLogger("qftrio.server.auth")

DEV_TENANT = "default"
DEV_TOKEN = "dev"


@dataclasses.dataclass(frozen=True, slots=True)
class Principal:
    """Who a request is: the worker (``tenant is None``) or a tenant."""

    tenant: str | None

    @property
    def is_worker(self) -> bool:
        return self.tenant is None


class Credentials:
    """The server's credentials.

    Args:
        worker_token: the token of worker-protocol routes.
        tenants: tenant name → token.
        dev: development mode: any valid credential may act as a worker, the
            worker token acts for tenant ``default``, and with no tenant
            configured, tenant ``default`` has the token ``dev``.
        metrics_token: the only token ``GET /metrics`` takes; None: it takes none.
        throttle: failed credentials by client address.
    """

    def __init__(
        self,
        *,
        worker_token: str | None,
        tenants: dict[str, str],
        dev: bool,
        metrics_token: str | None = None,
        throttle: Throttle | None = None,
    ) -> None:
        tenants = dict(tenants)
        if dev and not tenants:
            tenants[DEV_TENANT] = DEV_TOKEN
        self.dev = dev
        self.throttle = throttle if throttle is not None else Throttle()
        self._worker = worker_token.encode() if worker_token else None
        self._tenants = [(name, token.encode()) for name, token in tenants.items()]
        self._metrics = metrics_token.encode() if metrics_token else None

    def check_startable(self) -> None:
        """Refuse to serve the API without credentials, outside dev mode."""
        if self.dev:
            return
        if self._worker is None:
            raise errors.ConfigError(
                "no worker token: pass --worker-token or set QFTRIO_WORKER_TOKEN (or --dev for development)"
            )
        if not self._tenants:
            raise errors.ConfigError(
                "no tenant credential: pass --tenant NAME=TOKEN or set QFTRIO_TENANTS (or --dev for development)"
            )

    def _bearer(self, authorization: str | None) -> bytes:
        """The token of an ``Authorization: Bearer`` header.

        Raises:
            Unauthorized: none given, or not a bearer token (counted).
            TooManyRequests: the client's address is throttled.
        """
        if not authorization:
            raise errors.Unauthorized("missing credential: send Authorization: Bearer <token>")
        client = current_client.get()
        if client is not None and client[2] is not None:
            raise errors.TooManyRequests(
                f"too many wrong credentials from this address: retry in {math.ceil(client[2])} s"
            )
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            self._failed("malformed")
            raise errors.Unauthorized("malformed credential: send Authorization: Bearer <token>")
        return token.strip().encode()

    def _failed(self, kind: str) -> None:
        """Log a wrong credential (never the token) and count it against the
        client's address."""
        client = current_client.get()
        if client is None:
            log.warning("%s credential in a call outside a request", kind)
            return
        address, scope, _ = client
        log.warning("%s credential from %s on %s", kind, address, route_of(scope))
        self.throttle.fail(address)

    def identify(self, authorization: str | None) -> Principal:
        """The principal of an ``Authorization: Bearer`` header: 401 if
        none, 429 while the client's address is throttled."""
        given = self._bearer(authorization)
        found: Principal | None = None
        if self._worker is not None and hmac.compare_digest(given, self._worker):
            found = Principal(None)
        for name, expected in self._tenants:
            if hmac.compare_digest(given, expected) and found is None:
                found = Principal(name)
        if found is None:
            self._failed("unknown")
            raise errors.Unauthorized("unknown credential")
        return found

    def metrics(self, authorization: str | None) -> None:
        """Authorise a scrape of ``/metrics``: anyone when no metrics token
        is set, else only that token."""
        if self._metrics is None:
            return
        if not hmac.compare_digest(self._bearer(authorization), self._metrics):
            self._failed("unknown")
            raise errors.Unauthorized("unknown credential: /metrics takes the metrics token")

    def worker(self, authorization: str | None) -> Principal:
        """Authorise a worker-protocol call."""
        principal = self.identify(authorization)
        if not principal.is_worker and not self.dev:
            raise errors.Forbidden("worker routes take the worker token, not a tenant token")
        return principal

    def tokens_of(self, tenant: str) -> list[bytes]:
        """The tokens that act for *tenant* now: a dashboard session stays
        valid only while the token it was signed in with is one of them."""
        tokens = [token for name, token in self._tenants if name == tenant]
        if self.dev and tenant == DEV_TENANT and self._worker is not None:
            tokens.append(self._worker)
        return tokens

    def tenant(self, authorization: str | None) -> str:
        """Authorise an application call; returns the tenant it acts for."""
        principal = self.identify(authorization)
        if principal.tenant is not None:
            return principal.tenant
        if self.dev:
            return DEV_TENANT
        raise errors.Forbidden("the worker token belongs to no tenant; use a tenant token")
