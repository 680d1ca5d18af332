"""The aggregate catalogue's contract: every kind it registers, by every SQL node type
and spelling it answers (``tests/sql_grammar.AGGREGATE_SQL``), is run through the
passes on real DuckDB and

- released, at a budget where noise is negligible, as what DuckDB computes for the same
  SQL on the same rows (a kind planned as another is caught here);
- within its sensitivities on every neighbour of a small table (brute force);
- covered by its 95% interval at least as often as promised, over repeated draws;
- judged by a noise-dominance rule built from its own parts.

A node type outside the table is refused, never planned as a look-alike; the tests at
the end register one wrongly (SKEWNESS as a variance, VARIANCE as a standard
deviation, COUNT_IF as a count, TRIMMED_MEAN as an average) and show the contract
catch it. DuckDB has no trimmed mean: the engine's own is a macro written here from
its definition (``TRIMMED_MEAN_SQL``), itself checked against numpy."""

from __future__ import annotations

import itertools
import math
import re
from fractions import Fraction

import duckdb
import numpy as np
import pytest
from sqlglot import exp

from dpmagic.gate.failures import Refused
from dpmagic.gate.sql.aggregates import average, count, registry, variance
from dpmagic.gate.sql.aggregates.func import AggregateFunc
from dpmagic.gate.sql.dominance import judging_rule
from dpmagic.gate.sql.noise import noise
from dpmagic.gate.sql.release import release
from tests.gate_helpers import dataset, exact_vectors, load_table, make_plan, run_rewritten
from tests.sql_grammar import AGGREGATE_SQL

COLUMNS = {"pid": {"type": "int"}, "x": {"type": "int", "lower": 0, "upper": 100}}
# 300 people of two rows each, every value within the bounds and both bounds taken (the
# DP MIN and MAX are the quantiles at 0 and 1 of the bounds' grid): no row is left out
# or clamped, so the gate's exact aggregate is DuckDB's.
ROWS = [(i // 2, (i * 37) % 101) for i in range(600)]
LEVEL = 0.25
# The engine's trimmed mean, as scipy's ``trim_mean`` defines it: the mean of the values
# left after dropping the FLOOR(p·n) smallest and largest of the n non-NULL ones.
TRIMMED_MEAN_SQL = """
CREATE MACRO trimmed_mean(v, p) AS list_avg(list_slice(
    list_sort(list(v) FILTER (WHERE v IS NOT NULL)),
    CAST(FLOOR(p * COUNT(v)) AS BIGINT) + 1, COUNT(v) - CAST(FLOOR(p * COUNT(v)) AS BIGINT)))
"""
# Every spelling of every registered node type, with DISTINCT where the kind has one.
SPELLINGS = [(node, template) for node in registry.CATALOGUE for template in AGGREGATE_SQL[node]]


def _call(template: str) -> str:
    """A spelling of ``AGGREGATE_SQL`` over the column ``x``, at ``LEVEL``."""
    return re.sub(r"\bX\b", "x", template).format(q=LEVEL)


def _sql(template: str) -> str:
    return f"SELECT {_call(template)} AS v FROM t"


def _id(case: tuple[type[exp.Expression], str]) -> str:
    return _call(case[1])


@pytest.fixture(scope="module")
def con() -> duckdb.DuckDBPyConnection:
    return _engine(ROWS)


def _engine(rows: list[tuple[int, int]]) -> duckdb.DuckDBPyConnection:
    """DuckDB holding ``rows`` as the table ``t``, with the trimmed mean it lacks."""
    connection = duckdb.connect()
    connection.execute(TRIMMED_MEAN_SQL)
    load_table(connection, "t", ["pid", "x"], rows)
    return connection


def _engine_value(con: duckdb.DuckDBPyConnection, sql: str) -> float:
    (value,) = con.execute(sql).fetchone()
    return float(value)


def released(con: duckdb.DuckDBPyConnection, sql: str, epsilon: float) -> tuple[float, list]:
    """The released value of ``sql``'s one cell, and its interval, from one draw."""
    p = make_plan(sql, dataset(COLUMNS, max_partitions=1, max_rows=2), epsilon)
    rewritten, exact = run_rewritten(p, con, seed=1)
    out = release(noise(p, rewritten, exact))
    (column,) = out.accuracy["columns"]
    return float(out.rows[0][0]), column["intervals"][0]


def agrees_with_the_engine(con: duckdb.DuckDBPyConnection, sql: str) -> None:
    """At ε = 10⁴ the noise is below a unit: the release is the engine's own value, to
    a percent (a DP quantile is chosen on a grid and DuckDB interpolates)."""
    value, _ = released(con, sql, 1e4)
    truth = _engine_value(con, sql)
    assert abs(value - truth) <= 0.01 * abs(truth) + 1.0, (sql, value, truth)


@pytest.mark.parametrize("case", SPELLINGS, ids=_id)
def test_every_kind_releases_what_duckdb_computes(con, case):
    agrees_with_the_engine(con, _sql(case[1]))


@pytest.mark.parametrize("case", SPELLINGS, ids=_id)
def test_every_kind_stays_within_its_sensitivity_on_every_neighbour(case):
    """One unit removed (add/remove) from a table where units have 1 to 3 rows, some
    NULL and some out of bounds: each measurement moves by at most its sensitivity,
    each selection's histogram by at most its distance."""
    columns = {"pid": {"type": "int"}, "x": {"type": "int", "lower": -3, "upper": 5}}
    p = make_plan(_sql(case[1]), dataset(columns, max_partitions=1, max_rows=2))
    rows = [(1, 4), (1, -9), (1, 2), (2, None), (2, 5), (3, 0), (4, 7), (4, -3)]
    con = duckdb.connect()
    load_table(con, "t", ["pid", "x"], rows)
    base = exact_vectors(p, con, seed=3)
    for pid in {r[0] for r in rows}:
        load_table(con, "t", ["pid", "x"], [r for r in rows if r[0] != pid])
        other = exact_vectors(p, con, seed=3)
        for m in p.measurements:
            moved = sum(abs(a - b) for a, b in zip(base[m.name], other[m.name], strict=True))
            assert moved <= m.noise.sensitivity, (case[1], m.label, moved)
        for s in p.selections:
            moved = sum(
                abs(a.get(k, 0) - b.get(k, 0))
                for a, b in zip(base[s.name], other[s.name], strict=True)
                for k in set(a) | set(b)
            )
            assert moved <= s.sensitivity, (case[1], s.label, moved)


DRAWS = 200


@pytest.mark.parametrize("case", SPELLINGS, ids=_id)
def test_every_kinds_interval_covers_the_truth(con, case):
    """At ε = 1, 200 draws of the noise: the 95% interval holds DuckDB's value in at
    least 90% of them (a binomial at 95% falls below that about once in 10⁴)."""
    sql = _sql(case[1])
    p = make_plan(sql, dataset(COLUMNS, max_partitions=1, max_rows=2), 1.0)
    rewritten, exact = run_rewritten(p, con, seed=1)
    truth = _engine_value(con, sql)
    held = 0
    for _ in range(DRAWS):
        (column,) = release(noise(p, rewritten, exact)).accuracy["columns"]
        lo, hi = column["intervals"][0]
        held += lo <= truth <= hi
    assert held >= 0.9 * DRAWS, (sql, held)


@pytest.mark.parametrize("case", SPELLINGS, ids=_id)
def test_every_kind_is_judged_by_a_rule_of_its_own_parts(case):
    """A bare aggregate of every kind is judged for noise dominance by a rule that reads
    its own measurements or selection, never by the rule of no aggregate."""
    p = make_plan(_sql(case[1]), dataset(COLUMNS, max_partitions=1, max_rows=2))
    (agg,) = p.checked.aggregates
    rule, what = judging_rule(p, exp.column(agg.name))
    expected = {
        AggregateFunc.QUANTILE: "percentiles",
        AggregateFunc.AVG: "range",
        AggregateFunc.COUNT: "zero",
        AggregateFunc.COUNT_DISTINCT: "zero",
        AggregateFunc.SUM: "zero",
    }.get(agg.func, "range")
    assert rule == expected and what is not None, (case[1], rule)


def test_every_function_is_some_node_types_kind():
    """The table plans every function of the enum, and each node type's kind says
    which function it is: the enum and the table cannot drift apart."""
    funcs = {registry.kind_of(f).func for f in AggregateFunc}
    assert funcs == set(AggregateFunc)


@pytest.mark.parametrize(
    "call", ["SKEWNESS(X)", "KURTOSIS(X)", "CORR(X, X)", "APPROX_QUANTILE(X, 0.5)"]
)
def test_an_unregistered_aggregate_is_refused(call):
    """These parse, and DuckDB computes them; the gate has no kind for them: refused,
    never released as a look-alike (SKEWNESS was once planned as a variance, and
    APPROX_QUANTILE is a subclass of sqlglot's QUANTILE: the table is read by exact
    node type)."""
    name = call.split("(")[0]
    with pytest.raises(Refused, match=f"aggregate {name} is not supported"):
        make_plan(_sql(call), dataset(COLUMNS, max_partitions=1, max_rows=2))


def test_a_kind_planned_as_another_is_caught(con, monkeypatch):
    """Registering SKEWNESS with one line as a variance, the planned-and-released bug
    the catalogue exists to stop, is caught by the contract: released as a variance, it
    is not what DuckDB computes."""
    monkeypatch.setitem(registry.CATALOGUE, exp.Skewness, variance.VAR_SAMP)
    with pytest.raises(AssertionError, match="SKEWNESS"):
        agrees_with_the_engine(con, _sql("SKEWNESS(X)"))


def test_a_node_type_registered_to_the_wrong_kind_is_caught(con, monkeypatch):
    """VARIANCE registered to the standard deviation's kind: the contract's own case for
    VARIANCE fails."""
    monkeypatch.setitem(registry.CATALOGUE, exp.Variance, variance.STDDEV_SAMP)
    with pytest.raises(AssertionError, match="VARIANCE"):
        agrees_with_the_engine(con, _sql("VARIANCE(X)"))
    values = np.array([r[1] for r in ROWS], dtype=float)
    assert _engine_value(con, _sql("VARIANCE(X)")) == pytest.approx(values.var(ddof=1))


def test_count_if_registered_as_a_plain_count_is_caught(con, monkeypatch):
    """``COUNT_IF`` is one module and one line: registered as ``COUNT`` instead (which
    counts every row whose condition is not NULL), the contract catches it."""
    monkeypatch.setitem(registry.CATALOGUE, exp.CountIf, count.COUNT)
    with pytest.raises(AssertionError, match="COUNT_IF"):
        agrees_with_the_engine(con, _sql("COUNT_IF(X > 40)"))


# A column of squares: skewed, so its trimmed mean is far from its mean.
SKEWED = [(pid, x * x // 100) for pid, x in ROWS]


def test_the_engines_trimmed_mean_is_scipys():
    """The macro the contract compares with computes the definition: numpy's mean of the
    sorted values with FLOOR(p·n) cut at each end."""
    con = _engine(SKEWED)
    values = np.sort([x for _, x in SKEWED])
    cut = math.floor(LEVEL * len(values))
    assert _engine_value(con, _sql("TRIMMED_MEAN(X, {q})")) == pytest.approx(
        values[cut : len(values) - cut].mean()
    )


def test_a_trimmed_mean_registered_as_an_average_is_caught(monkeypatch):
    """TRIMMED_MEAN is one module and one line: registered as AVG's kind instead, it
    releases the mean of a skewed column (33.1), not its trimmed mean (26.7), and the
    contract catches it. Over the contract's own evenly spread column the two are within
    a percent (49.93 and 49.94): only a skewed table tells them apart."""
    con = _engine(SKEWED)
    sql = _sql("TRIMMED_MEAN(X, {q})")
    agrees_with_the_engine(con, sql)
    monkeypatch.setitem(registry.CATALOGUE, "TRIMMED_MEAN", average.AVG)
    with pytest.raises(AssertionError, match="TRIMMED_MEAN"):
        agrees_with_the_engine(con, sql)


def _trimmed_sum(values: tuple[int, ...], p: Fraction, top=math.floor) -> int:
    """The sum the engine computes (``Dialect.trimmed_sum``), ``p·n`` exact as DuckDB's
    DECIMAL; ``top``: how many are cut at the top end (FLOOR, as the gate does)."""
    ordered = sorted(values)
    n = len(ordered)
    return sum(ordered[math.floor(p * n) : n - top(p * n)])


def _largest_move(lo: int, hi: int, top=math.floor) -> int:
    """The most a trimmed sum of values in ``[lo, hi]`` moves when one value is added,
    over every multiset of up to six values and several fractions."""
    moved = 0
    for p in (Fraction(0), Fraction(1, 10), Fraction(1, 4), Fraction(1, 3), Fraction(49, 100)):
        for n in range(7):
            for values in itertools.combinations_with_replacement(range(lo, hi + 1), n):
                before = _trimmed_sum(values, p, top)
                for y in range(lo, hi + 1):
                    moved = max(moved, abs(_trimmed_sum((*values, y), p, top) - before))
    return moved


def test_a_trimmed_sum_moves_as_a_plain_sum_does():
    """The proof in ``aggregates/trimmed_mean.py``, exhaustively on small multisets: one
    value added moves the trimmed sum by at most max(|a|, |b|), a plain sum's bound,
    which is reached. A window whose ends can both move when one value is added (its
    top end cut by CEIL) breaks the bound, and the check catches it. (Wider and
    one-sided bounds, and replacements: the search run.)"""
    assert _largest_move(-2, 3) == 3
    assert _largest_move(-2, 3, top=math.ceil) > 3


@pytest.mark.search
def test_a_trimmed_sum_moves_as_a_plain_sum_does_for_other_bounds_and_replacements():
    """The same for bounds on one side of 0, and one value replaced: it moves the
    trimmed sum by at most the change of the value."""
    for lo, hi in [(-3, 5), (0, 4), (-4, -1)]:
        assert _largest_move(lo, hi) == max(abs(lo), abs(hi))
    assert _largest_move(-3, 5, top=math.ceil) > 5
    p = Fraction(1, 4)
    for values in itertools.combinations_with_replacement(range(-2, 3), 5):
        for i, y in itertools.product(range(5), range(-2, 3)):
            changed = (*values[:i], y, *values[i + 1 :])
            moved = abs(_trimmed_sum(changed, p) - _trimmed_sum(values, p))
            assert moved <= abs(y - values[i])


def test_the_engines_trimmed_sum_reaches_a_plain_sums_sensitivity():
    """Through the engine, a unit of two rows at the lower bound, removed, moves the
    trimmed sum (six values, one cut at each end; then four, one cut) by exactly its
    sensitivity, a plain sum's: no smaller calibration (say a sum's times the 1 − 2p
    of values kept) is sound, and the brute force above would not show it (its table
    moves a sum by half its sensitivity)."""
    columns = {"pid": {"type": "int"}, "x": {"type": "int", "lower": -3, "upper": 5}}
    p = make_plan(_sql("TRIMMED_MEAN(X, {q})"), dataset(columns, max_partitions=1, max_rows=2))
    rows = [(1, 1), (2, 5), (3, -3), (3, -2), (4, -3), (4, -3)]
    con = duckdb.connect()
    load_table(con, "t", ["pid", "x"], rows)
    base = exact_vectors(p, con, seed=3)
    load_table(con, "t", ["pid", "x"], [r for r in rows if r[0] != 4])
    other = exact_vectors(p, con, seed=3)
    (trimmed,) = (m for m in p.measurements if m.trim)
    moved = abs(base[trimmed.name][0] - other[trimmed.name][0])
    assert moved == trimmed.noise.sensitivity == 8
