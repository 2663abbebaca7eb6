"""``qftrio jobs wait``: the job printed once it ends, and its exit status
saying how (0 completed, 1 failed, 3 cancelled, 124 not ended in time)."""

from __future__ import annotations

import json

import pytest
import trio

from .test_cli import run_cli
from .test_protocol import enqueue, lease, report


async def test_jobs_wait_exit_status_says_how_the_job_ended(server, http, capsys: pytest.CaptureFixture[str]) -> None:
    opts = ["--url", server.url, "--token", server.tenants["acme"]]
    pending = await enqueue(http, server)
    assert await run_cli("jobs", "wait", pending["id"], "--timeout", "0.2", *opts) == 124
    assert json.loads(capsys.readouterr().out)["status"] == "pending"
    await http.post(f"/api/v1/jobs/{pending['id']}/cancel", headers=server.headers())
    assert await run_cli("jobs", "wait", pending["id"], *opts) == 3

    failing = await enqueue(http, server, max_attempts=1)
    (leased,) = await lease(http, server, lease_secs=300)
    codes: list[int] = []
    async with trio.open_nursery() as nursery:

        async def waiting() -> None:
            codes.append(await run_cli("jobs", "wait", failing["id"], *opts))

        nursery.start_soon(waiting)
        with trio.fail_after(60):  # a cap only: the wait parks at once
            while not len(server.engine.waits):  # parked: the state, not a time
                await trio.sleep(0.01)
        await report(http, server, failing["id"], "fail", lease_token=leased["lease_token"], error="boom")
    assert codes == [1]
    capsys.readouterr()

    done = await enqueue(http, server)
    (leased,) = await lease(http, server, lease_secs=300)
    await report(http, server, done["id"], "complete", lease_token=leased["lease_token"], result={"n": 1})
    assert await run_cli("jobs", "wait", done["id"], *opts) == 0
    assert json.loads(capsys.readouterr().out)["result"] == {"n": 1}
    assert await run_cli("jobs", "wait", "00000000-0000-0000-0000-000000000000", *opts) == 1
    assert "404" in capsys.readouterr().err
