"""Named SQL statements, read from the store's ``.sql`` files once, at import.

Each backend keeps its statements in ``queries/<backend>.sql``, one per
name, as procrastinate keeps its queries in one file::

    -- name: job_get
    -- The job by id.
    SELECT ... FROM jobs WHERE id = ?;

A statement runs from its ``-- name:`` line to the next one; comment lines
stay in the text (the database ignores them) and a trailing ``;`` is
dropped. ``{name}`` in a statement stands for the statement (a fragment) of
that name, such as the job columns every statement that answers jobs
reads; other ``{...}`` are left to be filled in at run time. A statement of comment lines only is empty (``""``): a plan's
statement the backend has no use for (:mod:`.changes`). Statements built at run time (a page's filters, an ``IN`` list of
a batch's length) start from a named fragment here too.
"""

from __future__ import annotations

import re
from importlib import resources

__all__ = ["load", "migrations"]

_NAME = re.compile(r"^-- name: ([a-z0-9_]+)\s*$", re.MULTILINE)
_INCLUDE = re.compile(r"\{([a-z0-9_]+)\}")


def load(backend: str) -> dict[str, str]:
    """``{name: statement}`` of ``queries/<backend>.sql``."""
    text = resources.files(__package__).joinpath("queries", f"{backend}.sql").read_text(encoding="utf-8")
    parts = _NAME.split(text)
    out: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2]):
        if name in out:
            raise ValueError(f"queries/{backend}.sql names {name!r} twice")
        body = body.strip().removesuffix(";").strip()
        out[name] = body if any(not line.startswith("--") for line in body.splitlines()) else ""
    # "{name}" includes the statement (a fragment) of that name, as written
    return {name: _INCLUDE.sub(lambda m: _code(out[m[1]]) if m[1] in out else m[0], body) for name, body in out.items()}


def _code(statement: str) -> str:
    """*statement* without its comment lines."""
    return "\n".join(line for line in statement.splitlines() if not line.lstrip().startswith("--"))


def migrations(backend: str) -> list[tuple[str, str, str]]:
    """``(version, name, script)`` of every migration of *backend* shipped,
    in order (``migrations/<backend>/0001_init.sql``: version ``0001``)."""
    folder = resources.files(__package__).joinpath("migrations", backend)
    out = []
    for entry in folder.iterdir():
        if entry.name.endswith(".sql"):
            stem = entry.name[: -len(".sql")]
            version, _, _ = stem.partition("_")
            out.append((version, stem, entry.read_text(encoding="utf-8")))
    out.sort()
    return out
