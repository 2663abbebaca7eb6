"""qftrio's environment variables: ``QFTRIO_NAME``, and the older
``QUEUEFLOW_NAME`` still honoured when the new one is not set."""

from __future__ import annotations

import os
from collections.abc import Mapping

__all__ = ["env"]

PREFIXES = ("QFTRIO_", "QUEUEFLOW_")


def env(name: str, environ: Mapping[str, str] = os.environ) -> str | None:
    """The first non-empty value of ``QFTRIO_<name>`` and
    ``QUEUEFLOW_<name>``, else None."""
    for prefix in PREFIXES:
        value = environ.get(prefix + name)
        if value:
            return value
    return None
