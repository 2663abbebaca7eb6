"""Handlers by job kind.

::

    registry = qftrio.Registry()

    @registry.handler("resize-image", timeout=30)
    async def resize(job: qftrio.Job) -> dict[str, Any]:
        ...

A handler takes the :class:`~qftrio.models.Job` and returns a JSON object (a
``dict``) or ``None``. Async handlers run in the worker's Trio task;
synchronous ones run in a worker thread (:func:`trio.to_thread.run_sync`).

qftrio ships type information (``py.typed``): under ``mypy --strict`` a
decorated handler keeps its own signature, and a function that cannot take a
job, or returns anything but a ``dict`` or ``None``, is reported where it is
registered.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import inspect
import logging
import os
import sys
import traceback
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

from ..errors import ConfigError
from ..models import Job, valid_name

__all__ = ["Registry", "Handler", "HandlerFn", "HandlerResult", "load_registry"]

#: What a handler returns: a JSON object or None, or (async handlers) an awaitable of one.
HandlerResult = Awaitable[dict[str, Any] | None] | dict[str, Any] | None
#: A handler: called with the job, once per attempt.
HandlerFn = Callable[[Job], HandlerResult]
#: The type of the function :meth:`Registry.handler` decorates, which it
#: returns unchanged: a type checker still sees its own signature, sync or
#: async, and refuses one that cannot take a job or returns something else.
H = TypeVar("H", bound=HandlerFn)

log = logging.getLogger("qftrio.worker")


def _is_async(fn: Callable[..., Any]) -> bool:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Handler:
    """A registered handler.

    Attributes:
        kind: the job kind it runs.
        fn: the function.
        timeout: seconds the handler may run before it is cancelled and the
            job failed (retryable); ``None`` for no limit but the lease's.
        is_async: whether *fn* is a coroutine function.
    """

    kind: str
    fn: Callable[[Job], Any]
    timeout: float | None
    is_async: bool


class Registry:
    """Maps job kinds to handlers."""

    def __init__(self) -> None:
        self._handlers: dict[str, Handler] = {}

    def handler(self, kind: str, *, timeout: float | None = None) -> Callable[[H], H]:
        """Decorator: register the function as the handler of *kind*, and
        return it unchanged (see :meth:`add`)."""

        def register(fn: H) -> H:
            self.add(kind, fn, timeout=timeout)
            return fn

        return register

    def add(self, kind: str, fn: HandlerFn, *, timeout: float | None = None) -> None:
        """Register *fn* for *kind*.

        Raises:
            ConfigError: *kind* is not a valid name, already has a handler,
                or *timeout* is not positive.
        """
        if not valid_name(kind):
            raise ConfigError(f"handler kind {kind!r}: use 1-128 characters of A-Z a-z 0-9 _ . -")
        if kind in self._handlers:
            raise ConfigError(f"handler kind {kind!r} is registered twice")
        if timeout is not None and not timeout > 0:
            raise ConfigError(f"handler {kind!r}: timeout must be positive, not {timeout!r}")
        if not callable(fn):
            raise ConfigError(f"handler {kind!r}: {fn!r} is not callable")
        self._handlers[kind] = Handler(kind=kind, fn=fn, timeout=timeout, is_async=_is_async(fn))

    def get(self, kind: str) -> Handler | None:
        return self._handlers.get(kind)

    @property
    def kinds(self) -> list[str]:
        return sorted(self._handlers)

    def __contains__(self, kind: object) -> bool:
        return kind in self._handlers

    def __iter__(self) -> Iterator[Handler]:
        return iter(list(self._handlers.values()))

    def __len__(self) -> int:
        return len(self._handlers)

    def __repr__(self) -> str:
        return f"<Registry kinds={self.kinds}>"


def load_registry(ref: str) -> Registry:
    """Import ``module:attr`` and return the :class:`Registry` it names.

    The current directory is importable, so ``qftrio worker images
    handlers:registry`` finds ``./handlers.py``.

    Raises:
        ConfigError: one clear sentence for anything that goes wrong (a bad
            reference, an import that fails, a missing attribute, not a
            registry). An import that fails is named with the file and line
            where it did; its traceback goes to the ``qftrio.worker`` logger
            at DEBUG.
    """
    module_name, sep, attr = ref.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"registry {ref!r}: expected module:attribute, e.g. handlers:registry")
    if "" not in sys.path and "." not in sys.path:
        cwd = os.getcwd()
        if cwd not in sys.path:
            sys.path.insert(0, cwd)
    try:
        module = importlib.import_module(module_name)
    except BaseException as exc:  # a user's module can raise anything while importing
        if isinstance(exc, (KeyboardInterrupt, SystemExit)):
            raise
        if isinstance(exc, ModuleNotFoundError) and exc.name and module_name.startswith(exc.name):
            raise ConfigError(f"registry {ref!r}: no module named {module_name!r}") from None
        log.debug("importing %r failed", module_name, exc_info=exc)
        raise ConfigError(
            f"registry {ref!r}: importing {module_name!r} failed at {_where(exc)}: {type(exc).__name__}: {exc}"
            " (--log-level DEBUG shows the traceback)"
        ) from None
    obj: Any = module
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ConfigError(f"registry {ref!r}: module {module_name!r} has no attribute {attr!r}") from None
    if not isinstance(obj, Registry):
        raise ConfigError(f"registry {ref!r} is a {type(obj).__name__}, not a qftrio Registry")
    return obj


def _where(exc: BaseException) -> str:
    """``file:line`` where *exc* was raised: the innermost frame that is not
    the import machinery's, or the place of a syntax error."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}:{exc.lineno}"
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<frozen ")]
    if not frames:
        return "an unknown place"
    return f"{frames[-1].filename}:{frames[-1].lineno}"
