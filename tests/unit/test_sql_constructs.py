"""The SQL a researcher writes, pass by pass: subqueries, CTEs, joins, the
newer aggregates and GROUP BY expressions — what each becomes in the plan,
and the reason given for each construct that stays refused."""

from __future__ import annotations

from pathlib import Path

import pytest

from dpmagic.gate.failures import Refused
from dpmagic.gate.policy import PolicyError, parse_policy
from tests.gate_helpers import dataset, make_plan

COLUMNS = {
    "pid": {"type": "int"},
    "age": {"type": "int", "lower": 0, "upper": 100},
    "income": {"type": "float", "lower": 0, "upper": 500000},
    "sex": {"type": "int", "public_values": [0, 1]},
    "note": {"type": "str"},
    "ok": {"type": "bool"},
}
MORE = {
    "u": {"columns": {"pid": {"type": "int"}, "z": {"type": "int", "lower": -2, "upper": 4}}},
    "pub": {
        "public": True,
        "columns": {"sex": {"type": "int"}, "label": {"type": "str"}},
    },
}
DS = dataset(COLUMNS, max_partitions=2, max_rows=3, more_tables=MORE)


def refusal(sql: str, ds=DS) -> str:
    with pytest.raises(Refused) as info:
        make_plan(sql, ds)
    return info.value.message


@pytest.mark.parametrize(
    ("sql", "reason"),
    [
        ("SELECT COUNT(*) FROM t WHERE age = (SELECT MAX(age) FROM t)", "exactly"),
        ("SELECT (SELECT COUNT(*) FROM t) AS n FROM t", "subqueries in expressions"),
        ("SELECT COUNT(*) FROM t WHERE EXISTS (SELECT 1 FROM u)", "tied to the query"),
        ("SELECT COUNT(*) FROM t WHERE EXISTS (SELECT 1 FROM u WHERE u.z = t.age)", "units"),
        (
            "SELECT COUNT(*) FROM t WHERE EXISTS (SELECT 1 FROM u WHERE u.pid = t.pid OR u.z > 0)",
            "one equality",
        ),
        ("SELECT COUNT(*) FROM t WHERE age IN (SELECT z FROM u)", "other units' rows"),
        ("SELECT COUNT(*) FROM t WHERE pid IN (SELECT z FROM u)", "must match privacy units"),
        ("SELECT COUNT(*) FROM t WHERE pid IN (SELECT pid, z FROM u)", "exactly one column"),
        ("SELECT COUNT(*) FROM t WHERE pid IN (SELECT pid FROM u LIMIT 3)", "LIMIT"),
        ("SELECT COUNT(*) FROM (SELECT * FROM t ORDER BY age LIMIT 5) AS s", "ORDER BY"),
        ("SELECT COUNT(*) FROM (SELECT * FROM t LIMIT 5) AS s", "LIMIT"),
        # Grouped by the unit it is a per-person subquery (tests/unit/test_per_person.py);
        # grouped by anything else it would mix persons.
        ("SELECT AVG(n) FROM (SELECT age, COUNT(*) AS n FROM t GROUP BY age) AS s", "GROUP BY"),
        ("SELECT COUNT(*) FROM (SELECT SUM(age) AS s FROM t) AS s", "aggregates inside"),
        ("SELECT COUNT(*) FROM (SELECT DISTINCT age FROM t) AS s", "DISTINCT"),
        ("WITH RECURSIVE r AS (SELECT 1 AS x FROM t) SELECT COUNT(*) FROM r", "RECURSIVE"),
        ("SELECT COUNT(*) FROM (SELECT 1 UNION SELECT 2) AS s", "UNION"),
        ("SELECT COUNT(*) FROM t JOIN u ON t.age = u.z", "mix two units"),
        ("SELECT COUNT(*) FROM t, u", "mix two units"),
        ("SELECT COUNT(*) FROM t JOIN u ON t.pid = u.pid + 0", "mix two units"),
        ("SELECT COUNT(*) FROM t LEFT JOIN u ON t.age = u.z AND t.pid = u.pid + 1", "mix"),
        ("SELECT COUNT(*) FROM pub", "public"),
        ("SELECT COUNT(*) FROM pub JOIN pub AS p2 ON pub.sex = p2.sex", "only public"),
        ("SELECT COUNT(*) FROM pub LEFT JOIN t ON pub.sex = t.sex", "optional side"),
        ("SELECT COUNT(*) FROM t RIGHT JOIN u ON t.pid = u.pid", "RIGHT JOIN"),
        ("SELECT COUNT(*) FROM t FULL JOIN u ON t.pid = u.pid", "FULL JOIN"),
        ("SELECT COUNT(*) FROM t JOIN u ON t.pid = u.pid WHERE pid > 3", "ambiguous"),
        (
            "SELECT COUNT(*) FROM t LEFT JOIN (SELECT * FROM u JOIN t AS t2 ON u.pid = t2.pid) "
            "AS s ON t.pid = s.pid",
            "one table",
        ),
        ("SELECT MAX(pid) FROM t", "privacy unit"),
        ("SELECT SUM(u.pid) FROM t JOIN u ON t.pid = u.pid", "privacy unit"),
        ("SELECT pid, COUNT(*) FROM t GROUP BY pid", "privacy unit"),
        ("SELECT u.pid, COUNT(*) FROM t JOIN u ON t.pid = u.pid GROUP BY u.pid", "privacy unit"),
        ("SELECT note, COUNT(*) FROM t GROUP BY note", "public_values for 'note'"),
        ("SELECT income, COUNT(*) FROM t GROUP BY income", "not public"),
        ("SELECT age * 1000000, COUNT(*) FROM t GROUP BY 1", "at most"),
        ("SELECT CASE WHEN age > 3 THEN note END AS n, COUNT(*) FROM t GROUP BY n", "not public"),
        ("SELECT CASE WHEN age > 3 THEN 'a' ELSE 1 END AS n, COUNT(*) FROM t GROUP BY n", "mix"),
        ("SELECT COUNT(*) FROM t GROUP BY 3", "no output column 3"),
        ("SELECT COUNT(*) FROM t GROUP BY COUNT(*)", "aggregate"),
        ("SELECT quantile_cont(age, 1.5) FROM t", "between 0 and 1"),
        ("SELECT quantile_cont(age, age) FROM t", "between 0 and 1"),
        ("SELECT SUM(DISTINCT age) FROM t", "COUNT(DISTINCT"),
        ("SELECT MEDIAN(note) FROM t", "not a number"),
        ("SELECT MEDIAN(income / (age - 1.5)) FROM t", "arbitrarily close to zero"),
        ("SELECT COUNT(*) FILTER (WHERE COUNT(*) > 1) FROM t", "nested"),
        ("SELECT string_agg(note, ',') FILTER (WHERE age > 1) FROM t", "never allowed"),
        ("SELECT COUNT(*) FROM t AS a JOIN t AS a ON a.pid = a.pid", "used twice"),
    ],
)
def test_refused_with_a_reason(sql, reason):
    assert reason in refusal(sql)


def test_joins_need_a_privacy_unit():
    row_level = dataset(COLUMNS, unit=None, more_tables={"pub": MORE["pub"]})
    assert "privacy unit" in refusal(
        "SELECT COUNT(*) FROM t JOIN pub ON t.sex = pub.sex", row_level
    )


# -- what the plan becomes -------------------------------------------------------


def test_subqueries_and_ctes_merge_into_one_scan_with_their_filters():
    p = make_plan(
        "WITH old AS (SELECT *, income / 1000 AS k FROM t WHERE age >= 65) "
        "SELECT sex, SUM(k) FROM (SELECT * FROM old WHERE sex = 1) AS o GROUP BY sex",
        DS,
    )
    resolved = p.checked.resolved
    assert [s.table.name for s in resolved.scans] == ["t"]
    where = p.checked.where.sql()
    assert "__s0.age >= 65" in where and "__s0.sex = 1" in where
    (m,) = p.measurements
    assert m.label == "SUM((income / 1000))"
    assert (m.clamp.lo, m.clamp.hi) == (0, 500)


def test_joined_rows_belong_to_the_first_private_table_unit():
    p = make_plan("SELECT COUNT(*) FROM pub JOIN u ON pub.sex = u.z JOIN t ON t.pid = u.pid", DS)
    resolved = p.checked.resolved
    assert [s.table.name for s in resolved.scans] == ["pub", "u", "t"]
    assert resolved.unit.sql() == "__s1.pid"


def test_a_left_join_keeps_its_condition_and_the_right_side_filters():
    p = make_plan(
        "SELECT COUNT(s.z) FROM t LEFT JOIN (SELECT * FROM u WHERE z > 0) AS s ON t.pid = s.pid",
        DS,
    )
    right = p.checked.resolved.scans[1]
    assert right.kind == "left"
    assert right.on.sql() == "__s0.pid = __s1.pid AND __s1.z > 0"
    assert p.checked.where is None  # nothing filters the preserved side


def test_count_distinct_unit_counts_each_unit_once_per_group():
    p = make_plan(
        "SELECT sex, COUNT(DISTINCT pid), COUNT(DISTINCT age), COUNT(*) FROM t GROUP BY sex",
        DS,
    )
    by_label = {m.label: m for m in p.measurements}
    assert by_label["COUNT(DISTINCT pid)"].sensitivity == 2  # 2 groups, 1 each
    assert by_label["COUNT(DISTINCT age)"].sensitivity == 6  # 2 groups, 3 rows each
    assert by_label["COUNT(*)"].sensitivity == 6


def test_variance_is_made_of_a_count_and_centred_sums():
    p = make_plan("SELECT VAR_POP(age), STDDEV(age), AVG(age) FROM t", DS, epsilon=1.0)
    labels = sorted(m.label for m in p.measurements)
    # The sums of the variance and of AVG are noised around the middle of their ranges
    # (the sum of distances to 50 is centred already); their shares are weighted.
    assert labels == [
        "COUNT(age)",
        "SUM((age - 50)^2) centred on 1250",
        "SUM(age - 50)",
        "SUM(age) centred on 50",
    ]
    square = next(m for m in p.measurements if "^2" in m.label)
    assert (square.clamp.lo, square.clamp.hi) == (0, 2500)
    assert (
        square.sensitivity
        == p.measurement(p.parts[p.checked.aggregates[2].name].names[0]).sensitivity * 25
    )
    total = sum(m.cost.epsilon for m in p.measurements)
    assert 0.999 < total <= 1.0


def test_quantiles_are_selections_over_a_grid_of_the_bounds():
    p = make_plan(
        "SELECT MIN(age), MEDIAN(age), MAX(age), quantile_cont(income, 0.9), "
        "percentile_disc(0.25) WITHIN GROUP (ORDER BY age DESC) FROM t",
        DS,
        epsilon=1.0,
    )
    # a COUNT of each argument, the plan's own: the quantiles are judged by it
    assert sorted(m.label for m in p.measurements) == ["COUNT(age)", "COUNT(income)"]
    levels = sorted((s.label.split("(")[0], s.noise.level) for s in p.selections)
    assert ("MAX", 1.0) in levels and ("MIN", 0.0) in levels and ("MEDIAN", 0.5) in levels
    assert any(level == 0.75 for _, level in levels)  # DESC turns 0.25 into 0.75
    ages = next(s for s in p.selections if s.label == "MEDIAN(age)")
    assert (ages.grid.lo, ages.grid.hi, ages.grid.size) == (0, 100, 101)
    incomes = next(s for s in p.selections if "income" in s.label)
    assert incomes.grid.size == 1001 and incomes.grid.value(1000) == 500000
    assert all(s.noise.epsilon <= s.epsilon for s in p.selections)
    # each quantile, its interval's two ends and the added counts share the ε
    spent = sum(s.epsilon + 2 * s.edges.epsilon for s in p.selections)
    assert spent + sum(m.cost.epsilon for m in p.measurements) == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("sql", "partitions"),
    [
        ("SELECT age, COUNT(*) FROM t GROUP BY age", [(a,) for a in range(101)]),
        ("SELECT age // 25 AS q, COUNT(*) FROM t GROUP BY q", [(q,) for q in range(5)]),
        ("SELECT ok, COUNT(*) FROM t GROUP BY ok", [(False,), (True,)]),
        ("SELECT age > 64, COUNT(*) FROM t GROUP BY 1", [(False,), (True,)]),
        (
            "SELECT CASE WHEN age < 18 THEN 'minor' WHEN age < 65 THEN 'adult' END AS b, "
            "sex, COUNT(*) FROM t GROUP BY b, sex",
            [("minor", 0), ("minor", 1), ("adult", 0), ("adult", 1)],
        ),
        ("SELECT IF(income > 1e5, 2.5, 0) AS r, COUNT(*) FROM t GROUP BY r", [(2.5,), (0,)]),
    ],
)
def test_group_key_values_come_from_the_query_and_policy(sql, partitions):
    assert list(make_plan(sql, DS).partitions) == partitions


def test_filter_becomes_a_case_argument():
    p = make_plan("SELECT COUNT(*) FILTER (WHERE age > 30), SUM(age) FILTER (WHERE ok) FROM t", DS)
    args = sorted(m.arg.sql() for m in p.measurements)
    assert args == [
        "CASE WHEN __s0.age > 30 THEN 1 END",
        "CASE WHEN __s0.ok THEN __s0.age END",
    ]
    s = next(m for m in p.measurements if m.kind == "sum")
    assert (s.clamp.lo, s.clamp.hi) == (0, 100)


def test_order_by_names_an_output_before_a_column():
    p = make_plan("SELECT sex, COUNT(*) AS age FROM t GROUP BY sex ORDER BY age DESC", DS)
    assert p.checked.order[0].this.sql() == "age"


# -- links in the policy ------------------------------------------------------


def _policy(tables: dict, unit: str | None = "patient_id"):
    raw = {
        "datasets": {
            "c": {
                "sources": {"patients": "p.csv"},
                "user_budget": {"epsilon": 1.0},
                "tables": tables,
                **({"privacy_unit": unit} if unit else {}),
            }
        }
    }
    return parse_policy(raw, Path("policy.toml")).dataset("c")


def test_links_name_each_table_unit_column():
    ds = _policy(
        {
            "patients": {"unit": "id", "columns": {"id": {"type": "int"}}},
            "visits": {
                "links": {"patient": "patients.id"},
                "columns": {"patient": {"type": "int"}, "cost": {"type": "float"}},
            },
            "labs": {"columns": {"patient_id": {"type": "int"}}},
        }
    )
    assert ds.tables["patients"].unit == "id"
    assert ds.tables["visits"].unit == "patient"
    assert ds.tables["labs"].unit == "patient_id"
    assert "links" in ds.as_dict()["tables"]["visits"]


@pytest.mark.parametrize(
    ("tables", "reason"),
    [
        ({"a": {"columns": {"x": {"type": "int"}}}}, "must hold the privacy unit"),
        ({"a": {"unit": "y", "columns": {"x": {"type": "int"}}}}, "declared columns"),
        (
            {
                "a": {"unit": "x", "columns": {"x": {"type": "int"}, "y": {"type": "int"}}},
                # b's own unit column (the privacy unit's name) links to a's key, not
                # to a's unit: the person would be read two ways
                "b": {"links": {"patient_id": "a.y"}, "columns": {"patient_id": {"type": "int"}}},
            },
            "must be the privacy unit column",
        ),
        (
            {"b": {"links": {"y": "nowhere.y"}, "columns": {"y": {"type": "int"}}}},
            "not a column of a declared private table",
        ),
        ({"b": {"links": {"y": "a"}, "columns": {"y": {"type": "int"}}}}, '"table.column"'),
        ({"p": {"public": True, "unit": "x", "columns": {"x": {"type": "int"}}}}, "public"),
    ],
)
def test_bad_units_and_links_are_named(tables, reason):
    with pytest.raises(PolicyError, match=reason):
        _policy(tables)


# -- dates --------------------------------------------------------------------

DATED = dataset(
    {
        "pid": {"type": "int"},
        "day": {"type": "date", "lower": "2019-01-01", "upper": "2024-12-31"},
        "x": {"type": "int", "lower": 0, "upper": 5},
    },
    max_partitions=100,
    max_rows=100,
)


def test_date_parts_group_by_their_public_ranges_and_read_clamped_dates():
    import duckdb

    from tests.gate_helpers import exact_vectors

    sql = "SELECT YEAR(day) AS y, COUNT(*), SUM(x) FROM t WHERE day < DATE '2024-01-01' GROUP BY y"
    p = make_plan(sql, DATED)
    assert [k for (k,) in p.partitions] == list(range(2019, 2025))
    con = duckdb.connect()
    con.execute("CREATE TABLE t (pid BIGINT, day DATE, x BIGINT)")
    rows = [(1, "2018-05-01", 1), (2, "2020-03-04", 2), (3, "2023-12-31", 3), (4, None, 4)]
    con.executemany("INSERT INTO t VALUES (?, ?, ?)", rows)
    out = exact_vectors(p, con, seed=1)
    counts, sums = (out[m.name] for m in p.measurements)
    # 2018-05-01 is read as the lower bound, 2019-01-01.
    assert counts == [1, 1, 0, 0, 1, 0] and sums == [1, 2, 0, 0, 3, 0]
    month = make_plan("SELECT EXTRACT(month FROM day) AS m, COUNT(*) FROM t GROUP BY m", DATED)
    assert len(month.partitions) == 12
    assert make_plan("SELECT MEDIAN(YEAR(day)) FROM t", DATED).selections[0].grid.size == 6


@pytest.mark.parametrize(
    ("sql", "reason"),
    [
        ("SELECT COUNT(*) FROM t WHERE day > DATE '2020-13-01'", "not a date"),
        ("SELECT YEAR(x), COUNT(*) FROM t GROUP BY 1", "need a date column"),
        ("SELECT EXTRACT(epoch FROM day) AS e, COUNT(*) FROM t GROUP BY e", "extract one of"),
        ("SELECT COUNT(*) FROM t WHERE CAST(x AS DATE) > DATE '2020-01-01'", "TRY_CAST"),
    ],
)
def test_date_refusals(sql, reason):
    assert reason in refusal(sql, DATED)


def test_date_bounds_in_the_policy():
    assert DATED.tables["t"].columns["day"].as_dict() == {
        "type": "date",
        "lower": "2019-01-01",
        "upper": "2024-12-31",
    }
    with pytest.raises(PolicyError, match="must be a date"):
        dataset({"pid": {"type": "int"}, "day": {"type": "date", "lower": 3, "upper": 4}})


@pytest.mark.parametrize(
    ("sql", "reason"),
    [
        ("SELECT COUNT(*) FROM t WHERE note = 5", "compares number with text"),
        ("SELECT COUNT(*) FROM t WHERE age = 'old'", "compares number with text"),
        ("SELECT COUNT(*) FROM t WHERE note IN ('a', 3)", "compares"),
        ("SELECT COUNT(*) FROM t JOIN pub ON t.note = pub.sex", "compares"),
        ("SELECT COUNT(*) FROM t WHERE age BETWEEN 'a' AND 'b'", "compares"),
        ("SELECT COUNT(*) FROM t WHERE note + 1 > 3", "arithmetic needs numbers"),
        ("SELECT COUNT(*) FROM t WHERE -note = 'x'", "arithmetic needs numbers"),
    ],
)
def test_comparisons_that_would_cast_data_are_refused(sql, reason):
    """DuckDB would cast one side; a cast that fails on some row is a data-dependent error."""
    assert reason in refusal(sql)


def test_dates_compare_with_date_text():
    assert make_plan("SELECT COUNT(*) FROM t WHERE day >= '2020-02-01'", DATED)
    assert "not a date" in refusal("SELECT COUNT(*) FROM t WHERE day >= '2020-02-31'", DATED)
