"""What the documentation names exists: each route of the HTTP API the docs
give with its method, each flag of a ``qftrio`` command they write out (checked
against that command's own parser), each ``QUEUEFLOW_*``/``QFTRIO_*``
environment variable and each ``qftrio_*`` metric name; and docs/client.md's
table of calls gives every call of the Python clients, each with the
signature it has.

Routes are checked against ``/openapi.json`` of a real server (or, for pages
such as ``/docs`` that it does not describe, a real ``GET``), metric names
against a real ``/metrics``. Each check returns what does not exist, and
``test_each_check_finds_what_does_not_exist`` holds the checks to failing on a
name that was never there.
"""

from __future__ import annotations

import argparse
import inspect
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import httpx
import pytest

from qftrio.cli import build_parser
from qftrio.client import SyncClient

from .conftest import RunningServer
from .processes import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL_FENCES = {"", "sh", "bash", "console"}
CODE_ROOTS = [ROOT / "qftrio", ROOT / "scripts", ROOT / "benchmarks", ROOT / "tests"]


def texts() -> list[str]:
    return [path.read_text() for path in DOCS]


# -- what the docs name ------------------------------------------------------


#: Words that run the command after them.
RUNNERS = ("exec", "sudo", "nohup", "time", "env")


def shell_lines(text: str) -> Iterator[str]:
    """Every line of a shell or console block, and every inline code span
    outside code blocks."""
    # a fence may be indented, as in a list item
    for lang, body in re.findall(r"^[ \t]*```(\w*)\n(.*?)^[ \t]*```", text, re.S | re.M):
        if lang in SHELL_FENCES:
            yield from body.splitlines()
    prose = re.sub(r"^[ \t]*```.*?^[ \t]*```", "", text, flags=re.S | re.M)
    # a span may go on over a line's end, as a paragraph does
    yield from re.findall(r"`([^`]+)`", re.sub(r"(?<!\n)\n(?!\n)", " ", prose))


def routes_named(text: str) -> set[tuple[str, str]]:
    """``METHOD /path`` pairs, a path's ``a|b`` alternatives expanded, its
    query left out, and each ``{parameter}`` as ``{}``."""
    found = set()
    for method, path in re.findall(r"\b(GET|POST|PUT|PATCH|DELETE) (/[^\s`?\"]*)", text):
        head, _, last = path.rstrip(".,;:)").rpartition("/")
        for alternative in last.split("|"):
            found.add((method, re.sub(r"\{[^}]*\}", "{}", f"{head}/{alternative}")))
    return found


def flags_named(text: str) -> Iterator[tuple[str, list[str], list[str]]]:
    """``(where, command words, flags)`` for every ``qftrio`` command written
    out: in shell lines and code spans, and in a table row whose first cell
    is one (the flags of the whole row are that command's). ``a|b`` in a
    command word names each of its alternatives."""
    for line in shell_lines(text):
        for segment in re.split(r"\s(?:\|\|?|&&|;|#)\s|\$\(|\)", line.replace("\\|", "⁞")):
            words = segment.split()
            for i, word in enumerate(words):
                # a command, not the name in a sentence: first in its segment,
                # after variables set for it, or after a word that runs it
                before = words[i - 1] if i else ""
                runs = all("=" in w for w in words[:i]) or before.endswith((";", "&")) or before in RUNNERS
                if (word == "qftrio" or word.endswith("/qftrio")) and runs:
                    yield line, words[i + 1 :], []
    for row in re.findall(r"^\|(.*)\|$", text, re.M):
        cells = row.replace("\\|", "⁞").split("|")
        first = re.match(r"\s*`qftrio ([^`]*)`", cells[0])
        if first:
            yield row, first.group(1).split(), re.findall(r"--[a-z][a-z0-9-]*", row)


def env_vars_named(text: str) -> set[str]:
    return set(re.findall(r"\b(?:QUEUEFLOW|QFTRIO)_[A-Z0-9_]*[A-Z0-9]\b", text))


def metrics_named(text: str) -> set[str]:
    return set(re.findall(r"\bqftrio_[a-z0-9_]*[a-z0-9]\b", text))


def calls_documented(text: str) -> dict[str, str]:
    """``{name: parameters}`` of each ``name(parameters)`` in the first cell
    of a row of the table of calls ("| call | returns |")."""
    table = text[text.index("| call | returns |") :].split("\n\n")[0]
    found = {}
    for row in re.findall(r"^\|(.*)\|$", table, re.M):
        for name, params in re.findall(r"`(\w+)\(([^)`]*)\)`", row.split("|")[0]):
            found[name] = params
    return found


# -- what exists ---------------------------------------------------------------


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {o for action in parser._actions for o in action.option_strings}


def missing_flags(named: Iterable[tuple[str, list[str], list[str]]]) -> list[str]:
    """Each unknown command, and each flag its command does not take: a flag
    must be an option of the command (of each of its alternatives) or of a
    command above it."""
    missing = []
    for where, words, row_flags in named:
        levels = [[build_parser()]]  # the root, then each command word's alternatives
        rest = list(words)
        while rest and len(levels[-1]) == 1 and (choices := _subcommands(levels[-1][0])):
            alternatives = re.split(r"[⁞|]", rest[0].strip("[]"))
            if not all(a in choices for a in alternatives):
                if len(levels) == 1 and re.fullmatch(r"[a-z][a-z-]*", rest[0]):
                    missing.append(f"qftrio {rest[0]}: no such command ({where})")
                break
            levels.append([choices[a] for a in alternatives])
            rest.pop(0)
        above = {o for level in levels[:-1] for p in level for o in _options(p)}
        command = " ".join(["qftrio", *words[: len(levels) - 1]]).replace("⁞", "|")
        flags = row_flags or [w.split("=")[0] for w in rest if re.fullmatch(r"--[a-z][a-z0-9-]*(=.*)?", w)]
        for flag in flags:
            if not all(flag in _options(p) | above for p in levels[-1]):
                missing.append(f"{flag} of {command} ({where})")
    return missing


def _parameters(call: object) -> str:
    """A call's parameters as the table writes them: a positional one with
    its default (``payload=None``), ``*``, then the keyword-only ones by
    name (each defaults to what the server does)."""
    words = []
    # a call's description, whose signature both clients' methods have
    for p in inspect.signature(getattr(call, "__wrapped__", call)).parameters.values():
        if p.kind is p.KEYWORD_ONLY and "*" not in words:
            words.append("*")
        keyword = p.kind is p.KEYWORD_ONLY or p.default is p.empty
        words.append(p.name if keyword else f"{p.name}={p.default!r}")
    return ", ".join(words)


def wrong_signatures(documented: dict[str, str], client: type = SyncClient) -> list[str]:
    """Each call of *client* the table leaves out, each it gives that
    *client* does not have, and each it gives with other parameters."""
    calls = {name for name in dir(client) if not name.startswith("_") and name not in ("close", "aclose")}
    wrong = [f"{name}: not in the table" for name in sorted(calls - set(documented))]
    for name, params in documented.items():
        if name not in calls:
            wrong.append(f"{name}: no such call")
        elif re.sub(r"\s+", " ", params.strip()) != _parameters(getattr(client, name)):
            wrong.append(f"{name}({params}): the call is {name}({_parameters(getattr(client, name))})")
    return wrong


def _openapi_routes(openapi: dict) -> set[tuple[str, str]]:
    return {(m.upper(), re.sub(r"\{[^}]*\}", "{}", path)) for path, item in openapi["paths"].items() for m in item}


def missing_routes(named: Iterable[tuple[str, str]], openapi: dict, pages: set[tuple[str, str]]) -> list[str]:
    return sorted(f"{m} {p}" for m, p in set(named) - _openapi_routes(openapi) - pages)


def missing_env_vars(named: Iterable[str]) -> list[str]:
    code = "\n".join(
        p.read_text(errors="replace")
        for root in CODE_ROOTS
        for p in root.rglob("*")
        if p.is_file() and p.suffix != ".pyc" and p != Path(__file__)  # not the names this file makes up
    )
    return sorted(v for v in set(named) if v not in code)


def missing_metrics(named: Iterable[str], exposition: str, roles: Iterable[str] = ()) -> list[str]:
    """Names that are neither a metric of the exposition (a family, or a
    family's ``_total``, ``_bucket``, ``_sum``, ``_count`` series), nor a name
    of the stores' schema (tables, indexes, the notification channel), nor a
    database role the docs create themselves (*roles*)."""
    families = set(re.findall(r"^# TYPE (\S+)", exposition, re.M))
    series = {f + suffix for f in families for suffix in ("", "_total", "_bucket", "_sum", "_count")}
    schema = "\n".join(p.read_text() for p in (ROOT / "qftrio/server/store").rglob("*") if p.suffix in (".sql", ".py"))
    return sorted(n for n in set(named) - set(roles) if n not in series and not re.search(rf"\b{n}\b", schema))


# -- the checks ----------------------------------------------------------------


def test_every_qftrio_command_and_flag_the_docs_write_exists() -> None:
    named = [f for text in texts() for f in flags_named(text)]
    assert len(named) > 50
    assert missing_flags(named) == []


def test_the_table_of_calls_gives_every_call_with_its_signature() -> None:
    import qftrio

    documented = calls_documented((ROOT / "docs/client.md").read_text())
    assert len(documented) > 30
    assert wrong_signatures(documented) == []
    # both clients have the same calls
    assert wrong_signatures(documented, qftrio.Client) == []


def test_every_environment_variable_the_docs_name_exists() -> None:
    named = {v for text in texts() for v in env_vars_named(text)}
    assert {"QFTRIO_URL", "QFTRIO_TOKEN", "QFTRIO_WORKER_TOKEN", "QFTRIO_DATABASE_URL"} <= named
    assert missing_env_vars(named) == []


async def _pages(http: httpx.AsyncClient, routes: set[tuple[str, str]], openapi: dict) -> set[tuple[str, str]]:
    """The documented ``GET`` routes /openapi.json does not describe that a
    real server serves (``/openapi.json`` itself, ``/docs``)."""
    described = {re.sub(r"\{[^}]*\}", "{}", p) for p in openapi["paths"]}
    found = set()
    for method, path in routes:
        if method == "GET" and path not in described and "{}" not in path:
            if (await http.get(path)).status_code != 404:
                found.add((method, path))
    return found


@pytest.mark.parametrize("storage", ["sqlite"], indirect=True)
async def test_every_route_and_metric_the_docs_name_exists(server: RunningServer, http: httpx.AsyncClient) -> None:
    openapi = (await http.get("/openapi.json")).json()
    exposition = (await http.get("/metrics")).text
    protocol = (ROOT / "docs/protocol.md").read_text() + (ROOT / "docs/workflows.md").read_text()
    routes = {r for text in texts() for r in routes_named(text)}
    assert missing_routes(routes, openapi, await _pages(http, routes, openapi)) == []
    # and the other way round: protocol.md gives every route the server has
    assert missing_routes(_openapi_routes(openapi), {"paths": {}}, routes_named(protocol)) == []
    metrics = {m for text in texts() for m in metrics_named(text)}
    assert "qftrio_stale_token_rejections_total" in metrics
    roles = {r for text in texts() for r in re.findall(r"CREATE ROLE (\w+)", text)}
    assert missing_metrics(metrics, exposition, roles) == []


@pytest.mark.parametrize("storage", ["sqlite"], indirect=True)
async def test_each_check_finds_what_does_not_exist(server: RunningServer, http: httpx.AsyncClient) -> None:
    doc = """
```sh
QUEUEFLOW_TOKEN=dev qftrio jobs delete --status failed --older-than 3d
qftrio serve --dev | tee log; qftrio dashboard
```

| `qftrio queues pause\\|resume QUEUE` | (`--url`, `--force`) |

`POST /api/v1/jobs/{id}/pause`, `GET /api/v1/jobs`, `QUEUEFLOW_COLOUR`, `qftrio_jobs_snoozed_total`
"""
    openapi = (await http.get("/openapi.json")).json()
    exposition = (await http.get("/metrics")).text
    assert [m.partition(" (")[0] for m in missing_flags(flags_named(doc))] == [
        "--older-than of qftrio jobs delete",
        "qftrio dashboard: no such command",
        "--force of qftrio queues pause|resume",
    ]
    assert missing_routes(routes_named(doc), openapi, set()) == ["POST /api/v1/jobs/{}/pause"]
    assert missing_env_vars(env_vars_named(doc)) == ["QUEUEFLOW_COLOUR"]
    assert missing_metrics(metrics_named(doc), exposition) == ["qftrio_jobs_snoozed_total"]
    table = """
| call | returns |
|---|---|
| `enqueue(kind, payload=None, *, queue)`, `job_get(job_id)` | the `Job` |
| `job_pause(job_id)`, `health(verbose)` | x |
"""
    assert wrong_signatures(calls_documented(table))[-3:] == [
        "enqueue(kind, payload=None, *, queue): the call is enqueue(" + _parameters(SyncClient.enqueue) + ")",
        "job_pause: no such call",
        "health(verbose): the call is health()",
    ]
    assert "queue_stats: not in the table" in wrong_signatures(calls_documented(table))
