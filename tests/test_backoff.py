"""The one backoff every retry of qftrio waits by."""

from __future__ import annotations

import pytest

from qftrio._backoff import backoff


def test_doubles_from_base_up_to_cap() -> None:
    waits = [backoff(n, base=0.5, cap=15.0, rand=lambda: 0.0) for n in range(1, 8)]
    assert waits == [0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 15.0]
    assert backoff(0, base=0.5, cap=15.0, rand=lambda: 0.0) == 0.5  # no failure yet counts as the first


def test_jitter_takes_off_at_most_its_share() -> None:
    assert backoff(3, base=1.0, cap=60.0, rand=lambda: 1.0) == 2.0  # the default jitter: half off at most
    assert backoff(3, base=1.0, cap=60.0, jitter=0.25, rand=lambda: 1.0) == 3.0
    assert backoff(3, base=1.0, cap=60.0, jitter=0.0) == 4.0
    for _ in range(200):
        assert 2.0 <= backoff(3, base=1.0, cap=60.0) <= 4.0


@pytest.mark.parametrize("failures", [1025, 10**6])
def test_no_overflow_after_very_many_failures(failures: int) -> None:
    assert backoff(failures, base=1.0, cap=3600.0, rand=lambda: 0.0) == 3600.0
    assert backoff(failures, base=1e300, cap=3600.0, rand=lambda: 0.0) == 3600.0
