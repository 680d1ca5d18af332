"""``dp/join_bounding``: every join of one unit's kept rows, over every count of its
rows in up to four tables, yields at most ``K`` joined rows; the bound is attained;
a join that gives each scan the whole ``K`` is caught; and the SQL's room is the
rule's, computed by DuckDB."""

from __future__ import annotations

import itertools

import duckdb
import pytest

from dpmagic.gate.dp.join_bounding import joined_rows_bound, rooms
from dpmagic.gate.engines.ranking import RANK, ROWS
from dpmagic.gate.sql.ranks import room_reads


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


# -- keyed scans: joined by their table's unique key ----------------------------------


def _keyed_join(k: int, rows: list[list[int]], keyed: list[bool], unique: bool) -> int:
    """The rows of a unit's join, each scan after the first joined to the one before by
    ``key = value`` (scan ``i``'s rows are the values its key takes; a keyed scan's
    partner is the scan before it), after each scan keeps its room's first rows."""
    counts = [len(r) for r in rows]
    room = rooms(k, counts, keyed)
    kept = [r[:room_i] for r, room_i in zip(rows, room, strict=True)]
    joined = [(v,) for v in kept[0]]
    for scan in kept[1:]:
        joined = [(*row, v) for row in joined for v in scan if v == row[-1]]
    assert not unique or all(len(set(scan)) == len(scan) for scan in kept[1:])
    return len(joined)


@pytest.mark.parametrize("k", [1, 2, 4, 6])
def test_keyed_scans_keep_at_most_k_joined_rows(k):
    """Every unit of up to three scans, the later ones keyed to the one before by a key
    unique in their table (their rows' values distinct): at most ``K`` joined rows,
    each keyed scan read at its first ``K`` ranks; the bound is attained."""
    seen = 0
    for m in (2, 3):
        for sizes in itertools.product(range(0, 5), repeat=m):
            first = [v % 3 for v in range(sizes[0])]  # values that repeat, as a line's order
            later = [list(range(n)) for n in sizes[1:]]  # unique keys
            rows = [first, *later]
            got = _keyed_join(k, rows, [False] + [True] * (m - 1), unique=True)
            assert got <= joined_rows_bound(k, sizes, [False] + [True] * (m - 1)) <= k
            seen = max(seen, got)
    assert seen == min(k, 4)


def test_a_scan_keyed_on_a_column_that_repeats_is_caught():
    """The broken version: the keyed rule applied to a join on a value that repeats in
    the later table (two order rows of one key) gives more than ``K`` joined rows."""
    k = 4
    rows = [[0, 0, 0, 0], [0, 0, 0, 0]]
    assert _keyed_join(k, rows, [False, True], unique=False) > k
    assert _keyed_join(k, rows, [False, False], unique=False) <= k  # the product rule
