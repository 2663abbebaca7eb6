"""Schedules over real HTTP, on both stores (docs/schedules.md, docs/protocol.md)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from qftrio import Client, errors
from qftrio.models import ScheduleRequest

from .conftest import RunningServer
from .test_dashboard import form_csrf, signed_in

BODY: dict[str, Any] = {"cron": "0 * * * *", "job": {"kind": "report", "payload": {"a": 1}, "config": {"queue": "cron"}}}


async def test_a_schedule_over_http(http: httpx.AsyncClient, server: RunningServer) -> None:
    h = server.headers()
    r = await http.put("/api/v1/schedules/hourly", json=BODY, headers=h)
    assert r.status_code == 201, r.text
    created = r.json()
    assert created["name"] == "hourly" and created["timezone"] == "UTC" and created["catch_up"] == "latest"
    assert created["next_run_at"].endswith(":00:00.000000Z") and created["last_run_at"] is None
    r = await http.put("/api/v1/schedules/hourly", json={**BODY, "catch_up": "all"}, headers=h)
    assert r.status_code == 200 and r.json()["catch_up"] == "all"
    assert r.json()["next_run_at"] == created["next_run_at"]  # the same timing keeps its tick

    r = await http.get("/api/v1/schedules", headers=h)
    assert r.status_code == 200 and [s["name"] for s in r.json()["schedules"]] == ["hourly"]
    assert r.json()["next_cursor"] is None
    assert (await http.get("/api/v1/schedules", headers=server.headers("globex"))).json()["schedules"] == []
    assert (await http.get("/api/v1/schedules/hourly", headers=server.headers("globex"))).status_code == 404

    r = await http.post("/api/v1/schedules/hourly/pause", headers=h)
    assert r.status_code == 200 and r.json()["paused"] and r.json()["next_run_at"] is None
    r = await http.post("/api/v1/schedules/hourly/resume", headers=h)
    assert r.status_code == 200 and not r.json()["paused"] and r.json()["next_run_at"] == created["next_run_at"]

    r = await http.post("/api/v1/schedules/hourly/trigger", headers=h)
    assert r.status_code == 201
    job = r.json()["job"]
    assert (job["kind"], job["queue"], job["payload"], job["schedule"]) == ("report", "cron", {"a": 1}, "hourly")
    assert r.json()["schedule"]["last_job_id"] == job["id"]
    assert (await http.get(f"/api/v1/jobs/{job['id']}", headers=h)).json()["schedule"] == "hourly"

    assert (await http.delete("/api/v1/schedules/hourly", headers=h)).status_code == 204
    assert (await http.delete("/api/v1/schedules/hourly", headers=h)).status_code == 404
    assert (await http.get("/api/v1/schedules/hourly", headers=h)).status_code == 404
    assert (await http.post("/api/v1/schedules/hourly/trigger", headers=h)).status_code == 404


async def test_the_janitor_fires_a_due_tick_and_wakes_the_queue(http: httpx.AsyncClient, server: RunningServer) -> None:
    h = server.headers()
    assert (await http.put("/api/v1/schedules/hourly", json=BODY, headers=h)).status_code == 201
    server.clock.advance(3600)  # the tick is due: the next janitor round enqueues its job
    r = await http.post(
        "/api/v1/queues/cron/lease", json={"wait_secs": 60, "worker_id": "w"}, headers=server.headers("worker")
    )
    assert r.status_code == 200
    (leased,) = r.json()["jobs"]
    assert leased["job"]["schedule"] == "hourly" and leased["job"]["kind"] == "report"
    shown = (await http.get("/api/v1/schedules/hourly", headers=h)).json()
    assert shown["last_job_id"] == leased["job"]["id"] and shown["last_run_at"] == leased["job"]["scheduled_at"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"cron": "61 * * * *"}, "cron"),
        ({"timezone": "Europe/Atlantis"}, "timezone"),
        ({"catch_up": "some"}, "catch_up"),
        ({"job": {"kind": "k", "config": {"queue": "no spaces"}}}, "job.config.queue"),
        ({"job": {"kind": "k", "config": {"delay_secs": -1}}}, "job.config.delay_secs"),
        ({"job": {"kind": "k", "config": {"idempotency_key": "once"}}}, "job.config.idempotency_key"),
        ({"paused": "yes"}, "paused"),
    ],
)
async def test_bad_input_is_a_422_naming_the_field_and_stores_nothing(
    http: httpx.AsyncClient, server: RunningServer, change: dict[str, Any], field: str
) -> None:
    h = server.headers()
    r = await http.put("/api/v1/schedules/s", json={**BODY, **change}, headers=h)
    assert r.status_code == 422, r.text
    assert field in r.json()["error"]["message"]
    assert (await http.get("/api/v1/schedules", headers=h)).json()["schedules"] == []


async def test_a_bad_name_is_refused(http: httpx.AsyncClient, server: RunningServer) -> None:
    r = await http.put("/api/v1/schedules/no%20spaces", json=BODY, headers=server.headers())
    assert r.status_code == 422
    assert (await http.get("/api/v1/schedules", headers=server.headers("worker"))).status_code == 403


async def test_the_clients_calls(server: RunningServer) -> None:
    async with Client(server.url, server.tenants["acme"], timeout=5) as client:
        schedule = await client.schedule_set("nightly", "30 2 * * *", {"kind": "k", "queue": "cron"}, timezone="Europe/Paris")
        assert (schedule.name, schedule.timezone, schedule.job["config"]["queue"]) == ("nightly", "Europe/Paris", "cron")
        assert (await client.schedule_get("nightly")).next_run_at == schedule.next_run_at
        assert (await client.schedule_pause("nightly")).paused
        assert not (await client.schedule_resume("nightly")).paused
        shown, job = await client.schedule_trigger("nightly")
        assert shown.last_job_id == job.id and job.schedule == "nightly"
        assert [s.name for s in (await client.schedules_list())[0]] == ["nightly"]
        await client.schedule_delete("nightly")
        with pytest.raises(errors.NotFound):
            await client.schedule_get("nightly")
        with pytest.raises(errors.InvalidInput, match="catch_up"):
            await client.schedule_set("x", "* * * * *", {"kind": "k"}, catch_up="sometimes")  # before the network
        with pytest.raises(errors.InvalidInput, match="cron"):
            await client.schedule_set("x", "61 * * * *", {"kind": "k"})


async def test_the_dashboard_page_shows_and_drives_schedules(server: RunningServer) -> None:
    body = ScheduleRequest.model_validate({**BODY, "cron": "30 2 * * *", "timezone": "Europe/Paris"})
    await server.engine.schedule_put("acme", "nightly", body)
    async with signed_in(server) as client:
        page = (await client.get("/dashboard/schedules")).text
        assert "nightly" in page and "30 2 * * *" in page and "Europe/Paris" in page and "active" in page
        csrf = form_csrf(page)
        r = await client.post("/dashboard/schedules/nightly/trigger", data={"csrf": csrf})
        assert r.status_code == 303
        r = await client.post("/dashboard/schedules/nightly/pause", data={"csrf": csrf})
        assert r.status_code == 303
        page = (await client.get("/dashboard/schedules")).text
        refused = await client.post("/dashboard/schedules/nightly/resume", data={"csrf": "guess"})
    schedule = await server.engine.schedule_get("acme", "nightly")
    assert schedule.paused and schedule.last_job_id is not None
    assert "paused" in page and f"/dashboard/jobs/{schedule.last_job_id}" in page and "Resume" in page
    assert refused.status_code == 403
