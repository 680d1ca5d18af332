"""Completion in %%dpsql cells: the IPython matcher the kernel answers with, fed by a real
gate's public schema, asked through IPython's own completer as a front end asks.

Through real processes (gate, kernel or CLI); the in-process tests of the same subject
are in tests/unit/test_completion.py, the shells and ``complete`` in tests/shells.py."""

# ruff: noqa: F811 - the shell fixtures are tests/shells.py's
from __future__ import annotations

import pytest

from tests.shells import complete, connected, ipython, shell  # noqa: F401


def texts(found: list[tuple]) -> list[str]:
    return [t for t, _ in found]


def test_after_select_a_column_names_functions_and_keywords(connected):
    found = complete(connected, "%%dpsql\nSELECT A")
    assert ("age", "column") in found
    assert ("AVG", "function") in found and ("ABS", "function") in found
    assert ("AND", "keyword") in found
    # nothing from Python inside SQL
    assert all(kind in ("column", "function", "keyword", "table") for _, kind in found)
    # typed in lower case, keywords and functions are offered in lower case
    lower = complete(connected, "%%dpsql\nSELECT a")
    assert ("avg", "function") in lower and ("age", "column") in lower


def test_after_from_only_table_names(connected):
    assert complete(connected, "%%dpsql\nSELECT COUNT(*) FROM ") == [("t", "table")]
    assert complete(connected, "%dpsql SELECT COUNT(*) FROM ") == [("t", "table")]


def test_a_tables_alias_completes_its_columns(connected):
    cell = "%%dpsql\nSELECT x.s FROM t AS x"
    found = complete(connected, cell, cell.index(" FROM"))
    assert found == [("x.sex", "column")]


def test_the_magic_line_completes_options_and_snippets(connected, capsys):
    assert ("--dry-run", "option") in complete(connected, "%%dpsql --dr")
    assert texts(complete(connected, "%%dpsql --mo")) == ["--mock", "--mock-rows"]
    connected.run_cell_magic("dpsql", "--save adults", "SELECT * FROM t WHERE age >= 18")
    assert complete(connected, "%%dpsql --with ad") == [("adults", "snippet")]


def test_python_cells_keep_pythons_completions(connected):
    connected.user_ns["some_variable_name"] = 1
    assert "some_variable_name" in texts(complete(connected, "x = 1\nsome_var"))


@pytest.mark.parametrize("cell", ["%%dpsql\nSELECT ", "%%dpsql\n"])
def test_an_empty_word_offers_everything_from_the_schema(connected, cell):
    found = texts(complete(connected, cell))
    assert {"age", "sex", "pid", "t", "SELECT", "COUNT"} <= set(found)
