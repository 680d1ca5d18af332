"""``sql/work.py``: the work one unit can add to a query, bounded before the debit.

Searched over the join shapes the gate accepts (self-joins of private tables up to
six scans, public tables joined on a key or on a condition, semi-joins, the window
path's distinct units and the ranks' path) on two real DuckDB gates: D, and D'
without the target unit, who has more rows than any bound keeps (each gate ranks
rows under its own seed, so the queries' filters keep whatever rows the ranks
pick: every other unit then adds the same rows to both). The rows the
target adds to the generated SQL's joined rows (the main join's and each
semi-join's) must stay within the plan's bound. The broken version, each scan of
a join reading the whole cap of its unit's rows (as main did on the window path),
is caught by the same measurement; and a query whose bound is above the policy's
``max_unit_work`` is refused, free, naming the limit."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlglot import exp

from dpmagic.gate.dp.accounting import PureAccountant
from dpmagic.gate.engines.ranking import RANK
from dpmagic.gate.failures import Refused
from dpmagic.gate.sql import rewrite as rewrites
from dpmagic.gate.sql.pipeline import Asked, analyse
from dpmagic.gate.sql.plan_types import Plan
from dpmagic.gate.sql.prices import MATCH_PER_PAIR
from dpmagic.gate.sql.ranks import RoomRead
from dpmagic.gate.sql.rewrite import rewrite
from dpmagic.gate.sql.work import TRY_ROW_STEPS, VECTOR_ROWS, WINDOW_STEPS, evaluated, steps_of
from tests.gate_helpers import running_engine

PATIENTS = 40
TARGET = 0  # 12 visits and 3 patient rows: more than the load cap of 2 × 3 keeps
POLICY = """
[gate]
state_dir = "state"

[datasets.c]
sources = { patients = "patients.csv", visits = "visits.csv", regions = "regions.csv", codes = "codes.csv" }
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
note = { type = "str", max_length = 200 }

[datasets.c.tables.regions]
public = true
[datasets.c.tables.regions.columns]
state = { type = "str", public_values = ["CA", "TX", "NY"] }
zone = { type = "int", public_values = [1, 2] }

[datasets.c.tables.codes]
public = true
[datasets.c.tables.codes.columns]
code = { type = "int", lower = 0, upper = 100 }
"""  # noqa: E501
STATES = ("CA", "TX", "NY")


def _tables(without_target: bool) -> dict:
    def kept(pid: int) -> bool:
        return not (without_target and pid == TARGET)

    patients = [(i, STATES[i % 3], (i * 37) % 101) for i in range(PATIENTS) if kept(i)]
    patients += [(TARGET, "CA", 50 + j) for j in range(2) if kept(TARGET)]
    visits = [
        (i, (i + j) % 3, (i * 7 + j) % 31, "n" * ((i + j) % 9))
        for i in range(PATIENTS)
        for j in range(12 if i == TARGET else i % 4)
        if kept(i)
    ]
    return {
        "patients": ("pid,state,age", patients),
        "visits": ("pid,kind,days,note", visits),
        "regions": ("state,zone", [(s, z) for s in STATES for z in (1, 2)]),
        "codes": ("code", [(c,) for c in range(30)]),
    }


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    with (
        running_engine(tmp_path_factory.mktemp("d"), POLICY, _tables(False)) as d,
        running_engine(tmp_path_factory.mktemp("d2"), POLICY, _tables(True)) as d2,
    ):
        yield d, d2


PRIVATE = {"p": "patients", "v": "visits"}


@st.composite
def queries(draw) -> str:
    """A query over a join of 1–6 private scans, maybe a public table, maybe a semi-join."""
    scans = draw(st.lists(st.sampled_from(sorted(PRIVATE)), min_size=1, max_size=6))
    names = [f"{a}{i}" for i, a in enumerate(scans)]
    parts = [f"{PRIVATE[scans[0]]} {names[0]}"]
    for a, n in zip(scans[1:], names[1:], strict=True):
        kind = draw(st.sampled_from(["", "LEFT "]))
        parts.append(f"{kind}JOIN {PRIVATE[a]} {n} ON {n}.pid = {names[0]}.pid")
    public = draw(st.sampled_from(["", "regions", "codes"]))
    first_p = next((n for a, n in zip(scans, names, strict=True) if a == "p"), None)
    first_v = next((n for a, n in zip(scans, names, strict=True) if a == "v"), None)
    if public == "regions" and first_p:
        parts.append(f"JOIN regions r ON r.state = {first_p}.state")
    elif public == "codes" and first_v:
        parts.append(f"JOIN codes c ON c.code < {first_v}.days")
    where = []
    if draw(st.booleans()):
        where.append(f"{names[0]}.pid = {TARGET}")
    if draw(st.booleans()):
        where.append(
            f"{names[0]}.pid IN (SELECT a.pid FROM visits a JOIN visits b ON b.pid = a.pid "
            "WHERE a.days + b.days >= 0)"
        )
    aggregate = draw(st.sampled_from(["COUNT(*)", f"COUNT(DISTINCT {names[0]}.pid)"]))
    key = f"{first_v}.kind" if first_v and draw(st.booleans()) else None
    select = f"{key}, {aggregate}" if key else aggregate
    sql = f"SELECT {select} FROM {' '.join(parts)}"
    if where:
        sql += " WHERE " + " AND ".join(where)
    return sql + (f" GROUP BY {key}" if key else "")


def _plan(engine, sql: str) -> Plan:
    return analyse(Asked(sql, {}, 1.0, 0.0), engine.policy.dataset("c"), PureAccountant())


def _joined_rows(engine, the_plan: Plan) -> list[int]:
    """The rows of the generated SQL's joins: the main one (``kept_rows``) and each
    semi-join's subquery, counted on ``engine``'s data."""
    tree = rewrite(the_plan, seed=5).tree
    store = engine.databases["c"]
    main = next(c for c in tree.find_all(exp.CTE) if c.alias == "kept_rows")
    subqueries = [n.args["query"].this for n in main.this.find_all(exp.In) if n.args.get("query")]
    counts = []
    for select in [main.this, *subqueries]:
        sql = f"SELECT COUNT(*) FROM ({store.dialect.render(select)})"
        counts.append(store.run(sql).rows[0][0])
    return counts


def _added(engines, sql: str) -> tuple[list[int], list[int]] | None:
    """The rows the target adds to each join, and the plan's bound on them."""
    d, d2 = engines
    try:
        the_plan = _plan(d, sql)
    except Refused:
        return None
    with_target, without = _joined_rows(d, the_plan), _joined_rows(d2, the_plan)
    added = [a - b for a, b in zip(with_target, without, strict=True)]
    private_semis = [
        j for j in the_plan.checked.resolved.semijoins if any(not s.table.public for s in j.scans)
    ]
    assert len(the_plan.work.joins) == 1 + len(private_semis)
    return added, [j.rows for j in the_plan.work.joins]


@pytest.mark.search
@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(sql=queries())
def test_one_unit_adds_no_more_joined_rows_than_the_plan_bounds(engines, sql) -> None:
    found = _added(engines, sql)
    if found is None:
        return
    added, bounds = found
    assert all(a <= b for a, b in zip(added, bounds, strict=True)), (sql, added, bounds)


def test_the_bound_is_reached_on_a_self_join(engines) -> None:
    """Not loose: the target's joined rows in a self-join come to the bound itself."""
    sql = "SELECT COUNT(DISTINCT a.pid) FROM visits a JOIN visits b ON b.pid = a.pid"
    added, bounds = _added(engines, sql)
    assert added[0] == bounds[0] == 6


def _whole_cap(
    tables: list[str], cap: int, first: object = None, keyed: object = None
) -> list[RoomRead]:
    """The broken version: every scan keeps its unit's first ``cap`` ranks."""
    rank = exp.LTE(this=exp.column(RANK, quoted=True), expression=exp.Literal.number(cap))
    return [RoomRead(exp.table_(t, quoted=True), rank.copy()) for t in tables]


def test_scans_that_each_keep_the_whole_cap_are_caught(engines, monkeypatch) -> None:
    sql = (
        "SELECT COUNT(DISTINCT a.pid) FROM visits a JOIN visits b ON b.pid = a.pid "
        "JOIN visits c ON c.pid = a.pid"
    )
    added, bounds = _added(engines, sql)
    assert added[0] <= bounds[0]
    monkeypatch.setattr(rewrites, "room_reads", _whole_cap)
    added, bounds = _added(engines, sql)
    assert added[0] == 6**3 > bounds[0]


def test_a_public_table_multiplies_by_its_key_repeats_or_its_size(engines) -> None:
    """Joined on a key, regions multiplies a row by its 2 rows per state; on a
    condition, codes by its 30 rows."""
    d, _ = engines
    on_key = _plan(d, "SELECT COUNT(*) FROM patients p JOIN regions r ON r.state = p.state")
    on_condition = _plan(d, "SELECT COUNT(*) FROM visits v JOIN codes c ON c.code < v.days")
    assert on_key.work.joins[0].rows == 6 * 2
    assert on_condition.work.joins[0].rows == 6 * 30


def test_a_query_above_the_limit_is_refused_free_naming_it(engines) -> None:
    d, _ = engines
    sql = "SELECT COUNT(*) FROM visits v JOIN codes c ON c.code < v.days JOIN codes e ON TRUE"
    dataset = d.policy.dataset("c")
    found = analyse(Asked(sql, {}, 1.0, 0.0), dataset, PureAccountant())
    assert found.work.joins[0].rows == 6 * 30 * 30
    limit = found.work.total - 1
    small = replace(dataset, max_unit_work=limit)
    with pytest.raises(Refused, match=f"above the policy's max_unit_work of {limit:,}"):
        analyse(Asked(sql, {}, 1.0, 0.0), small, PureAccountant())
    # Through the request path at the default limit (6 × 30^4 rows), nothing charged.
    before = d.budget("alice", "c", None)
    wider = sql + " JOIN codes f ON TRUE JOIN codes g ON TRUE"
    with pytest.raises(Refused, match="max_unit_work"):
        d.query("alice", {"sql": wider, "dataset": "c", "epsilon": 1.0})
    assert d.budget("alice", "c", None) == before


def test_a_like_costs_the_text_times_the_pattern(engines) -> None:
    d, _ = engines
    resolved = _plan(d, "SELECT COUNT(*) FROM visits v WHERE v.note LIKE '%a%b%'").checked.resolved
    where = resolved.tree.args["where"].this
    like = next(where.find_all(exp.Like))
    # the column and the pattern (a step each), the LIKE: the pattern (5 characters and
    # one more) tried at each of the column's 200 characters (``prices._matched``)
    assert steps_of(like, resolved) == 1 + 1 + 1 + MATCH_PER_PAIR * 200 * 6


def test_an_expression_under_try_costs_a_vector_on_the_slow_path(engines) -> None:
    """DuckDB evaluates a raising row's whole vector again row by row, other units' rows
    with it: an argument the proof cannot clear of overflow costs a vector's worth per
    row, and one it can costs its own steps."""
    d, _ = engines
    tried = _plan(d, "SELECT SUM(LEAST(GREATEST(v.pid * v.pid * v.pid, 0), 9)) FROM visits v")
    safe = _plan(d, "SELECT SUM(LEAST(GREATEST(v.days * v.days * v.days, 0), 9)) FROM visits v")
    resolved = tried.checked.resolved
    (arg,) = [m.arg for m in tried.measurements if m.arg is not None]
    assert evaluated(arg, resolved).unit == VECTOR_ROWS * (steps_of(arg, resolved) + TRY_ROW_STEPS)
    assert tried.work.total > 1000 * safe.work.total


def test_a_trimmed_mean_pays_for_ranking_each_row_in_its_group(engines) -> None:
    """A trimmed sum ranks each of a unit's rows among its group's values (a place in
    a sort, as the window's): at least that per row above a plain mean of the same
    argument (its own expressions cost a little more too; unpriced, the sort's steps
    are missing and the difference is below that)."""
    d, _ = engines
    plain = _plan(d, "SELECT v.kind, AVG(v.days) FROM visits v GROUP BY v.kind").work
    trimmed = _plan(d, "SELECT v.kind, TRIMMED_MEAN(v.days, 0.1) FROM visits v GROUP BY v.kind")
    assert trimmed.work.rows == plain.rows
    assert trimmed.work.row - plain.row >= WINDOW_STEPS
    assert trimmed.work.total - plain.total >= plain.rows * WINDOW_STEPS


def test_a_per_person_subquerys_other_keys_are_priced_per_row(engines) -> None:
    """``GROUP BY pid, kind`` evaluates the key on each of a unit's rows inside it."""
    d, _ = engines
    inner = "SELECT v.pid, {} COUNT(*) AS n FROM visits v GROUP BY v.pid{}"
    alone = _plan(d, f"SELECT COUNT(*) FROM ({inner.format('', '')}) AS p").work
    keyed = _plan(d, f"SELECT COUNT(*) FROM ({inner.format('v.kind,', ', v.kind')}) AS p").work
    assert keyed.total > alone.total
