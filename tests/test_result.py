"""Rendering of gate replies: the table, its tooltips, the footer, escaping."""

from __future__ import annotations

import re

import pytest

from dpmagic.result import BudgetView, DPResult, SchemaView, format_value


def budget(nb_left: float, user_left: float) -> dict:
    return {
        "user": {
            "spent": {"epsilon": 5.0 - user_left, "delta": 0.0},
            "limit": {"epsilon": 5.0, "delta": 0.0},
            "remaining": {"epsilon": user_left, "delta": 0.0},
        },
        "notebook": {
            "spent": {"epsilon": 2.0 - nb_left, "delta": 0.0},
            "limit": {"epsilon": 2.0, "delta": 0.0},
            "remaining": {"epsilon": nb_left, "delta": 0.0},
        },
    }


def reply(**overrides) -> dict:
    base = {
        "dataset": "d",
        "columns": ["sex", "n", "mean <age>"],
        "rows": [[0, 41.0, 37.25], [1, 57.0, 44.5], ["<script>x</script>", 3.0, 50.0]],
        "cost": {"epsilon": 0.5, "delta": 0.0},
        "accuracy": {
            "alpha": 0.05,
            "columns": [
                None,
                {"mechanism": "discrete_laplace", "scale": 4.0, "intervals": [[29.0, 53.0]] * 3},
                {"mechanism": "laplace", "scale": 1.5, "intervals": [[30.5, 44.0]] * 3},
            ],
        },
        "budget": budget(1.5, 4.5),
        "replayed": False,
        "dry_run": False,
        "plan": [],
    }
    base.update(overrides)
    return base


def test_dataframe_and_intervals():
    result = DPResult(reply())
    assert list(result.df.columns) == ["sex", "n", "mean <age>"]
    assert result.df["n"].tolist() == [41.0, 57.0, 3.0]
    intervals = result.interval("n")
    assert intervals.columns.tolist() == ["lo", "hi"]
    assert intervals.iloc[0].tolist() == [29.0, 53.0]
    with pytest.raises(ValueError, match="group key"):
        result.interval("sex")
    with pytest.raises(KeyError):
        result.interval("nope")


def test_html_table_tooltips_and_footer():
    html = DPResult(reply())._repr_html_()
    assert html.count("<tr>") == 4
    assert 'title="95% interval [29, 53]"' in html
    assert 'title="95% interval [30.50, 44]"' in html
    # a group key carries no noise, so no tooltip
    assert "<td>0</td>" in html
    footer = re.search(r'class="dpmagic-footer"[^>]*>(.*?)</div>', html).group(1)
    assert footer == "ε 0.5 spent · ε 1.5 left for the notebook, ε 4.5 left for the user"


def test_html_escapes_everything_from_the_wire():
    html = DPResult(reply())._repr_html_()
    assert "<script>" not in html
    assert "&lt;script&gt;x&lt;/script&gt;" in html
    assert "<th>mean &lt;age&gt;</th>" in html


def test_html_inherits_theme_colours():
    html = DPResult(reply())._repr_html_()
    assert "background" not in html
    assert "#fff" not in html.lower() and "white" not in html.lower()
    assert "var(--jp-ui-font-color2, inherit)" in html


def test_replayed_answer_says_no_cost():
    result = DPResult(reply(replayed=True, cost={"epsilon": 0.0, "delta": 0.0}))
    assert result.footer().startswith("replayed (no cost) · ")
    assert "spent" not in result.footer()
    assert "replayed (no cost)" in result._repr_html_()
    assert "replayed (no cost)" in repr(result)


def test_dry_run_shows_the_plan_and_charges_nothing():
    plan = [
        {
            "aggregate": "COUNT(*)",
            "sensitivity": 2.0,
            "mechanism": "discrete_laplace",
            "scale": 8.0,
            "epsilon": 0.25,
        },
        {
            "aggregate": "SUM(age)",
            "sensitivity": 200.0,
            "mechanism": "discrete_laplace",
            "scale": 800.0,
            "epsilon": 0.25,
        },
    ]
    result = DPResult(
        reply(rows=[], dry_run=True, plan=plan, accuracy={"alpha": 0.05, "columns": []})
    )
    html = result._repr_html_()
    for header in ("aggregate", "bounds", "sensitivity", "mechanism", "scale", "cost"):
        assert f"<th>{header}</th>" in html
    row = (
        "<td>SUM(age)</td><td></td><td>200</td><td>discrete_laplace</td><td>800</td><td>ε=0.25</td>"
    )
    assert row in html
    assert "dry run: nothing charged; it would spend ε 0.5" in html
    text = repr(result)
    assert "COUNT(*)" in text and "dry run: nothing charged" in text


def test_text_repr_matches_the_table():
    text = repr(DPResult(reply()))
    lines = text.splitlines()
    assert lines[0].split() == ["sex", "n", "mean", "<age>"]
    assert lines[1].split() == ["0", "41", "37.25"]
    assert lines[-1] == "ε 0.5 spent · ε 1.5 left for the notebook, ε 4.5 left for the user"


def test_display_limit_truncates_and_says_so():
    result = DPResult(reply(), display_limit=2)
    assert result._repr_html_().count("<tr>") == 3
    assert result.footer().endswith("showing 2 of 3 rows")
    assert len(result.df) == 3


def test_delta_appears_only_when_in_play():
    result = DPResult(reply(cost={"epsilon": 0.5, "delta": 1e-6}))
    assert result.footer().startswith("ε 0.5, δ 1e-06 spent")


def test_format_value():
    assert format_value(None) == "NULL"
    assert format_value(True) == "True"
    assert format_value(12) == "12"
    assert format_value(12.0) == "12"
    assert format_value(12.345) == "12.35"
    assert format_value(0.012345) == "0.0123"
    assert format_value(float("nan")) == "nan"
    assert format_value("a") == "a"


def test_budget_view():
    view = BudgetView({"dataset": "d", **budget(1.5, 4.5)}, notebook="nb<1>.ipynb")
    html = view._repr_html_()
    assert "notebook nb&lt;1&gt;.ipynb" in html
    assert "<td>user</td><td>0.5</td><td>5</td><td>4.5</td>" in html
    assert "δ" not in html
    text = repr(view)
    assert "left ε" in text and "4.5" in text and "dataset d" in text


def test_schema_view():
    schema = {
        "dataset": "d",
        "privacy_unit": "pid",
        "neighbouring": "add_remove",
        "max_partitions": 2,
        "max_rows_per_partition": 3,
        "user_budget": {"epsilon": 5.0, "delta": 0.0},
        "notebook_budget": {"epsilon": 2.0, "delta": 0.0},
        "query_default": {"epsilon": 0.1, "delta": 0.0},
        "tables": {
            "t": {
                "public": False,
                "columns": {
                    "pid": {"type": "int"},
                    "age": {"type": "int", "lower": 0, "upper": 100},
                    "sex": {"type": "int", "public_values": [0, 1]},
                },
            },
            "states": {"public": True, "columns": {"name": {"type": "str"}}},
        },
    }
    view = SchemaView(schema)
    assert view.summary() == (
        "dataset d · privacy unit pid · neighbouring add_remove · "
        "each unit in ≤ 2 groups, ≤ 3 rows per group · "
        "budget: user ε 5, notebook ε 2, query default ε 0.1"
    )
    html = view._repr_html_()
    assert "<td>age</td><td>int</td><td>[0, 100]</td><td></td>" in html
    assert "<td>sex</td><td>int</td><td></td><td>0, 1</td>" in html
    assert "<strong>states (public)</strong>" in html
    assert "states (public)" in repr(view)
