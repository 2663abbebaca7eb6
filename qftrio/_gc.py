"""The cyclic garbage collector's settings for qftrio's own long-running
processes (``qftrio serve``, ``qftrio worker``), applied once their imports
are done. Library use (an embedded worker, the test suite) keeps the
interpreter's defaults.

With the defaults, the collector's full passes walk every object the
imports made, about once a second under load. Moving what exists at
start-up out of the collector's reach (:func:`gc.freeze`) and collecting the
youngest generation less often removes most of that cost; the figures are in
``docs/performance.md`` ("The garbage collector").
"""

from __future__ import annotations

import gc

__all__ = ["settle_after_imports"]

#: Net allocations between two collections of the youngest generation.
YOUNG_THRESHOLD = 10_000


def settle_after_imports() -> None:
    """Collect once, freeze what survives, raise the young threshold."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
