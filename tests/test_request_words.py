"""A request that breaks its model is told the same thing by the Python
client's local checks as by the server's 422: every field by its path in the
body (``config.max_attempts``), in one wording (``qftrio.models.field_errors``;
docs/client.md, "with the message the server would give")."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from qftrio import errors
from qftrio.client import Client

from .conftest import RunningServer

#: ``(kind, payload, config)`` of a bad enqueue, and how its message starts.
BAD: list[tuple[str, dict[str, Any], dict[str, Any], str]] = [
    ("k", {}, {"max_attempts": 0}, "config.max_attempts: must be at least 1"),
    ("k", {}, {"timeout_secs": 8 * 86400}, "config.timeout_secs: must be at most 604800"),
    ("k", {}, {"unique": {"key": "u", "statuses": ["done"]}}, "config.unique.statuses.0: "),
    ("bad kind", {}, {}, "kind: must be 1-128 characters of A-Z a-z 0-9 _ . - (no spaces)"),
    ("k", {}, {"queue": "a/b"}, "config.queue: must be 1-128 characters"),
    ("k", {}, {"delay_secs": 1, "scheduled_at": "2030-01-01T00:00:00Z"}, "config: give delay_secs or scheduled_at, not both"),
    ("k", {}, {"scheduled_at": "soon"}, "config.scheduled_at: must be an RFC 3339 time"),
    ("k", {}, {"backoff": {"factor": 0.5}}, "config.backoff.factor: must be at least 1"),
    ("k", {}, {"concurrency": {"key": ""}}, "config.concurrency.key: must have at least 1 character(s)"),
    ("k", {}, {"headers": {"bad name": "v"}}, "config.headers.bad name"),
    ("k", {}, {"max_attempts": 0, "priority": 2**31}, "config.priority: must be at most 2147483647; config.max_attempts"),
]


@pytest.mark.parametrize(("kind", "payload", "config", "says"), BAD, ids=[case[3][:40] for case in BAD])
async def test_the_client_words_a_bad_enqueue_as_the_server_does(
    server: RunningServer, kind: str, payload: dict[str, Any], config: dict[str, Any], says: str
) -> None:
    async with httpx.AsyncClient(base_url=server.url, headers=server.headers(), timeout=10) as http:
        answer = await http.post("/api/v1/jobs", json={"kind": kind, "payload": payload, "config": config})
    assert answer.status_code == 422, answer.text
    said = answer.json()["error"]["message"]
    async with Client(server.url, server.tenants["acme"], timeout=5) as client:
        with pytest.raises(errors.InvalidInput) as refused:
            await client.enqueue(kind, payload, **config)
    assert str(refused.value) == said
    assert said.startswith(says), said
    # and nothing was stored
    assert await server.engine.queues_stats("acme") == []
