"""The decisions of cron schedules, no I/O: which ticks a round fires,
catch-up, and daylight-saving changes (docs/schedules.md)."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pytest

from qftrio import errors
from qftrio.server import schedules


def at(zone: str, *args: int, fold: int = 0) -> float:
    return dt.datetime(*args, tzinfo=ZoneInfo(zone), fold=fold).timestamp()  # type: ignore[misc]


def local(zone: str, t: float) -> str:
    return dt.datetime.fromtimestamp(t, ZoneInfo(zone)).isoformat()


def ticks(cron: str, zone: str, start: float, n: int) -> list[str]:
    out = []
    t: float | None = start
    for _ in range(n):
        t = schedules.next_after(cron, zone, t)  # type: ignore[arg-type]
        assert t is not None
        out.append(local(zone, t))
    return out


@pytest.mark.parametrize(
    ("zone", "day", "expected"),
    [
        # Spring forward: 02:30 does not exist that night; it runs once, at 03:00.
        ("Europe/Paris", (2026, 3, 28), ["2026-03-28T02:30:00+01:00", "2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00"]),
        ("America/New_York", (2026, 3, 7), ["2026-03-07T02:30:00-05:00", "2026-03-08T03:00:00-04:00", "2026-03-09T02:30:00-04:00"]),
        # Fall back: 02:30 (Paris) and 01:30 (New York) happen twice; each runs once, at the first.
        ("Europe/Paris", (2026, 10, 24), ["2026-10-24T02:30:00+02:00", "2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00"]),
    ],
)
def test_a_daily_time_runs_once_on_either_change(zone: str, day: tuple[int, int, int], expected: list[str]) -> None:
    assert ticks("30 2 * * *", zone, at(zone, *day, 0, 0), 3) == expected


def test_a_repeated_hour_runs_once_in_new_york() -> None:
    zone = "America/New_York"
    assert ticks("30 1 * * *", zone, at(zone, 2026, 10, 31, 12), 3) == [
        "2026-11-01T01:30:00-04:00", "2026-11-02T01:30:00-05:00", "2026-11-03T01:30:00-05:00",
    ]  # fmt: skip


def test_an_interval_follows_real_time_through_the_repeated_hour() -> None:
    zone = "Europe/Paris"
    assert ticks("*/30 * * * *", zone, at(zone, 2026, 10, 25, 1, 45), 5) == [
        "2026-10-25T02:00:00+02:00", "2026-10-25T02:30:00+02:00", "2026-10-25T02:00:00+01:00",
        "2026-10-25T02:30:00+01:00", "2026-10-25T03:00:00+01:00",
    ]  # fmt: skip


def test_a_leading_seconds_field() -> None:
    assert schedules.next_after("*/15 * * * * *", "UTC", 1000.0) == 1005.0  # 1005 = 16 min 45 s


@pytest.mark.parametrize(
    ("cron", "timezone", "field"),
    [
        ("61 * * * *", "UTC", "cron"),
        ("* * *", "UTC", "cron"),
        ("0 0 30 2 *", "UTC", "cron"),
        ("not cron at all", "UTC", "cron"),
        ("* * * * *", "Mars/Olympus", "timezone"),
        ("* * * * *", "../etc/passwd", "timezone"),
        ("* * * * *", "", "timezone"),
    ],
)
def test_what_cannot_fire_is_refused_naming_the_field(cron: str, timezone: str, field: str) -> None:
    with pytest.raises(errors.InvalidInput, match=f"^{field}: "):
        schedules.check(cron, timezone)


HOUR = 3600.0


def test_a_round_on_time_fires_the_due_ticks_whatever_catch_up_says() -> None:
    for catch_up in ("latest", "none", "all"):
        fire = schedules.due("*/5 * * * * *", "UTC", next_run_at=1000.0, now=1012.0, catch_up=catch_up)  # type: ignore[arg-type]
        assert fire == schedules.Fire(ticks=(1000.0, 1005.0, 1010.0), next_run_at=1015.0)


@pytest.mark.parametrize(
    ("catch_up", "fired"),
    [("latest", [5 * HOUR]), ("none", []), ("all", [h * HOUR for h in range(1, 6)])],
)
def test_ticks_missed_while_no_server_ran_follow_catch_up(catch_up: schedules.CatchUp, fired: list[float]) -> None:
    fire = schedules.due("0 * * * *", "UTC", next_run_at=HOUR, now=5 * HOUR + 1800, catch_up=catch_up)
    assert list(fire.ticks) == fired
    assert fire.next_run_at == 6 * HOUR


def test_all_catches_up_the_latest_hundred_missed() -> None:
    fire = schedules.due("* * * * *", "UTC", next_run_at=60.0, now=1000 * 60 + 30, catch_up="all")
    # the 100 missed before the grace, and the one within it
    assert fire.ticks == tuple(m * 60.0 for m in range(900, 1001))


def test_a_tick_within_the_grace_fires_and_latest_adds_no_other() -> None:
    fire = schedules.due("* * * * *", "UTC", next_run_at=60.0, now=HOUR + 10, catch_up="latest")
    assert fire.ticks == (HOUR,)


def test_the_same_timing_put_again_keeps_the_pending_tick() -> None:
    old = ("0 * * * *", "UTC", False, HOUR)
    assert schedules.next_on_put(old, cron="0 * * * *", timezone="UTC", paused=False, now=5 * HOUR + 1) == HOUR
    assert schedules.next_on_put(old, cron="30 * * * *", timezone="UTC", paused=False, now=5 * HOUR + 1) == 5.5 * HOUR
    assert schedules.next_on_put(old, cron="0 * * * *", timezone="UTC", paused=True, now=5 * HOUR) is None
