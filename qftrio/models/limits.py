"""Caps and name rules shared by the server's checks, the clients and the
worker runtime (docs/protocol.md, "Limits")."""

from __future__ import annotations

import re

NAME_PATTERN = r"^[A-Za-z0-9_.-]{1,128}$"
_NAME_RE = re.compile(NAME_PATTERN)

#: Caps shared by the server's validation and the client's documentation.
MAX_BATCH = 1000
MAX_LEASE_JOBS = 100
MAX_LEASE_SECS = 3600
MAX_WAIT_SECS = 60
#: A workflow has at most this many steps, and this many dependencies in all.
MAX_WORKFLOW_STEPS = 1000
MAX_WORKFLOW_DEPENDENCIES = 20_000
#: A running step adds at most this many steps a call, and at most this many
#: are added to one workflow in all (``POST /api/v1/jobs/{id}/steps``).
MAX_ADDED_STEPS = 1000
MAX_WORKFLOW_GROWN = 10_000
#: ``GET /api/v1/workflows`` pages hold at most this many workflows.
MAX_WORKFLOWS_PAGE = 100
#: Field caps of request bodies (docs/protocol.md lists them). The worker
#: runtime checks its worker id and cuts its errors to these too.
MAX_WORKER_ID = 200
MAX_TOKEN = 200
MAX_ERROR = 65536
MAX_IDEMPOTENCY_KEY = 255
MAX_JOB_ID = 100
MAX_WORKFLOW_NAME = 200
#: A bulk action changes at most this many jobs per call (default 10,000).
MAX_BULK = 1_000_000
#: A page of jobs or workflows stops before the item that would take it past
#: this many bytes, by default (``qftrio serve --max-answer-bytes``).
MAX_ANSWER_BYTES = 8 << 20
#: ``GET /api/v1/queues`` pages hold this many queues unless asked for
#: fewer, and at most ``MAX_QUEUES_PAGE``.
QUEUES_PAGE = 100
MAX_QUEUES_PAGE = 1000
#: A job's timeout, at most (``config.timeout_secs``).
MAX_TIMEOUT_SECS = 7 * 86400
#: Queue stats count the scheduled jobs of a queue up to this many, so that
#: their cost does not grow with the jobs kept.
MAX_SCHEDULED_COUNT = 10_000
#: A snooze's delay and a fail's ``retry_in_secs``, at most.
MAX_DELAY_SECS = 30 * 86400


def timeout_error(timeout_secs: int | None) -> str:
    """The error of an attempt that ran past its job's ``timeout_secs``: the
    server's (its janitor ends the attempt) and the worker runtime's (it
    cancels the handler then), alike."""
    return f"timed out after {timeout_secs} s"
#: A job's ``headers``: the bytes (UTF-8) of all their names and values
#: together, and of one name.
MAX_HEADERS_BYTES = 8192
#: A job's ``progress``: the bytes of its JSON text (docs/worker.md, "Progress").
MAX_PROGRESS_BYTES = 8192
#: A job's ``attempts``: the newest claims its history keeps (each store's
#: statements drop the oldest past it).
MAX_ATTEMPTS_KEPT = 20
#: The longest a wait on a job holds (``GET /api/v1/jobs/{id}/wait``).
MAX_JOB_WAIT_SECS = 60
#: ``GET /api/v1/events?stats_secs=``: at most this many seconds between stats.
MAX_EVENT_STATS_SECS = 60
MAX_HEADER_NAME = 256


def valid_name(name: str) -> bool:
    """Whether *name* is a valid queue or kind name (the whole of it: ``$``
    alone would let a final newline through)."""
    return _NAME_RE.fullmatch(name) is not None

