"""Each analysis pass on its own: what it accepts, what it refuses and why."""

from __future__ import annotations

import math

import pytest
from sqlglot import exp

from dpmagic.gate.dp.accounting import PureAccountant
from dpmagic.gate.failures import Refused
from dpmagic.gate.sql.bound import bound
from dpmagic.gate.sql.check import check
from dpmagic.gate.sql.parse import parse
from dpmagic.gate.sql.plan import plan
from dpmagic.gate.sql.resolve import resolve
from dpmagic.gate.sql.value_range import ValueRange
from tests.gate_helpers import dataset, make_plan

COLUMNS = {
    "pid": {"type": "int"},
    "age": {"type": "int", "lower": 0, "upper": 100},
    "income": {"type": "float", "lower": 0, "upper": 500000},
    "sex": {"type": "int", "public_values": [0, 1]},
    "state": {"type": "str", "public_values": ["CA", "NY", "TX"]},
    "note": {"type": "str"},
    "score": {"type": "float"},
}
DS = dataset(COLUMNS, max_partitions=2, max_rows=3)


def refusal(sql: str, params=None) -> str:
    with pytest.raises(Refused) as info:
        make_plan_params(sql, params)
    return info.value.message


def make_plan_params(sql, params=None):
    return plan(bound(check(resolve(parse(sql, params), DS))), 1.0, 0.0, PureAccountant())


# -- parse -------------------------------------------------------------------


def test_parse_canonical_text_ignores_layout():
    a = parse("select  count(*)\nfrom T where age>3")
    b = parse("SELECT COUNT(*) FROM t WHERE age > 3")
    assert a.canonical == b.canonical


@pytest.mark.parametrize(
    ("sql", "named"),
    [
        ("ATTACH 'x.db' AS o", "ATTACH"),
        ("COPY t TO 'out.csv'", "COPY"),
        ("PRAGMA table_info('t')", "PRAGMA"),
        ("SET threads = 1", "SET"),
        ("SUMMARIZE t", "SUMMARIZE"),
        ("INSTALL httpfs", "INSTALL"),
        ("DELETE FROM t", "DELETE"),
    ],
)
def test_parse_names_the_refused_statement(sql, named):
    assert named in refusal(sql)


def test_parse_refuses_a_second_statement_and_garbage():
    assert "one statement" in refusal("SELECT COUNT(*) FROM t; SELECT 1")
    assert "could not parse" in refusal("SELECT COUNT(* FROM t")
    assert "empty" in refusal("   ")


def test_parameters_are_bound_as_typed_literals():
    parsed = parse("SELECT COUNT(*) FROM t WHERE age > $a AND state = $s", {"a": 30, "s": "CA"})
    literals = {(n.this, n.is_string) for n in parsed.tree.find_all(exp.Literal)}
    assert ("30", False) in literals
    assert ("CA", True) in literals
    # A string parameter stays a string even when it looks like SQL.
    evil = parse("SELECT COUNT(*) FROM t WHERE note = $s", {"s": "x' OR 1=1 --"})
    assert evil.tree.find(exp.Or) is None
    assert "no value" in refusal("SELECT COUNT(*) FROM t WHERE age > $a")
    assert "not used" in refusal("SELECT COUNT(*) FROM t", {"b": 1})


# -- resolve -----------------------------------------------------------------


def test_resolve_refuses_unknown_names_and_files():
    assert "unknown table 'other'" in refusal("SELECT COUNT(*) FROM other")
    assert "unknown column 'salary'" in refusal("SELECT SUM(salary) FROM t")
    assert "reading files" in refusal("SELECT COUNT(*) FROM '/etc/passwd'")
    assert "table function" in refusal("SELECT COUNT(*) FROM read_csv('/etc/passwd')")
    assert "unknown table or alias" in refusal("SELECT COUNT(*) FROM t AS a WHERE b.age > 1")
    assert "mix two units" in refusal("SELECT COUNT(*) FROM t JOIN t AS u ON t.age = u.age")


def test_resolve_accepts_aliases_and_qualified_names():
    p = make_plan("SELECT SUM(a.age) FROM t AS a WHERE a.sex = 1", DS)
    assert [m.label for m in p.measurements] == ["SUM(age)"]


# -- check -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "reason"),
    [
        ("SELECT age FROM t", "inside an aggregate or listed in GROUP BY"),
        ("SELECT sex, age, COUNT(*) FROM t GROUP BY sex", "inside an aggregate"),
        ("SELECT pid, COUNT(*) FROM t GROUP BY pid", "privacy unit"),
        ("SELECT note, COUNT(*) FROM t GROUP BY note", "public_values"),
        ("SELECT score, COUNT(*) FROM t GROUP BY score", "public_values"),
        ("SELECT COUNT(*) FROM t WHERE CAST(note AS INT) > 1", "TRY_CAST"),
        ("SELECT COUNT(*) FROM t WHERE pg_sleep(1) IS NULL", "pg_sleep"),
        ("SELECT COUNT(*) FROM t WHERE regexp_matches(note, 'a')", "not allowed"),
        ("SELECT COUNT(*) FROM t WHERE note LIKE note", "literal pattern"),
        ("SELECT COUNT(*) OVER () FROM t", "window"),
        ("SELECT DISTINCT sex FROM t", "DISTINCT"),
        ("SELECT COUNT(*) FROM t WHERE age IN (SELECT age FROM t)", "privacy units"),
        ("SELECT SUM(COUNT(*)) FROM t", "nested"),
        ("SELECT list(age) FROM t", "never allowed"),
        ("SELECT 1 FROM t", "no aggregate"),
        ("SELECT COUNT(*) FROM t LIMIT -1", "LIMIT"),
    ],
)
def test_check_refuses_with_a_reason(sql, reason):
    assert reason in refusal(sql)


def test_check_classifies_outputs_and_shares_aggregates():
    checked = check(
        resolve(
            parse(
                "SELECT sex, COUNT(*) AS n, SUM(age) / COUNT(*) AS m FROM t GROUP BY sex "
                "HAVING COUNT(*) > 5 ORDER BY n DESC LIMIT 1"
            ),
            DS,
        )
    )
    assert [k.label for k in checked.keys] == ["sex"]
    assert [o.name for o in checked.outputs] == ["sex", "n", "m"]
    assert [a.label for a in checked.aggregates] == ["COUNT(*)", "SUM(age)"]
    # Released trees name aggregates and keys, never SQL text.
    assert checked.outputs[2].expr.sql() == "__a1 / __a0"
    assert checked.limit == 1


# -- bound -------------------------------------------------------------------


def _bounds(expr: str) -> ValueRange:
    b = bound(check(resolve(parse(f"SELECT SUM({expr}) FROM t"), DS)))
    return next(iter(b.bounds.values()))


@pytest.mark.parametrize(
    ("expr", "lo", "hi", "integral"),
    [
        ("age", 0, 100, True),
        ("age + income", 0, 500100, False),
        ("age - 2 * age", -200, 100, True),
        ("-age", -100, 0, True),
        ("CASE WHEN age > 90 THEN 1 ELSE 0 END", 0, 1, True),
        ("CASE WHEN age > 90 THEN age END", 91, 100, True),
        ("age > 50", 0, 1, True),
        ("income / (age + 1)", 0, 500000, False),
        ("age / sex", 0, 100, False),  # a zero divisor becomes NULL
        ("age / (sex - 1)", -100, 0, False),
        ("age // (2 * sex - 1)", -100, 100, True),
        ("age % 7", 0, 7, True),
        ("ABS(age - 50)", 0, 50, True),
        ("COALESCE(age, 200)", 0, 200, True),
        ("TRY_CAST(income AS INT)", 0, 500000, True),
        ("LEAST(income, 5000)", 0, 5000, False),
        ("GREATEST(age, 18)", 18, 100, True),
        ("LEAST(age, income)", 0, 500000, False),  # either may be NULL: no cap
        ("CASE WHEN income > 5000 THEN 5000 ELSE income END", 0, 5000, False),
        ("CASE WHEN age >= 65 THEN age - 65 END", 0, 35, True),
        ("CASE WHEN age < 18 OR age > 64 THEN 0 ELSE age END", 0, 64, True),
        ("CASE WHEN NOT (age <= 30) AND age < 40 THEN age END", 31, 39, True),
        ("CASE WHEN 10 > age THEN age ELSE 10 END", 0, 10, True),
    ],
)
def test_bound_interval_arithmetic(expr, lo, hi, integral):
    iv = _bounds(expr)
    assert (iv.lo, iv.hi, iv.integral) == (lo, hi, integral)


def test_bound_refuses_unbounded_aggregates_naming_the_column():
    assert "declare lower and upper for 'score'" in refusal("SELECT SUM(score) FROM t")
    assert "arbitrarily close to zero" in refusal("SELECT SUM(age / (income - 1)) FROM t")
    assert "not a number" in refusal("SELECT SUM(note) FROM t")
    assert "overflow" in refusal("SELECT SUM(age * 10000000000 * 10000000000) FROM t")


# -- plan --------------------------------------------------------------------


def test_plan_splits_epsilon_over_distinct_measurements():
    p = make_plan("SELECT AVG(age), SUM(age), COUNT(age), COUNT(*) FROM t", DS, epsilon=0.9)
    # AVG(age) is a centred SUM(age) and COUNT(age), the count shared with COUNT(age);
    # SUM(age) is summed raw, plus COUNT(*).
    labels = sorted(m.label for m in p.measurements)
    assert labels == ["COUNT(*)", "COUNT(age)", "SUM(age)", "SUM(age) centred on 50"]
    costs = {m.label: m.cost.epsilon for m in p.measurements}
    # The shared count keeps the even share COUNT(age) asks for; the centred sum gets
    # AVG's weight for it, more than an even share.
    assert costs["COUNT(*)"] == costs["COUNT(age)"] == costs["SUM(age)"]
    assert costs["SUM(age) centred on 50"] > costs["SUM(age)"]
    assert sum(m.noise.epsilon for m in p.measurements) <= 0.9
    assert p.cost.epsilon == 0.9


def test_plan_partitions_come_from_the_policy():
    p = make_plan("SELECT sex, state, COUNT(*) FROM t GROUP BY sex, state", DS)
    assert len(p.partitions) == 6
    # A unit keeps 2 groups · 3 rows, which may all fall in one partition.
    assert p.contribution.groups == 1 and p.contribution.rows == 6
    (m,) = p.measurements
    assert m.sensitivity == 6


def test_plan_float_sums_use_a_fine_grid():
    (m,) = make_plan("SELECT SUM(income) FROM t", DS, epsilon=1.0).measurements
    assert m.grid_exp < 0
    assert m.noise.granularity == 2.0**m.grid_exp
    assert m.scale == pytest.approx(3 * 500000 / 1.0, rel=1e-6)
    assert m.noise.granularity < m.scale / 2**20


def test_plan_refuses_too_many_groups():
    ds = dataset(
        {
            "pid": {"type": "int"},
            **{c: {"type": "int", "public_values": list(range(100))} for c in "abc"},
        },
    )
    with pytest.raises(Refused, match="key combinations"):
        make_plan("SELECT a, b, c, COUNT(*) FROM t GROUP BY a, b, c", ds)


def test_cost_does_not_depend_on_anything_but_query_and_policy():
    a = make_plan("SELECT sex, AVG(income) FROM t GROUP BY sex", DS, epsilon=0.25)
    b = make_plan("select sex, avg(income) from t group by sex", DS, epsilon=0.25)
    assert a.cost == b.cost
    assert [m.scale for m in a.measurements] == [m.scale for m in b.measurements]
    assert math.isclose(a.cost.epsilon, 0.25)
