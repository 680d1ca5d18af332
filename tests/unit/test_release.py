"""The release pass (``sql/release.py``): its fast path, which skips DuckDB for the
commonest released columns (keys, counts floored at zero, sums), answers exactly
as the post-processing query would, and declines everything else."""

from __future__ import annotations

import functools

import duckdb
import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlglot import exp

from dpmagic.gate.engines.dialect import DUCKDB
from dpmagic.gate.sql.aggregates.noisy_sql import at_least, col
from dpmagic.gate.sql.release_columns import direct

TABLE: dict[str, list[object]] = {
    "__pid": [0, 1, 2, 3],
    "__m0": [-3, 0, 7, 12],
    "__m1": [1.5, -2.25, 0.0, 1e12],
    "k": ["a", "b", "c", "d"],
}


def _rows(columns: list | None) -> list[tuple] | None:
    """The fast path's columns as DuckDB's rows (numpy values as Python's)."""
    if columns is None:
        return None
    lists = [c.tolist() if isinstance(c, np.ndarray) else list(c) for c in columns]
    return list(zip(*lists, strict=True))


def _via_duckdb(exprs: list[exp.Expression], table: dict[str, list[object]] = TABLE) -> list[tuple]:
    """The post-processing query, as the release pass runs it when the fast path
    declines: the columns as a pandas frame registered in DuckDB."""
    con = duckdb.connect()
    try:
        con.register("noisy", pd.DataFrame(table))
        return con.execute(DUCKDB.render(exp.select(*exprs).from_("noisy"))).fetchall()
    finally:
        con.close()


@pytest.mark.parametrize(
    "exprs",
    [
        [col("__pid"), col("k"), at_least(col("__m0"), 0)],
        [col("__pid"), col("__m1"), at_least(col("__m1"), 0)],
        [col("__pid"), col("__m0"), col("k")],
    ],
    ids=["key and floored count", "sum and floored sum", "bare columns"],
)
def test_the_fast_path_answers_as_the_post_processing_query(exprs):
    fast = _rows(direct(TABLE, exprs))
    assert fast is not None
    assert fast == _via_duckdb(exprs)


@pytest.mark.parametrize(
    "exprs",
    [
        [col("__pid"), col("k"), at_least(col("__m0"), 0)],
        [col("__pid"), col("__m1")],
        [col("__pid"), col("__m0"), col("k")],
    ],
    ids=["key and floored count", "sum", "bare columns"],
)
def test_numpy_columns_are_answered_as_the_post_processing_query(exprs):
    """The noise pass's numpy columns (``noise.columnar``) stay arrays through the fast
    path and give DuckDB's values, types included."""
    table = {**TABLE, "__pid": np.arange(4), "__m0": np.array(TABLE["__m0"]),
             "__m1": np.array(TABLE["__m1"])}  # fmt: skip
    columns = direct(table, exprs)
    assert columns is not None
    assert all(isinstance(c, np.ndarray) for c, e in zip(columns, exprs, strict=True)
               if e.name != "k")  # fmt: skip
    fast = _rows(columns)
    slow = _via_duckdb(exprs, table)
    assert [type(v) for row in fast for v in row] == [type(v) for row in slow for v in row]
    assert fast == slow


def test_a_numpy_column_duckdb_would_not_pass_as_it_is_goes_to_duckdb():
    floats = {"__pid": np.arange(2), "__m1": np.array([1.5, -2.0])}
    assert direct(floats, [col("__pid"), at_least(col("__m1"), 0)]) is None
    infinite = {"__pid": np.arange(2), "__m1": np.array([1.5, np.inf])}
    assert direct(infinite, [col("__pid"), col("__m1")]) is None


@pytest.mark.parametrize(
    "expr",
    [
        exp.Add(this=col("__m0"), expression=exp.Literal.number(1)),
        at_least(col("__m0"), 1),  # floored at 1, not 0: not a released count
        at_least(col("k"), 0),  # text is never floored
        col("missing"),
    ],
    ids=["arithmetic", "floor at one", "text floored", "unknown column"],
)
def test_anything_else_goes_to_duckdb(expr):
    assert direct(TABLE, [col("__pid"), expr]) is None


def _average_tree(sql: str) -> exp.Expression:
    """The tree the release pass builds for the query's AVG output."""
    from dpmagic.gate.sql.post_query import PostExpr
    from tests.gate_helpers import dataset, make_plan

    columns = {
        "pid": {"type": "int"},
        "x": {"type": "int", "lower": -3, "upper": 5},
        "y": {"type": "float", "lower": 0.0, "upper": 2.5},
    }
    plan = make_plan(sql, dataset(columns))
    (out,) = plan.checked.outputs
    return PostExpr(plan, plan.checked).tree(out.expr)


@pytest.mark.search
@settings(max_examples=200, deadline=None)
@given(
    sql=st.sampled_from(
        ["SELECT AVG(x) FROM t", "SELECT AVG(y) FROM t", "SELECT AVG(x + 3) FROM t"]
    ),
    values=st.lists(
        st.tuples(
            st.one_of(st.integers(-(2**60), 2**60), st.floats(-1e15, 1e15)),
            st.integers(-50, 10**9),
        ),
        min_size=1,
        max_size=6,
    ),
)
def test_an_average_is_answered_by_the_fast_path_as_by_duckdb(sql, values):
    """Whatever the noisy sums and counts (negative, zero, huge), the average computed
    here equals DuckDB's, value for value; and the tree the release pass builds for
    an AVG is one the fast path recognises."""
    tree = _average_tree(sql)
    total_name, count_name = (c.name for c in tree.find_all(exp.Column))
    totals = [t for t, _ in values]
    kind = float if any(isinstance(t, float) for t in totals) else int
    table: dict[str, list[object]] = {
        "__pid": list(range(len(values))),
        total_name: [kind(t) for t in totals],
        count_name: [n for _, n in values],
    }
    exprs = [col("__pid"), tree]
    fast = _rows(direct(table, exprs))
    assert fast is not None
    assert fast == _via_duckdb(exprs, table)
    if all(abs(t) < 2**62 for t in totals):  # as the noise pass's int64 or float64 arrays
        arrays = {k: np.asarray(v) for k, v in table.items()}
        assert _rows(direct(arrays, exprs)) == fast


_CELL = st.one_of(
    st.integers(-(2**130), 2**130),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
    st.text(max_size=3),
)


@pytest.mark.search
@settings(max_examples=300, deadline=None)
@given(
    column=st.one_of(
        st.lists(st.integers(-(2**130), 2**130), min_size=1, max_size=5),
        st.lists(st.floats(allow_nan=True, allow_infinity=True), min_size=1, max_size=5),
        st.lists(_CELL, min_size=1, max_size=5),
    ),
    floored=st.booleans(),
)
def test_the_fast_path_answers_as_duckdb_or_declines(column, floored):
    """Whatever a released column holds (integers beyond 64 bits, NaN and infinities,
    booleans, text, a mix), the fast path either declines or answers exactly as the
    post-processing query over the same columns, wherever DuckDB can read them (it
    cannot read integers of 128 bits and more, which the fast path returns as they are)."""
    table: dict[str, list[object]] = {"__pid": list(range(len(column))), "__m0": column}
    expr = at_least(col("__m0"), 0) if floored else col("__m0")
    fast = _rows(direct(table, [col("__pid"), expr]))
    if fast is None:
        return
    if any(type(v) is int and abs(v) >= 2**127 - 1 for v in column):
        # DuckDB reads these as text or not at all; the fast path keeps the numbers.
        assert [v for _, v in fast] == [max(v, 0) if floored else v for v in column]
        return
    slow = _via_duckdb([col("__pid"), expr], table)
    assert [type(v) for row in fast for v in row] == [type(v) for row in slow for v in row]
    assert fast == slow


def test_a_tree_like_an_average_but_not_one_goes_to_duckdb():
    tree = _average_tree("SELECT AVG(x) FROM t")
    broken = tree.copy()
    broken.find(exp.Greatest).find(exp.Greatest).set("expressions", [exp.Literal.number(2)])
    assert direct(TABLE, [col("__pid"), broken]) is None


_GROUPED = (
    "SELECT g, COUNT(*) AS n, SUM(x) AS s, SUM(y) AS f, AVG(x) AS a, AVG(y) AS b FROM t GROUP BY g"
)


@functools.cache
def _grouped_plan():
    from tests.gate_helpers import dataset, make_plan

    columns = {
        "pid": {"type": "int"},
        "g": {"type": "int", "public_values": [0, 1, 2]},
        "x": {"type": "int", "lower": -3, "upper": 5},
        "y": {"type": "float", "lower": 0.0, "upper": 2.5},
    }
    return make_plan(_GROUPED, dataset(columns, unit=None))


@settings(max_examples=200, deadline=None)
@given(
    counts=st.lists(st.integers(-(2**70), 2**70), min_size=3, max_size=3),
    sums=st.lists(st.integers(-(2**70), 2**70), min_size=3, max_size=3),
    floats=st.lists(st.floats(-1e300, 1e300), min_size=3, max_size=3),
    parts=st.integers(1, 3),
)
def test_bare_count_sum_and_average_intervals_are_each_cells_own(counts, sums, floats, parts):
    """The intervals of a bare count, sum or average, computed for all cells at once,
    are the ones the cell-by-cell evaluation gives (``_eval``), huge values included."""
    from dpmagic.gate.sql.intervals import CellIntervals, json_pair
    from dpmagic.gate.sql.noise import Noisy

    plan = _grouped_plan()  # the same plan for every draw: only the noisy values vary
    by_kind = {"count": counts, "sum": sums}
    values = {}
    for m in plan.measurements:
        values[m.name] = floats if m.noise.granularity != 1.0 else by_kind[m.kind.value]
    noisy = Noisy(plan=plan, values=values, partitions=plan.partitions)
    intervals = CellIntervals(plan, noisy, 0.05, {})
    pids = [2, 0, 1]
    for out in plan.checked.outputs[1:]:
        each = [json_pair(intervals.of(out.expr, pid, parts)) for pid in pids]
        pairs = intervals.cells(out.expr, pids, parts)
        assert isinstance(pairs, np.ndarray)
        assert [None if np.isnan(p).any() else p.tolist() for p in pairs] == each
