"""``dp/join_bounding``: every join of one unit's kept rows, over every count of its
rows in up to four tables, yields at most ``K`` joined rows; the bound is attained;
a join that gives each scan the whole ``K`` is caught; and the SQL's room is the
rule's, computed by DuckDB."""

from __future__ import annotations

import itertools

import duckdb
import pytest

from dpmagic.gate.dp.join_bounding import joined_rows_bound, rooms
from dpmagic.gate.sql.ranks import RANK, ROWS, room_reads


def _worst_join(k: int, counts: tuple[int, ...], room) -> int:
    """The most rows a join can produce from the ranks each scan keeps: every row
    matched with every kept row of the next scan, or with one NULL (LEFT JOIN)."""
    rows = 1
    for n, r in zip(counts, room(k, counts), strict=True):
        rows *= max(1, min(n, r))
    return rows


CASES = [
    (k, counts)
    for k in (1, 2, 3, 4, 6, 8)
    for m in (1, 2, 3, 4)
    for counts in itertools.product(range(0, 5), repeat=m)
]


@pytest.mark.parametrize("k", [1, 2, 3, 4, 6, 8])
def test_a_unit_keeps_at_most_k_joined_rows_and_the_bound_is_attained(k):
    cases = [c for kk, c in CASES if kk == k]
    for counts in cases:
        worst = _worst_join(k, counts, rooms)
        assert worst == joined_rows_bound(k, counts) <= k
    assert max(joined_rows_bound(k, c) for c in cases) == k


def test_a_join_that_gives_every_scan_the_whole_k_is_caught():
    def whole(k, counts):
        return [k] * len(counts)

    assert any(_worst_join(k, c, whole) > k for k, c in CASES)


@pytest.mark.parametrize(
    "counts", [(3, 2), (1, 4, 2), (5, 5, 5, 5), (0, 3, 2), (2, 1, 3, 1, 2, 2, 1, 3, 2, 2)]
)
def test_the_sql_reads_keep_the_rules_rooms(counts):
    """Each scan's read, run by DuckDB over a row of the unit's counts, keeps the ranks
    the rule gives it, for joins longer than the brute force reaches too."""
    k = 6
    tables = [f"t{i}" for i in range(len(counts))]
    con = duckdb.connect()
    names = ", ".join(f'{n} AS "{ROWS}{t}"' for n, t in zip(counts, tables, strict=True))
    for t in tables:
        con.execute(f'CREATE TABLE "{t}" AS SELECT {names}, 1 AS "{RANK}"')
    for i, read in enumerate(room_reads(tables, k)):
        room = read.bound.expression.sql(dialect="duckdb")  # the right of "rank <= room"
        source = read.source.sql(dialect="duckdb")
        (got,) = con.execute(f"SELECT {room} FROM {source}").fetchone()
        assert got == rooms(k, counts)[i]


def test_the_sql_grows_with_the_square_of_the_scans_not_exponentially():
    """Written as one expression, each scan's room would double the previous one's."""
    sizes = [sum(len(r.source.sql()) + len(r.bound.sql()) for r in room_reads(
        [f"t{i}" for i in range(m)], 16)) for m in (8, 16, 32)]  # fmt: skip
    assert sizes[2] < 5 * sizes[1] < 25 * sizes[0]
