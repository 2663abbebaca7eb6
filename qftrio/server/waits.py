"""Waits parked on jobs (``GET /api/v1/jobs/{id}/wait``): each a Trio event
that the store's word that the job ended sets (:attr:`Store.on_ended`), with
a cap per tenant."""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Iterator

import trio

from .. import errors
from .store.base import ALL_QUEUES

__all__ = ["JobWaits", "Parked"]


class Parked:
    """One parked wait: :attr:`event` is set when its job may have ended."""

    __slots__ = ("job_id", "event")

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self.event = trio.Event()

    def rearm(self) -> None:
        self.event = trio.Event()


class JobWaits:
    """Every wait parked on this server, by job, at most *per_tenant* of one
    tenant at once (beyond: ``429``, with ``Retry-After``)."""

    #: Seconds a caller refused for the cap is told to wait before trying again.
    RETRY_AFTER_SECS = 1

    def __init__(self, per_tenant: int) -> None:
        self.per_tenant = per_tenant
        self._by_job: dict[str, set[Parked]] = collections.defaultdict(set)
        self._of_tenant: collections.Counter[str] = collections.Counter()
        self._closed = False

    def __len__(self) -> int:
        return sum(self._of_tenant.values())

    @contextlib.contextmanager
    def park(self, tenant: str, job_id: str) -> Iterator[Parked]:
        if self._of_tenant[tenant] >= self.per_tenant:
            raise errors.TooManyRequests(
                f"this tenant has {self.per_tenant} waits open already", code="too_many_waits",
                retry_after=self.RETRY_AFTER_SECS,
            )  # fmt: skip
        parked = Parked(job_id)
        self._by_job[job_id].add(parked)
        self._of_tenant[tenant] += 1
        try:
            yield parked
        finally:
            waits = self._by_job[job_id]
            waits.discard(parked)
            if not waits:
                del self._by_job[job_id]
            self._of_tenant[tenant] -= 1
            if not self._of_tenant[tenant]:
                del self._of_tenant[tenant]

    def ended(self, job_id: str) -> None:
        """The job *job_id* may have ended (``*``: any job may have): its
        waits read it again."""
        if job_id == ALL_QUEUES:
            for waits in self._by_job.values():
                for parked in waits:
                    parked.event.set()
            return
        for parked in self._by_job.get(job_id, ()):
            parked.event.set()

    def close(self) -> None:
        """The server is shutting down: every wait answers now."""
        self._closed = True
        self.ended(ALL_QUEUES)

    @property
    def closed(self) -> bool:
        return self._closed
