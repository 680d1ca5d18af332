"""The release pass (``sql/release.py``): its fast path, which skips DuckDB for the
commonest released columns (keys, counts floored at zero, sums), answers exactly
as the post-processing query would, and declines everything else."""

from __future__ import annotations

import duckdb
import pandas as pd
import pytest
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
