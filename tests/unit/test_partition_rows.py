"""``plan_types.partition_rows``: more rows than any aggregate adds up in one partition,
searched over the join shapes the gate accepts, on a real DuckDB gate.

The bound is ``MAX_ROWS`` (more than any table's rows) for a query of one scan and
``MAX_ROWS × contribution.rows`` for a join: a join repeats a unit's rows (here a
public table holds two rows per state, and a patient has several visits), but
every joined row extends a row of the first private table, and bounding leaves
each unit at most ``ranks.rows`` rows in a partition. Scaled to a table we
can build, ``MAX_ROWS`` stands for the first private table's rows, which its
units cannot outnumber: the rows reaching each partition's aggregate, counted by
the generated SQL with its aggregates replaced by ``COUNT(*)``, must stay within
``partition_rows / MAX_ROWS`` times that. The sums' overflow proofs (the plan's
``SUM_LIMIT``, Spark's BIGINT sums) rest on this bound."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlglot import exp

from dpmagic.gate.dp.accounting import PureAccountant
from dpmagic.gate.engines.interface import MAX_ROWS
from dpmagic.gate.failures import Refused
from dpmagic.gate.policy import PolicyError, parse_policy
from dpmagic.gate.sql import plan_types
from dpmagic.gate.sql.pipeline import Asked, analyse
from dpmagic.gate.sql.rewrite import rewrite
from tests.gate_helpers import running_engine

PATIENTS = 60
POLICY = """
[gate]
state_dir = "state"

[datasets.c]
sources = { patients = "patients.csv", visits = "visits.csv", regions = "regions.csv" }
privacy_unit = "pid"
max_partitions = 2
max_rows_per_partition = 3
user_budget = { epsilon = 1e6 }

[datasets.c.tables.patients.columns]
pid = { type = "int" }
state = { type = "str", public_values = ["CA", "TX", "NY"] }
age = { type = "int", lower = 0, upper = 100 }

[datasets.c.tables.visits]
links = { pid = "patients.pid" }
[datasets.c.tables.visits.columns]
pid = { type = "int" }
kind = { type = "int", public_values = [0, 1, 2] }
days = { type = "int", lower = 0, upper = 30 }

[datasets.c.tables.regions]
public = true
[datasets.c.tables.regions.columns]
state = { type = "str", public_values = ["CA", "TX", "NY"] }
zone = { type = "int", public_values = [1, 2] }
"""
STATES = ("CA", "TX", "NY")


def _tables() -> dict:
    patients = [(i, STATES[i % 3], (i * 37) % 101) for i in range(PATIENTS)]
    # Patient i has i % 6 visits: up to twice the bound of 3 rows per partition.
    visits = [(i, (i + j) % 3, (i * 7 + j) % 31) for i in range(PATIENTS) for j in range(i % 6)]
    regions = [(s, z) for s in STATES for z in (1, 2)]  # two rows per state
    return {
        "patients": ("pid,state,age", patients),
        "visits": ("pid,kind,days", visits),
        "regions": ("state,zone", regions),
    }


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    with running_engine(tmp_path_factory.mktemp("rows"), POLICY, _tables()) as e:
        yield e


ROOTS = {"patients": "p", "visits": "v"}
JOINS = {
    ("patients", "visits"): "{kind} JOIN visits v ON v.pid = p.pid",
    ("visits", "patients"): "{kind} JOIN patients p ON p.pid = v.pid",
    ("patients", "regions"): "{kind} JOIN regions r ON r.state = p.state",
}
KEYS = {"p": ["p.state"], "v": ["v.kind"], "r": ["r.zone"]}
VALUES = {"p": "p.age", "v": "v.days"}


@st.composite
def queries(draw) -> tuple[str, str]:
    """A query the gate accepts over one scan or a join, and its first private table."""
    root = draw(st.sampled_from(sorted(ROOTS)))
    aliases = [ROOTS[root]]
    joins = []
    for (left, right), text in JOINS.items():
        if ROOTS.get(left) in aliases and right[0] not in aliases and draw(st.booleans()):
            joins.append(text.format(kind=draw(st.sampled_from(["", "LEFT"]))))
            aliases.append(right[0])
    keys = draw(st.lists(st.sampled_from([k for a in aliases for k in KEYS[a]]), unique=True))
    value = VALUES[draw(st.sampled_from([a for a in aliases if a in VALUES]))]
    aggregate = draw(st.sampled_from(["COUNT(*)", f"SUM({value})", f"AVG({value})"]))
    where = draw(st.sampled_from(["", f" WHERE {value} > 10"]))
    select = ", ".join([*keys, aggregate])
    group = f" GROUP BY {', '.join(keys)}" if keys else ""
    sql = f"SELECT {select} FROM {root} {ROOTS[root]} {' '.join(joins)}{where}{group}"
    return sql, root


def _rows_per_partition(engine, sql: str) -> tuple[int, int]:
    """The most rows any partition's aggregate reads, and the plan's bound on them
    scaled from ``MAX_ROWS`` to the first private table's rows."""
    dataset = engine.policy.dataset("c")
    try:
        the_plan = analyse(Asked(sql, {}, 1.0, 0.0), dataset, PureAccountant())
    except Refused:
        return 0, 0
    rw = rewrite(the_plan, seed=5)
    tree = rw.tree.copy()
    tree.set("expressions", [*tree.expressions[: rw.keys], exp.Count(this=exp.Star())])
    store = engine.databases["c"]
    rows = store.run(store.dialect.render(tree)).rows
    root = the_plan.checked.resolved.scans[0].table.name
    (table_rows,) = store.run(f"SELECT COUNT(*) FROM {root}").rows[0]
    per_unit = the_plan.partition_rows // MAX_ROWS
    return max((r[-1] for r in rows), default=0), per_unit * table_rows


@pytest.mark.search
@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(query=queries())
def test_no_partition_sums_more_rows_than_the_plan_allows(engine, query) -> None:
    sql, _ = query
    most, bound = _rows_per_partition(engine, sql)
    assert most <= bound, sql


def test_the_bound_without_a_join_factor_is_caught(engine, monkeypatch) -> None:
    """The broken version, ``MAX_ROWS`` whatever the query joins: a patient's visits
    outnumber the patients, and the search above would fail on them."""
    sql = "SELECT COUNT(*) FROM patients p JOIN visits v ON v.pid = p.pid"
    most, bound = _rows_per_partition(engine, sql)
    assert bound // PATIENTS == 3 and PATIENTS < most <= bound
    monkeypatch.setattr(plan_types, "partition_rows", lambda resolved, contribution: MAX_ROWS)
    most, bound = _rows_per_partition(engine, sql)
    assert most > bound


@pytest.mark.parametrize(("partitions", "rows"), [(2**11, 2**11), (1, 2**22)])
def test_a_unit_may_be_bounded_to_at_most_2_22_rows(partitions, rows) -> None:
    """Fewer than 2^40 units of at most 2^22 rows: every count fits 64 bits."""

    def raw(max_rows: int) -> dict:
        return {
            "datasets": {
                "d": {
                    "sources": {"t": "t.csv"},
                    "privacy_unit": "pid",
                    "max_partitions": partitions,
                    "max_rows_per_partition": max_rows,
                    "user_budget": {"epsilon": 1.0},
                    "tables": {"t": {"columns": {"pid": {"type": "int"}}}},
                }
            }
        }

    parse_policy(raw(rows), Path("p.toml"))
    with pytest.raises(PolicyError, match=f"is {partitions * (rows + 1):,}; at most 4,194,304"):
        parse_policy(raw(rows + 1), Path("p.toml"))
