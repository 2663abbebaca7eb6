"""The Trio worker runtime: registry, runtime, and transports."""

from .registry import Handler as Handler, Registry as Registry, load_registry as load_registry
from .runtime import (
    Worker as Worker,
    WorkerEvent as WorkerEvent,
    WorkerStatistics as WorkerStatistics,
    default_worker_id as default_worker_id,
    open_worker as open_worker,
)
from .transport import EngineTransport as EngineTransport, HttpTransport as HttpTransport, Transport as Transport

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
    "EngineTransport",
]
