"""Every computed sensitivity against brute force on small neighbouring datasets.

For random small tables and each neighbour of them (one privacy unit removed,
or one unit's rows replaced by other rows), the generated SQL is run on real
DuckDB and the L1 distance between the exact measurement vectors is compared
with the sensitivity the plan calibrates its noise to. The contribution
bounding is deterministic for a fixed seed, so the bound must hold seed by
seed, not just on average.
"""

from __future__ import annotations

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
from dpmagic.gate.failures import Refused
from dpmagic.gate.sql import resolve as resolve_module
from dpmagic.gate.sql.ranks import Window
from dpmagic.gate.sql.rewrite import rewrite
from tests.gate_helpers import dataset, exact_vectors, load_table, make_plan, neighbours
from tests.sensitivity_cases import (
    COLUMNS,
    JOIN_QUERIES,
    JOINED,
    OFFSET,
    ORDER,
    QUERIES,
    compared_exists,
    joined_neighbours,
    joined_unit,
    rows_of,
    unit_rows,
    units,
)


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
    offset=st.booleans(),
)
def test_sensitivity_bounds_every_neighbour(
    per_unit, replacement, query, neighbouring, user_level, max_partitions, max_rows, seed, offset
):
    ds = dataset(
        OFFSET if offset else COLUMNS,
        unit="pid" if user_level else None,
        neighbouring=neighbouring,
        max_partitions=max_partitions,
        max_rows=max_rows,
    )
    p = make_plan(query, ds)
    con = duckdb.connect()
    rows = rows_of(per_unit)
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
    ("sql", "columns", "high", "low", "sensitivity"),
    [
        # x in [-3, 5]: centred on 1, each term in [-4, 4]; 2 rows kept in one group.
        ("SELECT AVG(x) FROM t", COLUMNS, 99, -99, 16),
        # 0/1 values centred on 1/2 in half units: terms in [-1, 1], released as ±0.5.
        ("SELECT AVG(CASE WHEN x > 0 THEN 1 ELSE 0 END) FROM t", COLUMNS, 1, -1, 4),
        # x in [2, 9], counted exactly: centred on 5.5 in half units, terms in [-7, 7]
        # (around 4.5 of [0, 9] they would reach 9).
        ("SELECT AVG(x) FROM t", OFFSET, 99, -99, 28),
    ],
)
def test_worst_case_unit_reaches_the_centred_sum_bound(sql, columns, high, low, sensitivity):
    """Under substitute, a unit at the top of the range replaced by one at the bottom
    moves the centred sum by exactly its sensitivity: the bound is tight, so a centred
    sum noised for half of it (the rule's broken variant) would be caught here."""
    ds = dataset(columns, max_partitions=1, max_rows=2, neighbouring="substitute")
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


@pytest.mark.search
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    per_unit=st.lists(joined_unit, min_size=1, max_size=4),
    replacement=joined_unit,
    drawn=compared_exists(),
    neighbouring=st.sampled_from(["add_remove", "substitute"]),
    max_partitions=st.integers(1, 3),
    max_rows=st.integers(1, 3),
    seed=st.integers(0, 2**62),
)
def test_an_exists_comparing_one_persons_rows_stays_within_the_bounds(
    per_unit, replacement, drawn, neighbouring, max_partitions, max_rows, seed
):
    """``[NOT] EXISTS`` comparing its rows with the query's row: answered exactly when
    its tie keeps both rows one person's, and then a row's answer reads only its own
    person's rows, so the bounds hold on every neighbour."""
    query, person = drawn
    ds = dataset(
        COLUMNS,
        neighbouring=neighbouring,
        max_partitions=max_partitions,
        max_rows=max_rows,
        more_tables=JOINED,
    )
    try:
        p = make_plan(query, ds)
    except Refused as exc:
        assert not person, (query, exc.message)
        assert "must tie them to one person" in exc.message and len(exc.message) < 300
        return
    assert person, query
    pairs = joined_neighbours(
        per_unit, replacement, neighbouring, lambda c: exact_vectors(p, c, seed)
    )
    for base, other in pairs:
        _assert_within_sensitivity(p, base, other, query)


def test_an_exists_tied_beyond_one_person_would_break_the_bound(monkeypatch):
    """The broken version: a resolver that took any equality as tying one person
    (``_one_person`` always true) answers a tie on ``g``, and adding one unit then
    flips the other units' rows, past the count's sensitivity."""
    monkeypatch.setattr(resolve_module, "_one_person", lambda *args: True)
    ds = dataset(COLUMNS, max_partitions=1, max_rows=1, more_tables=JOINED)
    p = make_plan(
        "SELECT COUNT(*) FROM t WHERE EXISTS (SELECT 1 FROM t AS b WHERE b.g = t.g AND b.x < t.x)",
        ds,
    )
    (m,) = p.measurements
    con = duckdb.connect()
    load_table(con, "u", ["pid", "z"], [])
    load_table(con, "t", ORDER, [(pid, 0, 3, 1.0) for pid in range(2, 6)])
    without = exact_vectors(p, con, seed=1)
    load_table(con, "t", ORDER, [(1, 0, -3, 1.0)] + [(pid, 0, 3, 1.0) for pid in range(2, 6)])
    with_unit = exact_vectors(p, con, seed=1)
    assert without[m.name] == [0] and with_unit[m.name] == [4]
    assert _l1(with_unit[m.name], without[m.name]) > m.noise.sensitivity == 1


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
