"""JupySQL's conventions in dpmagic: ``{{var}}``, ``autopandas``/``autopolars``, and
``[tool.dpmagic]`` in ``pyproject.toml``; in a real IPython shell against a real gate.

Through real processes (gate, kernel or CLI); the in-process tests of the same subject
are in tests/unit/test_conventions.py."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import polars
import pytest
from IPython.core.error import UsageError
from IPython.core.interactiveshell import InteractiveShell
from traitlets.config import Config

from dpmagic.client.http_gate import Gate
from dpmagic.client.settings import find_pyproject
from dpmagic.display.result import DPResult
from dpmagic.magics.dpsql import DpSql, register

COUNT_OLD = "SELECT COUNT(*) AS n FROM t WHERE age >= {{min_age}} AND sex = {{sex}}"


@pytest.fixture
def shell(gate, monkeypatch) -> InteractiveShell:
    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    ipython = InteractiveShell.instance(config=config)
    monkeypatch.delenv("DPMAGIC_GATE", raising=False)
    monkeypatch.setenv("JPY_SESSION_NAME", "conventions.ipynb")
    ipython.configurables[:] = [c for c in ipython.configurables if not isinstance(c, DpSql)]
    ipython.config.pop("DpSql", None)  # %config lines of earlier tests
    register(ipython)
    ipython.run_line_magic("config", f"DpSql.gate = {gate.address!r}")
    return ipython


def magics(shell: InteractiveShell) -> DpSql:
    return next(c for c in shell.configurables if isinstance(c, DpSql))


def test_template_values_are_bound_by_the_gate(shell, gate):
    shell.user_ns.update(min_age=70, sex=1)
    templated = shell.run_cell_magic("dpsql", "-e 0.5", COUNT_OLD)
    # The same query with $name: the same canonical query and parameters, so a replay.
    dollar = shell.run_cell_magic("dpsql", "-e 0.5", COUNT_OLD.replace("{{", "$").replace("}}", ""))
    assert dollar.replayed and dollar.rows == templated.rows
    # A value that would change the query if spliced stays one (typed) value.
    shell.user_ns["sex"] = "1 OR 1=1"
    with pytest.raises(UsageError, match="compares number with text"):
        shell.run_cell_magic("dpsql", "-e 0.5", COUNT_OLD)
    # What reaches the gate is the parameter, never the value spliced into the text.
    (first, _) = Gate(gate.address).history(notebook="conventions.ipynb")["entries"]
    assert "$min_age" in first["sql"] and "$sex" in first["sql"] and "70" not in first["sql"]


def test_quoted_template_needs_a_string(shell):
    shell.user_ns["s"] = 1
    with pytest.raises(UsageError, match=r"'\{\{s\}\}' is a string literal but s is a int"):
        shell.run_cell_magic(
            "dpsql", "", "SELECT COUNT(*) AS n FROM t WHERE CAST(sex AS TEXT) = '{{s}}'"
        )


def test_undefined_template_variable_is_named_by_the_gate(shell):
    with pytest.raises(UsageError, match=r"^query refused: parameter \$nope has no value"):
        shell.run_cell_magic("dpsql", "", "SELECT COUNT(*) AS n FROM t WHERE age > {{nope}}")


def test_autopandas_and_autopolars_store_dataframes(shell, capsys):
    sql = "SELECT sex, COUNT(*) AS n FROM t GROUP BY sex ORDER BY sex"
    shown = shell.run_cell_magic("dpsql", "-e 0.5 plain <<", sql)
    assert isinstance(shell.user_ns["plain"], DPResult)
    shell.run_line_magic("config", "DpSql.autopandas = True")
    again = shell.run_cell_magic("dpsql", "-e 0.5 frame <<", sql)
    assert isinstance(again, DPResult)  # the cell still shows the accuracy and the cost
    assert isinstance(shell.user_ns["frame"], pd.DataFrame)
    assert shell.user_ns["frame"]["n"].tolist() == [r[1] for r in shown.rows]
    shell.run_line_magic("config", "DpSql.autopolars = True")
    assert magics(shell).autopandas is False  # one kind at a time, as in JupySQL
    shell.run_cell_magic("dpsql", "-e 0.5 -o fast", sql)
    assert isinstance(shell.user_ns["fast"], polars.DataFrame)
    assert shell.user_ns["fast"]["n"].to_list() == [r[1] for r in shown.rows]
    out = capsys.readouterr().out
    assert "stored in frame (a pandas DataFrame)" in out
    assert "stored in fast (a polars DataFrame)" in out


def test_feedback_off_stores_quietly(shell, capsys):
    shell.run_line_magic("config", "DpSql.feedback = False")
    shell.run_cell_magic("dpsql", "-e 0.5 quiet <<", "SELECT COUNT(*) AS n FROM t")
    assert "quiet" in shell.user_ns and capsys.readouterr().out == ""


def test_nearest_pyproject_supplies_defaults(tmp_path: Path, shell, monkeypatch, capsys, gate):
    (tmp_path / "pyproject.toml").write_text(
        "[project]\nname = 'course'\n\n[tool.dpmagic]\n"
        f"gate = {gate.address!r}\ndataset = 'd'\nepsilon = 0.25\ndisplaylimit = 1\n"
        "autopolars = true\n"
    )
    notebooks = tmp_path / "week1" / "notebooks"
    notebooks.mkdir(parents=True)
    assert find_pyproject(notebooks) == tmp_path / "pyproject.toml"
    monkeypatch.chdir(notebooks)
    shell.configurables[:] = [c for c in shell.configurables if not isinstance(c, DpSql)]
    register(shell)
    assert (
        f"settings from [tool.dpmagic] in {tmp_path / 'pyproject.toml'}" in capsys.readouterr().out
    )
    result = shell.run_cell_magic("dpsql", "r <<", "SELECT sex, COUNT(*) AS n FROM t GROUP BY sex")
    assert result.cost["epsilon"] == 0.25
    assert result.footer().endswith("showing 1 of 2 rows")
    assert isinstance(shell.user_ns["r"], polars.DataFrame)
    # %config still wins over the project file.
    shell.run_line_magic("config", "DpSql.epsilon = 0.5")
    assert shell.run_cell_magic("dpsql", "", "SELECT COUNT(*) AS n FROM t").cost["epsilon"] == 0.5
