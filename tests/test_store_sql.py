"""The stores' statement files against the code that reads them, without a
database: every job column list against :class:`qftrio.models.Job`, and
every statement a change (``store/changes.py``) names present in both files."""

from __future__ import annotations

import dataclasses
import inspect
import re

import pytest

from qftrio.models import Job
from qftrio.server.store import changes, sql

#: A job column is named as its field on the wire.
FIELDS = [field.metadata.get("wire", field.name) for field in dataclasses.fields(Job)]

#: The columns a PostgreSQL job row holds beyond Job's fields (read by name,
#: for the lease of a claim and the idempotency of an insert).
PG_EXTRA = {"lease_token", "idempotency_key"}

# A job row's column list: from its "id, tenant, queue" up to Job's last field.
_JOB_LIST = re.compile(
    r"(?:SELECT|RETURNING)\s+((?:j\.)?id,\s*(?:j\.)?tenant,\s*(?:j\.)?queue,[^;]*?(?:j\.)?" + FIELDS[-1] + r")\b"
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
