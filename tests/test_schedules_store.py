"""Schedules in the store conformance suite: every backend runs these
unchanged, on Trio's autojump clock (docs/schedules.md)."""

from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pytest
import trio

from qftrio import errors
from qftrio.models import Job, ScheduleRequest
from qftrio.server.engine import Engine
from qftrio.server.store.base import Store

T = "acme"


def put(cron: str, *, kind: str = "tick", **fields: object) -> ScheduleRequest:
    return ScheduleRequest.model_validate({"cron": cron, "job": {"kind": kind, "config": {"queue": "cron"}}, **fields})


async def jobs_of(engine: Engine, name: str) -> list[Job]:
    jobs, _ = await engine.jobs_list(T, queue="cron", limit=1000)
    return sorted((j for j in jobs if j.schedule == name), key=lambda j: j.scheduled_at)


def engine_at(storage: Store, start: float) -> Engine:
    """An engine whose wall clock is *start* when Trio's clock is now."""
    origin = trio.current_time()
    return Engine(storage, clock=lambda: start + trio.current_time() - origin)


async def run_rounds(engines: list[Engine], secs: float, step: float = 1.0) -> None:
    """Janitor rounds of every engine at once, every *step* seconds."""
    for _ in range(int(secs / step)):
        async with trio.open_nursery() as nursery:
            for e in engines:
                nursery.start_soon(e.fire_schedules)
        await trio.sleep(step)


async def test_each_tick_enqueues_one_job_however_many_servers_try(storage: Store, autojump_clock: trio.abc.Clock) -> None:
    engines = [engine_at(storage, 1_800_000_000.0) for _ in range(3)]
    schedule, created = await engines[0].schedule_put(T, "every-5s", put("*/5 * * * * *", catch_up="all"))
    assert created and schedule.next_run_at.timestamp() == 1_800_000_005.0  # the first tick after now
    await run_rounds(engines, 31)
    jobs = await jobs_of(engines[0], "every-5s")
    assert [j.scheduled_at.timestamp() for j in jobs] == [1_800_000_000.0 + 5 * k for k in range(1, 7)]
    assert {(j.kind, j.queue, j.schedule) for j in jobs} == {("tick", "cron", "every-5s")}
    shown = await engines[0].schedule_get(T, "every-5s")
    assert shown.last_run_at == jobs[-1].scheduled_at and shown.last_job_id == jobs[-1].id
    assert shown.next_run_at.timestamp() == jobs[-1].scheduled_at.timestamp() + 5


@pytest.mark.parametrize(("catch_up", "expected"), [("latest", [5]), ("none", []), ("all", [1, 2, 3, 4, 5])])
async def test_ticks_missed_while_every_server_was_down_follow_catch_up(
    storage: Store, autojump_clock: trio.abc.Clock, catch_up: str, expected: list[int]
) -> None:
    hour = 3600.0
    base = 1_800_000_000.0 // hour * hour
    engine = engine_at(storage, base + 60)
    await engine.schedule_put(T, "hourly", put("0 * * * *", catch_up=catch_up))
    await trio.sleep(5 * hour + 600)  # no server runs a round meanwhile
    await engine.fire_schedules()
    await engine.fire_schedules()
    assert [(j.scheduled_at.timestamp() - base) / hour for j in await jobs_of(engine, "hourly")] == expected
    assert (await engine.schedule_get(T, "hourly")).next_run_at.timestamp() == base + 6 * hour


async def test_putting_the_same_timing_again_keeps_the_due_tick(storage: Store, autojump_clock: trio.abc.Clock) -> None:
    engine = engine_at(storage, 1_800_000_030.0)
    await engine.schedule_put(T, "m", put("* * * * *"))
    await trio.sleep(600)  # down for ten minutes; restarted with the same file
    schedule, created = await engine.schedule_put(T, "m", put("* * * * *"))
    assert not created
    await engine.fire_schedules()
    # latest: the tick within the grace (60 s), and none of the nine before it
    assert [j.scheduled_at.timestamp() for j in await jobs_of(engine, "m")] == [1_800_000_600.0]


async def test_a_paused_schedule_fires_nothing_and_resumes_from_now(storage: Store, autojump_clock: trio.abc.Clock) -> None:
    engine = engine_at(storage, 1_800_000_000.0)
    await engine.schedule_put(T, "p", put("*/10 * * * * *", catch_up="all"))
    paused = await engine.schedule_pause(T, "p")
    assert paused.paused and paused.next_run_at is None
    assert (await engine.schedule_pause(T, "p")).paused
    await run_rounds([engine], 30)
    assert await jobs_of(engine, "p") == []
    resumed = await engine.schedule_resume(T, "p")
    assert not resumed.paused and resumed.next_run_at.timestamp() == 1_800_000_040.0
    await run_rounds([engine], 11)
    assert [j.scheduled_at.timestamp() for j in await jobs_of(engine, "p")] == [1_800_000_040.0]


async def test_trigger_enqueues_one_job_now_and_keeps_the_next_run(storage: Store, autojump_clock: trio.abc.Clock) -> None:
    engine = engine_at(storage, 1_800_000_000.5)
    await engine.schedule_put(T, "t", put("0 0 1 1 *", paused=True, kind="report"))
    schedule, job = await engine.schedule_trigger(T, "t")
    assert (job.kind, job.schedule, job.scheduled_at.timestamp()) == ("report", "t", 1_800_000_000.5)
    assert schedule.last_job_id == job.id and schedule.last_run_at.timestamp() == 1_800_000_000.5
    assert schedule.paused and schedule.next_run_at is None
    assert (await engine.job_get(T, job.id)).schedule == "t"
    with pytest.raises(errors.NotFound):
        await engine.schedule_trigger(T, "nope")


async def test_schedules_are_the_tenants_own_and_delete_keeps_their_jobs(
    storage: Store, autojump_clock: trio.abc.Clock
) -> None:
    engine = engine_at(storage, 1_800_000_000.0)
    for name in ("b", "a", "c"):
        await engine.schedule_put(T, name, put("* * * * *"))
    page, cursor = await engine.schedules_list(T, limit=2)
    assert [s.name for s in page] == ["a", "b"] and cursor == "b"
    page, cursor = await engine.schedules_list(T, limit=2, cursor=cursor)
    assert [s.name for s in page] == ["c"] and cursor is None
    assert await engine.schedules_list("globex") == ([], None)
    with pytest.raises(errors.NotFound):
        await engine.schedule_get("globex", "a")
    _, job = await engine.schedule_trigger(T, "a")
    await engine.schedule_delete(T, "a")
    with pytest.raises(errors.NotFound):
        await engine.schedule_get(T, "a")
    with pytest.raises(errors.NotFound):
        await engine.schedule_delete(T, "a")
    assert (await engine.job_get(T, job.id)).schedule == "a"


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"cron": "61 * * * *"}, "cron"),
        ({"cron": "* * * * *", "timezone": "Europe/Atlantis"}, "timezone"),
        ({"cron": "* * * * *", "job": {"kind": "k", "config": {"idempotency_key": "x"}}}, "job.config.idempotency_key"),
        ({"cron": "* * * * *", "job": {"kind": "k", "config": {"scheduled_at": "2030-01-01T00:00:00Z"}}}, "job.config.scheduled_at"),
    ],
)
async def test_bad_input_is_refused_naming_the_field_and_nothing_is_stored(
    storage: Store, autojump_clock: trio.abc.Clock, body: dict[str, object], field: str
) -> None:
    engine = engine_at(storage, 1_800_000_000.0)
    request = ScheduleRequest.model_validate({"job": {"kind": "k"}, **body})
    with pytest.raises(errors.InvalidInput, match=f"^{field}: "):
        await engine.schedule_put(T, "bad", request)
    assert await engine.schedules_list(T) == ([], None)


@pytest.mark.parametrize(
    ("zone", "start", "expected"),
    [
        ("Europe/Paris", (2026, 3, 28), ["2026-03-28T02:30:00+01:00", "2026-03-29T03:00:00+02:00", "2026-03-30T02:30:00+02:00"]),
        ("Europe/Paris", (2026, 10, 24), ["2026-10-24T02:30:00+02:00", "2026-10-25T02:30:00+02:00", "2026-10-26T02:30:00+01:00"]),
        ("America/New_York", (2026, 3, 7), ["2026-03-07T02:30:00-05:00", "2026-03-08T03:00:00-04:00", "2026-03-09T02:30:00-04:00"]),
        ("America/New_York", (2026, 10, 31), ["2026-10-31T02:30:00-04:00", "2026-11-01T02:30:00-05:00", "2026-11-02T02:30:00-05:00"]),
    ],
)
async def test_a_0230_schedule_runs_once_a_day_across_daylight_saving_changes(
    storage: Store, autojump_clock: trio.abc.Clock, zone: str, start: tuple[int, int, int], expected: list[str]
) -> None:
    tz = ZoneInfo(zone)
    engine = engine_at(storage, dt.datetime(*start, tzinfo=tz).timestamp())
    await engine.schedule_put(T, "nightly", put("30 2 * * *", timezone=zone))
    await run_rounds([engine], 3 * 86400, step=20 * 60)  # a round every 20 minutes for three days
    jobs = await jobs_of(engine, "nightly")
    assert [j.scheduled_at.astimezone(tz).isoformat() for j in jobs] == expected
