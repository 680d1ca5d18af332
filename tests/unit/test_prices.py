"""``sql/prices.py`` and the derived text sizes: every row operator priced at its worst,
every text a row can make bounded by construction, and the per-row cap.

- Every node class the checker admits on rows has a price; an operator without one
  is refused, free, naming it.
- Searched, not hand-picked: Hypothesis draws text expressions from the row grammar
  (concatenations, choices, case mappings, cuts, nested), DuckDB evaluates each on
  the texts that make it longest (columns at their ``max_length`` of 1- to 4-byte
  characters and ligatures that grow when folded), and the result is never longer
  than ``bound.text_length`` says. A bound that takes a ``CASE``'s first branch
  instead of its longest is caught by the same search.
- The attack's shape (a long derived text matched against a backtracking pattern on
  one unit's rows) is refused before the debit, for its text and for its row's price;
  with ``LIKE`` priced as it was (the text's length times its wildcards / 64), the
  same query would have been accepted.
"""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlglot import exp

from dpmagic.gate.dp.accounting import PureAccountant
from dpmagic.gate.failures import Refused
from dpmagic.gate.policy import PolicyError, parse_policy
from dpmagic.gate.policy.values import row_work_limit
from dpmagic.gate.sql import bound, prices
from dpmagic.gate.sql.check import DATE_PARTS, ROW_ONLY_NODES, SCALAR_NODES
from dpmagic.gate.sql.pipeline import Asked, analyse
from dpmagic.gate.sql.work import steps_of

LENGTHS = {"a": 12, "b": 30, "c": 5}
FILLS = ("a", "é", "ﬃ", "😀", "ß", " ")


def _raw(quantum_ms: float = 250, **dataset: object) -> dict:
    columns = {name: {"type": "str", "max_length": n} for name, n in LENGTHS.items()}
    columns["pid"] = {"type": "int"}
    columns["age"] = {"type": "int", "lower": 0, "upper": 100}
    return {
        "gate": {"response_quantum_ms": quantum_ms},
        "datasets": {
            "d": {
                "sources": {"t": "t.csv"},
                "privacy_unit": "pid",
                "user_budget": {"epsilon": 100.0},
                "tables": {"t": {"columns": columns}},
                **dataset,
            }
        },
    }


def _dataset(quantum_ms: float = 250, **dataset: object):
    return parse_policy(_raw(quantum_ms, **dataset), Path("policy.toml")).dataset("d")


DATASET = _dataset()
# No cap on a row's price or on texts: the search reaches every size the grammar makes.
ROOMY = _dataset(1e9, max_text_length=10**6, max_unit_work=2**62)


def _plan(sql: str, dataset=DATASET):
    return analyse(Asked(sql, {}, 1.0, 0.0), dataset, PureAccountant())


def test_every_row_operator_has_a_price() -> None:
    allowed = (*SCALAR_NODES, *ROW_ONLY_NODES, *DATE_PARTS)
    unpriced = [c.__name__ for c in allowed if not any(k in prices.PRICES for k in c.__mro__)]
    assert not unpriced


def test_an_operator_without_a_price_is_refused_free(monkeypatch) -> None:
    sql = "SELECT COUNT(*) FROM t WHERE a LIKE '%x%'"
    assert _plan(sql).work.row > 0
    monkeypatch.delitem(prices.PRICES, exp.Like)
    with pytest.raises(Refused, match="no bound on the work of LIKE"):
        _plan(sql)


# -- derived text sizes, searched -------------------------------------------------------


def _texts(depth: int) -> st.SearchStrategy[str]:
    """Text expressions of the row grammar over columns a, b, c."""
    leaf = st.sampled_from(["a", "b", "c", "'xy'", "'ﬃﬃ'", "(age || '')", "(NULL || '')"])
    if depth == 0:
        return leaf
    sub = _texts(depth - 1)
    # A text function takes text (``check``): any operand is made one by concatenation.
    arg = sub.map(lambda s: f"({s} || '')")
    return st.one_of(
        leaf,
        st.tuples(sub, sub).map(lambda p: f"({p[0]} || {p[1]})"),
        st.tuples(sub, sub, sub).map(lambda p: f"CONCAT({p[0]}, {p[1]}, {p[2]})"),
        st.tuples(sub, sub).map(lambda p: f"CASE WHEN age > 50 THEN {p[0]} ELSE {p[1]} END"),
        st.tuples(sub, sub).map(lambda p: f"COALESCE({p[0]}, {p[1]})"),
        st.tuples(sub, sub).map(lambda p: f"NULLIF({p[0]}, {p[1]})"),
        arg.map(lambda s: f"UPPER({s})"),
        arg.map(lambda s: f"LOWER({s})"),
        arg.map(lambda s: f"TRIM({s})"),
        st.tuples(arg, st.integers(0, 40)).map(lambda p: f"LEFT({p[0]}, {p[1]})"),
        st.tuples(arg, st.integers(0, 40)).map(lambda p: f"RIGHT({p[0]}, {p[1]})"),
        st.tuples(arg, st.integers(1, 9), st.integers(0, 40)).map(
            lambda p: f"SUBSTRING({p[0]}, {p[1]}, {p[2]})"
        ),
    )


@pytest.fixture(scope="module")
def worst_rows() -> duckdb.DuckDBPyConnection:
    """Rows whose texts are at their ``max_length``, of every fill, both ages."""
    con = duckdb.connect()
    con.execute("CREATE TABLE t (a VARCHAR, b VARCHAR, c VARCHAR, pid INT, age INT)")
    rows = [
        (fa * LENGTHS["a"], fb * LENGTHS["b"], fc * LENGTHS["c"], i, age)
        for i, (fa, fb, fc) in enumerate(
            zip(FILLS, FILLS[1:] + FILLS[:1], FILLS[2:] + FILLS[:2], strict=True)
        )
        for age in (10, 90)
    ]
    con.executemany("INSERT INTO t VALUES (?, ?, ?, ?, ?)", rows)
    return con


def _longest(con: duckdb.DuckDBPyConnection, text: str) -> int:
    found = con.execute(f"SELECT MAX(LENGTH(CAST({text} AS VARCHAR))) FROM t").fetchone()[0]
    return found or 0


@pytest.mark.search
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow,
          HealthCheck.function_scoped_fixture])  # fmt: skip
@given(text=_texts(3))
def test_no_row_makes_a_text_longer_than_its_bound(worst_rows, text: str) -> None:
    plan = _plan(f"SELECT COUNT(*) FROM t WHERE LENGTH({text} || '') >= 0", ROOMY)
    resolved = plan.checked.resolved
    tree = next(resolved.tree.args["where"].this.find_all(exp.Length)).this
    assert _longest(worst_rows, text) <= bound.text_length(tree, resolved)


def test_a_bound_taking_the_first_branch_is_caught(worst_rows, monkeypatch) -> None:
    """The broken version: a choice's length read from its first branch alone."""
    monkeypatch.setattr(bound, "_branches", lambda node: [node.args["ifs"][0].args["true"]]
                        if isinstance(node, exp.Case) else None)  # fmt: skip
    text = "CASE WHEN age > 50 THEN c ELSE b END"
    plan = _plan(f"SELECT COUNT(*) FROM t WHERE LENGTH({text} || '') >= 0")
    resolved = plan.checked.resolved
    tree = next(resolved.tree.args["where"].this.find_all(exp.Case))
    assert _longest(worst_rows, text) > bound.text_length(tree, resolved)


def test_a_choice_concatenated_is_answered_not_an_overflow() -> None:
    """``CASE … END || 'x'`` was refused as "could not analyse (OverflowError)"."""
    for sql in (
        "SELECT COUNT(*) FROM t WHERE CASE WHEN age > 3 THEN a END || 'x' = 'ax'",
        "SELECT COUNT(*) FROM t WHERE COALESCE(a, b) || 'x' = 'ax'",
    ):
        assert _plan(sql).work.row > 0


def test_a_text_longer_than_the_cap_is_refused_free() -> None:
    small = _dataset(max_text_length=60)
    ok = "SELECT COUNT(*) FROM t WHERE a || b || 'x' = 'y'"  # 43 characters
    assert _plan(ok, small).work.row > 0
    with pytest.raises(Refused, match="up to 73 characters, longer than the dataset's "
                       "max_text_length of 60"):  # fmt: skip
        _plan("SELECT COUNT(*) FROM t WHERE (a || b) || (b || 'x') = 'y'", small)


def test_the_text_cap_is_never_below_a_column() -> None:
    with pytest.raises(PolicyError, match="max_text_length"):
        _dataset(max_text_length=20)  # b has 30 characters


# -- the per-row cap ----------------------------------------------------------------------


def test_the_row_cap_follows_the_quantum() -> None:
    assert _dataset(250).max_row_work == row_work_limit(250) == 40_690
    assert _dataset(25).max_row_work == row_work_limit(25) == 4_069
    assert _dataset(0).max_row_work == row_work_limit(250)  # padding off: the default's
    assert _dataset(250, max_row_work=100).max_row_work == 100
    with pytest.raises(PolicyError, match="max_row_work"):
        _dataset(25, max_row_work=5_000)


def _attack(pattern_as: int = 2_000) -> str:
    """The issue's shape, scaled to these columns: a derived text matched, on one
    unit's rows only, against a pattern that retries at every position."""
    pattern = "%" + "a" * pattern_as + "_b%"
    return (
        f"SELECT COUNT(*) FROM t WHERE CASE WHEN pid = 7 THEN a || b || a || b END LIKE '{pattern}'"
    )


def test_a_backtracking_like_is_refused_for_its_row(monkeypatch) -> None:
    big = _dataset(max_text_length=200_000)
    with pytest.raises(Refused, match="one row of this query could cost up to"):
        _plan(_attack(), big)

    # As it was priced before (text × (1 + wildcards) / 64), the same query passed.
    def linear(node: exp.Expression, r) -> float:
        wildcards = node.expression.this.count("%") + node.expression.this.count("_")
        return prices._chars(node.this, r) * (1 + wildcards) / 64

    monkeypatch.setitem(prices.PRICES, exp.Like, linear)
    assert _plan(_attack(), big).work.row < big.max_row_work


def test_folding_prices_the_grown_text() -> None:
    """``UPPER`` may make three characters of one: what reads it pays for three."""
    plan = _plan("SELECT COUNT(*) FROM t WHERE UPPER(b) LIKE '%x%'")
    resolved = plan.checked.resolved
    like = next(resolved.tree.args["where"].this.find_all(exp.Like))
    upper = like.this
    assert bound.text_length(upper, resolved) == 3 * LENGTHS["b"]
    expected_like = 1 + prices.MATCH_PER_PAIR * 3 * LENGTHS["b"] * 4
    expected_upper = 1 + prices.FOLD_PER_CHAR * LENGTHS["b"]
    assert steps_of(like, resolved) == expected_like + expected_upper + 1 + 1
