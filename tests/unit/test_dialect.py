"""The DuckDB profile's grid sum: the cast alone rounds each value to the nearest
integer, as the plan's fixed-point sums assume (the sum's bounds hold for any
rounding; its accuracy wants the nearest)."""

from __future__ import annotations

import math

import duckdb
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlglot import exp

from dpmagic.gate.engines.dialect import DUCKDB
from dpmagic.gate.engines.spark.dialect import SparkDialect

values = st.lists(
    st.floats(min_value=-1e6, max_value=1e6, allow_nan=False, allow_infinity=False),
    min_size=1,
    max_size=40,
)
# Halves exactly, where nearest and truncation and half-up differ most.
halves = st.lists(st.integers(-(10**6), 10**6).map(lambda n: n + 0.5), min_size=1, max_size=40)


def _grid_sum(rows: list[float], scale_exp: int, widest: float) -> int:
    con = duckdb.connect()
    con.execute("CREATE TABLE t (v DOUBLE)")
    con.executemany("INSERT INTO t VALUES (?)", [(v,) for v in rows])
    scaled = exp.Mul(this=exp.column("v"), expression=exp.Literal.number(2.0**scale_exp))
    sql = exp.select(DUCKDB.grid_sum(scaled, widest, 2**40)).from_("t").sql(dialect="duckdb")
    return int(con.execute(sql).fetchone()[0])


def _nearest(rows: list[float], scale_exp: int) -> int:
    return sum(round(v * 2.0**scale_exp) for v in rows)  # Python's round: half to even


@pytest.mark.search
@settings(max_examples=150, deadline=None)
@given(st.one_of(values, halves), st.integers(-4, 8), st.booleans())
def test_the_cast_rounds_each_value_to_the_nearest(rows, scale_exp, wide):
    widest = 2.0**70 if wide else 2.0**40  # BIGINT casts, and HUGEINT ones
    got = _grid_sum(rows, scale_exp, widest)
    assert got == _nearest(rows, scale_exp)
    # Whichever way it rounds, each value stays within [floor, ceil]: the plan's bounds.
    lo = sum(math.floor(v * 2.0**scale_exp) for v in rows)
    hi = sum(math.ceil(v * 2.0**scale_exp) for v in rows)
    assert lo <= got <= hi


@pytest.mark.parametrize("rounding", [math.trunc, math.floor, lambda x: math.floor(x + 0.5)])
def test_the_check_catches_another_rounding(rounding):
    """Truncation, flooring and rounding half up all differ from DuckDB's cast on
    halves, so the test above would catch a profile that rounded that way."""
    rows = [2.5, -2.5, 3.5, -0.5, 0.5, 7.5]
    assert sum(rounding(v) for v in rows) != _grid_sum(rows, 0, 2.0**40)


def test_spark_rounds_before_its_truncating_cast():
    value = exp.column("v")
    tree = SparkDialect().grid_sum(value, 2.0**40, 2**40)
    assert isinstance(tree.this.this, exp.Round)
    assert DUCKDB.grid_sum(exp.column("v"), 2.0**40, 2**40).find(exp.Round) is None
