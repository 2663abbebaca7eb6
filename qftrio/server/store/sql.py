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

import json
import re
from importlib import resources
from typing import Any

from ... import models

__all__ = ["load", "migrations", "functions", "bound", "literal", "job_wire"]

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
        if entry.name.endswith(".sql") and entry.name[:1].isdigit():  # not functions.sql
            stem = entry.name[: -len(".sql")]
            version, _, _ = stem.partition("_")
            out.append((version, stem, entry.read_text(encoding="utf-8")))
    out.sort()
    return out


_PLACEHOLDER = re.compile(r"\{\{([A-Za-z_]+)(?:\.([a-z_]+)\.([A-Za-z]+))?\}\}")


def functions(backend: str) -> str:
    """``migrations/<backend>/functions.sql``, each ``{{...}}`` in it written
    as the SQL literal of what it names (:func:`bound`)."""
    text = resources.files(__package__).joinpath("migrations", backend, "functions.sql").read_text(encoding="utf-8")
    return _PLACEHOLDER.sub(lambda m: literal(bound(m[1], m[2], m[3])), text)


def bound(name: str, field: str | None = None, keyword: str | None = None) -> Any:
    """What a placeholder of ``functions.sql`` names: the constant *name* of
    :mod:`qftrio.models`; or, for the field *field* of its request model
    *name*, the *keyword* of the field's JSON schema (``maximum``,
    ``exclusiveMinimum``, ``maxLength``, ``minItems``, ``pattern``, ...), its
    ``default`` (as the model fills it in), or its ``range`` (a number's
    lowest value, whether that is excluded, and its highest: the arguments of
    ``qftrio_enqueue_float``)."""
    if name == "JOB_WIRE":
        return job_wire()
    value = getattr(models, name)
    if field is None:
        return value
    if keyword == "default":
        return value.model_fields[field].get_default(call_default_factory=True)
    schema = value.model_json_schema()["properties"][field]
    # an optional field: the schema of its value, beside null's
    schema = next((s for s in schema.get("anyOf", ()) if s.get("type") != "null"), schema)
    if keyword == "range":
        open_ = "exclusiveMinimum" in schema
        return _Raw(f"{literal(schema['exclusiveMinimum' if open_ else 'minimum'])}, {str(open_).lower()}, "
                    f"{literal(schema['maximum'])}")  # fmt: skip
    return schema[keyword]


def job_wire(row: str = "j") -> _Raw:
    """The SQL expression of the wire form of the job row *row*
    (``qftrio_jobs``), as :meth:`Job.to_wire <qftrio.models.Job.to_wire>`
    writes it: from Job's fields, each time as ``qftrio_wire_time`` writes
    it, the ids as text."""
    parts = []
    for field, (kind, _, _) in models.JOB_FORM.kinds.items():
        name = models.JOB_FORM.wire[field]  # the column's name too
        column = f'{row}."{name}"' if name == "unique" else f"{row}.{name}"
        if kind == "time":
            column = f"qftrio_wire_time({column})"
        elif name == "attempts":  # with the running or completed attempt, from the row
            column = f"qftrio_wire_job_attempts({row})"
        elif kind == "records":  # the error history: [] as it is
            column = f"CASE WHEN {column} = '[]' THEN {column} ELSE qftrio_wire_errors({column}) END"
        elif name in ("id", "workflow_id"):  # uuid columns
            column = f"{column}::text"
        parts.append(f"'{name}', {column}")
    return _Raw("jsonb_build_object(" + ", ".join(parts) + ")")


class _Raw(str):
    """SQL written as it is."""


def literal(value: Any) -> str:
    """*value* as an SQL literal (a list or dict as its JSON text)."""
    if isinstance(value, _Raw):
        return value
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "NULL"}[value]
    if isinstance(value, (int, float)):
        return repr(value)
    if not isinstance(value, str):
        value = json.dumps(value)
    return "'" + value.replace("'", "''") + "'"
