"""The bounding report (``sql/bounding_report.py``, ``rewrite.left_out``, ``dp/left_out.LeftOut``):
its count is exact, one unit moves it by at most its sensitivity on every
neighbour of random data, its cost is a share of the query's, and every reply
says which bounds it is over."""

from __future__ import annotations

import textwrap
from dataclasses import replace

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpmagic.gate.dp.accounting import ApproxAccountant, PureAccountant, ZCDPAccountant
from dpmagic.gate.dp.calibration import Accuracy
from dpmagic.gate.engines.ranking import load_cap
from dpmagic.gate.failures import Refused
from dpmagic.gate.sql.bound import bound
from dpmagic.gate.sql.check import check
from dpmagic.gate.sql.parse import parse
from dpmagic.gate.sql.plan import plan
from dpmagic.gate.sql.plan_types import Plan
from dpmagic.gate.sql.resolve import resolve
from dpmagic.gate.sql.rewrite import left_out
from tests.gate_helpers import dataset, load_table, neighbours, run_exact, running_engine
from tests.sensitivity_cases import (
    COLUMNS,
    JOIN_QUERIES,
    JOINED,
    ORDER,
    QUERIES,
    joined_neighbours,
    joined_unit,
    unit_rows,
    units,
)


def reported(sql: str, ds, share: float = 0.2, accountant=None) -> Plan:
    accountant = accountant or PureAccountant()
    delta = 1e-6 if accountant.gaussian or isinstance(accountant, ApproxAccountant) else 0.0
    return plan(bound(check(resolve(parse(sql), ds))), 1.0, delta, accountant, report=share)


def exact_report(p: Plan, con: duckdb.DuckDBPyConnection, seed: int) -> tuple[int, int]:
    """The report's exact (rows, units) on ``con``'s raw tables, prepared as at load."""
    run_exact(p, con, seed)  # prepares the tables into the schema ``prepared``
    return _run_report(p, con, seed)


def _run_report(p: Plan, con: duckdb.DuckDBPyConnection, seed: int) -> tuple[int, int]:
    con.execute("SET schema = 'prepared'")
    try:
        ((rows, units_left),) = con.execute(left_out(p, seed).sql).fetchall()
    finally:
        con.execute("SET schema = 'main'")
    return int(rows), int(units_left)


# -- exact: what is left out, plus what is kept, is every row the query reads -----------

SINGLE = [
    ("SELECT COUNT(*) FROM t", lambda r: True),
    ("SELECT COUNT(*) FROM t WHERE x > 0", lambda r: r[2] is not None and r[2] > 0),
    # g is clamped into its declared range [0, 2] at load: only NULL fails the key test.
    ("SELECT g, COUNT(*) FROM t GROUP BY g", lambda r: r[1] is not None),
    ("SELECT g, COUNT(DISTINCT pid) FROM t GROUP BY g", lambda r: r[1] is not None),
]


@pytest.mark.search
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    per_unit=units,
    case=st.sampled_from(SINGLE),
    max_partitions=st.integers(1, 3),
    max_rows=st.integers(1, 3),
    seed=st.integers(0, 2**62),
)
def test_left_out_and_kept_add_up_to_every_row_read(per_unit, case, max_partitions, max_rows, seed):
    """With no cap, the rows left out plus the rows the query counted are the rows that
    pass its filters, counted here in Python from the raw rows; and the units
    reported are those that have more such rows than were counted."""
    sql, passes = case
    ds = dataset(COLUMNS, max_partitions=max_partitions, max_rows=max_rows)
    p = reported(sql, ds)
    p = replace(p, left_out=replace(p.left_out, cap=10**9))
    rows = [(pid, *r) for pid, rs in enumerate(per_unit, start=1) for r in rs]
    con = duckdb.connect()
    load_table(con, "t", ORDER, rows)
    counted = _counted_per_unit(p, con, seed)
    left_rows, left_units = _run_report(p, con, seed)
    read = {pid: sum(1 for r in rows if r[0] == pid and passes(r)) for pid in range(1, 5)}
    assert left_rows + sum(counted.values()) == sum(read.values())
    assert left_units == sum(1 for pid, n in read.items() if n > counted.get(pid, 0))


def _counted_per_unit(p: Plan, con: duckdb.DuckDBPyConnection, seed: int) -> dict[int, int]:
    """Each unit's rows the query itself kept, read from the report's own CTEs."""
    run_exact(p, con, seed)
    con.execute("SET schema = 'prepared'")
    try:
        tree = left_out(p, seed).tree
        kept = next(c for c in tree.args["with_"].expressions if c.alias == "kept_units")
        sql = kept.this.sql(dialect="duckdb")
        ctes = ", ".join(
            c.sql(dialect="duckdb")
            for c in tree.args["with_"].expressions
            if c.alias not in ("kept_units", "all_rows", "all_units", "left_units")
        )
        return dict(con.execute(f"WITH {ctes} {sql}").fetchall())
    finally:
        con.execute("SET schema = 'main'")


# -- one unit moves the report by at most its sensitivity, on every neighbour ------------


@pytest.mark.search
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    per_unit=units,
    replacement=unit_rows,
    query=st.sampled_from(QUERIES),
    neighbouring=st.sampled_from(["add_remove", "substitute"]),
    max_partitions=st.integers(1, 3),
    max_rows=st.integers(1, 3),
    seed=st.integers(0, 2**62),
)
def test_one_unit_moves_the_report_within_its_sensitivity(
    per_unit, replacement, query, neighbouring, max_partitions, max_rows, seed
):
    ds = dataset(
        COLUMNS, neighbouring=neighbouring, max_partitions=max_partitions, max_rows=max_rows
    )
    p = reported(query, ds)
    con = duckdb.connect()
    rows = [(pid, *r) for pid, rs in enumerate(per_unit, start=1) for r in rs]
    load_table(con, "t", ORDER, rows)
    base = exact_report(p, con, seed)
    for neighbour in neighbours(rows, len(per_unit), True, neighbouring, replacement):
        load_table(con, "t", ORDER, neighbour)
        _assert_within(p, base, exact_report(p, con, seed))


@pytest.mark.search
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    per_unit=st.lists(joined_unit, min_size=1, max_size=4),
    replacement=joined_unit,
    query=st.sampled_from(JOIN_QUERIES),
    neighbouring=st.sampled_from(["add_remove", "substitute"]),
    max_partitions=st.integers(1, 3),
    max_rows=st.integers(1, 3),
    seed=st.integers(0, 2**62),
)
def test_one_unit_moves_a_joins_report_within_its_sensitivity(
    per_unit, replacement, query, neighbouring, max_partitions, max_rows, seed
):
    ds = dataset(
        COLUMNS,
        neighbouring=neighbouring,
        max_partitions=max_partitions,
        max_rows=max_rows,
        more_tables=JOINED,
    )
    p = reported(query, ds)
    pairs = joined_neighbours(
        per_unit, replacement, neighbouring, lambda c: exact_report(p, c, seed)
    )
    for base, other in pairs:
        _assert_within(p, base, other)


def _assert_within(p: Plan, base: tuple[int, int], other: tuple[int, int]) -> None:
    report = p.left_out
    assert abs(base[0] - other[0]) <= report.rows.sensitivity
    assert abs(base[1] - other[1]) <= report.units.sensitivity


def test_a_unit_with_many_rows_moves_the_report_by_the_cap_and_no_more():
    """The bound is attained, and without the per-unit cap in the SQL it would not hold:
    the brute-force tests above catch a report that forgets it."""
    ds = dataset(COLUMNS, max_partitions=1, max_rows=2)
    p = reported("SELECT COUNT(*) FROM t", ds)
    cap = p.left_out.cap
    assert cap == load_cap(ds) == p.left_out.rows.sensitivity
    con = duckdb.connect()
    heavy = [(1, 0, 1, 1.0)] * 40
    load_table(con, "t", ORDER, [*heavy, (2, 0, 1, 1.0)])
    with_heavy = exact_report(p, con, seed=3)
    load_table(con, "t", ORDER, [(2, 0, 1, 1.0)])
    without = exact_report(p, con, seed=3)
    assert with_heavy[0] - without[0] == cap
    # The broken report: its SQL with no cap, its noise still calibrated to the cap.
    uncapped = replace(p, left_out=replace(p.left_out, cap=10**9))
    load_table(con, "t", ORDER, [*heavy, (2, 0, 1, 1.0)])
    moved = exact_report(uncapped, con, seed=3)[0] - without[0]
    assert moved > p.left_out.rows.sensitivity


# -- the plan: a share of the query's budget, refused where it means nothing -------------


@pytest.mark.parametrize("accountant", [PureAccountant(), ApproxAccountant(), ZCDPAccountant()])
def test_the_report_takes_its_share_and_the_query_costs_the_same(accountant):
    ds = dataset(COLUMNS)
    sql = "SELECT g, COUNT(*), AVG(y) FROM t GROUP BY g"
    p = reported(sql, ds, share=0.25, accountant=accountant)
    delta = 1e-6 if isinstance(accountant, ApproxAccountant | ZCDPAccountant) else 0.0
    plain = plan(bound(check(resolve(parse(sql), ds))), 1.0, delta, accountant)
    assert p.cost == plain.cost
    if accountant.gaussian:
        parts = sum(m.cost.rho for m in p.measurements)
        assert p.left_out.cost.rho == pytest.approx(0.25 * p.unit_cost.rho)
        assert parts + p.left_out.cost.rho == pytest.approx(p.unit_cost.rho)
    else:
        parts = sum(m.cost.epsilon for m in p.measurements)
        assert p.left_out.cost.epsilon == pytest.approx(0.25)
        assert parts + p.left_out.cost.epsilon <= 1.0 + 1e-9
        assert parts == pytest.approx(0.75)
    # The query's own noise grows as its share shrinks.
    for a, b in zip(p.measurements, plain.measurements, strict=True):
        assert a.scale > b.scale


def test_the_report_is_refused_where_it_means_nothing():
    ds = dataset(COLUMNS)
    for share in (0.0, 0.95, -0.1):
        with pytest.raises(Refused, match="share"):
            reported("SELECT COUNT(*) FROM t", ds, share=share)
    with pytest.raises(Refused, match="no privacy unit"):
        reported("SELECT COUNT(*) FROM t", dataset(COLUMNS, unit=None))
    with pytest.raises(Refused, match="accuracy"):
        plan(
            bound(check(resolve(parse("SELECT COUNT(*) FROM t"), ds))),
            1.0,
            0.0,
            PureAccountant(),
            Accuracy(10.0, 0.05),
            report=0.2,
        )


# -- the intervals: statistical, with a broken noise caught ------------------------------


@pytest.mark.parametrize("broken", [False, True])
def test_the_reports_intervals_cover_at_their_level(broken):
    """2,000 draws of each count's interval around known exact values (400 rows, 200
    units). A correct 95% interval misses at most 5% of the time: below 93.5%
    coverage has probability < 1e-4 (binomial, n = 2,000). The same intervals
    around noise drawn at four times the scale cover far less, and are caught."""
    from dpmagic.gate.sql.bounding_report import report as noisy_report

    p = reported("SELECT COUNT(*) FROM t", dataset(COLUMNS, max_rows=3), share=0.5)
    if broken:
        wide = [replace(n, scale=n.scale * 4) for n in (p.left_out.rows, p.left_out.units)]
        drawn = replace(p, left_out=replace(p.left_out, rows=wide[0], units=wide[1]))
    covered = {"rows": 0, "units": 0}
    for _ in range(2000):
        got = noisy_report(drawn if broken else p, (400, 200), 0.05)
        if broken:  # the broken draws, the plan's own half-widths
            for count, noise in ((got.rows, p.left_out.rows), (got.units, p.left_out.units)):
                half = noise.half_width(0.05)
                count.interval = [count.value - half, count.value + half]
        for name, truth in (("rows", 400), ("units", 200)):
            lo, hi = getattr(got, name).interval
            covered[name] += lo <= truth <= hi
    for name in covered:
        rate = covered[name] / 2000
        assert (rate < 0.9) if broken else (rate >= 0.935), (name, rate)


# -- the reply: the bounds always, the report when bought -------------------------------

POLICY = textwrap.dedent(
    """
    [gate]
    state_dir = "state"

    [datasets.d]
    sources = { t = "t.csv" }
    privacy_unit = "pid"
    max_partitions = 1
    max_rows_per_partition = 2
    user_budget = { epsilon = 1000.0 }
    notebook_budget = { epsilon = 1000.0 }

    [datasets.d.tables.t.columns]
    pid = { type = "int" }
    age = { type = "int", lower = 0, upper = 100 }
    sex = { type = "int", public_values = [0, 1] }
    """
)
# 400 units: half with 1 row, half with 5 (3 of them beyond the 2 a query keeps).
PEOPLE = [(p, (p * 7) % 90, p % 2) for p in range(400) for _ in range(1 if p % 2 else 5)]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    with running_engine(
        tmp_path_factory.mktemp("report"), POLICY, {"t": ("pid,age,sex", PEOPLE)}
    ) as e:
        yield e


def test_every_reply_and_dry_run_says_what_bounds_it_is_over(engine):
    body = {"sql": "SELECT AVG(age) FROM t", "epsilon": 1.0, "notebook": "a"}
    dry = engine.query("alice", {**body, "dry_run": True})
    assert dry["bounding"]["rows_per_unit"] == 2
    assert "at most 2 rows of each pid" in dry["bounding"]["text"]
    assert dry["bounding"]["clamps"] == [{"aggregate": "AVG(age)", "bounds": [0, 100]}]
    reply = engine.query("alice", body)
    assert reply["accuracy"]["bounds"] == dry["bounding"]["text"]
    assert "left_out" not in reply["bounding"]


def test_the_report_counts_the_rows_left_out_within_its_interval(engine):
    """200 units each have 3 rows beyond the 2 kept: 600 rows, 200 units. At ε = 20 the
    intervals are a few rows wide; each covers the truth with probability ≥ 95%."""
    reply = engine.query(
        "alice",
        {"sql": "SELECT COUNT(*) FROM t", "epsilon": 20.0, "bounding_report": 0.5,
         "notebook": "b"},
    )  # fmt: skip
    report = reply["bounding"]["left_out"]
    assert report["cap"] == 2  # max_partitions × max_rows_per_partition
    # Counted up to the cap of 2 per unit: 400 rows, 200 units.
    lo, hi = report["rows"]["interval"]
    assert lo - 5 <= 400 <= hi + 5
    lo, hi = report["units"]["interval"]
    assert lo - 5 <= 200 <= hi + 5
    assert reply["cost"]["epsilon"] == pytest.approx(20.0)
    assert report["cost"]["epsilon"] == pytest.approx(10.0)


def test_a_report_is_not_replayed_for_a_query_without_one(engine):
    body = {"sql": "SELECT COUNT(*) FROM t WHERE age > 3", "epsilon": 1.0, "notebook": "c"}
    first = engine.query("alice", body)
    with_report = engine.query("alice", {**body, "bounding_report": 0.3})
    assert not with_report["replayed"] and "left_out" in with_report["bounding"]
    again = engine.query("alice", body)
    assert again["replayed"] and again["rows"] == first["rows"]


@pytest.mark.parametrize("bad", [0, 1, 1.5, "half", True])
def test_a_bad_report_share_is_refused_before_anything_is_charged(engine, bad):
    from dpmagic.gate.failures import InvalidBody

    with pytest.raises(InvalidBody):
        engine.query(
            "alice", {"sql": "SELECT COUNT(*) FROM t", "bounding_report": bad, "notebook": "d"}
        )
    assert engine.budget("alice", None, "d")["notebook"]["spent"]["epsilon"] == 0


def test_a_standard_deviation_says_the_bounds_its_values_were_clamped_to(engine):
    """A variance's sums are of the values' distances to the middle of their bounds;
    the reply names the values' own bounds, as declared, not those distances'."""
    body = {"sql": "SELECT STDDEV(age) AS sd FROM t", "epsilon": 1.0, "notebook": "b"}
    dry = engine.query("alice", {**body, "dry_run": True})
    assert dry["bounding"]["clamps"] == [{"aggregate": "STDDEV(age)", "bounds": [0, 100]}]
