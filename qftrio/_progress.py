"""What a handler asks of the worker runtime running it, through context
variables the runtime sets in the job's task (a synchronous handler's
thread runs in a copy of them): ``job.progress(obj)`` hands it the progress
to report, ``await job.add_steps(...)`` the steps to add to the job's
workflow."""

from __future__ import annotations

import contextvars
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

#: Where the handler running in this context reports: ``(job_id, progress)``.
sink: contextvars.ContextVar[Callable[[str, dict[str, Any]], None]] = contextvars.ContextVar("qftrio_progress")


def report(job_id: str, progress: dict[str, Any]) -> None:
    try:
        send = sink.get()
    except LookupError:
        raise RuntimeError("job.progress() reports from inside a handler that a qftrio worker runs") from None
    send(job_id, progress)


#: Where ``await job.add_steps(...)`` of the handler running in this
#: context goes: ``(job_id, steps, collect)``, answering the workflow.
steps_sink: contextvars.ContextVar[Callable[[str, Sequence[Any], str | None], Awaitable[Any]]] = contextvars.ContextVar(
    "qftrio_steps"
)


async def add_steps(job_id: str, steps: Sequence[Any], collect: str | None) -> Any:
    try:
        send = steps_sink.get()
    except LookupError:
        raise RuntimeError("job.add_steps() adds steps from inside a handler that a qftrio worker runs") from None
    return await send(job_id, steps, collect)
