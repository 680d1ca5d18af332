"""``not_null``: a column the owner declares never NULL. An average of it is the sum over
the query's ``COUNT(*)``, measured once, instead of a ``COUNT(column)`` of its own beside
it (which spent ε on the same number twice); the gate refuses to start over data that
breaks the declaration, naming the table and the column and no value."""

from __future__ import annotations

import pytest

from dpmagic.gate.policy import PolicyError
from tests.gate_helpers import dataset, make_plan, running_engine

COLUMNS = {
    "pid": {"type": "int"},
    "x": {"type": "int", "lower": 0, "upper": 100, "not_null": True},
    "y": {"type": "int", "lower": 0, "upper": 100},
}
SQL = "SELECT COUNT(*) AS n, AVG({col}) AS a FROM t"


def _counts(sql: str, ds=None) -> list[str]:
    plan = make_plan(sql, ds or dataset(COLUMNS))
    return [m.label for m in plan.measurements if m.kind == "count"]


def test_an_average_of_a_never_null_column_shares_the_querys_count() -> None:
    assert _counts(SQL.format(col="x")) == ["COUNT(*)"]
    assert sorted(_counts(SQL.format(col="y"))) == ["COUNT(*)", "COUNT(y)"]


def test_the_shared_count_costs_less_noise_at_the_same_epsilon() -> None:
    shared = make_plan(SQL.format(col="x"), dataset(COLUMNS))
    apart = make_plan(SQL.format(col="y"), dataset(COLUMNS))
    assert shared.cost == apart.cost
    scale = {p.label: p.noise.scale for p in shared.measurements}
    scale_apart = {p.label: p.noise.scale for p in apart.measurements}
    assert scale["COUNT(*)"] < scale_apart["COUNT(*)"]


def test_a_left_joined_column_may_be_null_whatever_it_declares() -> None:
    more = {"u": {"columns": {"pid": {"type": "int"}, "z": COLUMNS["x"]}}}
    ds = dataset(COLUMNS, more_tables=more, table_options={})
    sql = "SELECT COUNT(*) AS n, AVG(u.z) AS a FROM t LEFT JOIN u ON u.pid = t.pid"
    assert sorted(_counts(sql, ds)) == ["COUNT(*)", "COUNT(z)"]


POLICY = """
[gate]
state_dir = "state"

[datasets.d]
sources = { t = "t.csv" }
privacy_unit = "pid"
user_budget = { epsilon = 10.0 }

[datasets.d.tables.t.columns]
pid = { type = "int" }
x = { type = "int", lower = 0, upper = 100, not_null = true }
"""


def test_data_that_breaks_the_declaration_stops_the_gate_without_a_value(tmp_path) -> None:
    rows = [(1, 41), (2, None), (3, 7)]
    with (
        pytest.raises(PolicyError) as refused,
        running_engine(tmp_path, POLICY, {"t": ("pid,x", rows)}),
    ):
        pass
    message = str(refused.value)
    assert "t.x is declared not_null" in message
    assert "41" not in message and "7" not in message
    with running_engine(tmp_path / "ok", POLICY, {"t": ("pid,x", [(1, 41), (2, 3)])}) as e:
        assert e.query("ann", {"sql": "SELECT AVG(x) AS a FROM t", "epsilon": 1.0})["rows"]
