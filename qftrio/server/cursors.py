"""Cursors of the keyset pages: opaque to clients, refused with 422 when not
one this server issued."""

from __future__ import annotations

import base64
import json

from .. import errors
from ..models import valid_name

__all__ = ["decode_cursor", "decode_queue_cursor", "encode_cursor", "encode_queue_cursor"]


def encode_cursor(key: tuple[float, str]) -> str:
    """The cursor of the page after the item of *key*, ``(created_at, id)``."""
    raw = json.dumps(list(key)).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> tuple[float, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        created_at, job_id = json.loads(raw)
        job_id.encode()  # a lone surrogate is no id, and no store can take it
        return float(created_at), str(job_id)
    except Exception:
        raise errors.InvalidInput("cursor: not a cursor this server issued", code="invalid_cursor") from None


def encode_queue_cursor(queue: str) -> str:
    """The cursor of the page of queues after *queue*."""
    return base64.urlsafe_b64encode(queue.encode()).decode().rstrip("=")


def decode_queue_cursor(cursor: str) -> str:
    try:
        queue = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except Exception:
        queue = ""
    if not valid_name(queue):
        raise errors.InvalidInput("cursor: not a cursor this server issued", code="invalid_cursor")
    return queue
