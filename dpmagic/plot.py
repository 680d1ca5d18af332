"""Plots of noisy answers with their 95% intervals as error bars (matplotlib).

A bar without its interval invites reading noise as a difference, so every
bar, histogram bin and point carries the interval the gate released, and a
value where noise dominates is drawn hatched and pale. Plotting is
post-processing of released values: it costs nothing. matplotlib comes from
the ``plot`` extra (``pip install 'dpmagic[plot]'``).
"""

from __future__ import annotations

from typing import Any, Protocol

import pandas as pd

from dpmagic.render import MOCK_LABEL, format_value


class Plotted(Protocol):
    """What a plot reads of an answer (``DPResult`` has it): named by what is used, so
    that the answer, which offers ``.plot()``, and the plot do not import each other."""

    columns: list[str]
    rows: list[list[Any]]
    mock: bool

    @property
    def confidence(self) -> float: ...

    @property
    def keys(self) -> list[str]: ...

    def interval(self, column: str) -> pd.DataFrame: ...

    def noise_dominates(self, column: str) -> list[bool | None]: ...


KINDS = ("bar", "hist", "line")
INSTALL_HINT = "plots need matplotlib: pip install 'dpmagic[plot]'"


def plot(result: Plotted, kind: str = "bar", x: str | None = None, y: str | None = None) -> Any:
    """Draw ``y`` against ``x`` (default: the first group key and the first noisy column)
    and return the matplotlib Axes."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(KINDS)}, not {kind!r}")
    try:
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError(INSTALL_HINT) from None
    x, y = _columns(result, x, y)
    index = result.columns.index(y)
    rows = list(range(len(result.rows)))
    if kind in ("hist", "line") and x is not None:
        rows.sort(key=lambda r: _sort_key(result.rows[r][result.columns.index(x)]))
    labels = [format_value(result.rows[r][result.columns.index(x)]) if x else str(r) for r in rows]
    values = [_number(result.rows[r][index]) for r in rows]
    errors = _errors(result, y, rows, values)
    dominated = result.noise_dominates(y) if errors is not None else [False] * len(rows)
    _, axes = plt.subplots(figsize=(max(4.0, 0.6 * len(rows) + 2), 3.5))
    if kind == "line":
        axes.errorbar(labels, values, yerr=errors, marker="o", capsize=3)
    else:
        bars = axes.bar(
            labels, values, yerr=errors, capsize=3, width=1.0 if kind == "hist" else 0.8,
            edgecolor="grey" if kind == "hist" else None,
        )  # fmt: skip
        for bar, weak in zip(bars, (dominated[r] for r in rows), strict=True):
            if weak is not False:  # dominated, or the gate could not say it is not
                bar.set_alpha(0.35)
                bar.set_hatch("//")
    axes.set_xlabel(x or "row")
    axes.set_ylabel(y)
    title = f"{y} with {result.confidence:.0%} intervals"
    if errors is None:
        title = f"{y} (no interval)"
    if any(d is not False for d in dominated):
        title += "; hatched: noise dominates (or may)"
    if result.mock:
        title = f"{MOCK_LABEL}\n{title}"
    axes.set_title(title, fontsize=10)
    if len(rows) > 6:
        axes.tick_params(axis="x", labelrotation=45)
    axes.figure.tight_layout()
    return axes


def _columns(result: Plotted, x: str | None, y: str | None) -> tuple[str | None, str]:
    for name in (x, y):
        if name is not None and name not in result.columns:
            raise KeyError(f"no column {name!r}; columns are {result.columns}")
    keys = result.keys
    if y is None:
        numeric = [c for c in result.columns if c not in keys]
        if not numeric:
            raise ValueError("nothing noisy to plot: every column is a group key")
        y = numeric[0]
    if x is None and keys:
        x = keys[0]
    return x, y


def _errors(
    result: Plotted, y: str, rows: list[int], values: list[float]
) -> list[list[float]] | None:
    """Asymmetric error bars (below, above) from the intervals (a quantile's too); None
    for a mock answer or a group key, which have none."""
    if result.mock:
        return None
    try:
        frame = result.interval(y)
    except ValueError:
        return None
    below, above = [], []
    for r, value in zip(rows, values, strict=True):
        lower, upper = frame["lower"].iloc[r], frame["upper"].iloc[r]
        below.append(max(0.0, value - lower) if lower == lower else 0.0)  # NaN: unknown
        above.append(max(0.0, upper - value) if upper == upper else 0.0)
    return [below, above]


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) else float("nan")


def _sort_key(value: Any) -> tuple[int, Any]:
    return (0, value) if isinstance(value, int | float) else (1, str(value))
