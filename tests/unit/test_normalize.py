"""The normalisation rules (``dpmagic/gate/sql/normalize/``): each rule's fixtures,
and each rule checked against DuckDB, which must answer the rewritten query as it
answers the query written: dates folded as DuckDB computes them, factored ``OR``s
and renamed columns giving the same rows on data with NULLs. Each check is also
run on a broken rule, and must catch it."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from datetime import date, datetime
from pathlib import Path

import duckdb
import pytest
import sqlglot
from dateutil.relativedelta import relativedelta
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlglot import exp

from dpmagic.gate.failures import Refused
from dpmagic.gate.sql.normalize import column_lists, intervals, or_factoring
from dpmagic.gate.sql.normalize.column_lists import inline_column_lists
from dpmagic.gate.sql.normalize.decimals import fold_decimals
from dpmagic.gate.sql.normalize.intervals import fold_intervals
from dpmagic.gate.sql.normalize.or_factoring import factor_or
from dpmagic.gate.sql.parse import parse

FIXTURES = Path(__file__).resolve().parents[1] / "golden" / "normalize"
RULES: dict[str, Callable[[exp.Select], exp.Select]] = {
    "intervals": fold_intervals,
    "column_lists": inline_column_lists,
    "or_factoring": factor_or,
    "decimals": fold_decimals,
}


def cases(name: str) -> list[tuple[str, str]]:
    """The fixture file's (query, expected) pairs."""
    blocks = (FIXTURES / f"{name}.sql").read_text().split("\n\n")
    pairs = []
    for block in blocks:
        lines = [ln for ln in block.splitlines() if ln.strip() and not ln.startswith("--")]
        assert len(lines) == 2, block
        pairs.append((lines[0], lines[1]))
    return pairs


@pytest.mark.parametrize(
    ("rule", "given_sql", "expected"),
    [(rule, q, e) for rule in RULES for q, e in cases(rule)],
)
def test_fixtures(rule: str, given_sql: str, expected: str) -> None:
    tree = sqlglot.parse_one(given_sql, dialect="duckdb")
    assert RULES[rule](tree).sql(dialect="duckdb") == expected


def test_parse_applies_every_rule() -> None:
    parsed = parse(
        "SELECT COUNT(*) FROM (SELECT a FROM t) AS x (p) "
        "WHERE (p > 1 AND d < DATE '2000-01-31' + INTERVAL 1 MONTH) OR (p > 1 AND p < 9)"
    )
    assert parsed.canonical == (
        "SELECT COUNT(*) FROM (SELECT a AS p FROM t) AS x WHERE p > 1 AND "
        "(d < CAST('2000-02-29' AS DATE) OR p < 9)"
    )


def test_the_longest_or_chain_a_query_can_hold_is_factored_without_recursion() -> None:
    """A 20,000-character query chains about 2,000 ORs: walked iteratively (a
    recursive walk raised RecursionError here)."""
    chain = " OR ".join(["(a = 1 AND x = 2)"] * 900)
    assert parse(f"SELECT COUNT(*) FROM t WHERE {chain}").canonical == (
        "SELECT COUNT(*) FROM t WHERE a = 1 AND x = 2"
    )
    assert parse("SELECT COUNT(*) FROM t WHERE " + " OR ".join(["x = 1"] * 2190)).canonical == (
        "SELECT COUNT(*) FROM t WHERE x = 1"
    )


def test_only_sql_digits_count_an_interval() -> None:
    tree = fold_intervals(
        sqlglot.parse_one("SELECT 1 FROM t WHERE d < DATE '2000-01-01' + INTERVAL '1_0' DAY")
    )
    assert tree.find(exp.Interval) is not None


def test_more_names_than_columns_is_refused() -> None:
    with pytest.raises(Refused, match="x names 2 columns but its SELECT has 1"):
        parse("SELECT COUNT(*) FROM (SELECT a FROM t) AS x (p, q)")


# -- intervals against DuckDB -----------------------------------------------------------

UNITS = ["year", "quarter", "month", "week", "day", "hour", "minute", "second"]
days = st.dates(min_value=date(1000, 1, 1), max_value=date(9000, 12, 31))
moves = st.tuples(st.sampled_from(UNITS), st.integers(-2000, 2000), st.booleans())


def literal(base: date | datetime) -> str:
    if isinstance(base, datetime):
        return f"TIMESTAMP '{base.isoformat(sep=' ')}'"
    return f"DATE '{base.isoformat()}'"


def folded_text(base: date | datetime, unit: str, count: int, add: bool) -> str:
    sign = "+" if add else "-"
    sql = f"SELECT x FROM t WHERE x < {literal(base)} {sign} INTERVAL '{count}' {unit}"
    tree = fold_intervals(sqlglot.parse_one(sql, dialect="duckdb"))
    return tree.args["where"].this.expression.sql(dialect="duckdb")


def fold_mismatches(con: duckdb.DuckDBPyConnection, draws: list[tuple]) -> list[tuple]:
    """The draws whose folded literal DuckDB does not compute the same."""
    wrong = []
    for base, (unit, count, add) in draws:
        sign = "+" if add else "-"
        (truth,) = con.execute(
            f"SELECT CAST({literal(base)} {sign} INTERVAL '{count}' {unit} AS TIMESTAMP)"
        ).fetchone()
        (ours,) = con.execute(
            f"SELECT CAST({folded_text(base, unit, count, add)} AS TIMESTAMP)"
        ).fetchone()
        if ours != truth:
            wrong.append((base, unit, count, add, ours, truth))
    return wrong


INTERVAL_DRAWS = st.lists(
    st.tuples(
        st.one_of(
            days,
            st.datetimes(min_value=datetime(1000, 1, 1), max_value=datetime(9000, 1, 1)).map(
                lambda d: d.replace(microsecond=0)
            ),
        ),
        moves,
    ),
    min_size=1,
    max_size=5,
)


@settings(max_examples=15, deadline=None)
@given(INTERVAL_DRAWS)
def test_intervals_fold_as_duckdb_computes(draws: list[tuple]) -> None:
    """A few draws in the default run; the search below tries 150."""
    assert fold_mismatches(duckdb.connect(), draws) == []


@pytest.mark.search
@settings(max_examples=150, deadline=None)
@given(INTERVAL_DRAWS)
def test_intervals_fold_as_duckdb_computes_searched(draws: list[tuple]) -> None:
    assert fold_mismatches(duckdb.connect(), draws) == []


def test_the_duckdb_check_catches_a_fold_off_by_a_day(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(intervals.UNITS, "month", relativedelta(months=1, days=1))
    draws = [(date(1994, 1, 31), ("month", 1, True)), (date(2000, 2, 29), ("month", -3, False))]
    assert len(fold_mismatches(duckdb.connect(), draws)) == 2


def test_whole_days_keep_a_date_and_hours_make_a_timestamp() -> None:
    assert folded_text(date(1998, 12, 1), "day", 68, False) == "CAST('1998-09-24' AS DATE)"
    assert folded_text(date(1998, 12, 1), "hour", 1, True) == (
        "CAST('1998-12-01 01:00:00' AS TIMESTAMP)"
    )


def test_a_fold_out_of_the_calendar_is_left_as_written() -> None:
    sql = "SELECT x FROM t WHERE x < DATE '9999-12-31' + INTERVAL 1 DAY"
    tree = fold_intervals(sqlglot.parse_one(sql, dialect="duckdb"))
    assert tree.find(exp.Interval) is not None


# -- OR factoring against DuckDB, over every three-valued assignment ---------------------

ATOMS = ["a", "b", "c", "d"]
# Every assignment of TRUE, FALSE and NULL to the atoms: a table of 81 rows.
TRUTH_TABLE = list(itertools.product([True, False, None], repeat=len(ATOMS)))

conjunct = st.sampled_from(ATOMS + [f"NOT {a}" for a in ATOMS])
branch = st.lists(conjunct, min_size=1, max_size=3)


def ors(common: list[str], rests: list[list[str]]) -> str:
    """``(common AND rest1) OR (common AND rest2) …``, each branch's conjuncts shuffled
    by the draw's order."""
    return " OR ".join("(" + " AND ".join(common + r) + ")" for r in rests)


def or_mismatches(
    con: duckdb.DuckDBPyConnection, conditions: list[str], rule: Callable[[exp.Select], exp.Select]
) -> list[str]:
    """The conditions whose rewrite selects other rows than the condition written."""
    wrong = []
    for condition in conditions:
        sql = f"SELECT COUNT(*), SUM(i) FROM truth WHERE {condition}"
        rewritten = rule(sqlglot.parse_one(sql, dialect="duckdb")).sql(dialect="duckdb")
        if con.execute(sql).fetchall() != con.execute(rewritten).fetchall():
            wrong.append(condition)
    return wrong


@pytest.fixture(scope="module")
def truth() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute(f"CREATE TABLE truth (i INT, {', '.join(f'{a} BOOLEAN' for a in ATOMS)})")
    con.executemany(
        f"INSERT INTO truth VALUES (?, {', '.join('?' for _ in ATOMS)})",
        [(i, *row) for i, row in enumerate(TRUTH_TABLE)],
    )
    return con


@settings(max_examples=200, deadline=None)
@given(
    st.lists(conjunct, min_size=1, max_size=2),
    st.lists(st.lists(conjunct, max_size=2), min_size=2, max_size=4),
)
def test_factoring_selects_the_same_rows(
    truth: duckdb.DuckDBPyConnection, common: list[str], rests: list[list[str]]
) -> None:
    assert or_mismatches(truth, [ors(common, rests)], factor_or) == []


def test_the_duckdb_check_catches_a_factoring_that_drops_a_branch(
    truth: duckdb.DuckDBPyConnection, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = or_factoring._branches
    monkeypatch.setattr(or_factoring, "_branches", lambda node: original(node)[:-1] or [node])
    conditions = [ors(["a"], [["b"], ["c"]]), ors(["a", "d"], [["b"], ["NOT b"], ["c"]])]
    assert or_mismatches(truth, conditions, factor_or) == conditions


def test_the_duckdb_check_catches_absorption_where_none_holds(
    truth: duckdb.DuckDBPyConnection,
) -> None:
    def absorbing(tree: exp.Select) -> exp.Select:  # keeps the common part alone, always
        for node in list(tree.find_all(exp.Or)):
            if not isinstance(node.parent, exp.Or):
                first = or_factoring._conjuncts(or_factoring._branches(node)[0])
                node.replace(exp.and_(*(c.copy() for c in first[:1])))
        return tree

    condition = ors(["a"], [["b"], ["c"]])
    assert or_mismatches(truth, [condition], absorbing) == [condition]


# -- column lists against DuckDB -------------------------------------------------------

LISTED = [
    "SELECT p, COUNT(*) FROM (SELECT k, v FROM r) AS x (p) GROUP BY p ORDER BY p",
    "WITH w (p, q) AS (SELECT k, v * 2 AS z FROM r) SELECT p, SUM(q) FROM w GROUP BY p ORDER BY p",
    "SELECT q FROM (SELECT k AS kk, v FROM r) AS x (p, q) ORDER BY q",
]


def listed_mismatches(rule: Callable[[exp.Select], exp.Select]) -> list[str]:
    con = duckdb.connect()
    con.execute("CREATE TABLE r AS SELECT i % 3 AS k, i AS v FROM range(10) t(i)")
    wrong = []
    for sql in LISTED:
        rewritten = rule(sqlglot.parse_one(sql, dialect="duckdb")).sql(dialect="duckdb")
        if con.execute(sql).fetchall() != con.execute(rewritten).fetchall():
            wrong.append(sql)
    return wrong


def test_column_lists_give_the_same_rows() -> None:
    assert listed_mismatches(inline_column_lists) == []


def test_the_duckdb_check_catches_names_moved_to_the_wrong_columns(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def reversed_names(tree: exp.Select) -> exp.Select:
        for node in tree.find_all(exp.Subquery, exp.CTE):
            alias = node.args.get("alias")
            if alias is not None and alias.columns:
                alias.set("columns", list(reversed(alias.columns)))
        return column_lists.inline_column_lists(tree)

    assert listed_mismatches(reversed_names) != []


DECIMALS = st.lists(
    st.decimals(min_value=-1000, max_value=1000, places=3, allow_nan=False),
    min_size=2,
    max_size=4,
)
DECIMAL_OPS = st.lists(st.sampled_from(["+", "-", "*"]), min_size=3, max_size=3)


def check_decimals_fold(numbers: list, ops: list) -> None:
    """The folded literal equals DuckDB's exact DECIMAL arithmetic on the same text."""
    text = f"{numbers[0]:f}"
    for op, n in zip(ops, numbers[1:], strict=False):
        text = f"({text}) {op} ({n:f})"
    tree = fold_decimals(sqlglot.parse_one(f"SELECT {text} AS v", dialect="duckdb"))
    folded = tree.expressions[0].this
    con = duckdb.connect()
    try:
        (want,) = con.execute(f"SELECT CAST({text} AS DECIMAL(38, 9))").fetchone()
    except duckdb.OutOfRangeException:
        return  # past DuckDB's DECIMAL(18) itself: no exact answer to compare with
    if isinstance(folded, exp.Literal | exp.Paren):
        (got,) = con.execute(f"SELECT CAST({folded.sql()} AS DECIMAL(38, 9))").fetchone()
        assert got == want, (text, folded.sql())


@settings(max_examples=20, deadline=None)
@given(DECIMALS, DECIMAL_OPS)
def test_decimals_fold_as_duckdb_computes(numbers: list, ops: list) -> None:
    """A few draws in the default run; the search below tries 200."""
    check_decimals_fold(numbers, ops)


@pytest.mark.search
@settings(max_examples=200, deadline=None)
@given(DECIMALS, DECIMAL_OPS)
def test_decimals_fold_as_duckdb_computes_searched(numbers: list, ops: list) -> None:
    check_decimals_fold(numbers, ops)


def test_the_duckdb_check_catches_a_fold_in_doubles() -> None:
    """The broken version: folding in binary floats, as the gate's doubles would."""
    (exact,) = duckdb.connect().execute("SELECT 0.06 + 0.01 = 0.07").fetchone()
    assert exact and (0.06 + 0.01) != 0.07
    folded = fold_decimals(sqlglot.parse_one("SELECT 0.06 + 0.01 AS v", dialect="duckdb"))
    assert folded.expressions[0].this.sql() == "0.07"
