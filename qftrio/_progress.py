"""The progress a handler reports: ``job.progress(obj)`` hands it to the
worker runtime running that handler, through a context variable the runtime
sets in the job's task (a synchronous handler's thread runs in a copy of it)."""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any

#: Where the handler running in this context reports: ``(job_id, progress)``.
sink: contextvars.ContextVar[Callable[[str, dict[str, Any]], None]] = contextvars.ContextVar("qftrio_progress")


def report(job_id: str, progress: dict[str, Any]) -> None:
    try:
        send = sink.get()
    except LookupError:
        raise RuntimeError("job.progress() reports from inside a handler that a qftrio worker runs") from None
    send(job_id, progress)
