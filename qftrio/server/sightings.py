"""The workers' sightings: which lease callers this server has written to the
store lately, so that a worker's lease calls cost at most one write per few
seconds and a caller inventing worker ids grows nothing without bound."""

from __future__ import annotations

import collections

__all__ = ["Sightings"]


class Sightings:
    """Which ``(worker_id, queue)`` lease callers this server wrote to the
    store, and when: a pair is written again only once *every* seconds have
    passed, so a worker's lease calls cost at most one write per few seconds.

    Bounded: pairs not written for *window* seconds are forgotten (the
    oldest writes first), and at most *capacity* pairs are kept. A new pair
    arriving when that many were written within the window is not recorded
    (nor written): a caller sending endless worker ids grows neither this
    server's memory nor the table, and each server adds at most *capacity*
    rows per window. The workers list then misses such pairs until room
    frees up; :attr:`refused` counts them.
    """

    def __init__(self, *, every: float, window: float, capacity: int) -> None:
        self.every = every
        self.window = window
        self.capacity = capacity
        self.refused = 0
        # Oldest write first, so expired pairs are found at the front.
        self._written: collections.OrderedDict[tuple[str, str], float] = collections.OrderedDict()

    def due(self, worker_id: str, queue: str, now: float) -> bool:
        """Whether the pair is to be written now; if so, it counts as
        written at *now*."""
        key = (worker_id, queue)
        last = self._written.get(key)
        if last is not None and now - last < self.every:
            return False
        while self._written:
            oldest, at = next(iter(self._written.items()))
            if now - at < self.window:
                break
            del self._written[oldest]
        if key not in self._written and len(self._written) >= self.capacity:
            self.refused += 1
            return False
        self._written[key] = now
        self._written.move_to_end(key)
        return True

    def __len__(self) -> int:
        return len(self._written)
