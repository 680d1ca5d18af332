"""Plots: bars, histograms and lines carry the released intervals as error bars."""

from __future__ import annotations

import pytest

from dpmagic.result import DPResult
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


def test_bars_show_values_and_their_intervals():
    axes = averages().plot()
    heights = [bar.get_height() for bar in axes.patches]
    assert heights == [500.0, 0.0, 620.0]
    assert [t.get_text() for t in axes.get_xticklabels()] == ["b", "a", "c"]
    # the error bars span each interval: 400..650, 0..1000, 600..640
    segments = axes.collections[0].get_segments()
    assert [(s[0][1], s[1][1]) for s in segments] == [(400, 650), (0, 1000), (600, 640)]
    # noise dominates "a" (its interval is the whole of [0, 1000]): drawn hatched
    assert [bar.get_hatch() for bar in axes.patches] == [None, "//", None]
    assert "noise dominates" in axes.get_title()


def test_lines_and_histograms_are_sorted_by_their_key():
    axes = averages().plot("line", y="n")
    assert list(axes.lines[0].get_ydata()) == [2, 300, 250]
    hist = averages().plot("hist", x="band", y="n")
    assert [bar.get_width() for bar in hist.patches] == [1.0] * 3


def test_a_quantile_is_drawn_with_its_interval_in_units():
    axes = DPResult(quantile_reply()).plot()
    (bars,) = axes.collections  # the error bars: 37 in [35, 38.5], 41 in [17.5, 100]
    (first, second) = (segment[:, 1].tolist() for segment in bars.get_segments())
    assert first == [35.0, 38.5] and second == [17.5, 100.0]
    assert "95% intervals" in axes.get_title() and "hatched" in axes.get_title()


def test_bad_columns_and_kinds_are_named():
    with pytest.raises(KeyError, match="nope"):
        averages().plot(y="nope")
    with pytest.raises(ValueError, match="kind"):
        averages().plot("pie")


def test_the_magic_plots_a_stored_result(capsys):
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    from dpmagic.magics import register

    config = Config()
    config.HistoryManager.hist_file = ":memory:"
    shell = InteractiveShell.instance(config=config)
    register(shell)
    shell.user_ns["costs"] = averages()
    import matplotlib.pyplot as plt

    assert shell.run_line_magic("dpplot", "line costs --y n") is None
    axes = plt.gcf().axes[0]
    assert list(axes.lines[0].get_ydata()) == [2, 300, 250]
    from IPython.core.error import UsageError

    with pytest.raises(UsageError, match="no %%dpsql answer yet"):
        shell.run_line_magic("dpplot", "bar")
