"""``--clip``'s rows per person (``sql/clip.py``, ``sql/unit_rows.py``).

The first release's quantile of each person's count of rows is over one value a
person: brute force over neighbouring datasets, seed by seed on real DuckDB, shows
its histogram moves by at most its distance (one value added or removed, two
replaced), for every query shape of the grammar's single-table corner drawn at
random; the version that counts rows without grouping them per person is caught.
The rule uses the count only within a tenth of the persons, and through the engine
the query is then asked with the tighter bound, stated in the reply and replayed."""

from __future__ import annotations

import math

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlglot import exp

from dpmagic.gate.dp.accounting import PureAccountant
from dpmagic.gate.sql import rewrite as rewrites
from dpmagic.gate.sql import unit_rows
from dpmagic.gate.sql.bound import bound
from dpmagic.gate.sql.check import check
from dpmagic.gate.sql.clip import (
    ROWS_FACTOR,
    ROWS_LABEL,
    ROWS_LEVEL,
    USEFUL_RANKS,
    ClipBounds,
    bounds_checked,
    clip_bounded,
    clipped,
)
from dpmagic.gate.sql.parse import parse
from dpmagic.gate.sql.plan import plan
from dpmagic.gate.sql.ranks import Window
from dpmagic.gate.sql.resolve import resolve
from tests.gate_helpers import (
    dataset,
    exact_vectors,
    load_table,
    neighbours,
    run_rewritten,
    running_engine,
)

COLUMNS = {
    "pid": {"type": "int"},
    "g": {"type": "int", "public_values": [0, 1, 2]},
    "x": {"type": "int", "lower": 0, "upper": 100},
}
ORDER = ["pid", "g", "x"]
QUERIES = [
    "SELECT COUNT(*) FROM t",
    "SELECT g, SUM(x) FROM t WHERE x > 20 GROUP BY g",
    "SELECT g, COUNT(*), AVG(x) FROM t WHERE g <> 1 GROUP BY g",
]


def _first(sql: str, neighbouring: str = "add_remove", max_rows: int = 3):
    """The first release's plan, as ``pipeline.analyse`` makes it for ``ClipBounds``."""
    ds = dataset(COLUMNS, neighbouring=neighbouring, max_partitions=2, max_rows=max_rows)
    checked = check(resolve(parse(sql), ds))
    first = plan(
        clip_bounded(bound(bounds_checked(checked)), ClipBounds()),
        1.0,
        0.0,
        PureAccountant(),
        quantile_intervals=False,
    )
    return checked, first


def _rows_selection(first):
    (selection,) = [s for s in first.selections if unit_rows.is_marker(s.arg)]
    return selection


def test_the_first_release_asks_each_persons_rows_and_counts_the_persons() -> None:
    _, first = _first("SELECT g, COUNT(*) FROM t GROUP BY g")
    assert [(a.func, a.level) for a in first.checked.aggregates] == [
        ("quantile", ROWS_LEVEL),
        ("count", None),
    ]
    selection = _rows_selection(first)
    assert selection.label == ROWS_LABEL and selection.grid.lo == 1 and selection.grid.hi == 3
    assert selection.noise.distance == 1  # one value a person
    (persons,) = first.measurements
    assert persons.kind == "count" and persons.noise.sensitivity == 1  # one row a person
    # no window over the rows for the persons (a COUNT(DISTINCT unit) would need one)
    assert not isinstance(first.bounding, Window)
    _, replaced = _first("SELECT COUNT(*) FROM t", neighbouring="substitute")
    assert _rows_selection(replaced).noise.distance == 2


row = st.tuples(st.sampled_from([0, 1, 2]), st.integers(0, 100))
units = st.lists(st.lists(row, min_size=0, max_size=5), min_size=1, max_size=4)


def _worst(first, per_unit, seed, neighbouring: str = "add_remove") -> tuple[int, int]:
    """The rows selection's largest move over every neighbour (the L1 distance of its
    histograms: values added plus values removed), and its distance; the persons'
    count's largest move is checked against its sensitivity on the way."""
    selection = _rows_selection(first)
    (persons,) = [m for m in first.measurements if unit_rows.is_marker(m.arg)]
    con = duckdb.connect()
    rows = [(pid, *r) for pid, rs in enumerate(per_unit, start=1) for r in rs]
    load_table(con, "t", ORDER, rows)
    exact = exact_vectors(first, con, seed)
    (base,), (counted,) = exact[selection.name], exact[persons.name]
    worst = 0
    for other in neighbours(rows, len(per_unit), True, neighbouring, [(0, 7)] * 4):
        load_table(con, "t", ORDER, other)
        exact = exact_vectors(first, con, seed)
        (moved,), (recounted,) = exact[selection.name], exact[persons.name]
        keys = set(base) | set(moved)
        worst = max(worst, sum(abs(base.get(k, 0) - moved.get(k, 0)) for k in keys))
        assert abs(recounted - counted) <= persons.noise.sensitivity
    return worst, selection.noise.distance


SEARCH = dict(per_unit=units, query=st.sampled_from(QUERIES), seed=st.integers(0, 2**62),
              neighbouring=st.sampled_from(["add_remove", "substitute"]))  # fmt: skip


def _moves_within(per_unit, query, seed, neighbouring) -> None:
    _, first = _first(query, neighbouring)
    moved, distance = _worst(first, per_unit, seed, neighbouring)
    assert moved <= distance


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**SEARCH)
def test_one_person_moves_the_rows_histogram_by_its_distance(**drawn) -> None:
    _moves_within(**drawn)


@pytest.mark.search
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**SEARCH)
def test_one_person_moves_the_rows_histogram_by_its_distance_searched(**drawn) -> None:
    _moves_within(**drawn)


def test_rows_counted_without_grouping_per_person_are_caught(monkeypatch) -> None:
    """The broken version: the rows counted over everyone at once (no ``GROUP BY`` the
    unit), so one person's rows move the one value every person shares."""
    grouped = rewrites._unit_rows

    def ungrouped(selections, final):
        query = grouped(selections, final)
        query.set("group", None)
        return query

    monkeypatch.setattr(rewrites, "_unit_rows", ungrouped)
    _, first = _first("SELECT COUNT(*) FROM t")
    moved, distance = _worst(first, [[(0, 1)], [(0, 2)], [(1, 3)]], seed=1)
    assert distance == 1 and moved == 2


def test_each_person_counts_their_bounded_rows_up_to_the_grid() -> None:
    """The exact histogram, before noise: per person, the count of their rows the query
    keeps (bounded to ``max_rows`` a group), as a candidate index (count − 1)."""
    _, first = _first("SELECT COUNT(*) FROM t WHERE x > 20", max_rows=3)
    selection = _rows_selection(first)
    con = duckdb.connect()
    rows = [(1, 0, 50), (1, 0, 60), (1, 1, 10), (2, 2, 30), (3, 0, 90), (3, 0, 91), (3, 0, 92),
            (3, 0, 93), (4, 0, 1)]  # fmt: skip
    load_table(con, "t", ORDER, rows)
    (histogram,) = exact_vectors(first, con, seed=5)[selection.name]
    # person 1 keeps 2 rows past the filter, 2 keeps 1, 3 keeps 3 of 4, 4 none
    assert dict(histogram) == {1: 1, 0: 1, 2: 1}
    assert isinstance(first.checked.aggregates[0].arg, exp.Column)


def test_the_first_release_of_a_count_is_one_row() -> None:
    """A count's first release aggregates nothing but the persons (their histogram of
    rows, their count): still one row, not one a row of the query (the persons counted
    as a scalar over ``UNIT_ROWS`` gave a row per bounded row)."""
    _, first = _first("SELECT COUNT(*) FROM t")
    con = duckdb.connect()
    load_table(con, "t", ORDER, [(1, 0, 5), (1, 1, 6), (2, 2, 7), (3, 0, 8)])
    _, exact = run_rewritten(first, con, seed=3)
    ((persons, histogram),) = exact.rows  # the measurements, then the selections
    assert dict(histogram) == {1: 1, 0: 2} and persons == 3


def test_the_rule_uses_the_rows_only_within_a_tenth_of_the_persons() -> None:
    checked, first = _first("SELECT COUNT(*) FROM t", max_rows=40)
    radius = _rows_selection(first).noise.rank_radius(0.05)
    need = radius / USEFUL_RANKS * (1 + 1e-12)
    used = clipped(checked, [3.0, need + 10], first, [(need, need + 20)]).rows
    assert used is not None and used.source == "data"
    assert used.selected == 3 and used.rows == ROWS_FACTOR * 3 and used.declared == 40
    assert used.rank_error == radius and used.persons_low == need
    kept = clipped(checked, [3.0, need + 10], first, [(need - 1, need + 19)]).rows
    assert kept is not None and kept.source == "declared" and kept.rows == 40
    assert "too little ε" in kept.reason and "bounded by 40" in kept.reason
    # a chosen count near the policy's: twice it would pass it, so the policy's is kept
    near = clipped(checked, [30.0, need + 10], first, [(need, need + 20)]).rows
    assert near is not None and near.rows == 40 and near.selected == 30


POLICY = """
[gate]
state_dir = "state"

[datasets.d]
sources = { t = "t.csv" }
privacy_unit = "pid"
max_partitions = 2
max_rows_per_partition = 32
user_budget = { epsilon = 1e6 }
notebook_budget = { epsilon = 1e6 }

[datasets.d.tables.t.columns]
pid = { type = "int" }
g = { type = "int", public_values = [0, 1] }
x = { type = "int", lower = 0, upper = 100 }
"""


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    # 6,000 persons of one or two rows each, under a policy that allows 32
    rows = [(i, i % 2, i % 100) for i in range(6000)]
    rows += [(i, i % 2, (3 * i) % 100) for i in range(0, 6000, 3)]
    with running_engine(tmp_path_factory.mktemp("r"), POLICY, {"t": ("pid,g,x", rows)}) as e:
        yield e


def test_a_clipped_query_is_asked_with_the_rows_chosen_and_says_so(engine) -> None:
    ask = {"sql": "SELECT g, COUNT(*) AS n, SUM(x) AS s FROM t GROUP BY g", "epsilon": 1.0,
           "clip": 0.25, "notebook": "rows"}  # fmt: skip
    plain = engine.query("ann", {k: v for k, v in ask.items() if k != "clip"})
    reply = engine.query("ann", ask)
    rows = reply["clip"]["rows"]
    assert rows["source"] == "data" and rows["selected"] in (1, 2)
    assert rows["rows"] == ROWS_FACTOR * rows["selected"] and rows["declared"] == 32
    assert rows["persons_low"] <= rows["persons"] and rows["level"] == ROWS_LEVEL
    # the query's noise is the chosen bound's (as --max-rows would ask), not the policy's
    by_hand = {k: v for k, v in ask.items() if k != "clip"}
    tight = engine.query("ann", {**by_hand, "max_rows_per_partition": rows["rows"]})
    (clipped,) = [p for p in reply["plan"] if p["kind"] == "count"]
    (asked,) = [p for p in tight["plan"] if p["kind"] == "count"]
    (policy,) = [p for p in plain["plan"] if p["kind"] == "count"]
    assert clipped["contribution"] == asked["contribution"]
    assert clipped["sensitivity"] == asked["sensitivity"] <= policy["sensitivity"] / 4
    assert reply["cost"]["epsilon"] == pytest.approx(1.0)
    again = engine.query("ann", ask)
    assert again["replayed"] and again["rows"] == reply["rows"]
    assert again["clip"]["rows"] == rows


def test_a_count_alone_may_be_clipped_for_its_rows(engine) -> None:
    reply = engine.query("bea", {"sql": "SELECT COUNT(*) FROM t", "epsilon": 1.0, "clip": 0.3})
    assert reply["clip"]["chosen"] == [] and reply["clip"]["rows"]["source"] == "data"
    (count,) = reply["rows"][0]
    assert math.isclose(count, 8000, rel_tol=0.02)  # every row: none past the bound


def test_the_footer_says_the_rows_per_person(engine) -> None:
    from dpmagic.display.result import DPResult

    reply = engine.query("cy", {"sql": "SELECT COUNT(*) FROM t", "epsilon": 1.0, "clip": 0.3})
    bound_rows = reply["clip"]["rows"]["rows"]
    footer = DPResult(reply).footer()
    assert f"rows per person: at most {bound_rows} in each group (chosen with ε 0.3" in footer
    assert "left out" in footer
