"""The cyclic garbage collector's settings for qftrio's own long-running
processes (``qftrio serve``, ``qftrio worker``), applied once their imports
are done. Library use (an embedded worker, the test suite) keeps the
interpreter's defaults.

With the defaults, the collector's full passes walked every object the
imports had made (50,000-75,000 of them) about once a second under load:
16 µs of the server's CPU per job and 20 µs of a worker's, measured with
``gc.callbacks`` during ``benchmarks/throughput.py --store postgres``.
Moving what exists at start-up out of the collector's reach
(:func:`gc.freeze`) and collecting the youngest generation every 10,000
net allocations instead of 700 brought that to 2 µs in both.
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
