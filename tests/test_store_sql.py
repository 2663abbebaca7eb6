"""The stores' statement files against the code that reads them, without a
database: every job column list against :class:`qftrio.models.Job`, and
every statement a change (``store/changes.py``) names present in both files."""

from __future__ import annotations

import dataclasses
import inspect
import pathlib
import re

import pytest

from qftrio import models
from qftrio.models import JOB_FORM, Job, Status
from qftrio.models import to_datetime as when
from qftrio.server.store import changes, sql
from qftrio.server.store.base import Inserted, NewJob

#: A job column is named as its field on the wire.
FIELDS = [field.metadata.get("wire", field.name) for field in dataclasses.fields(Job)]

#: The columns a PostgreSQL job row holds beyond Job's fields (read by name,
#: for the lease of a claim and the idempotency of an insert).
PG_EXTRA = {"lease_token", "idempotency_key"}

# A job row's column list: from its "id, tenant, queue" up to Job's last field.
_JOB_LIST = re.compile(
    r"(?:SELECT|RETURNING)\s+((?:j\.)?id,\s*(?:j\.)?tenant,\s*(?:j\.)?queue,[^;]*?,\s*(?:j\.)?" + FIELDS[-1] + r")\b"
)


def job_lists(backend: str) -> dict[str, list[str]]:
    """``{statement name: its job columns}`` of every statement answering jobs."""
    found = {}
    for name, statement in sql.load(backend).items():
        text = re.sub(r"--[^\n]*", "", statement)
        for match in _JOB_LIST.finditer(text):
            columns = [column.strip().removeprefix("j.").strip('"') for column in match[1].split(",")]
            if "context" in columns:
                found[name] = columns
    return found


def test_every_sqlite_job_list_is_the_fields_of_job_in_order() -> None:
    lists = job_lists("sqlite")
    assert {"job_get", "claim", "job_cancel", "job_reset", "jobs_of_workflows"} <= lists.keys()
    for name, columns in lists.items():
        assert columns == FIELDS, f"queries/sqlite.sql {name}: {columns} is not Job's fields {FIELDS}"


def test_every_postgres_job_list_holds_the_fields_of_job() -> None:
    lists = job_lists("postgres")
    assert {"job_get", "claim", "jobs_by_ids", "job_cancel", "job_reset", "jobs_of_workflows"} <= lists.keys()
    for name, columns in lists.items():
        assert len(set(columns)) == len(columns), f"queries/postgres.sql {name} repeats a column"
        assert set(columns) == set(FIELDS) | PG_EXTRA, f"queries/postgres.sql {name}: {columns} against {FIELDS}"


def test_a_job_list_missing_a_field_is_caught() -> None:
    statement = f"SELECT id, tenant, queue, kind, {FIELDS[-1]} FROM jobs"
    match = _JOB_LIST.search(statement)
    assert match is not None and [c.strip() for c in match[1].split(",")] != FIELDS


def plan_statements() -> set[str]:
    """The names every plan of ``changes.py`` may yield."""
    source = inspect.getsource(changes)
    return set(re.findall(r'(?:_value|_row|_rows|_run|Call|fitting)\(\s*"([a-z_]+)"', source))


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
def test_every_statement_a_change_names_is_in_both_files(backend: str) -> None:
    names = plan_statements()
    assert {"job_cancel", "workflow_end", "enqueue_steps", "fail", "reap", "bulk_reset"} <= names
    missing = names - sql.load(backend).keys()
    assert not missing, f"queries/{backend}.sql lacks {sorted(missing)}"


def test_a_fragment_is_included_by_name() -> None:
    statements = sql.load("sqlite")
    assert "{job_columns}" not in statements["job_get"]
    assert "workflow_id, step," in statements["job_get"]
    # a run-time placeholder stays
    assert "{marks}" in statements["reports_of"]


def test_no_sqlite_statement_joins_two_arrays() -> None:
    # json_each has no index: a join on its keys reads one array whole for
    # each item of the other, which made a fail batch of 1000 jobs cost five
    # times more per job; parallel arrays are read with json_extract by index
    for name, statement in sql.load("sqlite").items():
        assert not re.search(r"JOIN\s+json_each", statement), f"queries/sqlite.sql {name} joins on json_each"


def test_both_stores_count_scheduled_jobs_up_to_the_same_cap() -> None:
    from qftrio.models import MAX_SCHEDULED_COUNT

    assert f"LIMIT {MAX_SCHEDULED_COUNT})" in sql.load("postgres")["queues_stats"]


# -- a new job's fields, in the order each store's insert takes them ------------------------

NEW_FIELDS = ["id"] + [field.name for field in dataclasses.fields(NewJob)]


def _top_level(text: str) -> list[str]:
    """*text*'s comma-separated parts outside parentheses."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    return parts + [text[start:].strip()]


def _insert(statement: str, table: str, values: str) -> dict[str, str]:
    """``{column: its value's expression}`` of the ``INSERT INTO table``."""
    text = re.sub(r"--[^\n]*", "", statement)
    match = re.search(rf"INSERT INTO {table} \(([^)]*)\)\s*{values}\s*(.*?)\s*(?:\)\s*;?\s*$|FROM batch)", text, re.S)
    assert match is not None, statement
    columns = [column.strip().strip('"') for column in match[1].split(",")]
    exprs = _top_level(match[2].removeprefix("(") if values == "VALUES" else match[2])
    assert len(columns) == len(exprs), (columns, exprs)
    return dict(zip(columns, exprs))


def test_new_job_fields_are_job_fields() -> None:
    assert set(NEW_FIELDS) - set(FIELDS) == {"idempotency_key"}


def test_the_sqlite_insert_takes_new_job_fields_in_their_order() -> None:
    values = _insert(sql.load("sqlite")["job_insert"], "jobs", "VALUES")
    for position, name in enumerate(NEW_FIELDS, start=1):
        assert values[name] == f"?{position}", f"job_insert: {name} is {values[name]}, not ?{position}"


def test_the_postgres_insert_takes_new_job_fields_in_their_order() -> None:
    values = _insert(sql.load("postgres")["jobs_insert"], "qftrio_jobs", "SELECT")
    for position, name in enumerate(NEW_FIELDS):
        places = set(re.findall(r"j->>?(\d+)", values[name]))
        assert places == {str(position)}, f"jobs_insert: {name} is {values[name]}, not element {position}"


def test_a_store_insert_out_of_order_is_caught() -> None:
    values = _insert("INSERT INTO jobs (id, queue, tenant) VALUES (?1, ?2, ?3)", "jobs", "VALUES")
    assert values["tenant"] != f"?{NEW_FIELDS.index('tenant') + 1}"


def test_an_inserted_job_is_its_new_job_with_every_field() -> None:
    # every field of NewJob set, so that one Inserted leaves out shows
    new = NewJob(
        tenant="t", queue="q", kind="k", payload={"a": 1}, priority=3, max_attempts=2, scheduled_at=5.0,
        idempotency_key="i", workflow_id="w", step="s", context={"c": 1}, timeout_secs=9,
        backoff={"initial_secs": 1.0}, headers={"h": "v"}, schedule="daily", concurrency={"key": "c", "limit": 1},
        rate_limit="r", unique={"key": "u", "statuses": ["pending"]},
    )  # fmt: skip
    assert {f.name for f in dataclasses.fields(NewJob)} == set(NEW_FIELDS[1:])
    inserted = Inserted("id", new, 7.0)
    job = inserted.job
    for name in NEW_FIELDS[1:]:
        if name != "idempotency_key":  # a time as the job carries it, from epoch seconds
            given = getattr(new, name)
            assert getattr(job, name) == (when(given) if JOB_FORM.kinds[name][0] == "time" else given), name
    assert (job.id, job.status, job.attempt, job.created_at, job.updated_at) == ("id", Status.PENDING, 0, when(7.0), when(7.0))
    assert inserted.to_wire() == job.to_wire()
    earlier = Inserted("other", new, 8.0, job)
    assert earlier.job is job and earlier.to_wire() == job.to_wire()


# -- the SQL enqueue function's bounds and defaults, from the models -------------------------

#: The request models qftrio_enqueue checks a job by, and the fields it
#: checks otherwise (a time's form; headers by the constants of their rule).
ENQUEUE_MODELS = [models.EnqueueRequest, models.JobConfig, models.BackoffConfig, models.ConcurrencyConfig,
                  models.UniqueConfig, models.EnqueueBatchRequest]  # fmt: skip
BOUNDS = ("minimum", "maximum", "exclusiveMinimum", "minLength", "maxLength", "minItems", "maxItems", "pattern")


def _functions_source() -> str:
    text = (pathlib.Path(sql.__file__).parent / "migrations" / "postgres" / "functions.sql").read_text()
    return re.sub(r"--[^\n]*", "", text)


def enforced() -> list[tuple[str, str, str]]:
    """``(model, field, keyword)`` of every bound and default the route
    enforces on a job, from the models' JSON schemas."""
    out = []
    for model in ENQUEUE_MODELS:
        for field, schema in model.model_json_schema()["properties"].items():
            if field == "headers":
                continue
            schema = next((s for s in schema.get("anyOf", ()) if s.get("type") != "null"), schema)
            if "$ref" in schema or schema.get("items", {}).get("$ref"):
                out += [(model.__name__, field, k) for k in ("minItems", "maxItems") if k in schema]
                continue  # a model of its own, walked as one
            out += [(model.__name__, field, k) for k in BOUNDS if k in schema]
            info = model.model_fields[field]
            if not info.is_required() and info.get_default(call_default_factory=True) not in (None, {}):
                out.append((model.__name__, field, "default"))
    return out


def test_every_bound_and_default_of_the_route_is_written_from_the_models() -> None:
    source = _functions_source()
    assert ("JobConfig", "max_attempts", "maximum") in enforced()
    assert ("BackoffConfig", "jitter", "default") in enforced()
    missing = []
    for model, field, keyword in enforced():
        names = {f"{{{{{model}.{field}.{keyword}}}}}"}
        if keyword in ("minimum", "maximum", "exclusiveMinimum"):
            names.add(f"{{{{{model}.{field}.range}}}}")
        if keyword == "pattern" and sql.bound(model, field, keyword) == models.NAME_PATTERN:
            names.add("{{NAME_PATTERN}}")
        if not any(name in source for name in names):
            missing.append(f"{model}.{field}.{keyword}")
    for name in ("MAX_HEADERS_BYTES", "MAX_HEADER_NAME", "HEADER_NAME_PATTERN", "HEADER_VALUE_PATTERN"):
        if f"{{{{{name}}}}}" not in source:
            missing.append(name)
    assert not missing, f"functions.sql does not write these from the models: {missing}"


def test_no_bound_of_the_models_is_written_by_hand() -> None:
    source = re.sub(r"[*/%] 1000(000)?\b", "", _functions_source())  # milli- and microseconds, not bounds
    values = [sql.bound(*key) for key in enforced()] + [models.MAX_HEADERS_BYTES, models.MAX_HEADER_NAME]
    for value in values:
        if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) > 100:
            assert not re.search(rf"(?<![\w.]){value}(?![\w.])", source), f"functions.sql writes {value} by hand"
        elif isinstance(value, (str, list)) and len(value) > 1:
            assert sql.literal(value) not in source, f"functions.sql writes {value!r} by hand"
    assert not re.search(r"\d+ \* 86400", source), "functions.sql writes a duration by hand"


def test_the_functions_are_written_with_the_models_bounds() -> None:
    text = sql.functions("postgres")
    assert "{{" not in text
    assert sql.bound("JobConfig", "timeout_secs", "maximum") == models.MAX_TIMEOUT_SECS
    assert f"at || '.timeout_secs',\n            1, {models.MAX_TIMEOUT_SECS})" in text
    assert sql.bound("BackoffConfig", "initial_secs", "range") == f"0, true, {models.MAX_DELAY_SECS}"
    assert sql.literal(models.HEADER_NAME_PATTERN) == "'^[A-Za-z0-9!#$%&''*+.^_`|~-]+$'"
    assert sql.literal(["pending", "running"]) == """'["pending", "running"]'"""


def test_the_sql_wire_form_of_a_job_is_written_from_its_fields() -> None:
    expression = sql.job_wire()
    assert re.findall(r"'(\w+)', ", expression) == FIELDS
    assert "{{JOB_WIRE}}" in _functions_source() and expression in sql.functions("postgres")
