"""Fast JSON for the hot paths (answers, stored payloads), with the standard
library as the fallback for what orjson refuses (integers beyond 64 bits)."""

from __future__ import annotations

import json
from typing import Any

import orjson

__all__ = ["dumps", "dumps_str", "loads"]

loads = orjson.loads


def dumps(value: Any) -> bytes:
    try:
        return orjson.dumps(value)
    except TypeError:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def dumps_str(value: Any) -> str:
    try:
        return orjson.dumps(value).decode()
    except TypeError:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False)
