"""Reading a PostgreSQL URL as libpq will connect with it, without
connecting (``pgtrio.read_url``): what the errors of a first connection
name, and the URLs that cannot work, refused in one line."""

from __future__ import annotations

import getpass

import pytest

from qftrio import errors
from qftrio.server.store.pgtrio import Target, read_url


@pytest.fixture(autouse=True)
def no_pg_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("PGHOST", "PGPORT", "PGUSER", "PGSSLMODE", "PGDATABASE"):
        monkeypatch.delenv(name, raising=False)


@pytest.mark.parametrize(
    ("url", "where", "user"),
    [
        ("postgresql://qf:s3cret@db.example:6543/jobs", "db.example:6543", "qf"),
        ("postgres://qf@db.example/jobs?sslmode=require", "db.example:5432", "qf"),
        ("postgresql://qf@a:1,b/jobs?port=7", "a:1, b:5432", "qf"),
        ("postgresql://q%40f@[::1]:5433/jobs", "[::1]:5433", "q@f"),
        ("postgresql:///jobs?host=/var/run/pg&port=5433&user=qf", "/var/run/pg/.s.PGSQL.5433", "qf"),
    ],
)
def test_where_a_url_connects_and_as_whom(url: str, where: str, user: str) -> None:
    assert read_url(url) == Target(where=where, user=user, database="jobs")


def test_the_environment_fills_in_what_the_url_leaves_out(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGHOST", "envhost")
    monkeypatch.setenv("PGPORT", "6000")
    assert read_url("postgresql:///jobs") == Target(where="envhost:6000", user=getpass.getuser(), database="jobs")
    monkeypatch.setenv("PGUSER", "envuser")
    assert read_url("postgresql://db/jobs").user == "envuser"
    assert read_url("postgresql://db").database == "envuser"  # no database named: libpq takes the user's
    monkeypatch.setenv("PGDATABASE", "envdb")
    assert read_url("postgresql://db").database == "envdb"


def test_no_host_is_the_socket_directories_then_localhost() -> None:
    where = read_url("postgresql:///jobs").where
    assert where.startswith("/run/postgresql/.s.PGSQL.5432, ") and where.endswith("localhost:5432")


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("mysql://qf:s3cret@db/jobs", '"postgresql"'),
        ("postgresql://qf:s3cret@db/jobs?sslmode=bogus", "`sslmode` parameter must be one of: disable, allow,"),
        ("postgresql://qf:s3cret@db:abc/jobs", "not a number: 'abc'"),
        ("postgresql://qf:s3cret@db:70000/jobs", "out of range"),
        ("postgresql://qf:s3cret@/jobs?host=a,b,c&port=1,2", "could not match 2 port numbers to 3 hosts"),
    ],
)
def test_a_url_that_cannot_work_is_refused_without_its_password(url: str, says: str) -> None:
    with pytest.raises(errors.ConfigError) as caught:
        read_url(url)
    assert says in str(caught.value)
    assert "s3cret" not in str(caught.value)
