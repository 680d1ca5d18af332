"""Plots of noisy answers with their 95% intervals as error bars (matplotlib).

A bar without its interval invites reading noise as a difference, so every
bar, histogram bin and point carries the interval the gate released. A cell
the gate flags as noise-dominated (or that noise may dominate) is not drawn
as a finding: no bar, and no point on a line, only its interval, dashed and
grey, with a hollow mark at its value; where its interval is unknown too, it
is left out. The title says which were drawn so, since a bar's height is what
an eye compares first: an empty group's average clamped to its bound drew the
tallest bar of a chart (docs/accuracy.md, "When noise dominates"). The verdicts
are the gate's, read as they came (``noise_dominates``); nothing here judges a
cell. Plotting is post-processing of released values: it costs nothing.
matplotlib comes from the ``plot`` extra (``pip install 'dpmagic[plot]'``).
"""

from __future__ import annotations

import math
import textwrap
from typing import Any, Protocol

import pandas as pd

from dpmagic.display.render import MOCK_LABEL, format_value


class Plotted(Protocol):
    """What a plot reads of an answer (``DPResult`` has it): named by what is used, so
    that the answer, which offers ``.plot()``, and the plot do not import each other."""

    columns: list[str]
    mock: bool

    @property
    def rows(self) -> list[list[Any]]: ...

    @property
    def confidence(self) -> float: ...

    @property
    def keys(self) -> list[str]: ...

    def interval(self, column: str) -> pd.DataFrame: ...

    def noise_dominates(self, column: str) -> list[bool | None]: ...


KINDS = ("bar", "hist", "line")
INSTALL_HINT = "plots need matplotlib: pip install 'dpmagic[plot]'"
NOISE_COLOUR = "grey"
"""The colour of a noise-dominated cell's interval: not the data's."""
TITLE_CHARS_PER_INCH = 13
"""About this many characters of the 9-point title fit an inch of the figure."""
SHOWN_NAMES = 4
"""At most this many noise-dominated groups are named in the title; more are counted."""


def plot(result: Plotted, kind: str = "bar", x: str | None = None, y: str | None = None) -> Any:
    """Draw ``y`` against ``x`` (default: the first group key and the first noisy column)
    and return the matplotlib Axes. Cells the gate did not clear of noise (a verdict
    of True or None) get their interval alone (``_noise``)."""
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
    verdicts = result.noise_dominates(y) if errors is not None else [False] * len(result.rows)
    weak = [verdicts[r] is not False for r in rows]  # dominated, or the gate cannot say
    sound = [i for i, w in enumerate(weak) if not w]
    positions = list(range(len(rows)))
    figure, axes = plt.subplots(figsize=(max(4.0, 0.6 * len(rows) + 2), 3.5))
    if kind == "line":
        # A line through a noise-dominated point draws a trend out of noise: the line
        # breaks there.
        line = [v if not w else math.nan for v, w in zip(values, weak, strict=True)]
        axes.errorbar(positions, line, yerr=_pick(errors, sound, len(rows)), marker="o",
                      capsize=3)  # fmt: skip
    else:
        axes.bar(
            [positions[i] for i in sound], [values[i] for i in sound],
            yerr=_pick(errors, sound), capsize=3, width=1.0 if kind == "hist" else 0.8,
            edgecolor="grey" if kind == "hist" else None,
        )  # fmt: skip
    drawn, left_out = _noise(axes, positions, values, errors, weak)
    axes.set_xticks(positions, labels)
    axes.set_xlim(-0.6, len(rows) - 0.4)
    axes.set_xlabel(x or "row")
    axes.set_ylabel(y)
    title = f"{y} with {result.confidence:.0%} intervals"
    if errors is None:
        title = f"{y} (no interval)"
    notes = []
    where = f"{x} " if x else "row "
    if drawn:
        what = "no bar" if kind != "line" else "not on the line"
        notes.append(f"noise dominates (or may) at {where}{_names(labels, drawn)}: {what}, "
                     "its interval only (dashed)")  # fmt: skip
    if left_out:
        notes.append(f"left out, noise may dominate and no interval is known: "
                     f"{where}{_names(labels, left_out)}")  # fmt: skip
    if notes:
        # Wrapped to the figure's width: a long list of groups ran off the figure.
        chars = max(40, int(figure.get_figwidth() * TITLE_CHARS_PER_INCH))
        title += "\n" + "\n".join(textwrap.fill(note, chars) for note in notes)
    if result.mock:
        title = f"{MOCK_LABEL}\n{title}"
    axes.set_title(title, fontsize=9)
    if len(rows) > 6:
        axes.tick_params(axis="x", labelrotation=45)
    figure.tight_layout()
    return axes


def _noise(
    axes: Any,
    positions: list[int],
    values: list[float],
    errors: list[list[float]] | None,
    weak: list[bool],
) -> tuple[list[int], list[int]]:
    """Each noise-dominated cell as its interval alone: a dashed grey range with caps and
    a hollow mark at the value; left out where its interval is unknown. The indices
    drawn so, and those left out."""
    drawn: list[int] = []
    left_out: list[int] = []
    for i, w in enumerate(weak):
        if not w:
            continue
        known = errors is not None and not math.isnan(errors[0][i]) and math.isfinite(values[i])
        (drawn if known else left_out).append(i)
    if drawn and errors is not None:
        _, _, ranges = axes.errorbar(
            [positions[i] for i in drawn], [values[i] for i in drawn],
            yerr=_pick(errors, drawn), fmt="o", markerfacecolor="none", markersize=5,
            color=NOISE_COLOUR, ecolor=NOISE_COLOUR, capsize=4, elinewidth=1.5,
        )  # fmt: skip
        for lines in ranges:
            lines.set_linestyle("--")
    return drawn, left_out


def _pick(
    errors: list[list[float]] | None, keep: list[int], size: int | None = None
) -> list[list[float]] | None:
    """The error bars of the cells ``keep``: only those, or (with ``size``) all ``size``
    of them with the others' left empty (a line's positions are all its cells')."""
    if errors is None:
        return None
    if size is None:
        return [[_known(side[i]) for i in keep] for side in errors]
    chosen = set(keep)
    return [[_known(side[i]) if i in chosen else 0.0 for i in range(size)] for side in errors]


def _known(error: float) -> float:
    """An error bar's length, 0 where the interval is unknown (no bar drawn)."""
    return 0.0 if math.isnan(error) else error


def _names(labels: list[str], indices: list[int]) -> str:
    names = [labels[i] for i in indices[:SHOWN_NAMES]]
    more = len(indices) - len(names)
    return ", ".join(names) + (f" and {more} more" if more else "")


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
    """Asymmetric error bars (below, above) from the intervals (a quantile's too), NaN
    where a cell's interval is unknown; None for a mock answer or a group key, which
    have none."""
    if result.mock:
        return None
    try:
        frame = result.interval(y)
    except ValueError:
        return None
    below, above = [], []
    for r, value in zip(rows, values, strict=True):
        lower, upper = float(frame["lower"].iloc[r]), float(frame["upper"].iloc[r])
        if math.isnan(lower) or math.isnan(upper):
            below.append(math.nan)
            above.append(math.nan)
            continue
        below.append(max(0.0, value - lower))
        above.append(max(0.0, upper - value))
    return [below, above]


def _number(value: Any) -> float:
    return float(value) if isinstance(value, int | float) else float("nan")


def _sort_key(value: Any) -> tuple[int, Any]:
    return (0, value) if isinstance(value, int | float) else (1, str(value))
