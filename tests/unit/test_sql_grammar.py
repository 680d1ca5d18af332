"""The fuzzer's grammar keeps up with the checker's allow-list.

``sql_grammar`` refuses to import when an allowed node type has no builder.
These tests go further: for every node type, cast target, date part, EXTRACT
unit, text function and aggregate the checker allows, Hypothesis must find a
generated query that contains it *as the gate parses the query back*, so a
builder that never fires, or writes SQL that parses to something else, fails
here. A node type added to ``check.py`` without a way to generate it fails
too, so the fuzzer cannot silently fall behind the checker.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, Phase, find, settings
from sqlglot import exp

from dpmagic.gate.sql import check
from dpmagic.gate.sql.aggregates.registry import CATALOGUE
from dpmagic.gate.sql.parse import DIALECT, parse
from tests.sql_grammar import (
    AGGREGATE_SQL,
    BUILDERS,
    LEAVES,
    Grammar,
    Schema,
    date_literals,
    number_literals,
    positions,
    text_literals,
)

SCHEMA = Schema(
    {"number": ("t.n", "t.unit"), "text": ("t.s",), "date": ("t.d",), "bool": ("t.b",)},
    ("t.unit = 1",),
)
SEARCH = settings(
    max_examples=2000,
    derandomize=True,
    database=None,
    deadline=None,
    phases=[Phase.generate],
    suppress_health_check=list(HealthCheck),
)


def _finds(enabled: set[type], wanted: Callable[[exp.Expression], bool], how: str = "row_query"):
    """A query from the grammar with only ``enabled`` (and leaves) switched on, whose
    parsed tree has a node for which ``wanted`` holds; fails if none is generated."""
    grammar = Grammar(SCHEMA, enabled=frozenset(enabled))
    strategy = getattr(grammar, how)("t")
    return find(
        strategy, lambda sql: any(wanted(n) for n in parse(sql, {}).tree.walk()), settings=SEARCH
    )


ROW_NODES = [n for n in check.SCALAR_NODES + check.ROW_ONLY_NODES if n not in LEAVES]


def test_every_allowed_node_type_has_a_builder():
    assert set(check.SCALAR_NODES + check.ROW_ONLY_NODES) <= set(BUILDERS)
    assert set(CATALOGUE) <= set(AGGREGATE_SQL)


# The searches for each node type, date part and aggregate (about 15 s in all) run with
# the searches (``-m search``); the builders' existence, the cast targets and the
# extreme literals stay in the default run.
@pytest.mark.search
@pytest.mark.parametrize("node", ROW_NODES + list(LEAVES), ids=lambda n: n.__name__)
def test_every_allowed_node_type_is_generated(node):
    _finds({node}, lambda n: isinstance(n, node))


@pytest.mark.parametrize("target", sorted(check.CAST_TYPES, key=lambda t: t.value))
def test_every_cast_target_is_generated(target):
    _finds({exp.TryCast}, lambda n: isinstance(n, exp.TryCast) and n.to.this == target)


@pytest.mark.search
@pytest.mark.parametrize("part", sorted(set(check.EXTRACT_UNITS.values())))
def test_every_extract_part_is_generated(part):
    # sqlglot writes some units in a canonical spelling (DOW as DAYOFWEEK): what must
    # be covered is every part the checker knows.
    _finds({exp.Extract}, lambda n: isinstance(n, exp.Extract) and check.date_part(n) == part)


@pytest.mark.search
@pytest.mark.parametrize("node", list(CATALOGUE), ids=lambda n: getattr(n, "__name__", n))
def test_every_aggregate_is_generated(node):
    if isinstance(node, str):  # a function sqlglot has no node for, by its name
        _finds(set(), lambda n: isinstance(n, exp.AnonymousAggFunc) and n.name == node,
               how="aggregated")  # fmt: skip
    else:
        _finds(set(), lambda n: isinstance(n, node), how="aggregated")


@pytest.mark.parametrize(
    "literal", ["127", "-129", "32768", "2147483648", "4611686018427387904", "1e308", "-1e308"]
)
def test_extreme_numbers_are_generated(literal):
    find(number_literals, lambda n: n.sql(dialect=DIALECT) == literal, settings=SEARCH)


@pytest.mark.parametrize("text", ["", "nan", "inf", "z" * 3000, "9223372036854775808"])
def test_extreme_texts_are_generated(text):
    find(text_literals, lambda n: n.this == text, settings=SEARCH)


@pytest.mark.parametrize("day", ["0001-01-01", "9999-12-31"])
def test_dates_at_the_ends_of_the_calendar_are_generated(day):
    find(date_literals, lambda n: n.this.this == day, settings=SEARCH)


@pytest.mark.parametrize("position", [0, -1, 2**31, 2**62, 2**63 - 1, -(2**63)])
def test_huge_and_negative_positions_are_generated(position):
    find(positions, lambda p: p == position, settings=SEARCH)
