"""A handler's progress (DESIGN §2): ``POST /api/v1/jobs/{id}/progress``,
``progress`` in the items of a batch heartbeat, and the job's ``progress``
and ``progress_at``, over real HTTP on every backend."""

from __future__ import annotations

import httpx

from .conftest import RunningServer
from .test_protocol import enqueue, lease, report


async def get(http: httpx.AsyncClient, server: RunningServer, job_id: str) -> dict:
    r = await http.get(f"/api/v1/jobs/{job_id}", headers=server.headers())
    assert r.status_code == 200, r.text
    return r.json()


async def test_progress_is_recorded_latest_wins_and_extends_nothing(http, server) -> None:
    job = await enqueue(http, server)
    assert job["progress"] is None and job["progress_at"] is None
    (leased,) = await lease(http, server, lease_secs=30)
    token = leased["lease_token"]
    r = await report(http, server, job["id"], "progress", lease_token=token, progress={"done": 1, "of": 3})
    assert r.status_code == 200 and r.json() == {"status": "running"}
    server.clock.advance(5)
    r = await report(http, server, job["id"], "progress", lease_token=token, progress={"done": 2, "of": 3})
    assert r.status_code == 200
    got = await get(http, server, job["id"])
    assert got["progress"] == {"done": 2, "of": 3}
    assert got["progress_at"] is not None and got["progress_at"] == got["updated_at"]
    assert got["locked_until"] == leased["job"]["locked_until"]  # extended nothing
    # The progress stays once the job ends, for those who look afterwards.
    assert (await report(http, server, job["id"], "complete", lease_token=token)).status_code == 204
    done = await get(http, server, job["id"])
    assert done["status"] == "completed" and done["progress"] == {"done": 2, "of": 3}


async def test_progress_token_rules_are_a_heartbeats(http, server) -> None:
    job = await enqueue(http, server)
    (leased,) = await lease(http, server, lease_secs=30)
    token = leased["lease_token"]
    stale = await report(http, server, job["id"], "progress", lease_token="00000000-0000-0000-0000-000000000000", progress={"x": 1})
    assert stale.status_code == 409 and stale.json()["error"]["code"] == "lease_lost"
    unknown = await report(http, server, "00000000-0000-0000-0000-000000000001", "progress", lease_token=token, progress={})
    assert unknown.status_code == 404
    r = await http.post(f"/api/v1/jobs/{job['id']}/cancel", headers=server.headers())
    assert r.status_code == 200
    after = await report(http, server, job["id"], "progress", lease_token=token, progress={"x": 2})
    assert after.status_code == 200 and after.json() == {"status": "cancelled"}
    assert (await get(http, server, job["id"]))["progress"] is None  # neither stale nor late progress landed
    # A tenant's token is not a worker's.
    r = await http.post(
        f"/api/v1/jobs/{job['id']}/progress", json={"lease_token": token, "progress": {}}, headers=server.headers()
    )
    assert r.status_code == 403


async def test_progress_out_of_range_is_422_naming_the_field(http, server) -> None:
    job = await enqueue(http, server)
    (leased,) = await lease(http, server, lease_secs=30)
    token = leased["lease_token"]
    for bad in ({"blob": "x" * 8200}, [1, 2], "text", None):
        r = await report(http, server, job["id"], "progress", lease_token=token, progress=bad)
        assert r.status_code == 422, (bad, r.text)
        assert "progress" in r.json()["error"]["message"]
    r = await http.post(
        "/api/v1/leases/heartbeat",
        json={"items": [{"id": job["id"], "lease_token": token, "extend_secs": 30, "progress": {"blob": "x" * 8200}}]},
        headers=server.headers("worker"),
    )
    assert r.status_code == 422 and "progress" in r.json()["error"]["message"]
    assert (await get(http, server, job["id"]))["progress"] is None


async def test_batch_heartbeat_carries_progress(http, server) -> None:
    first, second = await enqueue(http, server), await enqueue(http, server)
    leases = await lease(http, server, lease_secs=30, max_jobs=2)
    by_id = {item["job"]["id"]: item["lease_token"] for item in leases}
    r = await http.post(
        "/api/v1/leases/heartbeat",
        json={
            "items": [
                {"id": first["id"], "lease_token": by_id[first["id"]], "extend_secs": 60, "progress": {"step": "a"}},
                {"id": second["id"], "lease_token": by_id[second["id"]], "extend_secs": 60},
                {"id": first["id"], "lease_token": by_id[first["id"]], "extend_secs": 60, "progress": {"step": "b"}},
            ]
        },
        headers=server.headers("worker"),
    )
    assert r.status_code == 200, r.text
    assert [item["code"] for item in r.json()["results"]] == [200, 200, 200]
    one, two = await get(http, server, first["id"]), await get(http, server, second["id"])
    assert one["progress"] == {"step": "b"} and one["locked_until"] != leases[0]["job"]["locked_until"]
    assert two["progress"] is None and two["progress_at"] is None
