"""docs/sdks.md's table of runtimes × rules names every scenario of the
suite, once, and a column for every runtime."""

from __future__ import annotations

import re

from . import test_rules
from .conftest import RUNTIMES
from ..processes import ROOT


def test_the_docs_table_names_every_scenario_and_runtime() -> None:
    text = (ROOT / "docs" / "sdks.md").read_text()
    header = next(line for line in text.splitlines() if line.startswith("| rule | scenario |"))
    assert [cell.strip().lower() for cell in header.strip("|").split("|")[2:]] == RUNTIMES
    named = re.findall(r"^\|[^|]*\| `(test_\w+)` \|", text, re.M)
    scenarios = [name for name in vars(test_rules) if name.startswith("test_")]
    assert sorted(named) == sorted(scenarios)
