"""Every computed sensitivity against brute force on small neighbouring datasets.

For random small tables and each neighbour of them (one privacy unit removed,
or one unit's rows replaced by other rows), the generated SQL is run on real
DuckDB and the L1 distance between the exact measurement vectors is compared
with the sensitivity the plan calibrates its noise to. The contribution
bounding is deterministic for a fixed seed, so the bound must hold seed by
seed, not just on average.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlglot import exp

from dpmagic.gate.dp.contribution import Contribution
from dpmagic.gate.dp.counts import count_sensitivity
from dpmagic.gate.dp.quantiles import selection_distance
from dpmagic.gate.dp.sums import sum_sensitivity
from dpmagic.gate.sql.contribution import Window
from dpmagic.gate.sql.rewrite import rewrite
from tests.gate_helpers import dataset, exact_vectors, load_table, make_plan, neighbours

COLUMNS = {
    "pid": {"type": "int"},
    "g": {"type": "int", "public_values": [0, 1, 2]},
    "x": {"type": "int", "lower": -3, "upper": 5},
    "y": {"type": "float", "lower": 0.0, "upper": 2.5},
}
QUERIES = [
    "SELECT COUNT(*) FROM t",
    "SELECT g, COUNT(*) FROM t GROUP BY g",
    "SELECT g, COUNT(x), SUM(x) FROM t GROUP BY g",
    "SELECT SUM(y) FROM t WHERE x > 0",
    "SELECT g, AVG(y) FROM t GROUP BY g",
    "SELECT g, SUM(x * y - 1) FROM t GROUP BY g",
    "SELECT SUM(CASE WHEN x > 2 THEN y ELSE -x END) AS s FROM t WHERE g IN (0, 2) OR y IS NULL",
    "SELECT g, SUM(y / (x + 4)) FROM t GROUP BY g HAVING COUNT(*) > 1",
    "SELECT SUM(x / g) AS ratio, COUNT(y) FROM t",
    "SELECT g, SUM(LEAST(y, 1.0)), SUM(CASE WHEN x > 2 THEN 2 WHEN x < 0 THEN -x ELSE x END) "
    "FROM t GROUP BY g",
    "SELECT AVG(CASE WHEN y >= 1 OR x = 0 THEN 1 ELSE y END) FROM t",
    # Centred sums: around 1 of [-3, 5]; in half units around 1/2 of [0, 1]; around 4.
    "SELECT g, AVG(x) FROM t GROUP BY g",
    "SELECT AVG(CASE WHEN x > 0 THEN 1 ELSE 0 END), COUNT(x) FROM t",
    "SELECT g, AVG(x + 3), VAR_SAMP(x + 3), STDDEV_POP(y) FROM t GROUP BY g",
    "SELECT g, COUNT(DISTINCT x), COUNT(DISTINCT pid) FROM t GROUP BY g",
    "SELECT VAR_POP(x), STDDEV_SAMP(y) FROM t WHERE g <> 1",
    "SELECT g, MEDIAN(x), MIN(y), quantile_cont(y, 0.9) FROM t GROUP BY g",
    "SELECT MAX(x) FILTER (WHERE g = 1), COUNT(*) FILTER (WHERE y > 1) FROM t",
    "SELECT x, COUNT(*), SUM(y) FROM t GROUP BY x",
    "SELECT CASE WHEN x < 0 THEN 'neg' ELSE 'pos' END AS sign, AVG(y) FROM t GROUP BY sign",
    "SELECT y > 1 AS big, x // 2 AS half, COUNT(*) FROM t GROUP BY big, half",
    "SELECT COUNT(*), SUM(z) FROM (SELECT x + 1 AS z FROM t WHERE y < 2) AS s WHERE z > 0",
    "WITH a AS (SELECT * FROM t WHERE g = 0), b AS (SELECT x * 2 AS x2 FROM a) "
    "SELECT SUM(x2) FROM b",
    # Bounded per query after load (a unit's ranked rows may reach several groups):
    "SELECT g, COUNT(DISTINCT pid) FROM t GROUP BY g",
]
ORDER = ["pid", "g", "x", "y"]

row = st.tuples(
    st.sampled_from([0, 1, 2, 3, None]),
    st.one_of(st.none(), st.integers(-10, 10)),
    st.one_of(st.none(), st.sampled_from([-5.0, 0.0, 0.5, 1.0, 2.5, 7.0]), st.floats(-5, 5)),
)
unit_rows = st.lists(row, min_size=0, max_size=5)
units = st.lists(unit_rows, min_size=1, max_size=4)


def _rows(per_unit: list[list[tuple]]) -> list[tuple]:
    return [(pid, *r) for pid, rows in enumerate(per_unit, start=1) for r in rows]


def _l1(a: list[int], b: list[int]) -> int:
    return sum(abs(x - y) for x, y in zip(a, b, strict=True))


@pytest.mark.search
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    per_unit=units,
    replacement=unit_rows,
    query=st.sampled_from(QUERIES),
    neighbouring=st.sampled_from(["add_remove", "substitute"]),
    user_level=st.booleans(),
    max_partitions=st.integers(1, 3),
    max_rows=st.integers(1, 3),
    seed=st.integers(0, 2**62),
)
def test_sensitivity_bounds_every_neighbour(
    per_unit, replacement, query, neighbouring, user_level, max_partitions, max_rows, seed
):
    ds = dataset(
        COLUMNS,
        unit="pid" if user_level else None,
        neighbouring=neighbouring,
        max_partitions=max_partitions,
        max_rows=max_rows,
    )
    p = make_plan(query, ds)
    con = duckdb.connect()
    rows = _rows(per_unit)
    load_table(con, "t", ORDER, rows)
    base = exact_vectors(p, con, seed)

    # A neighbour changes one privacy unit: a pid (user level) or a row (row level).
    for neighbour in neighbours(rows, len(per_unit), user_level, neighbouring, replacement):
        load_table(con, "t", ORDER, neighbour)
        other = exact_vectors(p, con, seed)
        _assert_within_sensitivity(p, base, other, query)


def _assert_within_sensitivity(p, base: dict, other: dict, query: str) -> None:
    for m in p.measurements:
        distance = _l1(base[m.name], other[m.name])
        assert distance <= m.noise.sensitivity, (query, m.label, distance)
    for s in p.selections:
        moved = sum(_symmetric(a, b) for a, b in zip(base[s.name], other[s.name], strict=True))
        assert moved <= s.sensitivity, (query, s.label, moved)


def _symmetric(a: dict[int, int], b: dict[int, int]) -> int:
    """The symmetric distance between two multisets given as histograms."""
    return sum(abs(a.get(k, 0) - b.get(k, 0)) for k in set(a) | set(b))


def test_worst_case_unit_reaches_the_count_bound():
    """A unit with many rows in many groups moves the counts by exactly k·m: the
    bound is tight, so the noise is not larger than it must be."""
    ds = dataset(COLUMNS, max_partitions=2, max_rows=2)
    p = make_plan("SELECT g, COUNT(*) FROM t GROUP BY g", ds)
    con = duckdb.connect()
    heavy = [(1, g, 0, 0.0) for g in (0, 1, 2) for _ in range(3)]
    others = [(2, 0, 1, 1.0), (3, 2, 1, 1.0)]
    load_table(con, "t", ORDER, heavy + others)
    with_unit = exact_vectors(p, con, seed=5)
    load_table(con, "t", ORDER, others)
    without = exact_vectors(p, con, seed=5)
    (m,) = p.measurements
    assert _l1(with_unit[m.name], without[m.name]) == m.noise.sensitivity == 4


def test_worst_case_unit_at_the_bounds_reaches_the_sum_bound():
    ds = dataset(COLUMNS, max_partitions=1, max_rows=3, neighbouring="substitute")
    p = make_plan("SELECT SUM(x) FROM t", ds)
    con = duckdb.connect()
    load_table(con, "t", ORDER, [(1, 0, 99, 0.0)] * 4 + [(2, 0, 1, 0.0)])
    high = exact_vectors(p, con, seed=1)
    load_table(con, "t", ORDER, [(1, 0, -99, 0.0)] * 4 + [(2, 0, 1, 0.0)])
    low = exact_vectors(p, con, seed=1)
    (m,) = p.measurements
    # Clamped to [-3, 5], three rows kept: 15 versus -9.
    assert _l1(high[m.name], low[m.name]) == 24 == m.noise.sensitivity


@pytest.mark.parametrize(
    ("sql", "high", "low", "sensitivity"),
    [
        # x in [-3, 5]: centred on 1, each term in [-4, 4]; 2 rows kept in one group.
        ("SELECT AVG(x) FROM t", 99, -99, 16),
        # 0/1 values centred on 1/2 in half units: terms in [-1, 1], released as ±0.5.
        ("SELECT AVG(CASE WHEN x > 0 THEN 1 ELSE 0 END) FROM t", 1, -1, 4),
    ],
)
def test_worst_case_unit_reaches_the_centred_sum_bound(sql, high, low, sensitivity):
    """Under substitute, a unit at the top of the range replaced by one at the bottom
    moves the centred sum by exactly its sensitivity: the bound is tight, so a centred
    sum noised for half of it (the rule's broken variant) would be caught here."""
    ds = dataset(COLUMNS, max_partitions=1, max_rows=2, neighbouring="substitute")
    p = make_plan(sql, ds)
    (m,) = [m for m in p.measurements if m.centre is not None]
    con = duckdb.connect()
    others = [(2, 0, 1, 0.0)]
    load_table(con, "t", ORDER, [(1, 0, high, 0.0)] * 3 + others)
    top = exact_vectors(p, con, seed=1)
    load_table(con, "t", ORDER, [(1, 0, low, 0.0)] * 3 + others)
    bottom = exact_vectors(p, con, seed=1)
    assert _l1(top[m.name], bottom[m.name]) == sensitivity == m.noise.sensitivity


@pytest.mark.parametrize(
    ("lower", "upper", "groups", "rows", "partitions", "add_remove", "substitute"),
    [
        (1, 1, 1, 1, 1, 1, 1),  # a row-level count
        (1, 1, 2, 3, 5, 6, 12),  # disjoint groups: a replacement touches 2k partitions
        (1, 1, 2, 3, 3, 6, 9),  # only 3 partitions exist
        (0, 10, 1, 2, 1, 20, 20),
        (-3, 5, 1, 3, 1, 15, 24),  # substitute: from 3·-3 to 3·5
        (-3, 5, 2, 1, 2, 10, 16),
    ],
)
def test_sensitivity_formulas(lower, upper, groups, rows, partitions, add_remove, substitute):
    c = Contribution.bounded(groups, rows, partitions)
    assert sum_sensitivity(lower, upper, c, "add_remove") == add_remove
    assert sum_sensitivity(lower, upper, c, "substitute") == substitute
    if lower == upper == 1:
        assert count_sensitivity(c, "substitute") == substitute
        assert selection_distance(c, "add_remove") == groups * rows
        assert selection_distance(c, "substitute") == 2 * groups * rows


# -- joins ---------------------------------------------------------------------

JOINED = {
    "u": {"columns": {"pid": {"type": "int"}, "z": {"type": "int", "lower": -2, "upper": 4}}},
    "pub": {
        "public": True,
        "columns": {
            "g": {"type": "int", "public_values": [0, 1, 2]},
            "w": {"type": "int", "lower": 0, "upper": 3},
        },
    },
}
PUBLIC_ROWS = [(0, 1), (0, 3), (1, 2), (2, 0), (2, 2), (2, 3)]  # g 0 and 2 match twice
JOIN_QUERIES = [
    "SELECT COUNT(*) FROM t JOIN u ON t.pid = u.pid",
    "SELECT t.g, SUM(u.z), COUNT(*) FROM t JOIN u ON t.pid = u.pid GROUP BY t.g",
    "SELECT COUNT(u.z), SUM(t.x) FROM t LEFT JOIN u ON t.pid = u.pid AND u.z > 0",
    "SELECT pub.w, COUNT(*), SUM(t.y) FROM t JOIN pub ON t.g = pub.g GROUP BY pub.w",
    "SELECT COUNT(*), SUM(a.x) FROM t AS a JOIN t AS b ON a.pid = b.pid",
    "SELECT MEDIAN(u.z), COUNT(DISTINCT t.pid) FROM u JOIN t USING (pid)",
    "SELECT g, AVG(z) FROM (SELECT t.g, u.z FROM t JOIN u ON t.pid = u.pid WHERE u.z >= 0) AS j "
    "GROUP BY g",
    "SELECT COUNT(*) FROM t JOIN u ON t.pid = u.pid JOIN pub ON pub.g = t.g WHERE pub.w > 1",
    "SELECT g, COUNT(*), SUM(x) FROM t WHERE pid IN (SELECT pid FROM u WHERE z > 0) GROUP BY g",
    "SELECT COUNT(*) FROM t WHERE pid NOT IN (SELECT u.pid FROM u JOIN pub ON u.z = pub.w)",
    "SELECT g, SUM(x) FROM t WHERE NOT EXISTS (SELECT 1 FROM u WHERE t.pid = u.pid AND z < 0) "
    "GROUP BY g",
    "SELECT COUNT(*), SUM(k.zz), MAX(k.zz) FROM t LEFT JOIN "
    "(SELECT pid, COALESCE(z, 0) + 1 AS zz FROM u WHERE z > 0) AS k ON t.pid = k.pid",
    "SELECT pub.w, COUNT(*), COUNT(DISTINCT t.pid) FROM t CROSS JOIN pub GROUP BY pub.w",
    # Private tables only: bounded by the ranks and counts stored at load, no window.
    "SELECT COUNT(*) FROM u JOIN t ON u.pid = t.pid",
    "SELECT t.g, COUNT(*), SUM(c.x) FROM t JOIN u ON t.pid = u.pid JOIN t AS c ON c.pid = u.pid "
    "GROUP BY t.g",
    "SELECT t.g, COUNT(v.z), SUM(u.z) FROM t LEFT JOIN u ON t.pid = u.pid "
    "LEFT JOIN u AS v ON v.pid = t.pid AND v.z > 0 GROUP BY t.g",
    "SELECT COUNT(*) FROM t AS a JOIN t AS b ON a.pid = b.pid JOIN t AS c ON c.pid = a.pid "
    "JOIN u ON u.pid = c.pid WHERE a.x < b.x",
]
joined_unit = st.tuples(unit_rows, st.lists(st.one_of(st.none(), st.integers(-5, 6)), max_size=4))


@pytest.mark.search
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    per_unit=st.lists(joined_unit, min_size=1, max_size=4),
    replacement=joined_unit,
    query=st.sampled_from(JOIN_QUERIES),
    neighbouring=st.sampled_from(["add_remove", "substitute"]),
    max_partitions=st.integers(1, 3),
    max_rows=st.integers(1, 3),
    seed=st.integers(0, 2**62),
)
def test_join_sensitivity_bounds_every_neighbour(
    per_unit, replacement, query, neighbouring, max_partitions, max_rows, seed
):
    """Joins multiply a unit's rows (a self-join squares them, the public table
    doubles some): the bounds hold all the same, because they apply after the join."""
    ds = dataset(
        COLUMNS,
        neighbouring=neighbouring,
        max_partitions=max_partitions,
        max_rows=max_rows,
        more_tables=JOINED,
    )
    p = make_plan(query, ds)
    pairs = joined_neighbours(
        per_unit, replacement, neighbouring, lambda c: exact_vectors(p, c, seed)
    )
    for base, other in pairs:
        _assert_within_sensitivity(p, base, other, query)


def joined_neighbours(
    per_unit: list[tuple], replacement: tuple, neighbouring: str, measure: Callable
) -> Iterator[tuple]:
    """``measure(con)`` on the tables ``t`` and ``u`` of ``per_unit``'s units (each a
    pair: its rows of ``t``, its values of ``u``) beside the public ``pub``, paired with
    ``measure`` on each neighbour: one unit removed, or under ``substitute`` replaced
    by ``replacement``."""
    con = duckdb.connect()
    load_table(con, "pub", ["g", "w"], PUBLIC_ROWS)

    def load(units: dict[int, tuple]):
        load_table(con, "t", ORDER, [(pid, *r) for pid, (rows, _) in units.items() for r in rows])
        load_table(con, "u", ["pid", "z"], [(pid, z) for pid, (_, zs) in units.items() for z in zs])
        return measure(con)

    units = dict(enumerate(per_unit, start=1))
    base = load(units)
    for pid in units:
        others = {k: v for k, v in units.items() if k != pid}
        if neighbouring == "substitute":
            others[pid] = replacement
        yield base, load(others)


def test_a_self_join_cannot_inflate_a_count():
    """One unit with 3 rows self-joined gives 9 rows: the count still moves by the bound."""
    ds = dataset(COLUMNS, max_partitions=1, max_rows=2, more_tables=JOINED)
    p = make_plan("SELECT COUNT(*) FROM t AS a JOIN t AS b ON a.pid = b.pid", ds)
    con = duckdb.connect()
    load_table(con, "t", ORDER, [(1, 0, 1, 1.0)] * 3 + [(2, 0, 1, 1.0)])
    with_unit = exact_vectors(p, con, seed=4)
    load_table(con, "t", ORDER, [(2, 0, 1, 1.0)])
    without = exact_vectors(p, con, seed=4)
    (m,) = p.measurements
    assert _l1(with_unit[m.name], without[m.name]) == m.noise.sensitivity == 2


def test_a_join_of_private_tables_keeps_at_most_the_bound_and_all_below_it():
    """Without a window: a unit whose rows multiply past the bound (3 × 3 joined rows,
    bound 6) moves the count by exactly the bound; units whose rows multiply to at most the
    bound (a fact table joined to one row per unit) keep every joined row."""
    ds = dataset(COLUMNS, max_partitions=2, max_rows=3, more_tables=JOINED)
    p = make_plan("SELECT t.g, COUNT(*) FROM t JOIN u ON t.pid = u.pid GROUP BY t.g", ds)
    assert not _windowed(rewrite(p, seed=3).tree)
    con = duckdb.connect()
    light = [(pid, g, 0, 0.0) for pid in (2, 3) for g in (0, 1, 2)]  # 3 rows each
    load_table(con, "u", ["pid", "z"], [(1, z) for z in (0, 1, 2)] + [(2, 0), (3, 1)])
    load_table(con, "t", ORDER, [(1, g, 0, 0.0) for g in (0, 1, 2)] + light)
    with_unit = exact_vectors(p, con, seed=3)
    load_table(con, "t", ORDER, light)
    load_table(con, "u", ["pid", "z"], [(2, 0), (3, 1)])
    without = exact_vectors(p, con, seed=3)
    (m,) = p.measurements
    assert without[m.name] == [2, 2, 2]
    assert _l1(with_unit[m.name], without[m.name]) == m.noise.sensitivity == 6


def test_a_join_keeps_the_window_where_ranks_would_raise_the_l2_sensitivity():
    """K rows anywhere have a larger L2 sensitivity than the window's rows in several
    groups: where noise may be Gaussian, a grouped join with room for several groups
    keeps the window; with one group, or under pure ε, the ranks bound it."""
    sql = "SELECT t.g, COUNT(*) FROM t JOIN u ON t.pid = u.pid GROUP BY t.g"
    for accountant, max_partitions, window in (
        ("zcdp", 2, True),
        ("approx", 2, True),
        ("zcdp", 1, False),
        ("pure", 2, False),
    ):
        ds = dataset(COLUMNS, max_partitions=max_partitions, max_rows=2, more_tables=JOINED)
        p = make_plan(sql, replace(ds, accountant=accountant))
        assert _windowed(rewrite(p, seed=1).tree) is window, (accountant, max_partitions)
        assert isinstance(p.bounding, Window) is window


def test_a_unit_in_many_groups_moves_a_quantile_histogram_by_the_bound():
    ds = dataset(COLUMNS, max_partitions=2, max_rows=2)
    p = make_plan("SELECT g, MEDIAN(x) FROM t GROUP BY g", ds)
    con = duckdb.connect()
    heavy = [(1, g, 5, 0.0) for g in (0, 1, 2) for _ in range(4)]
    load_table(con, "t", ORDER, [*heavy, (2, 0, -3, 0.0)])
    with_unit = exact_vectors(p, con, seed=9)
    load_table(con, "t", ORDER, [(2, 0, -3, 0.0)])
    without = exact_vectors(p, con, seed=9)
    (s,) = p.selections
    moved = sum(_symmetric(a, b) for a, b in zip(with_unit[s.name], without[s.name], strict=True))
    assert moved == s.sensitivity == 4


def test_a_null_in_a_private_subquery_cannot_decide_other_units_rows():
    """Under SQL's rules one unit's NULL would make ``NOT IN`` NULL for every row;
    the gate leaves NULLs out of a subquery over private rows, so adding the unit
    whose LEFT JOIN gives a NULL moves the count by its own bound only."""
    ds = dataset(COLUMNS, max_partitions=1, max_rows=1, more_tables=JOINED)
    sql = (
        "SELECT COUNT(*) FROM t WHERE pid NOT IN "
        "(SELECT v.pid FROM u LEFT JOIN u AS v ON u.pid = v.pid AND v.z > 3)"
    )
    p = make_plan(sql, ds)
    (m,) = p.measurements
    con = duckdb.connect()
    load_table(con, "t", ORDER, [(pid, 0, 1, 2.0) for pid in range(2, 8)])
    load_table(con, "u", ["pid", "z"], [])
    without = exact_vectors(p, con, seed=2)
    load_table(con, "u", ["pid", "z"], [(1, 0)])  # unit 1: no match, so v.pid is NULL
    with_null = exact_vectors(p, con, seed=2)
    assert without[m.name] == [6]
    assert _l1(with_null[m.name], without[m.name]) <= m.noise.sensitivity


def _windowed(tree: exp.Expression) -> bool:
    """Whether the generated query bounds units with a per-query window sort."""
    return any(isinstance(n, exp.RowNumber) for n in tree.walk())
