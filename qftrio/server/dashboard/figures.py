"""What the dashboard's pages show, in words and numbers: relative ages,
times, rates, a job's timeline, text cut to a page's size, and the throughput
samples behind the rates and the chart."""

from __future__ import annotations

import collections
import datetime
import json
import time
from collections.abc import Callable, Sequence
from typing import Any

from ...models import AttemptOutcome, Job, QueueStats, Status, elapsed, format_time

__all__ = ["Throughput", "age", "clip", "idle_note", "show_rate", "show_time", "shown", "timeline"]

#: How far back the completed-per-second rate looks.
RATE_WINDOW_SECS = 60.0
#: Samples kept per queue for the throughput chart.
CHART_POINTS = 60
#: Characters of a payload, result, error or context a page shows; the rest
#: is one link away (the whole job as JSON), so that no page is megabytes.
SHOWN_CHARS = 16 * 1024
#: Characters of a job's last error in a list.
LIST_ERROR_CHARS = 200


class Throughput:
    """Completed jobs per second, per tenant and queue, from the samples of
    the completed count this server's pages have read.

    Counts are exact and shared by every server (they come from the store),
    so any server's samples give the rate; a server only keeps the last
    :data:`CHART_POINTS` samples of each queue, one a second at most.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._samples: dict[tuple[str, str], collections.deque[tuple[float, int]]] = {}

    def observe(self, tenant: str, stats: QueueStats) -> tuple[float | None, list[float]]:
        """Record the queue's completed count; returns the rate over the
        last :data:`RATE_WINDOW_SECS` (None until two samples) and the
        chart's series of rates between successive samples."""
        now = self._clock()
        samples = self._samples.setdefault((tenant, stats.queue), collections.deque(maxlen=CHART_POINTS))
        completed = stats.counts.get(Status.COMPLETED.value, 0)
        if not samples or now - samples[-1][0] >= 1.0:
            samples.append((now, completed))
        since = next((s for s in samples if now - s[0] <= RATE_WINDOW_SECS), None)
        rate = None
        if since is not None and now > since[0]:
            # Deleting completed jobs lowers the count: never a negative rate.
            rate = max(0.0, (completed - since[1]) / (now - since[0]))
        pairs = zip(samples, list(samples)[1:])
        series = [max(0.0, (b[1] - a[1]) / (b[0] - a[0])) for a, b in pairs]
        return rate, series

    def span(self, tenant: str, queue: str) -> float:
        """Seconds between the oldest and the latest sample kept of the
        queue: the time its chart series covers."""
        samples = self._samples.get((tenant, queue))
        return samples[-1][0] - samples[0][0] if samples else 0.0


def idle_note(series: Sequence[Sequence[float]], span_secs: float) -> str | None:
    """What the chart says instead of a flat line when no series shows a
    job completed over the *span_secs* they cover; None while one does, and
    before they cover two seconds (one rate at most: too little to say)."""
    if span_secs < 2 or any(rate > 0 for rates in series for rate in rates):
        return None
    if span_secs < 60:
        covered = f"{span_secs:.0f} seconds"
    elif span_secs < 120:
        covered = "minute"
    else:
        covered = f"{span_secs // 60:.0f} minutes"
    return f"Nothing completed in the last {covered}."


def age(ts: datetime.datetime | None, now: float) -> str:
    """A short relative time: ``12s``, ``3m 04s``, ``2h 05m``, ``4d 03h``."""
    if ts is None:
        return "–"
    secs = elapsed(ts, now)
    future = secs < 0
    secs = abs(secs)
    if secs < 60:
        text = f"{secs:.0f}s"
    elif secs < 3600:
        text = f"{secs // 60:.0f}m {secs % 60:02.0f}s"
    elif secs < 86400:
        text = f"{secs // 3600:.0f}h {secs % 3600 // 60:02.0f}m"
    else:
        text = f"{secs // 86400:.0f}d {secs % 86400 // 3600:02.0f}h"
    return f"in {text}" if future else f"{text} ago"


def show_time(ts: datetime.datetime | None) -> str:
    text = format_time(ts)
    return "–" if text is None else text.replace("T", " ")[:19] + " UTC"


def show_rate(rate: float | None) -> str:
    return "–" if rate is None else f"{rate:.1f}"


#: How an ended attempt reads on a job's timeline, by its outcome.
_ENDED = {
    AttemptOutcome.COMPLETED: "completed",
    AttemptOutcome.FAILED: "failed",
    AttemptOutcome.TIMED_OUT: "timed out",
    AttemptOutcome.LOST: "lost its lease",
    AttemptOutcome.SNOOZED: "snoozed",
    AttemptOutcome.CANCELLED: "cancelled",
}


def timeline(job: Job) -> list[tuple[datetime.datetime, str]]:
    """A job's life as its attempt history records it, oldest first:
    enqueued, each claim (when, by whom) and how it ended, when it is next
    available, and the lease deadline of a running attempt. A job whose
    last attempt failed it says why: "failed permanently" when the attempt
    had attempts left (its handler said not to retry), else "no attempt
    left" (dead letter). A job claimed before histories were kept shows its
    error history instead."""
    events: list[tuple[datetime.datetime, str]] = [(job.created_at, "enqueued")]
    if not job.attempts:
        events += [(entry.at, f"attempt {entry.attempt} failed") for entry in job.errors]
    for n, entry in enumerate(job.attempts, 1):
        if entry.claimed_at is not None:  # else claimed before histories were kept
            events.append((entry.claimed_at, f"attempt {entry.attempt} claimed by {entry.worker_id or 'a worker'}"))
        if entry.ended_at is None:
            if job.status is Status.RUNNING and job.locked_until is not None and n == len(job.attempts):
                events.append((job.locked_until, "lease deadline"))
            continue
        what = f"attempt {entry.attempt} {_ENDED[entry.outcome]}"
        if entry.error is not None:
            what += f": {clip(entry.error)}"
        if job.status is Status.FAILED and n == len(job.attempts) and entry.outcome is not AttemptOutcome.CANCELLED:
            permanent = entry.outcome is AttemptOutcome.FAILED and entry.attempt < job.max_attempts
            what += "; failed permanently" if permanent else "; no attempt left (dead letter)"
        events.append((entry.ended_at, what))
    if job.status is Status.PENDING and job.scheduled_at > events[-1][0]:
        events.append((job.scheduled_at, f"available for attempt {job.attempt + 1}"))
    elif job.status is Status.CANCELLED and not any(e.outcome is AttemptOutcome.CANCELLED for e in job.attempts[-1:]):
        events.append((job.updated_at, "cancelled"))
    events.sort(key=lambda event: event[0])
    return events


def _pretty(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)


def clip(text: str | None, limit: int = LIST_ERROR_CHARS) -> str:
    """*text* cut to *limit* characters, an ellipsis saying it was cut."""
    if text is None:
        return ""
    return text if len(text) <= limit else text[:limit] + "…"


def shown(value: Any) -> tuple[str, int]:
    """JSON as a page shows it: pretty, its first :data:`SHOWN_CHARS`
    characters, and how many it leaves out."""
    text = _pretty(value)
    return text[:SHOWN_CHARS], max(0, len(text) - SHOWN_CHARS)
