"""The rewrite pass (``sql/rewrite.py``) builds a tree whose bounding is the one the
plan decided, and leaves no semi-join stand-in behind; the golden fixtures
(``tests/golden/``) pin the rendered SQL itself."""

from __future__ import annotations

import pytest
from sqlglot import exp

from dpmagic.gate.engines.ranking import RANK, load_cap
from dpmagic.gate.sql.ranks import Ranked, Window
from dpmagic.gate.sql.resolve import SEMI
from dpmagic.gate.sql.rewrite import rewrite
from tests.gate_helpers import dataset, make_plan

COLUMNS = {
    "pid": {"type": "int"},
    "age": {"type": "int", "lower": 0, "upper": 100},
    "g": {"type": "int", "public_values": [1, 2, 3]},
}
MORE = {"u": {"columns": {"pid": {"type": "int"}, "x": {"type": "int", "lower": 0, "upper": 9}}}}
QUERIES = [
    "SELECT COUNT(*) FROM t",
    "SELECT g, SUM(age) FROM t GROUP BY g",
    "SELECT COUNT(DISTINCT pid) FROM t",
    "SELECT g, COUNT(*) FROM t JOIN u ON u.pid = t.pid GROUP BY g",
    "SELECT COUNT(*) FROM t WHERE pid IN (SELECT pid FROM u WHERE x > 3)",
    "SELECT COUNT(*) FROM t WHERE EXISTS (SELECT 1 FROM u WHERE u.pid = t.pid)",
]


@pytest.mark.parametrize("sql", QUERIES)
def test_the_tree_bounds_units_as_the_plan_decided(sql):
    plan = make_plan(sql, dataset(COLUMNS, more_tables=MORE))
    tree = rewrite(plan, seed=7).tree
    windowed = any(isinstance(n, exp.RowNumber) for n in tree.walk())
    assert windowed is isinstance(plan.bounding, Window)
    # Every private scan filters on its rank, the first by the join's cap: the plan's K
    # when the ranks bound the query, else the load cap, which only bounds the work one
    # unit causes; later scans by what the earlier ones leave room for. A semi-join's
    # first private scan reads the load cap of its unit's rows. A one-table query the
    # window bounds reads its table twice (``_rank_split``), the second time only its
    # first ranks, those the window keeps whatever the filters drop.
    tests = [
        n for n in tree.find_all(exp.LTE) if isinstance(n.this, exp.Column) and n.this.name == RANK
    ]
    resolved = plan.checked.resolved
    split = any(cte.alias == "heavy_rows" for cte in tree.find_all(exp.CTE))
    assert split is (windowed and len(resolved.scans) == 1)
    private = [s for s in resolved.scans if not s.table.public]
    private += [s for j in resolved.semijoins for s in j.scans if not s.table.public]
    assert len(tests) == len(private) * (2 if split else 1)
    firsts = [t.expression.to_py() for t in tests if isinstance(t.expression, exp.Literal)]
    cap = plan.bounding.rows if isinstance(plan.bounding, Ranked) else load_cap(plan.dataset)
    allowed = {cap, load_cap(plan.dataset)}
    if split:
        c = plan.contribution
        allowed.add(min(c.rows, c.groups) if plan.keys else c.rows)
    assert cap in firsts and set(firsts) <= allowed


@pytest.mark.parametrize("sql", [q for q in QUERIES if "SELECT 1" in q or "IN (" in q])
def test_no_semi_join_stand_in_is_left(sql):
    plan = make_plan(sql, dataset(COLUMNS, more_tables=MORE))
    tree = rewrite(plan, seed=7).tree
    assert not any(isinstance(n, exp.Column) and n.table == SEMI for n in tree.walk())
    assert any(isinstance(n, exp.In) and n.args.get("query") is not None for n in tree.walk())


def test_the_rendered_sql_is_the_tree_rendered():
    plan = make_plan("SELECT g, COUNT(*) FROM t GROUP BY g", dataset(COLUMNS))
    out = rewrite(plan, seed=7)
    assert out.sql == out.tree.sql(dialect="duckdb")


def _scanned(select: exp.Select) -> str | None:
    """The table a SELECT reads directly (a scan of the generated SQL), if any."""
    source = select.args.get("from_") or select.args.get("from")
    return source.this.name if source is not None and isinstance(source.this, exp.Table) else None
