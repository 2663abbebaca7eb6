"""Credentials: the worker token and the tenants' tokens.

Tokens are compared in constant time (every configured token is compared on
every request, so timing says nothing about which one nearly matched) and are
never logged.
"""

from __future__ import annotations

import dataclasses
import hmac

from .. import errors

__all__ = ["Credentials", "Principal"]

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
    """

    def __init__(self, *, worker_token: str | None, tenants: dict[str, str], dev: bool) -> None:
        tenants = dict(tenants)
        if dev and not tenants:
            tenants[DEV_TENANT] = DEV_TOKEN
        self.dev = dev
        self._worker = worker_token.encode() if worker_token else None
        self._tenants = [(name, token.encode()) for name, token in tenants.items()]

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

    def identify(self, authorization: str | None) -> Principal:
        """The principal of an ``Authorization: Bearer`` header; 401 if none."""
        if not authorization:
            raise errors.Unauthorized("missing credential: send Authorization: Bearer <token>")
        scheme, _, token = authorization.partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise errors.Unauthorized("malformed credential: send Authorization: Bearer <token>")
        given = token.strip().encode()
        found: Principal | None = None
        if self._worker is not None and hmac.compare_digest(given, self._worker):
            found = Principal(None)
        for name, expected in self._tenants:
            if hmac.compare_digest(given, expected) and found is None:
                found = Principal(name)
        if found is None:
            raise errors.Unauthorized("unknown credential")
        return found

    def worker(self, authorization: str | None) -> Principal:
        """Authorise a worker-protocol call."""
        principal = self.identify(authorization)
        if not principal.is_worker and not self.dev:
            raise errors.Forbidden("worker routes take the worker token, not a tenant token")
        return principal

    def tenant(self, authorization: str | None) -> str:
        """Authorise an application call; returns the tenant it acts for."""
        principal = self.identify(authorization)
        if principal.tenant is not None:
            return principal.tenant
        if self.dev:
            return DEV_TENANT
        raise errors.Forbidden("the worker token belongs to no tenant; use a tenant token")
