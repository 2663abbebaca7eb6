"""The one backoff of qftrio: how long to wait before trying again.

Every retry qftrio schedules waits this way: a job's retry after a failed
attempt (the engine's ``RetryPolicy``), the worker's lease and report calls,
the PostgreSQL store's LISTEN reconnects and its transactions run again after
a conflict. Each caller keeps its own base and cap (documented where it is).
"""

from __future__ import annotations

import random
from collections.abc import Callable

__all__ = ["backoff"]

# 2.0 ** 1023 is the largest power of two a float holds: beyond it the
# exponent is not raised further (the cap has long been reached).
_MAX_EXPONENT = 1023


def backoff(
    failures: int,
    *,
    base: float,
    cap: float,
    jitter: float = 0.5,
    factor: float = 2.0,
    rand: Callable[[], float] = random.random,
) -> float:
    """Seconds to wait after *failures* failures in a row (1 for the first):
    ``min(cap, base * factor**(failures - 1))``, scaled by a random factor in
    ``[1 - jitter, 1]`` so that many clients do not retry in lockstep.

    Args:
        failures: how many tries failed in a row; 0 counts as 1.
        base: the wait after the first failure, before jitter.
        cap: the longest wait, before jitter.
        jitter: how much of the wait may be taken off at random (0 to 1).
        factor: how much longer each wait is than the one before (1 or more).
        rand: a source of numbers in ``[0, 1)``.
    """
    exponent = min(max(0, failures - 1), _MAX_EXPONENT)
    try:
        raw = min(cap, base * factor**exponent)
    except OverflowError:  # a factor above 2 reaches the cap long before
        raw = cap
    return raw * (1.0 - jitter * rand())
