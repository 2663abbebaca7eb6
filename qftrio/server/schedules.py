"""Cron schedules' decisions, as pure functions of their expression and
times: which ticks a janitor round fires, and when a schedule runs next.
No I/O; :mod:`.store.changes` calls them inside the transaction that fires.

Cron expressions are parsed and walked by ``cronsim`` (the five Debian cron
fields, optionally a leading seconds field) in an IANA time zone of
``zoneinfo``. Daylight saving, as cronsim does it after Debian's cron
(docs/schedules.md): a five-field expression with a fixed minute and hour
runs at its wall-clock time, once a day on either change (a time the clocks
skip runs at the first minute after the gap; a time they repeat runs at its
first occurrence); any other expression follows real time, so a ``*/30``
schedule runs every 30 minutes through both changes.

A tick is an instant (epoch seconds, a whole second), never a wall-clock
time, so each is one tick however the clocks move.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import math
from typing import Literal
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from .. import errors

__all__ = ["CatchUp", "GRACE_SECS", "MAX_CATCH_UP", "Fire", "zone", "check", "next_after", "due", "next_on_put"]

CatchUp = Literal["latest", "none", "all"]

#: A tick no round fired within this many seconds of its time was *missed*
#: (every server was down or stalled) and follows the schedule's
#: ``catch_up``; a later one is fired whatever ``catch_up`` says, so that a
#: round running a little late never drops a tick (sidekiq-cron's
#: ``reschedule_grace_period`` has the same default).
GRACE_SECS = 60.0

#: ``catch_up = "all"`` fires at most this many missed ticks (the latest).
MAX_CATCH_UP = 100


def zone(name: str) -> ZoneInfo:
    """The IANA time zone *name*.

    Raises:
        InvalidInput: an unknown zone, naming the field ``timezone``.
    """
    try:
        if not name or name != name.strip() or ".." in name or name.startswith("/"):
            raise ValueError(name)
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        raise errors.InvalidInput(f"timezone: not an IANA time zone: {name!r}") from None


def _walk(cron: str, tz: ZoneInfo, at: float, *, reverse: bool = False) -> CronSim:
    """A walk over *cron*'s ticks from the whole second *at*: forward, the
    ticks after it; in reverse, the ticks before it."""
    return CronSim(cron, dt.datetime.fromtimestamp(at, tz), reverse=reverse)


def check(cron: str, timezone: str) -> None:
    """Refuse a schedule that can never fire, or that no one can read.

    Raises:
        InvalidInput: naming ``cron`` (a field out of range, a day no month
            has, no tick within 50 years) or ``timezone``.
    """
    tz = zone(timezone)
    try:
        if len(cron.split()) not in (5, 6):
            raise CronSimError("five fields, or six with a leading seconds field")
        next(_walk(cron, tz, 0.0))
    except CronSimError as exc:
        raise errors.InvalidInput(f"cron: {exc}: {cron!r}") from None
    except StopIteration:
        raise errors.InvalidInput(f"cron: never fires: {cron!r}") from None


def _ticks(cron: str, tz: ZoneInfo, at: float, *, reverse: bool = False) -> CronSim:
    try:
        return _walk(cron, tz, float(math.floor(at)) if not reverse else float(math.ceil(at)), reverse=reverse)
    except CronSimError:  # checked when stored; a newer cronsim may read it otherwise
        return iter(())  # type: ignore[return-value]


def next_after(cron: str, timezone: str, t: float) -> float | None:
    """The first tick after *t*, or None if there is none (within cronsim's
    50 years)."""
    for tick in _ticks(cron, zone(timezone), t):
        return tick.timestamp()
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class Fire:
    """What one round does to a due schedule: the ticks it enqueues a job
    for, in order, and the schedule's next run."""

    ticks: tuple[float, ...]
    next_run_at: float | None


def due(
    cron: str, timezone: str, *, next_run_at: float, now: float, catch_up: CatchUp, grace: float = GRACE_SECS
) -> Fire:
    """The ticks from *next_run_at* (the schedule's first unfired tick) to
    *now* that a round fires. Ticks within *grace* of *now* all fire; older
    ones were missed, and *catch_up* says which fire: ``all`` every one (the
    latest :data:`MAX_CATCH_UP`), ``latest`` the latest one unless a tick
    within *grace* fires anyway, ``none`` none. Bounded: at most
    ``grace`` + :data:`MAX_CATCH_UP` ticks are walked."""
    tz = zone(timezone)
    cutoff = now - grace
    start = max(next_run_at, cutoff)
    recent = []
    after = None  # the first tick after now: the next run (one walk for both)
    for tick in _ticks(cron, tz, start - 1):
        at = tick.timestamp()
        if at > now:
            after = at
            break
        if at >= start:
            recent.append(at)
    missed: list[float] = []
    wanted = {"all": MAX_CATCH_UP, "latest": 0 if recent else 1, "none": 0}[catch_up]
    if next_run_at < cutoff and wanted:
        for tick in _ticks(cron, tz, cutoff, reverse=True):
            at = tick.timestamp()
            if at < next_run_at or len(missed) == wanted:
                break
            if at < cutoff:  # a walk in reverse may start on the cutoff
                missed.append(at)
        missed.reverse()
    return Fire(ticks=tuple(missed + recent), next_run_at=after)


def next_on_put(
    old: tuple[str, str, bool, float | None] | None, *, cron: str, timezone: str, paused: bool, now: float
) -> float | None:
    """A stored schedule's next run once ``PUT`` with *cron*, *timezone* and
    *paused*; *old* is what was stored before (cron, timezone, paused,
    next run), if anything. The same timing applied again (``qftrio serve
    --schedules`` at every start) keeps the pending tick, so that a tick due
    while the servers were down is caught up as ``catch_up`` says; a new
    timing, or a resume, starts from *now*; a paused schedule has none."""
    if paused:
        return None
    if old is not None:
        old_cron, old_timezone, old_paused, old_next = old
        if (old_cron, old_timezone, old_paused) == (cron, timezone, paused) and old_next is not None:
            return old_next
    return next_after(cron, timezone, now)
