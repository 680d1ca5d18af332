"""The window's two splits, each keeping exactly the window's rows:

- a one-table query (``rewrite._rank_split``): each unit's first ranks, which the
  window ordered by rank keeps whatever the filters drop, go straight through; the
  units with more rows than that go through the window, which keeps their rows of
  higher rank;
- a join (``rewrite._light``): a row whose unit has no more rows than the window
  keeps goes straight through, the others through the window.

Either way the test of a unit's stored count is a bare comparison, which DuckDB
checks against each row group's smallest and largest counts, so the window's branch
skips the row groups where no unit is heavy."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlglot import exp

from dpmagic.gate.sql import rewrite as rewrite_module
from dpmagic.gate.sql.plan_types import Plan
from dpmagic.gate.sql.ranks import Window
from tests.gate_helpers import dataset, load_table, make_plan, run_rewritten

COLUMNS = {
    "pid": {"type": "int"},
    "g": {"type": "int", "public_values": [0, 1, 2]},
    "x": {"type": "int", "lower": 0, "upper": 9},
}
ORDER = ["pid", "g", "x"]
# Shapes the window bounds (the others are bounded by the ranks stored at load).
SHAPES = [
    "SELECT COUNT(*), SUM(x) FROM t WHERE x > 3",
    "SELECT COUNT(*) FROM t AS a JOIN t AS b ON a.pid = b.pid WHERE a.x > b.x",
    "SELECT g, COUNT(DISTINCT pid) FROM t GROUP BY g",
    "SELECT x, COUNT(DISTINCT pid) FROM t GROUP BY x",
]
MAX_ROWS = 3


def _rows(sizes: list[int]) -> list[tuple]:
    """Unit ``u`` with ``sizes[u]`` rows, spread over the groups and values."""
    return [(u, (u + i) % 3, (u * 7 + i) % 10) for u, size in enumerate(sizes) for i in range(size)]


# Units below, at and just above the window's bound, and far above it.
SIZES = [1, 2, 3, 4, 5, 9, 3, 1, 12, 4, 2, 3, 30]


def _windowed(sql: str) -> Plan:
    p = make_plan(sql, dataset(COLUMNS, max_partitions=2, max_rows=MAX_ROWS))
    assert isinstance(p.bounding, Window), sql
    return p


@contextmanager
def _loaded(rows: list[tuple]) -> Iterator[duckdb.DuckDBPyConnection]:
    con = duckdb.connect()
    try:
        load_table(con, "t", ORDER, rows)
        yield con
    finally:
        con.close()


def _answer(sql: str, rows: list[tuple], seed: int = 11) -> list[tuple]:
    p = _windowed(sql)
    with _loaded(rows) as con:
        return sorted(run_rewritten(p, con, seed)[1].rows)


def _one_table(sql: str) -> bool:
    return " JOIN " not in sql


@pytest.mark.parametrize("sql", SHAPES)
def test_the_split_keeps_the_rows_the_window_alone_keeps(sql: str, monkeypatch) -> None:
    """Split, against the window over every row: for one table, no first ranks
    straight through (every row of rank above 0 through the window); for a join, no
    light test."""
    rows = _rows(SIZES)
    split = _answer(sql, rows)
    if _one_table(sql):
        monkeypatch.setattr(rewrite_module, "_first_kept", lambda plan, reads: 0)
    else:
        monkeypatch.setattr(rewrite_module, "_light", lambda plan, reads: None)
    assert split == _answer(sql, rows)


@pytest.mark.parametrize("sql", ["SELECT COUNT(*) FROM t WHERE x >= 0",
                                 "SELECT g, COUNT(DISTINCT pid) FROM t GROUP BY g"])  # fmt: skip
def test_a_split_that_lets_one_rank_too_many_through_is_caught(sql: str, monkeypatch) -> None:
    """The broken version: one rank more than the window keeps sent straight through.
    A unit of four rows then counts four in the total instead of three; grouped, a
    unit of three rows in three groups counts in three instead of two."""
    rows = _rows(SIZES)
    window = _answer(sql, rows)
    first = rewrite_module._first_kept

    def loose(plan, reads):
        found = first(plan, reads)
        return None if found is None else found + 1

    monkeypatch.setattr(rewrite_module, "_first_kept", loose)
    assert _answer(sql, rows) != window


def test_a_join_split_that_lets_one_row_too_many_through_is_caught(monkeypatch) -> None:
    """The broken version of the join's split: units of one row more than the window
    keeps called light."""
    sql = "SELECT COUNT(*) FROM t AS a JOIN t AS b ON a.pid = b.pid WHERE a.x >= 0 AND b.x >= 0"
    rows = _rows(SIZES)
    window = _answer(sql, rows)
    light = rewrite_module._light

    def loose(plan, reads):
        found = light(plan, reads)
        if found is not None:
            found.set("expression", exp.Literal.number(MAX_ROWS + 1))
        return found

    monkeypatch.setattr(rewrite_module, "_light", loose)
    assert _answer(sql, rows) != window


def _row_groups_scanned(con: duckdb.DuckDBPyConnection, sql: str) -> list[tuple[int, int]]:
    plan = con.execute("EXPLAIN ANALYZE " + sql).fetchall()[0][1]
    found = re.findall(r"Row Groups Scanned:\s*([\d,]+)\s*/\s*([\d,]+)", plan)
    return [(int(a.replace(",", "")), int(b.replace(",", ""))) for a, b in found]


def test_row_groups_without_a_heavy_unit_are_skipped_by_the_window() -> None:
    """300,000 units of two rows (five row groups of DuckDB's 122,880 rows), one of
    them heavy: the window's scan reads only the row groups that unit's rows lie in,
    the first ranks' scan every one. With the test wrapped (``COALESCE(… , FALSE)``,
    as the light test once was), the window's scan reads them all."""
    sizes = [2] * 300_000
    sizes[150_000] = MAX_ROWS + 2
    p = _windowed("SELECT COUNT(*) FROM t WHERE x > 3")
    with _loaded(_rows(sizes)) as con:
        rw, _ = run_rewritten(p, con, 5)
        con.execute("SET schema = 'prepared'")
        scanned = _row_groups_scanned(con, rw.sql)
        heavy = f'"__s0"."__dpmagic_rows_t" > {MAX_ROWS}'
        wrapped = rw.sql.replace(heavy, f"COALESCE({heavy}, FALSE)")
        assert wrapped != rw.sql
        scanned_wrapped = _row_groups_scanned(con, wrapped)
    assert len(scanned) == 2, scanned  # the first ranks' scan and the window's
    total = scanned[0][1]
    assert total >= 3
    assert min(read for read, _ in scanned) < total  # the window's skipped some
    assert max(read for read, _ in scanned) == total  # the first ranks' read them all
    assert all(read == total for read, _ in scanned_wrapped)


# Windowed one-table shapes whose rows a unit may spread over groups and rows.
GROUPED = [
    "SELECT g, COUNT(DISTINCT pid) FROM t GROUP BY g",
    "SELECT g, COUNT(DISTINCT pid) FROM t WHERE x > 2 GROUP BY g",
    "SELECT x, COUNT(DISTINCT pid) FROM t WHERE g <> 1 GROUP BY x",
]


def _contributions(sql: str, rows: list[tuple]) -> list[tuple[int, int, int]]:
    """Per unit and group of the query's bounded rows (``bounded_rows``): the unit, its
    number of groups, and its most rows in one group."""
    p = _windowed(sql)
    with _loaded(rows) as con:
        rw, _ = run_rewritten(p, con, 3)
        key = p.keys[0].name
        per_group = (
            exp.select("__unit", exp.alias_(exp.Count(this=exp.Star()), "n"))
            .from_("bounded_rows")
            .group_by("__unit", exp.column(key, quoted=True))
        )
        per_group.set("with_", rw.tree.args["with_"].copy())
        outer = exp.select("__unit", "COUNT(*)", "MAX(n)").from_(per_group.subquery("c"))
        con.execute("SET schema = 'prepared'")
        return con.execute(outer.group_by("__unit").sql("duckdb")).fetchall()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sql=st.sampled_from(GROUPED),
    units=st.lists(
        st.lists(st.tuples(st.integers(0, 2), st.integers(0, 9)), min_size=1, max_size=9),
        min_size=1,
        max_size=12,
    ),
)
def test_each_unit_keeps_within_the_window_s_bounds(sql: str, units: list) -> None:
    """Searched over units of any rows, spread over groups and values: after the
    split, no unit is in more groups than the window keeps, nor has more rows in one.
    (A split whose window chose groups otherwise than by their first rank, while the
    first ranks went straight through, put units in three groups: caught here.)"""
    rows = [(u, g, x) for u, own in enumerate(units) for g, x in own]
    for _, groups, most in _contributions(sql, rows):
        assert groups <= 2 and most <= MAX_ROWS
