"""The magics in a real IPython shell, against a real gate process.

Through real processes (gate, kernel or CLI); the in-process tests of the same subject
are in tests/unit/test_magics.py, the shells both use in tests/shells.py."""

# ruff: noqa: F811 - the shell fixtures are tests/shells.py's

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from IPython.core.error import UsageError

from dpmagic.client import identity
from dpmagic.display.budget import BudgetView
from dpmagic.display.render import format_value
from dpmagic.display.result import DPResult
from dpmagic.display.schema import SchemaView
from tests.conftest import TOKENS
from tests.shells import COUNT_BY_SEX, connected, ipython, shell  # noqa: F401


def test_cell_magic_returns_a_result_with_its_footer(connected):
    result = connected.run_cell_magic("dpsql", "-e 0.5", COUNT_BY_SEX)
    assert isinstance(result, DPResult)
    assert result.columns == ["sex", "n"]
    assert result.footer() == (
        "ε 0.5 spent · ε 1.5 left for the notebook, ε 4.5 left for the user"
        " · over bounded data: ≤ 1 row per pid"
    )
    assert "<table>" in result._repr_html_()


def test_a_value_released_first_is_shown_with_its_interval(connected):
    """The gate's typed ``stages`` facts as the user reads them: the subquery released
    first, the value the query compared with, its interval and its ε."""
    sql = "SELECT COUNT(*) AS n FROM t WHERE age > (SELECT AVG(age) FROM t)"
    result = connected.run_cell_magic("dpsql", "-e 0.5", sql)
    ((stage,),) = [result.envelope.stages]
    lo, hi = (format_value(v) for v in stage.interval)
    assert result.footer().startswith(
        "ε 0.5 spent · released first, with ε 0.25: SELECT AVG(age) FROM t = "
        f"{format_value(stage.value)} (95% interval {lo} to {hi}); the query compared "
        "with this noisy value · ε 1.5 left for the notebook"
    )
    dry = connected.run_cell_magic("dpsql", "-e 0.5 --dry-run", sql)
    assert "released first, with ε 0.25: SELECT AVG(age) FROM t ·" in dry.footer()


def test_a_table_released_first_and_worked_on_is_said(connected):
    """The gate's typed ``stages`` and ``post_processed`` facts as the user reads them:
    the CTE released first with its rows, and the rest of the query worked on it free."""
    sql = (
        "WITH s AS (SELECT sex, COUNT(*) AS n FROM t GROUP BY sex) "
        "SELECT sex, n FROM s WHERE n = (SELECT MAX(n) FROM s)"
    )
    result = connected.run_cell_magic("dpsql", "-e 0.5", sql)
    # The sexes whose noisy count is the largest: both, when the two noisy counts tie
    # (about one run in twenty at this scale).
    assert result.columns == ["sex", "n"] and len({n for _, n in result.rows}) == 1
    assert result.footer().startswith(
        "ε 0.5 spent on the releases below; the rest of the query worked on them (and public "
        "tables) at no further cost · released first, with ε 0.5: SELECT sex, COUNT(*) AS n "
        "FROM t GROUP BY sex (2 rows with noise); the query worked on these rows · ε 1.5 left"
    )
    dry = connected.run_cell_magic("dpsql", "-e 0.5 --dry-run", sql)
    assert dry.footer().startswith(
        "dry run: nothing charged; it would spend ε 0.5 · released first, with ε 0.5: "
        "SELECT sex, COUNT(*) AS n FROM t GROUP BY sex ·"
    )


def test_per_person_values_are_shown_with_their_bounds(connected):
    """The gate's typed ``per_person`` facts as the user reads them: each value's bound
    and why, decided from the text and the policy (one row per person here)."""
    sql = (
        "SELECT n, COUNT(*) AS persons FROM (SELECT pid, COUNT(*) AS n, AVG(age) AS a "
        "FROM t GROUP BY pid) AS p GROUP BY n"
    )
    result = connected.run_cell_magic("dpsql", "-e 0.5", sql)
    assert [row[0] for row in result.rows] == [0, 1]  # the keys 0..rows, all released
    assert (
        " · per person: COUNT(*) in [0, 1]: 1 row per unit; AVG(age) in [0, 100]: the "
        "argument's range"
    ) in result.footer()
    dry = connected.run_cell_magic("dpsql", "-e 0.5 --dry-run", sql)
    assert "per person: COUNT(*) in [0, 1]" in dry.footer()


def test_running_the_same_cell_again_is_replayed(connected):
    first = connected.run_cell_magic("dpsql", "-e 0.5", COUNT_BY_SEX)
    again = connected.run_cell_magic("dpsql", "-e 0.5", COUNT_BY_SEX)
    assert again.replayed and again.rows == first.rows
    assert again.footer().startswith("replayed (no cost)")
    fresh = connected.run_cell_magic("dpsql", "-e 0.5 --fresh", COUNT_BY_SEX)
    assert not fresh.replayed and fresh.cost["epsilon"] == pytest.approx(0.5)


def test_results_are_stored_in_the_named_variable(connected, capsys):
    connected.run_cell_magic("dpsql", "-e 0.5 a <<", COUNT_BY_SEX)
    connected.run_cell_magic("dpsql", "-e 0.5", f"b << {COUNT_BY_SEX}")
    connected.run_cell_magic("dpsql", "-e 0.5 -o c", COUNT_BY_SEX)
    ns = connected.user_ns
    assert ns["a"].rows == ns["b"].rows == ns["c"].rows
    assert ns["c"].df["n"].tolist() == [row[1] for row in ns["a"].rows]
    assert "stored in c" in capsys.readouterr().out


def test_a_whole_cell_runs_through_the_shell(connected):
    outcome = connected.run_cell(f"%%dpsql -e 0.5 x <<\n{COUNT_BY_SEX}\n")
    assert outcome.success
    assert outcome.result is connected.user_ns["x"]


def test_line_form_keeps_the_sql_verbatim(connected):
    connected.user_ns["min_age"] = 70
    result = connected.run_line_magic(
        "dpsql", "-e 0.5 y << SELECT COUNT(*) AS n FROM t WHERE age >= $min_age AND sex <> -1"
    )
    assert result.columns == ["n"]
    assert connected.user_ns["y"] is result


def test_dry_run_charges_nothing(connected):
    result = connected.run_cell_magic("dpsql", "--dry-run -e 1", "SELECT AVG(age) AS a FROM t")
    assert result.dry_run and result.plan
    assert "dry run: nothing charged" in result._repr_html_()
    budget = connected.run_line_magic("dpbudget", "")
    assert budget["d"].budget["user"]["spent"]["epsilon"] == 0


def test_config_supplies_defaults(connected):
    connected.run_line_magic("config", "DpSql.epsilon = 0.25")
    connected.run_line_magic("config", "DpSql.dataset = 'd'")
    connected.run_line_magic("config", "DpSql.displaylimit = 1")
    result = connected.run_cell_magic("dpsql", "", COUNT_BY_SEX)
    assert result.cost["epsilon"] == pytest.approx(0.25)
    assert result.footer().endswith("showing 1 of 2 rows")


def test_refusal_is_a_one_line_usage_error(connected):
    with pytest.raises(UsageError) as refused:
        connected.run_cell_magic("dpsql", "-e 0.5", "SELECT pid FROM t")
    message = str(refused.value)
    assert message.startswith("query refused: ")
    assert "pid" in message and "\n" not in message
    outcome = connected.run_cell("%%dpsql -e 0.5\nSELECT pid FROM t\n")
    assert isinstance(outcome.error_in_exec, UsageError)


def test_budget_exhaustion_is_a_usage_error_with_numbers(connected):
    connected.run_cell_magic("dpsql", "-e 1.5", COUNT_BY_SEX)
    with pytest.raises(
        UsageError, match=r"^not enough privacy budget in this notebook's budget: .*0\.5"
    ):
        connected.run_cell_magic("dpsql", "-e 1", "SELECT COUNT(*) AS n FROM t")


def test_notebook_identity_from_the_session(connected, monkeypatch):
    connected.user_ns["__session__"] = "from-namespace.ipynb"
    assert connected.run_line_magic("dpbudget", "").notebook == "from-namespace.ipynb"
    monkeypatch.setenv("JPY_SESSION_NAME", "course/week 1/hw1.ipynb")
    connected.run_cell_magic("dpsql", "-e 0.5", COUNT_BY_SEX)
    view = connected.run_line_magic("dpbudget", "--dataset d")
    assert isinstance(view, BudgetView)
    assert view.notebook == "course/week 1/hw1.ipynb"
    assert view["d"].budget["notebook"]["spent"]["epsilon"] == pytest.approx(0.5)
    assert "notebook course/week 1/hw1.ipynb" in repr(view)


def test_a_plain_shell_is_named_after_its_folder(connected):
    assert connected.run_line_magic("dpbudget", "").notebook == (
        f"ipython:{identity._short(Path.cwd())}"
    )


def test_a_servers_notebook_is_named_relative_to_the_servers_root(connected, monkeypatch, tmp_path):
    """Jupyter gives the kernel an absolute path; the footer shows it from the root."""
    root = tmp_path / "root"
    (root / "course").mkdir(parents=True)
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    (runtime / f"jpserver-{os.getppid()}.json").write_text(json.dumps({"root_dir": str(root)}))
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(runtime))
    monkeypatch.setenv("JPY_SESSION_NAME", str(root / "course" / "hw1.ipynb"))
    result = connected.run_cell_magic("dpsql", "-e 0.5", COUNT_BY_SEX)
    assert result.budget_note()["notebook"] == "course/hw1.ipynb"
    assert connected.run_line_magic("dpbudget", "").notebook == "course/hw1.ipynb"
    # without the server's runtime file, the path is shortened, never dropped
    (runtime / f"jpserver-{os.getppid()}.json").unlink()
    assert connected.run_line_magic("dpbudget", "").notebook.endswith("course/hw1.ipynb")


def test_mock_runs_cost_nothing_and_say_so(connected):
    result = connected.run_cell_magic("dpsql", "--mock --mock-rows 20", "SELECT * FROM t")
    assert result.mock and len(result.rows) == 20
    assert "mock data — not the real dataset" in result.footer()
    view = connected.run_line_magic("dpbudget", "")
    assert view["d"].history == []


def test_snippets_become_ctes_the_gate_analyses_whole(connected, capsys):
    assert (
        connected.run_cell_magic("dpsql", "--save old", "SELECT * FROM t WHERE age >= 60") is None
    )
    assert "saved snippet old" in capsys.readouterr().out
    connected.run_cell_magic(
        "dpsql", "--save old_women --with old", "SELECT * FROM old WHERE sex = 1"
    )
    result = connected.run_cell_magic(
        "dpsql", "-e 0.5 --with old_women", "SELECT COUNT(*) AS n FROM old_women"
    )
    sent = result.reply["request"]["sql"]
    assert sent.index("old AS (") < sent.index("old_women AS (") < sent.index("SELECT COUNT")
    # the answer counts the composed query's rows: at ε = 0.5 a count's discrete Laplace
    # noise has scale 2, so it misses by more than 30 with probability e^-15 < 1e-6
    expected = sum(1 for pid in range(200) if 20 + pid % 60 >= 60 and pid % 2 == 1)
    assert abs(result.rows[0][0] - expected) <= 30
    # the gate still sees the row-level snippet as part of the query: alone it refuses it
    with pytest.raises(UsageError, match="query refused"):
        connected.run_cell_magic("dpsql", "--with old", "SELECT * FROM old")
    with pytest.raises(UsageError, match="no snippet nope"):
        connected.run_cell_magic("dpsql", "--with nope", "SELECT COUNT(*) FROM nope")


def test_inline_intervals_from_config(connected):
    connected.run_line_magic("config", "DpSql.intervals = 'inline'")
    try:
        result = connected.run_cell_magic("dpsql", "-e 0.5", COUNT_BY_SEX)
    finally:
        connected.run_line_magic("config", "DpSql.intervals = 'shown'")  # the shell is shared
    assert result.intervals == "inline" and " ± " in result._repr_html_()


def test_schema_magic(connected):
    view = connected.run_line_magic("dpschema", "")
    assert isinstance(view, SchemaView)
    assert "privacy unit pid" in view.summary()
    assert "<td>age</td><td>int</td><td>[0, 100]</td>" in view._repr_html_()
    assert "<td>sex</td><td>int</td>" in view._repr_html_()
    uses = "GROUP BY, SUM/AVG/VARIANCE/STDDEV, MEDIAN/MIN/MAX/quantiles, WHERE, COUNT"
    assert f"<td>0, 1</td><td>{uses}</td></tr>" in view._repr_html_()
    assert "<td>pid</td><td>int</td><td></td><td></td><td>privacy unit" in view._repr_html_()
    assert "private · privacy unit in column pid · each unit in ≤ 1 groups" in view._repr_html_()


def test_connect_magic(shell, gate, short_dir: Path, capsys):
    shell.run_line_magic("dpconnect", gate.address)
    assert f"connected to the gate at {gate.address}" in capsys.readouterr().out
    assert shell.run_cell_magic("dpsql", "-e 0.5", COUNT_BY_SEX).columns == ["sex", "n"]
    with pytest.raises(UsageError, match="no gate answers"):
        shell.run_line_magic("dpconnect", f"unix:{short_dir / 'nobody.sock'}")
    with pytest.raises(UsageError, match="usage"):
        shell.run_line_magic("dpconnect", "")


def test_connect_with_a_token(shell, tcp_gate, capsys):
    shell.run_line_magic("dpconnect", f"{tcp_gate.address} --token {TOKENS['alice']}")
    result = shell.run_cell_magic("dpsql", "-e 0.5", COUNT_BY_SEX)
    assert result.cost["epsilon"] == pytest.approx(0.5)
    shell.run_line_magic("config", "DpSql.token = 'not-a-token-of-this-gate'")
    with pytest.raises(UsageError, match=r"^the gate refused access: "):
        shell.run_line_magic("dpbudget", "")
