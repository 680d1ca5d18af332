"""The release pass's fast path: what DuckDB returns for ``SELECT exprs FROM noisy`` when
every expression is a bare column, a count floored at zero or an average (keys,
counts, sums, quantiles, averages: most queries), computed here column by column from
the noisy table, without registering it in DuckDB (1.2–3 ms a release, and 0.5 ms
more to build the pandas frame DuckDB reads). The trees it recognises are those
``post_query`` builds; anything else is left to DuckDB (``direct`` returns None)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypeGuard

import numpy as np
from sqlglot import exp

from dpmagic.gate.sql.trees import unparen

# The noisy table, by column: lists, or numpy arrays where the noise pass made them.
Column = Sequence[object] | np.ndarray
Columns = dict[str, Column]


def direct(table: Columns, exprs: list[exp.Expression]) -> list[Column] | None:
    """What DuckDB returns for ``SELECT exprs FROM table`` when every expression is a
    bare column, a column floored at zero or an average (keys, counts, sums,
    quantiles, averages: most queries), computed here from the same columns, column
    by column; None for anything else. Registering the table in DuckDB and running
    the query costs 1.2–3 ms, and building the pandas frame DuckDB reads another
    0.5 ms, as much as the rest of the release pass. A numpy column (the noise pass's,
    ``noise.columnar``) stays one: 100,000 cells in microseconds, not a list's
    milliseconds."""
    columns: list[Column] = []
    for e in exprs:
        mean = _mean(e)
        if mean is not None:
            means = _mean_values(table, *mean)
            if means is None:
                return None
            columns.append(means)
            continue
        floored = _floored(e)
        column = floored if floored is not None else e
        if not isinstance(column, exp.Column) or column.name not in table:
            return None
        values = table[column.name]
        if isinstance(values, np.ndarray):
            array = _array_column(values, floored is not None)
            if array is None:
                return None
            columns.append(array)
            continue
        kind = _kind(values)
        if kind is None:
            return None
        if floored is not None:
            if not _numeric(values, kind):
                return None
            zero = 0.0 if kind == "f" else 0
            values = [max(v, zero) for v in values]
        columns.append(values)
    return columns


def _array_column(values: np.ndarray, floored: bool) -> np.ndarray | None:
    """A numpy column as DuckDB would return it: integers as they are (floored at 0 as
    ``max(v, 0)`` floors them), finite floats unfloored; None for anything else."""
    if values.dtype.kind == "i":
        return np.where(values < 0, 0, values) if floored else values
    if values.dtype.kind == "f" and not floored and np.isfinite(values).all():
        return values
    return None


Mean = tuple[float, str, str, float, float]  # centre, total, count, lo, hi


def _mean(e: exp.Expression) -> Mean | None:
    """The parts of an average as ``PostExpr`` releases it, ``LEAST(GREATEST(centre
    + (total / NULLIF(GREATEST(count, 1), 0)), lo), hi)`` with the three numbers as
    DOUBLE literals; None for any other tree."""
    if not (isinstance(e, exp.Least) and len(e.expressions) == 1):
        return None
    low, hi = e.this, _double(e.expressions[0])
    if not (isinstance(low, exp.Greatest) and len(low.expressions) == 1):
        return None
    lo, value = _double(low.expressions[0]), low.this
    if not isinstance(value, exp.Add):
        return None
    centre, share = _double(value.this), unparen(value.expression)
    if not isinstance(share, exp.Div):
        return None
    count = share.expression
    if isinstance(count, exp.Nullif) and count.expression == exp.Literal.number(0):
        count = count.this  # NULLIF(GREATEST(n, 1), 0): never 0, the same value
    if not (
        isinstance(share.this, exp.Column)
        and isinstance(count, exp.Greatest)
        and isinstance(count.this, exp.Column)
        and len(count.expressions) == 1
        and count.expressions[0] == exp.Literal.number(1)
    ):
        return None
    if centre is None or lo is None or hi is None:
        return None
    return centre, share.this.name, count.this.name, lo, hi


def _double(e: exp.Expression) -> float | None:
    """The value of ``literal``'s ``CAST('…' AS DOUBLE)``; None for anything else."""
    if (
        isinstance(e, exp.Cast)
        and e.to.this == exp.DataType.Type.DOUBLE
        and isinstance(e.this, exp.Literal)
        and e.this.is_string
    ):
        return float(e.this.this)
    return None


def _mean_values(
    table: Columns, centre: float, total: str, count: str, lo: float, hi: float
) -> list[float] | np.ndarray | None:
    """The average per row as DuckDB computes it: both columns as DOUBLE, divided,
    added to the centre, then clamped into ``[lo, hi]``."""
    if total not in table or count not in table:
        return None
    sums, counts = table[total], table[count]
    if isinstance(sums, np.ndarray) or isinstance(counts, np.ndarray):
        return _mean_array(sums, counts, centre, lo, hi)
    if (_kind(sums) or "O") not in "if" or _kind(counts) != "i":
        return None
    out = []
    for t, n in zip(table[total], table[count], strict=True):
        value = centre + float(t) / float(max(n, 1))
        if not math.isfinite(value):
            return None
        out.append(min(max(value, lo), hi))
    return out


def _mean_array(
    sums: Column, counts: Column, centre: float, lo: float, hi: float
) -> np.ndarray | None:
    """``_mean_values`` over numpy columns, the same operations in the same order on the
    same doubles: ``centre + t / max(n, 1)``, then ``min(max(·, lo), hi)`` as Python's
    ``max`` and ``min`` pick (the first argument on a tie)."""
    t, n = np.asarray(sums), np.asarray(counts)
    if t.dtype.kind not in "if" or n.dtype.kind != "i":
        return None
    value = centre + t.astype(float) / np.where(n < 1, 1, n).astype(float)
    if not np.isfinite(value).all():
        return None
    value = np.where(lo > value, lo, value)
    return np.where(hi < value, hi, value)


def _floored(e: exp.Expression) -> exp.Column | None:
    """The column of ``GREATEST(column, 0)``, the form a count is released in."""
    if (
        isinstance(e, exp.Greatest)
        and isinstance(e.this, exp.Column)
        and len(e.expressions) == 1
        and e.expressions[0] == exp.Literal.number(0)
    ):
        return e.this
    return None


def _numeric(values: Sequence[object], kind: str) -> TypeGuard[Sequence[float]]:
    """Whether ``values``, of ``_kind`` ``kind``, are all integers or all floats."""
    return kind in "if"


def _kind(values: Sequence[object]) -> str | None:
    """The kind of a column whose values DuckDB would return as they are (as numpy
    names them: ``i`` integers, ``f`` finite floats, ``b`` booleans, ``O`` strings);
    None for anything else, which goes through DuckDB. Integers beyond 128 bits,
    which DuckDB cannot read, are returned as they are. An empty column releases
    no row, whatever its kind."""
    if not values:
        return "i"
    types = set(map(type, values))
    if len(types) != 1:
        return None
    (first,) = types
    if first is float:
        return "f" if np.isfinite(np.asarray(values, dtype=float)).all() else None
    return {int: "i", bool: "b", str: "O"}.get(first)
