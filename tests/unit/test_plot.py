"""Plots: bars, histograms and lines carry the released intervals as error bars."""

from __future__ import annotations

import pytest

from dpmagic.display.result import DPResult
from tests.replies import quantile_reply, reply

matplotlib = pytest.importorskip("matplotlib", reason="the plot extra: pip install matplotlib")
matplotlib.use("Agg")


def averages() -> DPResult:
    return DPResult(
        reply(
            columns=["band", "avg_cost", "n"],
            rows=[["b", 500.0, 300], ["a", 0.0, 2], ["c", 620.0, 250]],
            accuracy={
                "alpha": 0.05,
                "columns": [
                    None,
                    {"measurements": ["SUM(cost)", "COUNT(cost)"],
                     "intervals": [[400.0, 650.0], [0.0, 1000.0], [600.0, 640.0]],
                     "rule": "range", "range": [0.0, 1000.0],
                     "noise_dominates": [False, True, False]},
                    {"measurements": ["COUNT(*)"],
                     "intervals": [[280.0, 320.0], [0.0, 22.0], [230.0, 270.0]],
                     "rule": "zero", "noise_dominates": [False, True, False]},
                ],
            },
            plan=[{"aggregate": "SUM(cost)", "bounds": [0.0, 1000.0]}],
        )
    )  # fmt: skip


def _title(axes) -> str:
    """The title as one line (the notes are wrapped to the figure's width)."""
    return " ".join(axes.get_title().split())


def _ranges(axes) -> list[tuple[float, float]]:
    """Each error bar's (low, high), in the order drawn: solid cells' first."""
    return [(float(s[0][1]), float(s[1][1])) for c in axes.collections for s in c.get_segments()]


def _dashed(axes) -> list[tuple[float, float, float]]:
    """The noise-dominated cells' dashed ranges: (x, low, high)."""
    out = []
    for c in axes.collections:
        if c.get_linestyle()[0][1] is None:  # solid
            continue
        out += [(float(s[0][0]), float(s[0][1]), float(s[1][1])) for s in c.get_segments()]
    return out


def test_bars_show_values_and_their_intervals():
    axes = averages().plot()
    assert [t.get_text() for t in axes.get_xticklabels()] == ["b", "a", "c"]
    # solid bars for the cells the gate cleared, each with its interval
    assert [(bar.get_x() + bar.get_width() / 2, bar.get_height()) for bar in axes.patches] == [
        (0, 500.0), (2, 620.0)
    ]  # fmt: skip
    assert (400, 650) in _ranges(axes) and (600, 640) in _ranges(axes)
    # noise dominates "a" (its interval is the whole of [0, 1000]): no bar, its interval
    # alone, dashed and grey, and the title says so
    assert _dashed(axes) == [(1.0, 0.0, 1000.0)]
    assert "noise dominates (or may) at band a: no bar" in _title(axes)


def test_an_empty_groups_clamped_average_is_not_the_tallest_bar():
    """The issue's chart: party size 7 had no rows, its average came out at the bound
    (100) and was drawn as the tallest bar, hatched; now it has no bar at all."""
    reply_ = reply(
        columns=["party", "avg_income"],
        rows=[[1, 41.6], [2, 46.6], [7, 100.0]],
        accuracy={"alpha": 0.05, "columns": [None, {
            "intervals": [[39.4, 43.8], [44.5, 48.7], [0.0, 100.0]], "rule": "range",
            "range": [0.0, 100.0], "noise_dominates": [False, False, True]}]},
    )  # fmt: skip
    axes = DPResult(reply_).plot(y="avg_income")
    tallest = max(bar.get_height() for bar in axes.patches)
    assert tallest == pytest.approx(46.6)
    assert _dashed(axes) == [(2.0, 0.0, 100.0)]
    hollow = [line for line in axes.lines if line.get_markerfacecolor() == "none"]
    assert [list(line.get_ydata()) for line in hollow] == [[100.0]]


def test_a_cell_noise_may_dominate_without_an_interval_is_left_out_with_a_note():
    reply_ = reply(
        columns=["g", "ratio"],
        rows=[[0, 2.0], [1, 9.0]],
        accuracy={"alpha": 0.05, "columns": [None, {
            "intervals": [[1.5, 2.5], None], "rule": "zero",
            "noise_dominates": [False, None]}]},
    )  # fmt: skip
    axes = DPResult(reply_).plot()
    assert [bar.get_height() for bar in axes.patches] == [2.0]
    assert _dashed(axes) == []
    assert not [line for line in axes.lines if line.get_markerfacecolor() == "none"]
    assert "left out, noise may dominate and no interval is known: g 1" in _title(axes)


def test_a_line_breaks_at_a_noise_dominated_point():
    axes = averages().plot("line", y="n")
    (line,) = [ln for ln in axes.lines if ln.get_linestyle() == "-"]
    # sorted by band: a (dominated), b, c; the line joins b and c only
    assert [v if v == v else None for v in line.get_ydata()] == [None, 300, 250]
    assert _dashed(axes) == [(0.0, 0.0, 22.0)]
    hist = averages().plot("hist", x="band", y="n")
    assert [bar.get_width() for bar in hist.patches] == [1.0] * 2


def test_a_quantile_is_drawn_with_its_interval_in_units():
    axes = DPResult(quantile_reply()).plot()
    # 37 in [35, 38.5] a bar; 41 in [17.5, 100], dominated: its interval alone
    assert [bar.get_height() for bar in axes.patches] == [37.0]
    assert (35.0, 38.5) in _ranges(axes)
    assert _dashed(axes) == [(1.0, 17.5, 100.0)]
    assert "95% intervals" in _title(axes) and "its interval only" in _title(axes)


def test_bad_columns_and_kinds_are_named():
    with pytest.raises(KeyError, match="nope"):
        averages().plot(y="nope")
    with pytest.raises(ValueError, match="kind"):
        averages().plot("pie")


def test_the_magic_plots_a_stored_result(capsys):
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    from dpmagic.magics.dpsql import register

    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    shell = InteractiveShell.instance(config=config)
    register(shell)
    shell.user_ns["costs"] = averages()
    import matplotlib.pyplot as plt

    assert shell.run_line_magic("dpplot", "line costs --y n") is None
    axes = plt.gcf().axes[0]
    assert [v if v == v else None for v in axes.lines[0].get_ydata()] == [None, 300, 250]
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match="no %%dpsql answer yet"):
        shell.run_line_magic("dpplot", "bar")
