"""The window's split (``rewrite._light``): a row whose unit has no more rows than the
window keeps goes straight through, the others through the window. The answer must be
the window's alone, whatever the split; and the split's test is a bare comparison of
the stored count, which DuckDB checks against each row group's smallest and largest
counts, so the window's branch skips the row groups where no unit is heavy."""

from __future__ import annotations

import re

import duckdb
import pytest
from sqlglot import exp

from dpmagic.gate.sql import rewrite as rewrite_module
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


def _answer(sql: str, rows: list[tuple], seed: int = 11) -> list[tuple]:
    ds = dataset(COLUMNS, max_partitions=2, max_rows=MAX_ROWS)
    p = make_plan(sql, ds)
    assert isinstance(p.bounding, Window), sql
    con = duckdb.connect()
    try:
        load_table(con, "t", ORDER, rows)
        return sorted(run_rewritten(p, con, seed)[1].rows)
    finally:
        con.close()


@pytest.mark.parametrize("sql", SHAPES)
def test_the_split_keeps_the_rows_the_window_alone_keeps(sql: str, monkeypatch) -> None:
    rows = _rows(SIZES)
    split = _answer(sql, rows)
    monkeypatch.setattr(rewrite_module, "_light", lambda plan, reads: None)
    assert split == _answer(sql, rows)


def test_a_split_that_lets_one_row_too_many_through_is_caught(monkeypatch) -> None:
    """The broken version: units of one row more than the window keeps called light.
    A unit of four rows then counts four in the total instead of three."""
    sql = "SELECT COUNT(*) FROM t WHERE x >= 0"
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
    the light scan every one. With the test wrapped (``COALESCE(… , FALSE)``, as it
    was), the window's scan reads them all."""
    sizes = [2] * 300_000
    sizes[150_000] = MAX_ROWS + 2
    ds = dataset(COLUMNS, max_partitions=2, max_rows=MAX_ROWS)
    p = make_plan("SELECT COUNT(*) FROM t WHERE x > 3", ds)
    con = duckdb.connect()
    try:
        load_table(con, "t", ORDER, _rows(sizes))
        rw, _ = run_rewritten(p, con, 5)
        con.execute("SET schema = 'prepared'")
        scanned = _row_groups_scanned(con, rw.sql)
        light = f'"__s0"."__dpmagic_rows_t" <= {MAX_ROWS}'
        wrapped = rw.sql.replace(f"{light} AS", f"COALESCE({light}, FALSE) AS")
        assert wrapped != rw.sql
        scanned_wrapped = _row_groups_scanned(con, wrapped)
    finally:
        con.close()
    assert len(scanned) == 2, scanned  # the light scan and the window's
    total = scanned[0][1]
    assert total >= 3
    assert min(read for read, _ in scanned) < total  # the window's skipped some
    assert max(read for read, _ in scanned) == total  # the light scan read them all
    assert all(read == total for read, _ in scanned_wrapped)
