"""Fast JSON for the hot paths (answers, stored payloads), with the standard
library as the fallback for what orjson refuses (integers beyond 64 bits)."""

from __future__ import annotations

import json
from typing import Any

import orjson

__all__ = ["dumps", "dumps_str", "dumps_strict", "loads"]

# orjson reads an integer beyond 64 bits as a float, silently; the standard
# library reads it exactly. Such integers have 19 digits or more. Finding a run
# of 19 digits by mapping every digit to "0" and every other byte to " " is
# far cheaper than a regular expression (docs/performance.md).
_DIGITS_TO_ZERO = bytes(48 if 48 <= i < 58 else 32 for i in range(256))
_LONG_RUN = b"0" * 19


def _may_hold_long_integer(data: bytes | bytearray | memoryview | str) -> bool:
    if isinstance(data, str):
        try:
            data = data.encode()
        except UnicodeEncodeError:
            return True  # lone surrogates: the standard library decides
    elif isinstance(data, memoryview):
        data = data.tobytes()
    return _LONG_RUN in data.translate(_DIGITS_TO_ZERO)


def loads(data: bytes | bytearray | memoryview | str) -> Any:
    """JSON text to Python, every integer exact (and numbers beyond a
    double's range read as the standard library reads them)."""
    if not _may_hold_long_integer(data):
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError:
            pass  # the standard library's verdict, and its error if any
    return json.loads(data)


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


def dumps_strict(value: Any) -> bytes:
    """:func:`dumps` for data from users: a number JSON cannot hold (NaN,
    Infinity) raises ``ValueError`` instead of being written as ``null``,
    which is what orjson does with it."""
    try:
        out = orjson.dumps(value)
    except TypeError:
        return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    if b"null" in out:
        json.dumps(value, allow_nan=False)  # raises where orjson wrote a non-finite number as null
    return out
