"""The Trio worker runtime: registry, runtime, and the transport interface
(with its HTTP implementation; the in-process one is the server's,
:mod:`qftrio.server.inprocess`)."""

from .registry import Handler as Handler, Registry as Registry, load_registry as load_registry
from .runtime import (
    Worker as Worker,
    WorkerEvent as WorkerEvent,
    WorkerStatistics as WorkerStatistics,
    default_worker_id as default_worker_id,
    open_worker as open_worker,
)
from ..errors import UnexpectedAnswer as UnexpectedAnswer
from .transport import HttpTransport as HttpTransport, Transport as Transport

__all__ = [
    "Registry",
    "Handler",
    "load_registry",
    "Worker",
    "WorkerEvent",
    "WorkerStatistics",
    "open_worker",
    "default_worker_id",
    "Transport",
    "HttpTransport",
    "UnexpectedAnswer",
]
