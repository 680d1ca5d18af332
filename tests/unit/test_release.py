"""The release pass (``sql/release.py``): its fast path, which skips DuckDB for the
commonest released columns (keys, counts floored at zero, sums), answers exactly
as the post-processing query would, and declines everything else."""

from __future__ import annotations

import duckdb
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlglot import exp

from dpmagic.gate.sql.dialect import DUCKDB
from dpmagic.gate.sql.release import _at_least, _col, _direct

TABLE = pd.DataFrame(
    {
        "__pid": [0, 1, 2, 3],
        "__m0": [-3, 0, 7, 12],
        "__m1": [1.5, -2.25, 0.0, 1e12],
        "k": ["a", "b", "c", "d"],
    }
)


def _via_duckdb(exprs: list[exp.Expression]) -> list[tuple]:
    con = duckdb.connect()
    try:
        con.register("noisy", TABLE)
        return con.execute(DUCKDB.render(exp.select(*exprs).from_("noisy"))).fetchall()
    finally:
        con.close()


@pytest.mark.parametrize(
    "exprs",
    [
        [_col("__pid"), _col("k"), _at_least(_col("__m0"), 0)],
        [_col("__pid"), _col("__m1"), _at_least(_col("__m1"), 0)],
        [_col("__pid"), _col("__m0"), _col("k")],
    ],
    ids=["key and floored count", "sum and floored sum", "bare columns"],
)
def test_the_fast_path_answers_as_the_post_processing_query(exprs):
    fast = _direct(TABLE, exprs)
    assert fast is not None
    assert fast == _via_duckdb(exprs)


@pytest.mark.parametrize(
    "expr",
    [
        exp.Add(this=_col("__m0"), expression=exp.Literal.number(1)),
        _at_least(_col("__m0"), 1),  # floored at 1, not 0: not a released count
        _at_least(_col("k"), 0),  # text is never floored
        _col("missing"),
    ],
    ids=["arithmetic", "floor at one", "text floored", "unknown column"],
)
def test_anything_else_goes_to_duckdb(expr):
    assert _direct(TABLE, [_col("__pid"), expr]) is None


def _average_tree(sql: str) -> exp.Expression:
    """The tree the release pass builds for the query's AVG output."""
    from dpmagic.gate.sql.release import _PostExpr
    from tests.gate_helpers import dataset, make_plan

    columns = {
        "pid": {"type": "int"},
        "x": {"type": "int", "lower": -3, "upper": 5},
        "y": {"type": "float", "lower": 0.0, "upper": 2.5},
    }
    plan = make_plan(sql, dataset(columns))
    (out,) = plan.checked.outputs
    return _PostExpr(plan, plan.checked).tree(out.expr)


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
    table = pd.DataFrame(
        {"__pid": range(len(values)), total_name: [kind(t) for t in totals],
         count_name: [n for _, n in values]}
    )  # fmt: skip
    exprs = [_col("__pid"), tree]
    fast = _direct(table, exprs)
    assert fast is not None
    con = duckdb.connect()
    try:
        con.register("noisy", table)
        slow = con.execute(DUCKDB.render(exp.select(*exprs).from_("noisy"))).fetchall()
    finally:
        con.close()
    assert fast == slow


def test_a_tree_like_an_average_but_not_one_goes_to_duckdb():
    tree = _average_tree("SELECT AVG(x) FROM t")
    broken = tree.copy()
    broken.find(exp.Greatest).find(exp.Greatest).set("expressions", [exp.Literal.number(2)])
    assert _direct(TABLE, [_col("__pid"), broken]) is None
