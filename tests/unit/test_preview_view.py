"""``%dpbudget``'s utility preview: the gate's typed numbers, each where it belongs in the
HTML, Markdown and text views, escaped; and the magic's options checked."""

from __future__ import annotations

import re

import pytest
from IPython.core.error import UsageError

from dpmagic.display.budget import BudgetView, DatasetBudget
from dpmagic.magics.dpsql import BudgetOptions, parse_budget_line
from tests.replies import budget

PREVIEW = {
    "accuracy": 10.0,
    "alpha": 0.05,
    "rows": 1000,
    "kinds": [
        {
            "kind": "count", "table": "p<1>", "column": None, "rows": None,
            "sql": 'SELECT COUNT(*) FROM "p<1>"',
            "at_accuracy": {"ask": {"accuracy": 10.0, "alpha": 0.05},
                            "cost": {"epsilon": 0.28434851242272163, "delta": 0.0},
                            "half_width": 10.0, "alpha": 0.05, "fits": 10},
            "at_default": {"ask": {"epsilon": 0.1, "delta": 0.0},
                           "cost": {"epsilon": 0.1, "delta": 0.0},
                           "half_width": 29.957322735539908, "alpha": 0.05, "fits": 30},
        },
        {
            "kind": "mean", "table": "visits", "column": "cost", "rows": 1000,
            "sql": "SELECT AVG(cost) FROM visits",
            "at_accuracy": {"refused": "cost: the declared bounds are too wide <b>"},
            "at_default": {"ask": {"epsilon": 0.1, "delta": 1e-06},
                           "cost": {"epsilon": 0.1, "delta": 1e-06},
                           "half_width": 8659.586171770714, "alpha": 0.05, "fits": 1234},
        },
    ],
}  # fmt: skip
ROWS = [
    ["count of p<1>", "--accuracy 10", "±10", "ε 0.285", "10"],
    ["count of p<1>", "-e 0.1 (the default)", "±30", "ε 0.1", "30"],
    ["mean of visits.cost", "±10", "refused: cost: the declared bounds are too wide <b>", "", ""],
    ["mean of visits.cost", "-e 0.1 -d 1e-06 (the default)", "±8660", "ε 0.1, δ 1e-06", "1,234"],
]
HEADERS = ["query", "ask with", "± at 95%", "cost each", "more that fit"]


def view(preview: dict | None = PREVIEW, asked: bool = True) -> BudgetView:
    reply = {"dataset": "d", **budget(0.5, 3.5)}
    if preview is not None:
        reply["preview"] = preview
    return BudgetView([DatasetBudget(reply, [])], "nb", preview=asked)


def test_the_html_shows_each_way_to_ask_with_its_numbers():
    html = view()._repr_html_()
    tables = re.findall(r"<table>.*?</table>", html)
    preview = next(t for t in tables if "more that fit" in t)
    assert re.findall(r"<th>(.*?)</th>", preview) == HEADERS
    rows = [re.findall(r"<td[^>]*>(.*?)</td>", r) for r in re.findall(r"<tr>(.*?)</tr>", preview)]
    unescape = {"&lt;": "<", "&gt;": ">"}
    shown = [[re.sub("&lt;|&gt;", lambda m: unescape[m.group()], c) for c in r] for r in rows[1:]]
    assert shown == ROWS
    assert "<b>" not in html and "p&lt;1&gt;" in html  # every string came over the wire
    assert 'title="SELECT COUNT(*) FROM &quot;p&lt;1&gt;&quot;"' in html
    assert "a mean&#x27;s ± assumes a group of 1,000 rows (the data&#x27;s size is private" in html


def test_the_rows_a_mean_is_over_are_an_assumption_unless_asked_for():
    """The issue's 210-row dataset read "a mean's ± is over a group of 1,000 rows": the
    gate's default, which it cannot check against the data's size (private). It now
    reads as the assumption it is, and as asked for where the user gave ``--rows``."""
    assumed = repr(view())
    assert "assumes a group of 1,000 rows (the data's size is private: give yours with" in assumed
    assert "is over a group of 1,000 rows" not in assumed
    asked = view({**PREVIEW, "rows": 210, "rows_basis": "asked"})
    assert "a mean's ± is over a group of 210 rows, as asked" in repr(asked)


def test_markdown_and_text_show_the_same_numbers():
    markdown = view()._repr_markdown_()
    for row in ROWS[1:2] + ROWS[3:]:
        cells = [c.replace("<", "&lt;").replace(">", "&gt;") for c in row]
        assert "| " + " | ".join(cells) + " |" in markdown
    assert "p&lt;1&gt;" in markdown and "<b>" not in markdown
    text = repr(view())
    assert "more that fit" in text and "1,234" in text and "--accuracy 10" in text
    assert "-e 0.1 -d 1e-06 (the default)" in text and "±8660" in text


def test_a_preview_not_asked_for_is_not_shown_and_one_missing_says_why():
    """Not asked for, nothing (a plain ``%dpbudget`` is as it was, live or graded from a
    transcript); asked of a transcript, which cannot plan one, or of a dataset with
    nothing to preview, a line that says so and no table."""
    for shown in (view(asked=False)._repr_html_(), view(asked=False)._repr_markdown_()):
        assert "more that fit" not in shown and "preview" not in shown
    offline, public = view(None), view({"alpha": 0.05, "rows": 1000, "kinds": []})
    for shown in (offline._repr_html_(), offline._repr_markdown_(), repr(offline)):
        assert "no preview: these answers come from a transcript" in shown
        assert "more that fit" not in shown
    assert "nothing to preview" in repr(public) and "more that fit" not in repr(public)


def test_dpbudget_options():
    assert parse_budget_line("") == BudgetOptions() and not BudgetOptions().previewed
    opts = parse_budget_line("--dataset d --accuracy 2.5 --rows=40")
    assert opts == BudgetOptions("d", False, 2.5, 40) and opts.previewed
    assert parse_budget_line("--preview").previewed
    assert parse_budget_line("--rows 10").previewed
    refused = {
        "extra": "takes only --dataset NAME, --preview, --accuracy A and --rows N, not 'extra'",
        "--preview=1": "takes only",
        "-e 0.5": "takes only",
        "--accuracy": "needs a value",
        "--accuracy -1": "must be a positive number",
        "--accuracy ten": "needs a number",
        "--rows 0": "whole number ≥ 1",
        "--rows 2.5": "whole number ≥ 1",
        "--rows ²": "whole number ≥ 1",
    }
    for line, message in refused.items():
        with pytest.raises(UsageError, match=re.escape(message)):
            parse_budget_line(line)
