"""The fuzzer's grammar keeps up with the checker's allow-list.

``sql_grammar`` refuses to import when an allowed node type has no builder;
this test also draws queries from it and checks, on the SQL the gate would
parse, that every allowed node type, cast target, date part, EXTRACT unit,
text function and aggregate is actually generated. A node type added to
``check.py`` without a way to generate it fails here, so the fuzzer cannot
silently fall behind the checker.
"""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, given, settings
from sqlglot import exp

from dpmagic.gate.sql import check
from dpmagic.gate.sql.parse import DIALECT, parse
from tests.sql_grammar import AGGREGATE_SQL, BUILDERS, EXTREME_DATES, Schema, swarm

SCHEMAS = {
    "t": Schema(
        {
            "number": ("t.n", "t.unit"),
            "text": ("t.s",),
            "date": ("t.d",),
            "bool": ("t.b",),
        },
        ("t.unit = 1",),
    )
}
DRAWS = 1500


def _generated() -> tuple[set, set, set, list[str]]:
    """Node types, cast targets and EXTRACT units in ``DRAWS`` queries, as parsed back."""
    nodes: set[type] = set()
    casts: set[exp.DataType.Type] = set()
    units: set[str] = set()
    texts: list[str] = []

    @settings(
        max_examples=DRAWS,
        derandomize=True,
        database=None,
        deadline=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    @given(sql=swarm(SCHEMAS) | swarm(SCHEMAS, placement="aggregated"))
    def collect(sql: str) -> None:
        texts.append(sql)
        tree = parse(sql, {}).tree
        for node in tree.walk():
            nodes.add(type(node))
            if isinstance(node, exp.TryCast):
                casts.add(node.to.this)
            if isinstance(node, exp.Extract):
                units.add(node.this.name.upper())

    collect()
    return nodes, casts, units, texts


GENERATED = _generated()


def test_every_allowed_node_type_is_generated():
    nodes = GENERATED[0]
    allowed = set(check.SCALAR_NODES + check.ROW_ONLY_NODES)
    assert allowed <= set(BUILDERS)
    missing = sorted(n.__name__ for n in allowed - nodes)
    assert not missing, f"the grammar never generates {missing}"


def test_every_text_function_date_part_and_aggregate_is_generated():
    nodes = GENERATED[0]
    for group in (check.TEXT_FUNCTIONS, check.CONCATENATION, tuple(check.DATE_PARTS)):
        missing = sorted(n.__name__ for n in group if n not in nodes)
        assert not missing, f"the grammar never generates {missing}"
    assert set(check.AGGREGATES) <= set(AGGREGATE_SQL)
    for node, forms in AGGREGATE_SQL.items():
        for form in forms:  # each written form parses to the node it stands for
            tree = parse(f"SELECT {form.replace('{q}', '0.5')} FROM t", {}).tree
            assert any(isinstance(n, node) for n in tree.walk()), form
    missing = sorted(n.__name__ for n in check.AGGREGATES if n not in nodes)
    assert not missing, f"the grammar never generates {missing}"


def test_every_cast_target_and_extract_unit_is_generated():
    _, casts, units, _ = GENERATED
    assert check.CAST_TYPES <= casts, sorted(t.value for t in check.CAST_TYPES - casts)
    # sqlglot writes some units in a canonical spelling (DOW as DAYOFWEEK): what must be
    # covered is every part the checker knows.
    parts = {check.EXTRACT_UNITS[u] for u in units if u in check.EXTRACT_UNITS}
    assert parts == set(check.EXTRACT_UNITS.values())


def test_extreme_literals_reach_the_sql():
    texts = "\n".join(GENERATED[3])
    for literal in ("127", "128", "32768", "2147483648", "9223372036854775808"):
        assert literal in texts, literal
    assert any(d in texts for d in EXTREME_DATES)
    assert "'nan'" in texts.lower() or "'inf'" in texts.lower()
    assert "NULL" in texts and "''" in texts


def test_queries_render_as_the_gate_parses_them():
    for sql in GENERATED[3][:200]:
        assert parse(sql, {}).tree.sql(dialect=DIALECT)
