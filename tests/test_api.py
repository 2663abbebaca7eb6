"""The application API (docs/protocol.md) over real HTTP, on every backend."""

from __future__ import annotations

import json
import uuid

import httpx
import trio

from qftrio import Client

from .conftest import RunningServer


async def post_job(http: httpx.AsyncClient, server: RunningServer, who: str = "acme", **body) -> httpx.Response:
    body.setdefault("kind", "send-email")
    return await http.post("/api/v1/jobs", json=body, headers=server.headers(who))


async def test_enqueue_defaults(http, server) -> None:
    r = await post_job(http, server)
    assert r.status_code == 201
    job = r.json()
    uuid.UUID(job["id"])
    assert job["tenant"] == "acme" and job["queue"] == "default" and job["kind"] == "send-email"
    assert job["payload"] == {} and job["status"] == "pending" and job["priority"] == 0
    assert job["attempt"] == 0 and job["max_attempts"] == 5
    assert job["scheduled_at"] == job["created_at"] == job["updated_at"]
    assert job["scheduled_at"].endswith("Z")
    for field in ("locked_until", "worker_id", "result", "error", "workflow_id", "step", "context"):
        assert job[field] is None, field
    assert job["errors"] == []
    assert "lease_token" not in job


async def test_integers_of_any_size_come_back_exactly(http, server) -> None:
    big = {"n": 123456789012345678901234567890, "m": -9223372036854775809, "u": 18446744073709551616, "f": 0.5}
    r = await post_job(http, server, payload=big)
    assert r.status_code == 201
    job = json.loads(r.content)  # the standard library reads every integer exactly
    assert job["payload"] == big
    (leased,) = (
        await http.post("/api/v1/queues/default/lease", json={}, headers=server.headers("worker"))
    ).json()["jobs"]
    assert leased["job"]["payload"] == big
    r = await http.post(
        f"/api/v1/jobs/{job['id']}/complete",
        json={"lease_token": leased["lease_token"], "result": big},
        headers=server.headers("worker"),
    )
    assert r.status_code == 204
    got = json.loads((await http.get(f"/api/v1/jobs/{job['id']}", headers=server.headers())).content)
    assert got["payload"] == big and got["result"] == big
    # and through qftrio's own client
    async with Client(server.url, server.tenants["acme"]) as client:
        fetched = await client.job_get(job["id"])
    assert fetched.payload == big and fetched.result == big


async def test_scheduled_at_beyond_four_digit_years_is_refused(http, server) -> None:
    r = await post_job(http, server, config={"scheduled_at": "9999-12-31T23:59:59.999999Z"})
    assert r.status_code == 422 and "scheduled_at" in r.json()["error"]["message"]
    r = await post_job(http, server, config={"scheduled_at": "9998-12-31T23:59:59-12:00"})
    assert r.status_code == 201
    assert r.json()["scheduled_at"].startswith("9999-01-01T11:59:59")


async def test_numbers_json_cannot_hold_are_refused(http, server) -> None:
    shapes = (b'{"ratio": [1, %s]}', b'{"ratio": [%s]}', b'{"ratio":\n\t%s}')
    for number in (b"NaN", b"-Infinity", b"1e400", b"-2.5E+999", b"12.75e0400"):
        for shape in shapes:
            r = await http.post(
                "/api/v1/jobs",
                content=b'{"kind": "k", "payload": ' + shape % number + b"}",
                headers={**server.headers("acme"), "Content-Type": "application/json"},
            )
            assert r.status_code == 422 and number.decode().lstrip("-") in r.json()["error"]["message"], r.text
    assert (await http.get("/api/v1/jobs", headers=server.headers())).json()["jobs"] == []
    # The same characters in strings, and large finite numbers, are fine.
    r = await post_job(http, server, payload={"note": "NaN, Infinity, 1e400", "big": 1e300})
    assert r.status_code == 201
    payload = r.json()["payload"]
    # (PostgreSQL's jsonb writes 1e300 out in digits: it comes back as an integer.)
    assert payload["note"] == "NaN, Infinity, 1e400" and float(payload["big"]) == 1e300
    (leased,) = (
        await http.post("/api/v1/queues/default/lease", json={}, headers=server.headers("worker"))
    ).json()["jobs"]
    r = await http.post(
        f"/api/v1/jobs/{leased['job']['id']}/complete",
        content=b'{"lease_token": "' + leased["lease_token"].encode() + b'", "result": {"x": NaN}}',
        headers=server.headers("worker"),
    )
    assert r.status_code == 422
    got = (await http.get(f"/api/v1/jobs/{leased['job']['id']}", headers=server.headers())).json()
    assert got["status"] == "running" and got["result"] is None


async def test_enqueue_with_config(http, server) -> None:
    r = await post_job(
        http, server, payload={"to": "a@b.c"},
        config={"queue": "mail", "priority": 7, "max_attempts": 2, "scheduled_at": "2040-01-02T03:04:05Z"},
    )  # fmt: skip
    job = r.json()
    assert (job["queue"], job["priority"], job["max_attempts"]) == ("mail", 7, 2)
    assert job["scheduled_at"].startswith("2040-01-02T03:04:05")
    r = await post_job(http, server, config={"delay_secs": 30})
    assert r.json()["scheduled_at"] > r.json()["created_at"]


async def test_idempotency_key(http, server) -> None:
    first = await post_job(http, server, config={"idempotency_key": "order-1"})
    again = await post_job(http, server, kind="other", config={"idempotency_key": "order-1"})
    assert first.status_code == 201 and again.status_code == 200
    assert again.json() == first.json()
    other_tenant = await post_job(http, server, who="globex", config={"idempotency_key": "order-1"})
    assert other_tenant.status_code == 201 and other_tenant.json()["id"] != first.json()["id"]
    listed = (await http.get("/api/v1/jobs", headers=server.headers())).json()["jobs"]
    assert len(listed) == 1


async def test_batch_enqueue(http, server) -> None:
    jobs = [{"kind": "k", "payload": {"i": i}, "config": {"queue": "bulk"}} for i in range(50)]
    r = await http.post("/api/v1/jobs/batch", json={"jobs": jobs}, headers=server.headers())
    assert r.status_code == 201
    assert [j["payload"]["i"] for j in r.json()["jobs"]] == list(range(50))
    stats = (await http.get("/api/v1/queues/bulk/stats", headers=server.headers())).json()
    assert stats["counts"]["pending"] == 50


async def test_concurrent_enqueues_each_get_their_own_jobs(http, server) -> None:
    # Concurrent calls share inserts; each still gets exactly its own jobs.
    answers: dict[int, httpx.Response] = {}

    async def one(i: int) -> None:
        if i % 4:
            answers[i] = await post_job(http, server, payload={"i": i}, config={"queue": "together"})
        else:
            jobs = [{"kind": "k", "payload": {"i": i, "j": j}, "config": {"queue": "together"}} for j in range(3)]
            answers[i] = await http.post("/api/v1/jobs/batch", json={"jobs": jobs}, headers=server.headers())

    async with trio.open_nursery() as nursery:
        for i in range(24):
            nursery.start_soon(one, i)
    ids = []
    for i, r in answers.items():
        assert r.status_code == 201
        if i % 4:
            assert r.json()["payload"] == {"i": i}
            ids.append(r.json()["id"])
        else:
            assert [job["payload"] for job in r.json()["jobs"]] == [{"i": i, "j": j} for j in range(3)]
            ids += [job["id"] for job in r.json()["jobs"]]
    assert len(set(ids)) == 18 + 6 * 3
    stats = (await http.get("/api/v1/queues/together/stats", headers=server.headers())).json()
    assert stats["counts"]["pending"] == 36


async def test_concurrent_enqueues_of_one_idempotency_key_make_one_job(http, server) -> None:
    answers = []

    async def one(kind: str) -> None:
        answers.append(await post_job(http, server, kind=kind, config={"idempotency_key": "order-9", "queue": "once"}))

    async with trio.open_nursery() as nursery:
        for i in range(10):
            nursery.start_soon(one, f"k{i}")
    assert sorted(r.status_code for r in answers) == [200] * 9 + [201]
    assert len({r.json()["id"] for r in answers}) == 1
    assert all(r.json() == answers[0].json() for r in answers)
    stats = (await http.get("/api/v1/queues/once/stats", headers=server.headers())).json()
    assert stats["counts"]["pending"] == 1


async def test_batch_is_all_or_nothing(http, server) -> None:
    jobs = [{"kind": "k"}, {"kind": "k", "config": {"queue": "no spaces"}}]
    r = await http.post("/api/v1/jobs/batch", json={"jobs": jobs}, headers=server.headers())
    assert r.status_code == 422 and "jobs.1.config.queue" in r.json()["error"]["message"]
    assert (await http.get("/api/v1/jobs", headers=server.headers())).json()["jobs"] == []
    r = await http.post("/api/v1/jobs/batch", json={"jobs": [{"kind": "k"}] * 1001}, headers=server.headers())
    assert r.status_code == 422
    r = await http.post("/api/v1/jobs/batch", json={"jobs": []}, headers=server.headers())
    assert r.status_code == 422


async def test_get_is_tenant_scoped(http, server) -> None:
    job = (await post_job(http, server)).json()
    r = await http.get(f"/api/v1/jobs/{job['id']}", headers=server.headers("acme"))
    assert r.status_code == 200 and r.json() == job
    r = await http.get(f"/api/v1/jobs/{job['id']}", headers=server.headers("globex"))
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    for path in (f"/api/v1/jobs/{job['id']}/cancel", f"/api/v1/jobs/{job['id']}/retry"):
        assert (await http.post(path, headers=server.headers("globex"))).status_code == 404
    r = await http.get("/api/v1/jobs/definitely-not-a-uuid", headers=server.headers())
    assert r.status_code == 404


async def test_list_pagination_and_filters(http, server) -> None:
    ids = [(await post_job(http, server, kind="a" if i % 2 else "b", config={"queue": "q1"})).json()["id"] for i in range(7)]
    await post_job(http, server, who="globex")
    seen: list[str] = []
    cursor = None
    while True:
        params = {"limit": 3, **({"cursor": cursor} if cursor else {})}
        page = (await http.get("/api/v1/jobs", params=params, headers=server.headers())).json()
        seen += [j["id"] for j in page["jobs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids[::-1]
    only_a = (await http.get("/api/v1/jobs", params={"kind": "a"}, headers=server.headers())).json()["jobs"]
    assert [j["id"] for j in only_a] == ids[1::2][::-1]
    running = (await http.get("/api/v1/jobs", params={"status": "running"}, headers=server.headers())).json()
    assert running == {"jobs": [], "next_cursor": None}
    for bad in ({"status": "nope"}, {"limit": "0"}, {"limit": "x"}, {"queue": "a b"}, {"cursor": "garbage!"}):
        r = await http.get("/api/v1/jobs", params=bad, headers=server.headers())
        assert r.status_code == 422, bad
        assert r.json()["error"]["message"]


async def test_cancel_and_retry(http, server) -> None:
    job = (await post_job(http, server, config={"queue": "c"})).json()
    r = await http.post(f"/api/v1/jobs/{job['id']}/cancel", headers=server.headers())
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    leased = await http.post("/api/v1/queues/c/lease", json={}, headers=server.headers("worker"))
    assert leased.json()["jobs"] == []
    r = await http.post(f"/api/v1/jobs/{job['id']}/cancel", headers=server.headers())
    assert r.status_code == 409 and r.json()["error"]["code"] == "conflict"
    r = await http.post(f"/api/v1/jobs/{job['id']}/retry", headers=server.headers())
    assert r.status_code == 200 and r.json()["status"] == "pending" and r.json()["attempt"] == 0
    r = await http.post(f"/api/v1/jobs/{job['id']}/retry", headers=server.headers())
    assert r.status_code == 409
    leased = await http.post("/api/v1/queues/c/lease", json={}, headers=server.headers("worker"))
    assert [x["job"]["id"] for x in leased.json()["jobs"]] == [job["id"]]


async def test_queues_and_stats(http, server) -> None:
    await post_job(http, server, config={"queue": "a"})
    await post_job(http, server, config={"queue": "b", "delay_secs": 100})
    await post_job(http, server, who="globex", config={"queue": "z"})
    queues = (await http.get("/api/v1/queues", headers=server.headers())).json()["queues"]
    assert [q["queue"] for q in queues] == ["a", "b"]
    a, b = queues
    assert a["counts"] == {"pending": 1, "running": 0, "completed": 0, "failed": 0, "cancelled": 0, "scheduled": 0}
    assert a["oldest_ready_at"] is not None and a["next_available_at"] is None
    assert b["oldest_ready_at"] is None and b["next_available_at"] is not None
    empty = (await http.get("/api/v1/queues/nothing/stats", headers=server.headers())).json()
    assert empty["queue"] == "nothing" and sum(empty["counts"].values()) == 0
    r = await http.get("/api/v1/queues/bad%20name/stats", headers=server.headers())
    assert r.status_code == 422


async def test_application_routes_refuse_the_worker_token(http, server) -> None:
    r = await post_job(http, server, who="worker")
    assert r.status_code == 403
    r = await http.get("/api/v1/jobs")
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    r = await http.get("/api/v1/jobs", headers={"Authorization": "Basic abc"})
    assert r.status_code == 401


async def test_bad_input_is_a_clear_4xx_and_changes_nothing(http, server) -> None:
    h = server.headers()
    cases = [
        ({"kind": "bad kind!"}, "kind"),
        ({"kind": "k", "payload": [1, 2]}, "payload"),
        ({"kind": "k", "config": {"queue": "x" * 129}}, "config.queue"),
        ({"kind": "k", "config": {"max_attempts": 0}}, "config.max_attempts"),
        ({"kind": "k", "config": {"priority": "high"}}, "config.priority"),
        ({"kind": "k", "config": {"delay_secs": 5, "scheduled_at": "2030-01-01T00:00:00Z"}}, "config"),
        ({"kind": "k", "config": {"scheduled_at": "yesterday"}}, "config.scheduled_at"),
        ({"kind": "k", "surprise": 1}, "surprise"),
        ({}, "kind"),
    ]
    for body, field in cases:
        r = await http.post("/api/v1/jobs", json=body, headers=h)
        assert r.status_code == 422, body
        assert r.json()["error"]["code"] == "invalid"
        assert field in r.json()["error"]["message"], (body, r.json())
    r = await http.post("/api/v1/jobs", content=b'{"kind": ', headers=h)
    assert r.status_code == 400 and r.json()["error"]["code"] == "malformed_json"
    r = await http.post("/api/v1/jobs", json=[1, 2], headers=h)
    assert r.status_code == 422
    big = {"kind": "k", "payload": {"blob": "x" * (1 << 20)}}
    r = await http.post("/api/v1/jobs", json=big, headers=h)
    assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"
    assert (await http.get("/api/v1/jobs", headers=h)).json()["jobs"] == []


async def test_unknown_route_and_method_are_json(http, server) -> None:
    r = await http.get("/api/v1/nothing", headers=server.headers())
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    # A 405 says which methods the path takes, on every kind of route.
    for method, path, allow in [
        ("DELETE", "/api/v1/jobs", "GET, HEAD, POST"),
        ("GET", "/api/v1/jobs/batch", "POST"),
        ("POST", "/api/v1/jobs/some-id", "GET, HEAD"),
        ("GET", "/api/v1/queues/q/lease", "POST"),
        ("PUT", "/api/v1/leases/complete", "POST"),
        ("POST", "/healthz", "GET, HEAD"),
        ("POST", "/metrics", "GET, HEAD"),
    ]:
        r = await http.request(method, path, headers=server.headers())
        assert r.status_code == 405 and r.json()["error"]["code"] == "method_not_allowed", (method, path)
        assert sorted(r.headers["allow"].split(", ")) == allow.split(", "), (method, path)


async def test_names_in_paths_and_queries_are_validated_as_in_bodies(http, server) -> None:
    for path in ("/api/v1/queues/foo%0A/stats", "/api/v1/jobs?queue=foo%0A", "/api/v1/jobs?kind=k%0A"):
        r = await http.get(path, headers=server.headers())
        assert r.status_code == 422 and r.json()["error"]["code"] == "invalid", path
    r = await post_job(http, server, kind="k\n")
    assert r.status_code == 422


async def test_numbers_are_read_as_json_schema_reads_them(http, server) -> None:
    for config, field in [
        ({"priority": "5"}, "config.priority"),
        ({"priority": True}, "config.priority"),
        ({"max_attempts": 2.5}, "config.max_attempts"),
        ({"delay_secs": "10"}, "config.delay_secs"),
        ({"scheduled_at": 0}, "config.scheduled_at"),
    ]:
        r = await post_job(http, server, config=config)
        assert r.status_code == 422 and field in r.json()["error"]["message"], config
    assert (await http.get("/api/v1/jobs", headers=server.headers())).json()["jobs"] == []
    r = await post_job(http, server, config={"priority": 5.0, "delay_secs": 10})
    assert r.status_code == 201 and r.json()["priority"] == 5


async def test_query_parameters_are_parsed_strictly(http, server) -> None:
    await post_job(http, server)
    h = server.headers()
    for query, named in [
        ("stauts=failed", "stauts"),
        ("status=failed&status=pending", "status"),
        ("limit=1.5", "limit"),
        ("queue=", "queue"),
    ]:
        r = await http.get(f"/api/v1/jobs?{query}", headers=h)
        assert r.status_code == 422 and named in r.json()["error"]["message"], query
    r = await http.get("/api/v1/workflows?limt=3", headers=h)
    assert r.status_code == 422 and "limt" in r.json()["error"]["message"]
    # a route that takes no parameter refuses any
    for path in ("/api/v1/queues?all=1", "/api/v1/queues/default/stats?x=1"):
        r = await http.get(path, headers=h)
        assert r.status_code == 422 and "unknown parameter" in r.json()["error"]["message"], path
    r = await http.get("/api/v1/jobs?status=pending&limit=1", headers=h)
    assert r.status_code == 200 and len(r.json()["jobs"]) == 1


async def test_cancel_and_retry_take_an_empty_body_only(http, server) -> None:
    job = (await post_job(http, server)).json()
    h = server.headers()
    for action in ("cancel", "retry"):
        path = f"/api/v1/jobs/{job['id']}/{action}"
        r = await http.post(path, content=b"{not json", headers=h)
        assert r.status_code == 400 and r.json()["error"]["code"] == "malformed_json", action
        r = await http.post(path, json={"force": True}, headers=h)
        assert r.status_code == 422 and "force" in r.json()["error"]["message"], action
        r = await http.post(path, json=[], headers=h)
        assert r.status_code == 422, action
        r = await http.post(path, content=b"{" + b" " * (1 << 20) + b"}", headers=h)
        assert r.status_code == 413 and r.headers["connection"] == "close", action
    assert (await http.get(f"/api/v1/jobs/{job['id']}", headers=h)).json()["status"] == "pending"
    r = await http.post(f"/api/v1/jobs/{job['id']}/cancel", json={}, headers=h)
    assert r.status_code == 200 and r.json()["status"] == "cancelled"
    r = await http.post(f"/api/v1/jobs/{job['id']}/retry", headers=h)
    assert r.status_code == 200 and r.json()["status"] == "pending"


async def test_integers_beyond_4300_digits_are_a_422_naming_the_field(http, server) -> None:
    huge = b"9" * 4301
    r = await http.post(
        "/api/v1/jobs", content=b'{"kind": "k", "payload": {"ok": 1, "n": [2, ' + huge + b"]}}", headers=server.headers()
    )
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid"
    assert r.json()["error"]["message"] == "payload.n.1: an integer of more than 4300 digits"
    r = await http.post(
        "/api/v1/jobs", content=b'{"kind": "k", "config": {"priority": -' + huge + b"}}", headers=server.headers()
    )
    assert r.status_code == 422 and "config.priority" in r.json()["error"]["message"]
    r = await http.post(
        "/api/v1/jobs/x/complete", content=b'{"lease_token": "t", "result": {"r": ' + huge + b"}}",
        headers=server.headers("worker"),
    )  # fmt: skip
    assert r.status_code == 422 and r.json()["error"]["message"].startswith("result.r:")
    assert (await http.get("/api/v1/jobs", headers=server.headers())).json()["jobs"] == []
    # 4300 digits are held exactly
    r = await http.post("/api/v1/jobs", content=b'{"kind": "k", "payload": {"n": ' + b"9" * 4300 + b"}}", headers=server.headers())
    assert r.status_code == 201 and json.loads(r.content)["payload"]["n"] == int("9" * 4300)


async def test_health_metrics_openapi(http, server) -> None:
    r = await http.get("/healthz")
    assert r.status_code == 200 and r.json() == {"status": "ok"}
    await post_job(http, server)
    metrics = (await http.get("/metrics")).text
    for name in (
        "qftrio_jobs_enqueued_total", "qftrio_jobs_leased_total", "qftrio_jobs_completed_total",
        "qftrio_jobs_failed_total", "qftrio_jobs_dead_lettered_total", "qftrio_stale_token_rejections_total",
        "qftrio_lease_wait_seconds", "qftrio_job_run_seconds", "qftrio_queue_jobs", "qftrio_queue_oldest_ready_age_seconds",
    ):  # fmt: skip
        assert name in metrics, name
    spec = (await http.get("/openapi.json")).json()
    assert "/api/v1/queues/{queue}/lease" in spec["paths"]
    assert "/api/v1/jobs" in spec["paths"]


async def test_the_nul_character_is_refused_by_name_on_every_store(http, server) -> None:
    # PostgreSQL cannot store U+0000, SQLite can: both refuse it, so that a
    # job holds the same on either.
    h, w = server.headers(), server.headers("worker")
    nul = "a\u0000b"
    cases = [
        ("/api/v1/jobs", {"kind": "k", "payload": {"deep": [{"x": nul}]}}, "payload", "deep.0.x"),
        ("/api/v1/jobs", {"kind": "k", "payload": {nul: 1}}, "payload", "a\\u0000b"),
        ("/api/v1/jobs", {"kind": "k", "config": {"idempotency_key": nul}}, "config.idempotency_key", ""),
        ("/api/v1/jobs/batch", {"jobs": [{"kind": "k"}, {"kind": "k", "payload": {"s": nul}}]}, "jobs.1.payload", "s"),
        ("/api/v1/workflows", {"name": "w", "context": {"c": nul}, "steps": [{"name": "a", "kind": "k"}]}, "context", "c"),
        ("/api/v1/workflows", {"name": nul, "steps": [{"name": "a", "kind": "k"}]}, "name", ""),
        ("/api/v1/workflows", {"name": "w", "steps": [{"name": "a", "kind": "k", "payload": {"p": nul}}]}, "steps.0.payload", "p"),
    ]
    for path, body, field, where in cases:
        r = await http.post(path, json=body, headers=h)
        assert r.status_code == 422, (body, r.text)
        message = r.json()["error"]["message"]
        assert message.startswith(f"{field}: holds the character \\u0000"), message
        assert where in message, message
    assert (await http.get("/api/v1/jobs", headers=h)).json()["jobs"] == []
    assert (await http.get("/api/v1/workflows", headers=h)).json()["workflows"] == []

    # reports: a result or an error holding it changes nothing
    r = await post_job(http, server, payload={"escaped": "\\u0000"})  # six characters: kept
    assert r.status_code == 201 and r.json()["payload"] == {"escaped": "\\u0000"}
    (leased,) = (await http.post("/api/v1/queues/default/lease", json={}, headers=w)).json()["jobs"]
    job_id, token = leased["job"]["id"], leased["lease_token"]
    refused = [
        (f"/api/v1/jobs/{job_id}/complete", {"lease_token": token, "result": {"r": nul}}, "result"),
        (f"/api/v1/jobs/{job_id}/fail", {"lease_token": token, "error": nul}, "error"),
        ("/api/v1/leases/complete", {"items": [{"id": job_id, "lease_token": token, "result": {"r": nul}}]}, "items.0.result"),
        ("/api/v1/leases/fail", {"items": [{"id": job_id, "lease_token": token, "error": nul}]}, "items.0.error"),
        ("/api/v1/queues/default/lease", {"worker_id": nul}, "worker_id"),
    ]
    for path, body, field in refused:
        r = await http.post(path, json=body, headers=w)
        assert r.status_code == 422 and r.json()["error"]["message"].startswith(field), (body, r.text)
    got = (await http.get(f"/api/v1/jobs/{job_id}", headers=h)).json()
    assert (got["status"], got["result"], got["error"]) == ("running", None, None)


async def test_a_negative_delay_is_refused_in_a_batch_as_alone(http, server) -> None:
    h = server.headers()
    for delay in (-1, -1e-300):
        r = await post_job(http, server, config={"delay_secs": delay})
        assert r.status_code == 422 and r.json()["error"]["message"].startswith("config.delay_secs"), r.text
        batch = {"jobs": [{"kind": "k"}, {"kind": "k", "config": {"delay_secs": delay}}]}
        r = await http.post("/api/v1/jobs/batch", json=batch, headers=h)
        assert r.status_code == 422 and r.json()["error"]["message"].startswith("jobs.1.config.delay_secs"), r.text
    assert (await http.get("/api/v1/jobs", headers=h)).json()["jobs"] == []
    # and the document says so, so that no client is led to send one
    doc = (await http.get("/openapi.json")).json()
    (number,) = [s for s in doc["components"]["schemas"]["JobConfig"]["properties"]["delay_secs"]["anyOf"] if s.get("type") == "number"]
    assert (number["minimum"], number["maximum"]) == (0, 10 * 365 * 86400)
