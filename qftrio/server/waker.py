"""Long-poll parking and hand-off: the polls parked on each queue, woken when
work may have come, or handed jobs an enqueue claimed for them in its own
transaction."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import trio

from ..models import Lease, Status
from .store.base import ClaimRequest, NewJob, ReportResult

__all__ = ["Parked", "Waker", "wake_after_reports"]


class Parked:
    """A long-poll parked on a queue, from its claim until woken or handed
    jobs."""

    __slots__ = ("claim", "event", "leases", "taken", "waiting")

    def __init__(self, claim: ClaimRequest) -> None:
        self.claim = claim
        self.event = trio.Event()
        #: Its claim found nothing and it waits: only then may an enqueue
        #: claim for it.
        self.waiting = False
        #: Jobs an enqueue claimed for this poll, in its own transaction.
        self.leases: list[Lease] = []
        #: An enqueue is claiming for this poll: its event is set once that
        #: transaction ends, with or without jobs.
        self.taken = False


class Waker:
    """The long-polls parked on each queue, oldest first.

    A poll parks before it claims, and waits only if its claim found
    nothing. ``notify(queue)`` wakes every poll parked on that queue; each
    then claims again, and those that find nothing park again. A notify
    that comes while a poll claims (for work its claim may not have seen:
    committed after the claim read the queue) is not lost either: the poll
    claims again at once instead of waiting. ``take(queue, n)`` unparks the
    oldest waiting polls that can hold *n* jobs between them, for an
    enqueue to claim for them.
    """

    def __init__(self) -> None:
        self._parked: dict[str, list[Parked]] = {}

    def park(self, claim: ClaimRequest) -> Parked:
        parked = Parked(claim)
        self._parked.setdefault(claim.queue, []).append(parked)
        return parked

    def unpark(self, parked: Parked) -> None:
        polls = self._parked.get(parked.claim.queue)
        if polls is not None and parked in polls:
            polls.remove(parked)
            if not polls:
                del self._parked[parked.claim.queue]

    def take(self, queue: str, jobs: int) -> list[Parked]:
        polls = self._parked.get(queue)
        if not polls:
            return []
        taken: list[Parked] = []
        kept: list[Parked] = []  # claiming for themselves, or not needed
        room = 0
        for k, parked in enumerate(polls):
            if room >= jobs:
                kept += polls[k:]
                break
            if parked.waiting:
                parked.taken = True
                taken.append(parked)
                room += parked.claim.limit
            else:
                kept.append(parked)
        if kept:
            self._parked[queue] = kept
        else:
            del self._parked[queue]
        return taken

    def notify(self, queue: str) -> None:
        for parked in self._parked.pop(queue, ()):
            parked.event.set()

    def notify_all(self) -> None:
        everything, self._parked = self._parked, {}
        for polls in everything.values():
            for parked in polls:
                parked.event.set()

    def after_change(self, queues: Iterable[str], *, freed: bool) -> None:
        """Wake the polls a change of jobs may have made work for: those
        parked on *queues* (where it made jobs ready), or every poll when it
        *freed* a concurrency key's place (a job of a key stopped running:
        a report ended it, a cancel, or the janitor took it back), since that
        key's jobs on any queue may be claimable now; other servers hear the
        key's NOTIFY. Polls park on a queue only when it had nothing to hand
        out, and each wake costs a claim: a change that made nothing
        claimable wakes no one."""
        if freed:
            self.notify_all()
            return
        for queue in set(queues):
            self.notify(queue)


    def take_due(self, jobs: Sequence[NewJob], now: float) -> list[Parked]:
        """:meth:`take` for each queue of *jobs* the polls that can hold
        those of them due by *now*: an enqueue's hand-off."""
        due: dict[str, int] = {}
        for job in jobs:
            if job.scheduled_at <= now:
                due[job.queue] = due.get(job.queue, 0) + 1
        handed: list[Parked] = []
        for queue, count in due.items():
            handed += self.take(queue, count)
        return handed


def wake_after_reports(waker: Waker, results: Sequence[ReportResult], *, retried: bool) -> None:
    """Wake the long polls that *results* may have made work for
    (:meth:`Waker.after_change`): on the queues where they made jobs ready
    (workflow steps, and with *retried* the jobs put back to pending, whose
    polls recompute their wait), and every poll when an ended job held a
    concurrency key."""
    queues = {q for r in results for q in r.ready_queues}
    if retried:
        queues |= {r.queue for r in results if r.applied and r.status is Status.PENDING and r.queue is not None}
    waker.after_change(queues, freed=any(r.applied and r.keyed for r in results))
