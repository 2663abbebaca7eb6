"""The failed-credential throttle on its own: token buckets by address, and
a table whose memory is bounded."""

from __future__ import annotations

import pytest

from qftrio.server.throttle import Throttle, client_key


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_an_address_is_throttled_past_its_burst_and_forgiven_as_time_passes() -> None:
    clock = FakeClock()
    throttle = Throttle(burst=3, refill_secs=10, clock=clock)
    for _ in range(3):
        assert throttle.retry_after("a") is None
        throttle.fail("a")
    assert throttle.retry_after("a") == pytest.approx(10)
    assert throttle.retry_after("b") is None  # another address is untouched
    clock.now += 4
    assert throttle.retry_after("a") == pytest.approx(6)
    clock.now += 6
    assert throttle.retry_after("a") is None  # one failure forgiven: one more try
    throttle.fail("a")
    assert throttle.retry_after("a") == pytest.approx(10)


def test_buckets_that_filled_up_again_are_forgotten() -> None:
    clock = FakeClock()
    throttle = Throttle(burst=2, refill_secs=5, clock=clock)
    throttle.fail("a")
    clock.now += 5  # "a" is full again
    throttle.fail("b")
    assert len(throttle) == 1
    assert throttle.retry_after("a") is None


def test_the_table_is_capped_and_drops_the_least_recently_failing() -> None:
    clock = FakeClock()
    throttle = Throttle(burst=1, refill_secs=3600, max_addresses=100, clock=clock)
    for i in range(10_000):
        throttle.fail(f"10.0.{i // 256}.{i % 256}")
    assert len(throttle) == 100
    assert throttle.retry_after("10.0.39.15") is not None  # the last one, kept
    assert throttle.retry_after("10.0.0.0") is None  # the first, forgotten


@pytest.mark.parametrize(
    ("host", "key"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:ffff::1", "2001:db8:1:2::/64"),
        ("::ffff:192.0.2.7", "192.0.2.7"),
        ("not-an-address", "not-an-address"),
    ],
)
def test_addresses_are_keyed_by_host_and_ipv6_by_its_64(host: str, key: str) -> None:
    assert client_key(host) == key
