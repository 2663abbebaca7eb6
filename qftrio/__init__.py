"""qftrio: a durable job server and a Trio worker runtime.

The public surface: write handlers with :class:`Registry`, run them with
:class:`Worker` / :func:`open_worker` (or ``qftrio worker``), talk to a server
with :class:`Client` (async) or :class:`SyncClient` (blocking). Everything
else lives in submodules whose API is not stable.
"""

from .client import Client as Client, SyncClient as SyncClient
from .errors import (
    ApiError as ApiError,
    BadRequest as BadRequest,
    ConfigError as ConfigError,
    Conflict as Conflict,
    Forbidden as Forbidden,
    InvalidInput as InvalidInput,
    NotFound as NotFound,
    PayloadTooLarge as PayloadTooLarge,
    PermanentError as PermanentError,
    QftrioError as QftrioError,
    RetryIn as RetryIn,
    Snooze as Snooze,
    TransportError as TransportError,
    Unauthorized as Unauthorized,
    Unavailable as Unavailable,
    UnexpectedAnswer as UnexpectedAnswer,
)
from .models import (
    Job as Job,
    Lease as Lease,
    QueueStats as QueueStats,
    Status as Status,
    WorkerInfo as WorkerInfo,
    Workflow as Workflow,
    WorkflowStatus as WorkflowStatus,
)
from .worker.registry import Registry as Registry
from .worker.runtime import Worker as Worker, WorkerEvent as WorkerEvent, open_worker as open_worker
from .worker.transport import HttpTransport as HttpTransport

__version__ = "0.1.0"

__all__ = [
    "Client",
    "SyncClient",
    "ApiError",
    "BadRequest",
    "ConfigError",
    "Conflict",
    "Forbidden",
    "InvalidInput",
    "NotFound",
    "PayloadTooLarge",
    "PermanentError",
    "QftrioError",
    "RetryIn",
    "Snooze",
    "TransportError",
    "Unauthorized",
    "Unavailable",
    "UnexpectedAnswer",
    "Job",
    "Lease",
    "QueueStats",
    "Status",
    "WorkerInfo",
    "Workflow",
    "WorkflowStatus",
    "HttpTransport",
    "Registry",
    "Worker",
    "WorkerEvent",
    "open_worker",
]

# Show public names where users find them (``qftrio.Job``, not
# ``qftrio.models.Job``) in reprs, tracebacks and docs, as trio does.
for _name in __all__:
    _obj = globals()[_name]
    if getattr(_obj, "__module__", "").startswith("qftrio."):
        try:
            _obj.__module__ = "qftrio"
        except (AttributeError, TypeError):
            pass
del _name, _obj
