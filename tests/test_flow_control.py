"""Flow control at claim time over real HTTP, on both stores: fair tenants.

One tenant's backlog, priorities or back-dated jobs never starve another
tenant's jobs on a queue they share; a single tenant sees lease order.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from qftrio.server import transitions

from .conftest import RunningServer
from .test_protocol import lease


async def enqueue_batch(
    http: httpx.AsyncClient, server: RunningServer, who: str, configs: list[dict[str, Any]], kind: str = "k"
) -> list[str]:
    ids = []
    for start in range(0, len(configs), 1000):
        body = {"jobs": [{"kind": kind, "config": config} for config in configs[start : start + 1000]]}
        r = await http.post("/api/v1/jobs/batch", json=body, headers=server.headers(who))
        assert r.status_code == 201, r.text
        ids += [job["id"] for job in r.json()["jobs"]]
    return ids


async def test_a_noisy_tenant_does_not_starve_another(http: httpx.AsyncClient, server: RunningServer) -> None:
    b = await enqueue_batch(http, server, "globex", [{"queue": "shared"}] * 5)
    await enqueue_batch(http, server, "acme", [{"queue": "shared", "priority": 2147483647}] * 500)
    await enqueue_batch(http, server, "acme", [{"queue": "shared", "scheduled_at": "1970-01-01T00:00:00Z"}] * 500)
    first = await lease(http, server, "shared", max_jobs=10)
    second = await lease(http, server, "shared", max_jobs=10)
    handed = [item["job"]["id"] for item in first + second]
    assert len(handed) == 20
    assert set(b) <= set(handed)
    # the first lease already takes both tenants in turn
    assert [item["job"]["tenant"] for item in first] == ["acme", "globex"] * 5 or [
        item["job"]["tenant"] for item in first
    ] == ["globex", "acme"] * 5


async def test_leases_of_one_job_serve_the_tenants_in_turn(http: httpx.AsyncClient, server: RunningServer) -> None:
    await enqueue_batch(http, server, "acme", [{"queue": "one", "priority": 100}] * 10)
    await enqueue_batch(http, server, "globex", [{"queue": "one"}] * 10)
    tenants = [(await lease(http, server, "one", max_jobs=1))[0]["job"]["tenant"] for _ in range(6)]
    assert sorted(tenants) == ["acme"] * 3 + ["globex"] * 3, tenants


async def test_a_short_share_is_filled_from_the_other_tenants(http: httpx.AsyncClient, server: RunningServer) -> None:
    await enqueue_batch(http, server, "globex", [{"queue": "fill"}] * 2)
    await enqueue_batch(http, server, "acme", [{"queue": "fill"}] * 30)
    got = await lease(http, server, "fill", max_jobs=10)
    assert sorted(item["job"]["tenant"] for item in got) == ["acme"] * 8 + ["globex"] * 2


async def test_a_single_tenant_sees_lease_order(http: httpx.AsyncClient, server: RunningServer) -> None:
    configs = [{"queue": "solo", "priority": p % 3, "delay_secs": 0} for p in range(30)]
    ids = await enqueue_batch(http, server, "acme", configs)
    got = []
    for _ in range(4):
        got += await lease(http, server, "solo", max_jobs=8)
    jobs = [item["job"] for item in got]
    assert len(jobs) == 30 and {j["id"] for j in jobs} == set(ids)
    order = sorted(jobs, key=lambda j: (-j["priority"], j["scheduled_at"], j["created_at"]))
    assert [j["id"] for j in jobs] == [j["id"] for j in order]


@pytest.mark.parametrize(
    ("served", "expected"),
    [
        (["a"], ["a1", "a2", "a3"]),
        (["b", "a"], ["b1", "a1", "b2", "a2", "a3"]),
    ],
)
def test_fair_order(served: list[str], expected: list[str]) -> None:
    candidates = [
        ("a3", "a", 0, 3.0, 3.0),
        ("a1", "a", 9, 9.0, 9.0),
        ("b2", "b", 0, 2.0, 2.0),
        ("a2", "a", 0, 1.0, 1.0),
        ("b1", "b", 5, 5.0, 5.0),
    ]
    candidates = [c for c in candidates if c[1] in served]
    assert [c[0] for c in transitions.fair_order(candidates, served)] == expected


def test_turns_rotate_and_shares_cover_the_lease() -> None:
    assert [transitions.turns(["b", "a", "c"], turn) for turn in range(4)] == [
        ["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"],
    ]  # fmt: skip
    assert transitions.share(10, 1) == 10
    assert transitions.share(10, 3) == 4
    assert transitions.share(10, 300) == 1
