"""Rendering of gate replies: the table, its tooltips, the footer, escaping."""

from __future__ import annotations

import re
from html import escape

import msgspec
import pytest

from dpmagic.display.budget import BudgetView, DatasetBudget
from dpmagic.display.render import budget_left, format_value
from dpmagic.display.result import DPResult
from dpmagic.display.schema import SchemaView
from dpmagic.protocol import Budgets, Clip
from tests.replies import budget, quantile_reply, reply


def test_dataframe_and_intervals():
    result = DPResult(reply())
    assert list(result.df.columns) == ["sex", "n", "mean <age>"]
    assert result.df["n"].tolist() == [41.0, 57.0, 3.0]
    intervals = result.interval("n")
    # aligned with the group keys, as JupySQL users join them
    assert intervals.columns.tolist() == ["sex", "lower", "upper"]
    assert intervals.iloc[0].tolist() == [0, 29.0, 53.0]
    assert intervals["sex"].tolist() == result.df["sex"].tolist()
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
    footer = re.search(r'class="dpm-footer-text">(.*?)</span>', html).group(1)
    assert footer.startswith("ε 0.5 spent · ε 1.5 left for the notebook, ε 4.5 left for the user")


def test_intervals_are_shown_beside_each_value_by_default():
    html = DPResult(reply())._repr_html_()
    spans = re.findall(r'<span class="dpm-int">(.*?)</span>', html)
    assert spans == ["[29, 53]", "[30.50, 44]"] * 3
    assert 'style="display:none"' not in html and "<details" not in html


def test_hover_setting_hides_intervals_behind_a_toggle():
    html = DPResult(reply(), intervals="hover")._repr_html_()
    assert '<details class="dpm-toggle"><summary>95% intervals</summary></details><table>' in html
    spans = re.findall(r'<span class="dpm-int" style="display:none">(.*?)</span>', html)
    assert spans == ["[29, 53]", "[30.50, 44]"] * 3
    # the style sheet opens exactly those spans when the toggle is open
    assert "details.dpm-toggle[open] ~ table .dpm-int { display: inline-block !important; }" in html
    # a cell the gate judged noise-dominated is flagged whatever the setting
    assert html.count('<span class="dpm-flag">noise dominates</span>') == 1


def test_no_toggle_without_noisy_cells():
    keys_only = reply(columns=["sex"], rows=[[0], [1]], accuracy={"alpha": 0.05, "columns": [None]})
    assert 'dpm-toggle"' not in DPResult(keys_only, intervals="hover")._repr_html_()


def test_footer_bars_show_earlier_spending_and_this_query():
    html = DPResult(reply())._repr_html_()
    bars = re.findall(
        r'role="meter" aria-valuemin="0" aria-valuemax="([\d.]+)" aria-valuenow="([\d.]+)" '
        r'aria-valuetext="[^"]*" title="(\w+): [^"]*".*?width: ([\d.]+)%.*?width: ([\d.]+)%',
        html,
    )
    # notebook: 0.5 of 2 spent, all of it by this query; user: 0.5 of 5.
    assert bars == [("2", "0.5", "notebook", "0.0", "25.0"), ("5", "0.5", "user", "0.0", "10.0")]
    replayed = DPResult(reply(replayed=True, cost={"epsilon": 0.0, "delta": 0.0}))
    assert re.findall(r"width: ([\d.]+)%", replayed._repr_html_())[:2] == ["25.0", "0.0"]


def test_html_escapes_everything_from_the_wire():
    html = DPResult(reply())._repr_html_()
    assert "<script>" not in html
    assert "&lt;script&gt;x&lt;/script&gt;" in html
    assert "<th>mean &lt;age&gt;</th>" in html


def test_html_inherits_theme_colours():
    """Every colour is a JupyterLab theme variable, so dark mode just works."""
    history = [{"time": "2026-01-01T10:00:00+00:00", "sql": "SELECT 1", "status": "released",
                "cost": {"epsilon": 0.5, "delta": 0.0}}]  # fmt: skip
    views = [
        DPResult(reply())._repr_html_(),
        BudgetView(
            [DatasetBudget({"dataset": "d", **budget(1.5, 4.5)}, history)], "nb"
        )._repr_html_(),
    ]
    for html in views:
        fixed = re.findall(r"#fff\b|#000\b|(?<![\w-])(?:white|black)(?![\w-])", html.lower())
        assert fixed == []
        colours = re.findall(r"(?:background|color|stroke|fill): ?([^;\"]+)", html)
        colours += re.findall(r'(?:stroke|fill)="([^"]+)"', html)
        assert colours
        for colour in colours:
            assert colour.startswith(("var(--jp-", "inherit", "none", "currentColor")), colour


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
        assert re.search(f'<th title="[^"]+">{re.escape(header)}</th>', html), header
    row = (
        "<td>SUM(age)</td><td></td><td>200</td><td>discrete_laplace</td><td>800</td><td>ε=0.25</td>"
    )
    assert row in html
    assert "dry run: nothing charged; it would spend ε 0.5" in html
    text = repr(result)
    assert "COUNT(*)" in text and "dry run: nothing charged" in text
    assert "Spark" not in text
    on_spark = DPResult(reply(rows=[], dry_run=True, plan=plan, engine="spark"))
    assert "dry run: nothing charged; it would spend ε 0.5 · answered by Spark" in repr(on_spark)


def test_text_repr_matches_the_table():
    text = repr(DPResult(reply()))
    lines = text.splitlines()
    assert lines[0].split() == ["sex", "n", "mean", "<age>"]
    # plain text shows each interval beside its value
    assert lines[1].split() == ["0", "41", "[29,", "53]", "37.25", "[30.50,", "44]"]
    assert lines[-1].startswith(
        "ε 0.5 spent · ε 1.5 left for the notebook, ε 4.5 left for the user"
    )


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


HISTORY = [
    {"time": "2026-03-01T09:15:02.123456+00:00", "dataset": "d", "status": "released",
     "sql": "SELECT COUNT(*) AS n\n  FROM t", "cost": {"epsilon": 0.5, "delta": 0.0}},
    {"time": "2026-03-01T09:16:00.000001+00:00", "dataset": "d", "status": "replayed",
     "sql": "SELECT COUNT(*) AS n FROM t", "cost": {"epsilon": 0.0, "delta": 0.0}},
    {"time": "2026-03-01T09:17:00+00:00", "dataset": "d", "status": "failed",
     "sql": "SELECT AVG(age) AS <a> FROM t " + "WHERE age > 1 " * 10,
     "cost": {"epsilon": 1.0, "delta": 0.0}},
]  # fmt: skip


def test_budget_view():
    view = BudgetView([DatasetBudget({"dataset": "d", **budget(0.5, 3.5)}, HISTORY)], "nb<1>")
    html = view._repr_html_()
    assert "notebook nb&lt;1&gt;" in html
    assert "you, all notebooks</td><td>1.5</td><td>5</td><td>3.5</td>" in html
    assert ">notebook nb&lt;1&gt;</td><td>1.5</td><td>2</td><td>0.5</td>" in html
    assert "δ" not in html
    rows = re.findall(r"<tr><td[^>]*>(2026[^<]*)</td><td[^>]*><code>(.*?)</code></td>"
                      r"<td[^>]*>(.*?)</td><td>(.*?)</td></tr>", html)  # fmt: skip
    assert [r[0] for r in rows] == [
        "2026-03-01 09:15:02",
        "2026-03-01 09:16:00",
        "2026-03-01 09:17:00",
    ]
    assert rows[0][1:] == ("SELECT COUNT(*) AS n FROM t", "ε 0.5", "answered")
    assert rows[1][2:] == ("ε 0", "replayed")  # its cost beside it: a shared one may charge
    assert rows[2][3] == "failed (charged)"
    assert rows[2][1].endswith("…") and len(rows[2][1]) < 100 and "&lt;a&gt;" in rows[2][1]
    assert 'title="SELECT AVG(age) AS &lt;a&gt; FROM t WHERE' in html
    text = repr(view)
    assert "dataset d" in text and "left ε" in text and "replayed" in text
    assert "renamed or moved, a notebook starts a new notebook budget" in text
    assert view["d"].history == HISTORY
    with pytest.raises(KeyError):
        view["e"]


def test_budget_chart_steps_up_by_each_cost():
    html = BudgetView([DatasetBudget({"dataset": "d", **budget(0.5, 3.5)}, HISTORY)], "nb")
    svg = re.search(r"<svg.*</svg>", html._repr_html_()).group()
    points = re.search(r'points="([^"]+)"', svg).group(1).split()
    heights = [float(p.split(",")[1]) for p in points]
    # one flat step per query at the running total: 0.5, 0.5, 1.5 (of a 2.0 limit)
    assert len(points) == 1 + 2 * len(HISTORY)
    bottom, top = heights[0], re.search(r'y1="([\d.]+)"', svg).group(1)
    per_eps = (bottom - float(top)) / 2.0
    assert [round((bottom - h) / per_eps, 6) for h in heights[1::2]] == [0.5, 0.5, 1.5]
    assert "limit ε 2" in svg


def test_budget_view_without_history():
    view = BudgetView([DatasetBudget({"dataset": "d", **budget(2.0, 5.0)}, [])], "nb")
    assert "no queries from this notebook yet" in view._repr_html_()
    assert "<svg" not in view._repr_html_()
    assert "no queries from this notebook yet" in repr(view)


def test_polars_frame_matches_pandas():
    result = DPResult(reply())
    assert result.pl.columns == result.columns
    assert result.pl["n"].to_list() == result.df["n"].tolist()
    assert result.pl["sex"].to_list() == ["0", "1", "<script>x</script>"]


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
    # every way a column can be used: grouping by an expression, sums, quantiles
    assert (
        "<td>age</td><td>int</td><td>[0, 100]</td><td></td><td>GROUP BY age or age // 10 "
        "(every value in its bounds), SUM/AVG/VARIANCE/STDDEV, MEDIAN/MIN/MAX/quantiles, "
        "WHERE, COUNT</td>"
    ) in html
    assert "<td>name</td><td>str</td><td></td><td></td><td>public table: join, filter" in html
    assert "<td>sex</td><td>int</td><td></td><td>0, 1</td>" in html
    assert "<strong>states (public)</strong>" in html
    assert "states (public)" in repr(view)


def test_a_quantile_is_shown_with_its_interval_in_units_and_its_band():
    result = DPResult(quantile_reply())
    assert result.rank_radius("median <age>") == 39.6
    with pytest.raises(ValueError, match="not a quantile"):
        DPResult(reply()).rank_radius("n")
    assert result.interval("median <age>")[["lower", "upper"]].values.tolist() == [
        [35.0, 38.5],
        [17.5, 100.0],
    ]
    assert result.percentiles("median <age>")["upper"].tolist() == [0.6, 1.0]
    assert result.noise_dominates("median <age>") == [False, True]
    html = result._repr_html_()
    assert "95% interval [35, 38.50], for its group&#x27;s true 0.5-quantile" in html
    assert "between the 40th and 60th percentile of its group&#x27;s values" in html
    assert "the group may be empty or nearly so" in html
    text = repr(result)
    assert "[35, 38.50]" in text and "[17.50, 100] (noise dominates)" in text
    assert "noise dominates 1 cell" in result.footer()


def test_a_stored_quantile_reply_without_interval_or_band_may_be_noise():
    """A reply a gate stored before quantiles carried an interval in units, for a
    query without a count of the argument: nothing to show but that it may be noise."""
    r = quantile_reply()
    r["accuracy"]["columns"][1].update(
        intervals=[None, None], count=None, percentiles=[None, None], noise_dominates=[None, None]
    )
    result = DPResult(r)
    assert result.noise_dominates("median <age>") == [None, None]
    assert result.interval("median <age>")["lower"].isna().all()
    html = result._repr_html_()
    assert html.count('<span class="dpm-flag">noise may dominate</span>') == 2
    assert "noise may dominate 2 cells" in result.footer()


def test_the_client_shows_the_gates_verdicts_and_never_judges_by_itself():
    """The demo's diagnoses with no visits: AVG(cost) of 0 or 50000 with [0, 50000]. The
    verdicts are the gate's: the client never pairs labels or re-derives them."""
    r = reply(
        columns=["diagnosis", "avg_cost", "visits"],
        rows=[["checkup", 512.0, 424], ["copd", 0.0, 27], ["cancer", 50000.0, 0]],
        accuracy={
            "alpha": 0.05,
            "columns": [
                None,
                {"mechanism": "post-processing", "measurements": ["SUM(cost) centred on 25000",
                 "COUNT(cost)"], "intervals": [[400.0, 640.0], [0.0, 26000.0], [0.0, 50000.0]],
                 "rule": "range", "range": [0.0, 50000.0], "noise_dominates": [False, True, True]},
                {"mechanism": "discrete_laplace", "measurements": ["COUNT(*)"],
                 "intervals": [[136.0, 712.0], [0.0, 315.0], [0.0, 136.0]], "rule": "zero",
                 "noise_dominates": [False, True, True]},
            ],
        },
    )  # fmt: skip
    result = DPResult(r)
    assert result.noise_dominates("avg_cost") == [False, True, True]
    assert result.noise_dominates("visits") == [False, True, True]
    assert result.noise_dominates("diagnosis") == [False] * 3
    html = result._repr_html_()
    assert html.count('<span class="dpm-flag">noise dominates</span>') == 4
    assert "covers at least half of the range [0, 50000]" in html
    assert "noise dominates 4 cells" in result.footer()
    # inline intervals: value ± half-width in every noisy cell, no toggle
    inline = DPResult(r, intervals="inline")._repr_html_()
    assert "424 ± 288" in inline and "<details" not in inline
    # a count released as 0 (its noisy value was below 0) is shown as the rule says,
    # in every view: 0 and its interval from 0, never "0 ± 315", which reaches below 0
    assert "0 ([0, 136])" in inline and "0 ± 136" not in inline
    assert "0 [0, 136] (noise dominates)" in repr(result)
    # the plain text and Markdown views say it too
    assert "0 [0, 50000] (noise dominates)" in repr(result)
    assert "0 \\[0, 50000\\] (noise dominates)" in result._repr_markdown_()
    # the same intervals with other verdicts: the client follows the gate
    r["accuracy"]["columns"][1]["noise_dominates"] = [True, False, False]
    assert DPResult(r).noise_dominates("avg_cost") == [True, False, False]


def test_a_flag_judged_on_a_wider_interval_shows_that_interval():
    """The issue's ``33.06 [19.77, 43.49] noise dominates``: the gate judged the cell on a
    wider interval (the one shown widened to the fewest rows its count allows) and says
    so in ``judged_wider``; every view shows it with the flag, the tooltip says why, and
    a cell whose interval alone flags it reads as before. A client that ignores the
    field shows the bare flag beside a narrow interval, which this test catches."""
    r = reply(
        columns=["party", "avg_income"],
        rows=[[3, 33.06], [7, 100.0], [1, 41.6]],
        accuracy={"alpha": 0.05, "columns": [None, {
            "intervals": [[19.77, 43.49], [0.0, 100.0], [39.4, 43.8]], "rule": "range",
            "range": [0.0, 100.0], "noise_dominates": [True, True, False],
            "judged_wider": {"rows": [0], "intervals": [[3.2, 63.4]], "least_rows": [9.4]},
        }]},
    )  # fmt: skip
    result = DPResult(r)
    text = repr(result)
    assert "33.06 [19.77, 43.49] (noise dominates, judged on [3.20, 63.40])" in text
    assert "100 [0, 100] (noise dominates)" in text
    html = result._repr_html_()
    assert '<span class="dpm-flag">noise dominates, judged on [3.20, 63.40]</span>' in html
    assert "in a group of 9 rows, the fewest its noisy count" in html
    assert "judged on \\[3.20, 63.40\\]" in result._repr_markdown_()
    # hover: the interval is behind the toggle, the flag and what it was judged on not
    hover = DPResult(r, intervals="hover")._repr_html_()
    assert "noise dominates, judged on [3.20, 63.40]</span>" in hover
    # a group that may be empty: no interval to show, and it says so
    r["accuracy"]["columns"][1]["judged_wider"] = {
        "rows": [0], "intervals": [None], "least_rows": [None]
    }  # fmt: skip
    assert "(noise dominates, its group may be empty)" in repr(DPResult(r))


def test_a_reply_from_an_older_gate_is_not_taken_for_facts():
    """No verdicts in the reply (a gate from before them): every noisy cell may be noise."""
    r = reply()
    for info in r["accuracy"]["columns"][1:]:
        del info["noise_dominates"]
    result = DPResult(r)
    assert result.noise_dominates("n") == [None] * 3
    assert "an older gate" in result._repr_html_()


def test_rich_outputs_carry_markdown_and_the_budget_note():
    result = DPResult(reply())
    result.notebook = "hw/1.ipynb"
    data, metadata = result._repr_mimebundle_()
    assert set(data) == {"text/html", "text/markdown", "text/plain"}
    lines = data["text/markdown"].splitlines()
    assert lines[0] == "| sex | n | mean &lt;age&gt; |"
    assert lines[2] == "| 0 | 41 \\[29, 53\\] | 37.25 \\[30.50, 44\\] |"
    assert "<script>" not in data["text/markdown"]
    assert metadata == {
        "dpmagic": {"notebook": "hw/1.ipynb", "dataset": "d", "epsilon_left": 1.5,
                    "epsilon_limit": 2.0}
    }  # fmt: skip


def test_jupysql_result_names():
    result = DPResult(reply())
    assert result.DataFrame() is result.df
    assert result.PolarsDataFrame()["n"].to_list() == [41.0, 57.0, 3.0]
    assert result.dict()["n"] == (41.0, 57.0, 3.0)
    assert list(result)[1] == (1, 57.0, 44.5)
    assert len(result) == 3
    assert result.csv().splitlines()[:2] == ["sex,n,mean <age>", "0,41.0,37.25"]


def test_dry_run_costs_in_epsilon_ranks_for_quantiles_and_each_columns_error():
    plan = [
        {"aggregate": "SUM(stay_days) centred on 15", "kind": "sum", "bounds": [0, 30],
         "sensitivity": 480.0, "norm": "L1", "mechanism": "discrete_laplace", "scale": 1920.0,
         "cost": {"epsilon": 0.25, "delta": 0.0, "rho": 0.03125}, "accuracy": 5752.0},
        {"aggregate": "COUNT(stay_days)", "kind": "count", "bounds": None, "sensitivity": 16.0,
         "norm": "L1", "mechanism": "discrete_laplace", "scale": 64.0,
         "cost": {"epsilon": 0.25, "delta": 0.0, "rho": 0.03125}, "accuracy": 192.0},
        {"aggregate": "MEDIAN(cost)", "kind": "quantile", "bounds": [0.0, 50000.0],
         "sensitivity": 16, "norm": "symmetric", "mechanism": "exponential", "scale": 320.0,
         "cost": {"epsilon": 0.1, "delta": 0.0}, "candidates": 1001, "level": 0.5},
        {"kind": "output", "column": "a", "aggregate": "AVG(stay_days)", "rule": "range",
         "range": [0, 30], "half_width_at": [[100, 57.5], [1000, 5.75]],
         "dominated_below": 767},
        {"kind": "output", "column": "m", "aggregate": "MEDIAN(cost)", "rule": "percentiles",
         "percentiles_at": [[100, [0.0, 1.0]], [1000, [0.0, 1.0]]], "dominated_below": 6339,
         "count": "COUNT(cost)"},
    ]  # fmt: skip
    pure = DPResult(reply(rows=[], dry_run=True, plan=plan, cost={"epsilon": 0.6, "delta": 0.0}))
    text = repr(pure)
    assert "ρ" not in text and "ε=0.25" in text
    # MEDIAN: 320 · ln(1001 / 0.05) / 2 = 1584.7 → 1585 ranks, no literal NULL
    assert "±1585 ranks" in text and "NULL" not in text
    # each column's error in its own units, at stated group sizes, from the gate's steps
    assert "a = AVG(stay_days)" in text and "±57.50 for a group of 100 rows" in text
    assert "p0–p100 for a group of 1,000 rows" in text
    # the warning, before anything is spent
    footer = pure.footer()
    assert "noise may dominate: a in groups under 767 rows; m in groups under 6,339 rows" in footer
    assert "noise may dominate" in pure._repr_html_() and "767" in pure._repr_markdown_()
    zcdp = DPResult(
        reply(rows=[], dry_run=True, plan=plan, cost={"epsilon": 0.6, "delta": 0.0, "rho": 0.07})
    )
    assert "ρ=0.0313" in repr(zcdp)  # 0.03125 as every amount: 3 digits, rounded up


def test_every_epsilon_the_notebook_shows_follows_one_rule():
    """Three significant digits everywhere an amount of ε is shown (the footer, a
    plan's steps, the values clipped, %dpbudget's table, bars and chart): spent and
    costs rounded up, limits and what is left down. Before, the footer said 0.36 and
    the plan 0.359312, the budget table 1.64069 and its bar's tooltip 1.641."""
    costs = {"epsilon": 0.359312, "delta": 0.0}
    plan = [
        {"aggregate": "COUNT(*)", "kind": "count", "sensitivity": 1, "norm": "L1",
         "mechanism": "discrete_laplace", "scale": 2.78, "cost": costs, "accuracy": 8.3},
    ]  # fmt: skip
    left = budget(2.0 - 0.359312, 4.640688)
    answer = DPResult(reply(cost=costs, budget=left))
    clipped = {"aggregate": "AVG(x)", "bounds": [0, 10], "source": "data", "moved": []}
    answer.envelope.clip = msgspec.convert(
        {"share": 0.1, "epsilon": 0.0359312, "rule": "r", "chosen": [clipped]}, Clip
    )
    dry = DPResult(reply(rows=[], dry_run=True, plan=plan, cost=costs, budget=left))
    entry = DatasetBudget(
        budget={"dataset": "d", **left},
        history=[{"time": "2026-01-01T10:00:00", "sql": "SELECT 1", "cost": costs,
                  "status": "released"}],
    )  # fmt: skip
    view = BudgetView([entry], "nb.ipynb")
    shown = " ".join(
        [answer.footer(), answer._repr_html_(), repr(dry), dry._repr_html_(), repr(view),
         view._repr_html_(), view._repr_markdown_()]
    )  # fmt: skip
    # a meter's machine-readable value stays exact; what it reads out (aria-valuetext)
    # and shows (its title) follow the rule
    shown = re.sub(r'aria-value(?:now|min|max)="[^"]*"', "", shown)
    for number in re.findall(r"(?:ε|ρ|δ)\s?=?\s?(\d[\d.e+-]*)", shown):
        digits = number.replace(".", "").lstrip("0")
        assert len(digits) <= 3, number
    for text in ("ε 0.36 spent", "ε=0.36", "ε 0.036", "ε 0.36 of 2 spent", "1.64", "4.64"):
        assert text in shown, text
    assert "0.359312" not in shown and "1.64069" not in shown and "4.64069" not in shown


def test_the_footer_rounds_budget_numbers():
    r = reply(cost={"epsilon": 0.35931, "delta": 0.0}, budget=budget(2.64069 - 1, 4.64069))
    footer = DPResult(r).footer()
    # spent rounded up, left rounded down: never more than is there
    assert footer.startswith("ε 0.36 spent · ε 1.64 left for the notebook, ε 4.64 left")


def test_an_expression_without_an_interval_gives_nan():
    r = reply()
    r["accuracy"]["columns"][2]["intervals"] = [None, [30.5, 44.0], None]
    intervals = DPResult(r).interval("mean <age>")
    assert intervals["lower"].isna().tolist() == [True, False, True]


def test_schema_shows_each_tables_unit_links_and_bounds():
    schema = {
        "dataset": "clinic",
        "privacy_unit": "id",
        "max_partitions": 4,
        "max_rows_per_partition": 5,
        "tables": {
            "patients": {"public": False, "unit": "id", "columns": {"id": {"type": "int"}}},
            "visits": {
                "public": False,
                "unit": "patient_id",
                "links": {"patient_id": "patients.id"},
                "columns": {"patient_id": {"type": "int"}, "id": {"type": "int"}},
            },
            "codes": {"public": True, "columns": {"code": {"type": "str"}}},
        },
    }
    view = SchemaView(schema)
    html, text = view._repr_html_(), repr(view)
    bounds = "each unit in ≤ 4 groups, ≤ 5 rows per group"
    link = "links visits.patient_id → patients.id"
    visits = f"private · privacy unit in column patient_id · {link} · {bounds}"
    assert f"patients: private · privacy unit in column id · {bounds}" in text
    assert f"visits: {visits}" in text
    assert "codes (public): public: no privacy unit, no privacy cost" in text
    assert escape(visits) in html
    # visits.id is an ordinary column there; the unit is patient_id
    assert "<td>patient_id</td><td>int</td><td></td><td></td><td>privacy unit" in html
    assert "<td>id</td><td>int</td><td></td><td></td><td>WHERE, COUNT</td>" in html


def test_a_row_level_dataset_says_each_row_is_a_unit():
    view = SchemaView({"privacy_unit": None, "tables": {"t": {"public": False, "columns": {}}}})
    assert "t: private · each row is its own privacy unit" in repr(view)


def test_budget_and_schema_views_read_as_markdown_and_publish_the_budget():
    view = BudgetView([DatasetBudget({"dataset": "d", **budget(0.5, 3.5)}, HISTORY)], "nb")
    data, metadata = view._repr_mimebundle_()
    markdown = data["text/markdown"]
    assert "| you, all notebooks | 1.5 | 5 | 3.5 |" in markdown
    assert "0.5 → 0.5 → 1.5 (limit 2)" in markdown  # the chart, as numbers
    assert metadata["dpmagic"]["epsilon_left"] == 0.5
    schema = SchemaView(
        {
            "dataset": "d",
            "privacy_unit": "pid",
            "tables": {"t": {"public": False, "columns": {"pid": {"type": "int"}}}},
        }
    )
    assert "| pid | int |" in schema._repr_markdown_()  # fmt: skip
    # where a viewer drops the SVG, the chart's labels do not run together
    svg = re.search(r"<svg.*</svg>", view._repr_html_()).group()
    assert re.sub(r"<[^>]+>", "", svg).split() == ["ε", "spent", "by", "notebook", "nb,",
                                                   "query", "by", "query", "limit", "ε", "2",
                                                   "query", "1", "…", "3"]  # fmt: skip


def test_the_footer_says_what_bounds_the_answer_is_over_and_what_they_left_out():
    bounding = {
        "unit": "pid",
        "rows_per_unit": 3,
        "rows_per_group": None,
        "groups_per_unit": None,
        "clamps": [{"aggregate": "AVG(age)", "bounds": [0, 100]}],
        "text": "Over bounded data: …",
    }
    footer = DPResult(reply(bounding=bounding)).footer()
    assert "over bounded data: ≤ 3 rows per pid; AVG(age) clamped to [0, 100]" in footer
    assert "left out" not in footer
    left = {
        "rows": {"value": 19870, "interval": [19812, 19928]},
        "units": {"value": 9904, "interval": [9875, 9933]},
        "cap": 9,
    }
    footer = DPResult(reply(bounding={**bounding, "left_out": left})).footer()
    assert "left out by the bounds: 19,870 rows [19,812, 19,928] (≤ 9 counted per pid)" in footer
    assert "of 9,904 pids [9,875, 9,933]" in footer
    window = {**bounding, "rows_per_unit": None, "rows_per_group": 2, "groups_per_unit": 3}
    assert "≤ 2 rows per pid and group, ≤ 3 groups" in DPResult(reply(bounding=window)).footer()
    assert "bounded" not in DPResult(reply()).footer()  # an older gate's reply says nothing


def test_budget_view_shows_the_shared_budgets_widest_first():
    shared = {
        "spent": {"epsilon": 12.0, "delta": 0.0},
        "limit": {"epsilon": 30.0, "delta": 0.0},
        "remaining": {"epsilon": 18.0, "delta": 0.0},
        "renew": {"period": "month", "next": "2026-12-01T00:00:00+00:00"},
    }
    group = {k: v for k, v in shared.items() if k != "renew"}
    reply = {"dataset": "d", **budget(0.5, 3.5), "dataset_budget": shared}
    reply["groups"] = {"sec<a>": {**group, "spent": {"epsilon": 5.5, "delta": 0.0}}}
    view = BudgetView([DatasetBudget(reply, [])], "nb")
    html = view._repr_html_()
    labels = re.findall(r'<td style="text-align: left">([^<]*)</td>', html)
    assert labels == [
        "the dataset, all users together (renews each month; next 2026-12-01 00:00:00)",
        "group sec&lt;a&gt;, its members together",
        "you, all notebooks",
        "notebook nb",
    ]
    assert "00:00:00)</td><td>12</td><td>30</td><td>18</td>" in html
    text = repr(view)
    assert "group sec<a>, its members together" in text
    footer = budget_left(msgspec.convert(reply, Budgets))
    assert "ε 18 left for the dataset (all users)" in footer
    assert "ε 18 left for group sec<a>" in footer


def test_a_clip_footer_says_which_bounds_and_what_the_cells_hold():
    """The gate's typed clip facts, rendered: bounds chosen from the data (the cells are
    of the values moved into them, about how many moved), or the declared ones kept."""
    answer = DPResult(reply())
    answer.envelope.clip = msgspec.convert({
        "share": 0.25,
        "epsilon": 0.25,
        "rule": "r",
        "chosen": [
            {"aggregate": "AVG(invt)", "bounds": [0, 944], "source": "data",
             "moved": [{"group": [1], "count": 7}, {"group": [2], "count": -2}]},
            {"aggregate": "SUM(gc)", "bounds": [0, 500], "source": "declared",
             "reason": "too little ε to choose bounds for 210 rows"},
        ],
    }, Clip)  # fmt: skip
    footer = answer.footer()
    assert "values clipped: AVG(invt) within [0, 944]" in footer
    assert "cells and intervals are of the values moved into these bounds" in footer
    assert "about 7 values moved" in footer  # a noisy count below 0 adds nothing
    assert "--clip kept SUM(gc)'s declared bounds [0, 500]: too little ε" in footer


def test_a_shared_answer_says_what_it_charged():
    """Served from another user's release: free where it already counted against the
    asker's budgets, else charged to the ones it had not (the gate's ``charged_to``)."""
    shared = {
        "released_at": "2026-11-28T10:00:00",
        "cost": {"epsilon": 0.5, "delta": 0.0},
        "scope": "group",
    }
    nothing = {**shared, "charged_to": []}
    free = DPResult(reply(cost={"epsilon": 0.0, "delta": 0.0}, replayed=True, shared=nothing))
    assert "no cost to you" in free.footer()
    charged_to = [{"budget": "group", "dataset": "d", "holder": "g2"},
                  {"budget": "user", "dataset": "d", "holder": "bob"}]  # fmt: skip
    charged = DPResult(
        reply(
            cost={"epsilon": 0.5, "delta": 0.0},
            replayed=True,
            shared={**shared, "charged_to": charged_to},
        )
    )
    footer = charged.footer()
    assert "ε 0.5 charged to group g2's budget, your budget" in footer
    assert "no cost to you" not in footer
