"""What resolve says to a newcomer: a misspelt column or table gets the closest
declared names (from the public schema, never the data), and ``x IN (SELECT 1)``,
a subquery of one constant, is the list it means."""

from __future__ import annotations

import textwrap

import pytest

from dpmagic.gate.dp.accounting import PureAccountant
from dpmagic.gate.failures import Refused
from dpmagic.gate.sql.bound import bound
from dpmagic.gate.sql.check import check
from dpmagic.gate.sql.parse import DIALECT, parse
from dpmagic.gate.sql.plan import plan
from dpmagic.gate.sql.resolve import resolve
from tests.gate_helpers import dataset, running_engine

COLUMNS = {
    "pid": {"type": "int"},
    "age": {"type": "int", "lower": 0, "upper": 100},
    "age_band": {"type": "str", "public_values": ["0-17", "18-64", "65+"]},
    "income": {"type": "float", "lower": 0, "upper": 500000},
    "sex": {"type": "int", "public_values": [0, 1]},
}
DS = dataset(
    COLUMNS, table="visits", more_tables={"patients": {"columns": {"pid": {"type": "int"}}}}
)


def refusal(sql: str) -> str:
    with pytest.raises(Refused) as info:
        plan(bound(check(resolve(parse(sql), DS))), 1.0, 0.0, PureAccountant())
    return info.value.message


@pytest.mark.parametrize(
    ("sql", "suggestion"),
    [
        ("SELECT AVG(agee) FROM visits", "did you mean 'age'?"),
        (
            "SELECT age_bnd, COUNT(*) FROM visits GROUP BY age_bnd",
            "did you mean 'age_band' or 'age'?",
        ),
        ("SELECT COUNT(*) FROM visits WHERE incme > 10", "did you mean 'income'?"),
        ("SELECT v.sx, COUNT(*) FROM visits AS v GROUP BY v.sx", "did you mean 'sex'?"),
        ("SELECT COUNT(*) FROM visit", "did you mean 'visits'?"),
    ],
)
def test_a_misspelt_name_gets_the_closest_declared_ones(sql, suggestion):
    message = refusal(sql)
    assert suggestion in message
    assert "declared: " in message  # the whole list stays


def test_several_close_names_closest_first():
    from dpmagic.gate.sql.resolve import _did_you_mean

    assert _did_you_mean("age", ["ages", "agee", "pid"]) == "did you mean 'ages' or 'agee'? "
    assert _did_you_mean("age", ["pid"]) == ""


def test_no_suggestion_when_nothing_is_close():
    message = refusal("SELECT SUM(salary) FROM visits")
    assert "unknown column 'salary'" in message and "did you mean" not in message


def test_a_query_alias_is_suggested_too():
    """A derived table's column names are the query's own text: they may be suggested."""
    sql = "SELECT COUNT(*) FROM (SELECT age AS years FROM visits) AS d WHERE d.yeas > 3"
    assert "did you mean 'years'?" in refusal(sql)


def test_in_a_constant_subquery_is_the_list_it_means():
    listed = resolve(parse("SELECT COUNT(*) FROM visits WHERE sex IN (1)"), DS)
    sub = resolve(parse("SELECT COUNT(*) FROM visits WHERE sex IN (SELECT 1)"), DS)
    assert sub.tree.sql(dialect=DIALECT) == listed.tree.sql(dialect=DIALECT)
    assert not sub.semijoins
    negated = resolve(parse("SELECT COUNT(*) FROM visits WHERE sex NOT IN (SELECT 1 AS x)"), DS)
    assert "NOT" in negated.tree.sql(dialect=DIALECT).upper()


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT COUNT(*) FROM visits WHERE sex IN (SELECT 1 WHERE TRUE)",
        "SELECT COUNT(*) FROM visits WHERE sex IN (SELECT age)",
        "SELECT COUNT(*) FROM visits WHERE sex IN (SELECT 1, 2)",
    ],
)
def test_any_other_subquery_without_from_says_how_to_write_a_list(sql):
    message = refusal(sql)
    assert message == (
        "IN (SELECT …) without FROM reads no table: write the values as a list, x IN (1, 2)"
    )
    assert "no FROM clause" not in message


POLICY = """
[gate]
state_dir = "state"

[datasets.d]
sources = { t = "t.csv" }
privacy_unit = "pid"
user_budget = { epsilon = 10.0 }

[datasets.d.tables.t.columns]
pid = { type = "int" }
sex = { type = "int", public_values = [0, 1] }
"""


def test_in_a_constant_subquery_is_answered_by_the_gate(tmp_path):
    rows = [(i, i % 2) for i in range(200)]
    with running_engine(tmp_path, textwrap.dedent(POLICY), {"t": ("pid,sex", rows)}) as engine:
        body = {"sql": "SELECT COUNT(*) AS n FROM t WHERE sex IN (SELECT 1)", "notebook": "nb"}
        reply = engine.query("alice", body)
    assert reply["columns"] == ["n"] and len(reply["rows"]) == 1


@pytest.mark.parametrize("union", ["UNION", "UNION ALL"])
def test_a_cte_of_a_union_is_refused_as_a_union_in_from_is(union):
    """Not "DISTINCT inside a subquery" nor a missing FROM, as it once was: the refusal
    of a UNION in FROM, whichever way the union is written."""
    cte = f"WITH u AS (SELECT pid, age FROM visits {union} SELECT pid, age FROM visits) "
    assert refusal(cte + "SELECT COUNT(*) AS n FROM u") == refusal(
        f"SELECT COUNT(*) AS n FROM (SELECT pid, age FROM visits {union} "
        "SELECT pid, age FROM visits) AS u"
    )
    assert refusal(cte + "SELECT COUNT(*) AS n FROM u").startswith("UNION is not supported")
