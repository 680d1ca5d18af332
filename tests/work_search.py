"""The work search's parts (tests/unit/test_work_search.py, and Spark's pair in
tests/system/test_spark_work_search.py): neighbouring datasets D and D' (D holds a
target unit with ten times the load cap of rows: ``tables``), the grammar of shapes
that multiply one unit's rows (``multiplying``), and ``compare``, which asks both
gates and fails where a reply's kind, status, message or padding slot differs. A second
grammar (``operating``) draws the row operators whose work grows with a text rather than
with rows: ``LIKE``/``ILIKE`` with varied ``_``/``%`` patterns, text functions over the
target's multi-byte texts, and CTE chains that double a text up to the caps."""

from __future__ import annotations

import time
from dataclasses import dataclass

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st

from dpmagic.gate.engine import Engine
from dpmagic.gate.failures import GateError

TARGET = 7
VISITS = 40  # the target's: ten times the load cap of 2 × 2
SLOT_S = 1.0
POLICY = """
[gate]
state_dir = "state"
accountant = "approx"
query_timeout_s = 4
response_quantum_ms = 0

[datasets.c]
max_text_length = 65536
privacy_unit = "pid"
max_partitions = 2
max_rows_per_partition = 2
user_budget = { epsilon = 1e9, delta = 0.5 }
notebook_budget = { epsilon = 1e9, delta = 0.5 }

[datasets.c.sources]
patients = "patients.csv"
visits = "visits.csv"
codes = "codes.csv"
orders = "orders.csv"
lines = "lines.csv"

[datasets.c.tables.patients.columns]
pid = { type = "int" }
age = { type = "int", lower = 0, upper = 100 }

[datasets.c.tables.visits]
links = { pid = "patients.pid" }
[datasets.c.tables.visits.columns]
pid = { type = "int" }
diag = { type = "str", public_values = ["a", "b", "c", "d"] }
day = { type = "int", lower = 0, upper = 60 }
note = { type = "str", max_length = 64 }
memo = { type = "str", max_length = 1024 }

[datasets.c.tables.orders]
links = { pid = "patients.pid" }
[datasets.c.tables.orders.columns]
oid = { type = "int" }
pid = { type = "int" }

[datasets.c.tables.lines]
links = { oid = "orders.oid" }
[datasets.c.tables.lines.columns]
oid = { type = "int" }
diag = { type = "str", public_values = ["a", "b", "c", "d"] }
day = { type = "int", lower = 0, upper = 60 }

[datasets.c.tables.codes]
public = true
[datasets.c.tables.codes.columns]
code = { type = "int", lower = 0, upper = 60 }
"""


def tables(with_target: bool) -> dict:
    people = [p for p in range(1, 61) if with_target or p != TARGET]
    patients = [(p, 20 + p % 50) for p in people]
    visits = [
        (p, "abcd"[(p + j) % 4], (p * 3 + j) % 61, f"n{(p + j) % 9}", _memo(p, j))
        for p in people
        for j in range(VISITS if p == TARGET else 1 + p % 3)
    ]
    # Orders, and their lines, which reach the person only through the orders' keys:
    # the target has ten orders of four lines (ten times the load cap again).
    orders = [(100 * p + k, p) for p in people for k in range(10 if p == TARGET else 1 + p % 2)]
    lines = [
        (oid, "abcd"[(oid + j) % 4], (oid + j) % 61)
        for oid, p in orders
        for j in range(4 if p == TARGET else 1 + oid % 2)
    ]
    return {
        "patients": ("pid,age", patients),
        "visits": ("pid,diag,day,note,memo", visits),
        "codes": ("code", [(c,) for c in range(0, 61, 2)]),
        "orders": ("oid,pid", orders),
        "lines": ("oid,diag,day", lines),
    }


# The target's texts at their longest, in the characters dearest to each operator (``a``
# makes a LIKE retry at every position; 4-byte and folding characters cost the most per
# character); everyone else's are short.
MEMO_FILLS = ("a", "😀", "a", "ﬃ", "a", "a", "é", "a")


def _memo(pid: int, visit: int) -> str:
    return MEMO_FILLS[visit % len(MEMO_FILLS)] * 1024 if pid == TARGET else f"m{visit}"


@st.composite
def operating(draw) -> str:
    """A query whose work per row grows with the texts it reads or makes."""
    levels = draw(st.integers(0, 7))  # 1,024 characters doubled: 7 levels pass the cap
    ctes = ["c0 AS (SELECT pid, day, memo AS s FROM visits)"]
    ctes += [f"c{i} AS (SELECT pid, day, s || s AS s FROM c{i - 1})" for i in range(1, levels + 1)]
    text = draw(
        st.sampled_from(
            ["s", "UPPER(s)", "LOWER(s)", "TRIM(s)", "SUBSTRING(s, 2, 3000)", "LEFT(s, 900)",
             "RIGHT(s, 900)", "s || 'ﬃ'", f"CASE WHEN pid = {TARGET} THEN s END",
             "COALESCE(s, 'x') || 'y'"]
        )
    )  # fmt: skip
    m = draw(st.sampled_from([1, 3, 40, 400, 4000, 15000]))
    pattern = draw(
        st.sampled_from(
            ["%" + "a" * m + "_b%", "%" + "a" * m + "b%", "%a" * min(m, 6) + "_c",
             "a" * m + "%", "_%" * min(m, 6), "%😀%ﬃ_%"]
        )
    )  # fmt: skip
    condition = draw(
        st.sampled_from(
            [f"{text} LIKE '{pattern}'", f"{text} ILIKE '{pattern}'", f"{text} = 'x'",
             f"LENGTH({text}) > 3", f"{text} IN ('a', 'b', '{pattern[:50]}')"]
        )
    )  # fmt: skip
    aggregate = draw(st.sampled_from(["COUNT(*)", "SUM(day)"]))
    return f"WITH {', '.join(ctes)} SELECT {aggregate} FROM c{levels} WHERE {condition}"


@st.composite
def along_keys(draw) -> str:
    """A join along the chain of keys (``lines → orders → patients``) that could multiply
    one unit's rows: lines joined to their order's other lines and to the order, again
    and again, with the semi-joins that read the chain (some comparing their rows with
    the query's row, a nested loop over one unit's rows)."""
    scans = draw(st.integers(1, 10))
    joins = []
    for i in range(1, scans):
        table = draw(st.sampled_from(["lines", "lines", "orders"]))
        side = draw(st.sampled_from(["", "LEFT "]))
        joins.append(f"{side}JOIN {table} AS a{i} ON a{i}.oid = a0.oid")
    public = draw(st.sampled_from(["", "JOIN codes AS r ON r.code = a0.day",
                                   "JOIN codes AS r ON r.code < a0.day"]))  # fmt: skip
    if public:
        joins.append(public)
    where = draw(
        st.sampled_from(
            [
                "",
                "a0.diag = 'b'",
                f"EXISTS (SELECT 1 FROM orders AS x WHERE x.oid = a0.oid AND x.pid = {TARGET})",
                "a0.oid IN (SELECT x.oid FROM lines AS x JOIN lines AS y ON y.oid = x.oid "
                "JOIN orders AS z ON z.oid = x.oid)",
                # Compared with the query's row: a nested loop over one unit's rows.
                "EXISTS (SELECT 1 FROM lines AS x WHERE x.oid = a0.oid AND x.day <> a0.day "
                "AND x.diag >= a0.diag)",
                "NOT EXISTS (SELECT 1 FROM lines AS x JOIN orders AS z ON z.oid = x.oid "
                "WHERE x.oid = a0.oid AND x.day + a0.day > 30)",
            ]
        )
    )
    aggregate = draw(st.sampled_from(["COUNT(*)", "MEDIAN(a0.day)", "SUM(a0.day)"]))
    key = draw(st.sampled_from(["", "a0.diag"]))
    select = f"{key}, {aggregate}" if key else aggregate
    sql = f"SELECT {select} FROM lines AS a0 {' '.join(joins)}"
    if where:
        sql += f" WHERE {where}"
    if key:
        sql += f" GROUP BY {key}"
    return sql


@st.composite
def multiplying(draw) -> str:
    """A query the grammar accepts whose rows could multiply one unit's: joins on the
    unit, or along the chain of keys (``along_keys``)."""
    if draw(st.integers(0, 3)) == 0:
        return draw(along_keys())
    scans = draw(st.integers(1, 12))
    form = draw(st.sampled_from(["on", "using", "cte"]))
    tables = ["visits"] + [draw(st.sampled_from(["visits", "visits", "patients"]))
                           for _ in range(scans - 1)]  # fmt: skip
    source = "c" if form == "cte" else None
    first = f"{source or tables[0]} AS a0"
    joins = []
    for i, table in enumerate(tables[1:], start=1):
        name = source or table
        side = draw(st.sampled_from(["", "LEFT "]))
        if form == "using":
            joins.append(f"{side}JOIN {name} AS a{i} USING (pid)")
        else:
            joins.append(f"{side}JOIN {name} AS a{i} ON a{i}.pid = a0.pid")
    public = draw(st.sampled_from(["", "JOIN codes AS r ON r.code = a0.day",
                                   "JOIN codes AS r ON r.code < a0.day"]))  # fmt: skip
    if public:
        joins.append(public)
    where = draw(
        st.sampled_from(
            [
                "",
                f"a0.pid = {TARGET}",
                "a0.diag = 'b'",
                f"a0.note = 'n{TARGET % 9}' AND a0.day > 3",
                "a0.pid IN (SELECT x.pid FROM visits AS x JOIN visits AS y ON y.pid = x.pid "
                "JOIN visits AS z ON z.pid = x.pid)",
                "NOT EXISTS (SELECT 1 FROM visits AS x WHERE x.pid = a0.pid "
                "AND x.day < a0.day AND x.diag <> a0.diag)",
            ]
        )
    )
    aggregate = draw(
        st.sampled_from(["COUNT(*)", "COUNT(DISTINCT a0.pid)", "MEDIAN(a0.day)", "SUM(a0.day)"])
    )
    key = draw(st.sampled_from(["", "a0.diag", "a0.note"]))
    select = f"{key}, {aggregate}" if key else aggregate
    sql = f"SELECT {select} FROM {first} {' '.join(joins)}"
    if form == "cte":
        sql = "WITH c AS (SELECT pid, diag, day, note FROM visits) " + sql
    if where:
        sql += f" WHERE {where}"
    if key:
        sql += f" GROUP BY {key}"
    return sql


@dataclass(frozen=True)
class Reply:
    kind: str
    status: int
    message: str
    slot: int
    seconds: float

    @property
    def told(self) -> tuple[str, int, str]:
        """What the reply says, its time apart."""
        return self.kind, self.status, self.message


def ask(engine: Engine, sql: str, n: int, user: str) -> Reply:
    body = {"sql": sql, "epsilon": 0.1, "delta": 1e-6, "fresh": True, "notebook": f"nb{n}"}
    start = time.monotonic()
    try:
        engine.query(user, body)
        kind, status, message = "ok", 200, ""
    except GateError as exc:
        kind, status, message = exc.kind, exc.status, exc.message
    took = time.monotonic() - start
    return Reply(kind, status, message, int(took // SLOT_S), took)


ASKED = iter(range(10**9))


def compare(gates: tuple[Engine, Engine], sql: str, user: str = "searcher") -> None:
    n = next(ASKED)
    a, b = (ask(g, sql, n, user) for g in gates)
    assert a.told == b.told, f"the reply hinges on the target unit: {sql}\n  D : {a}\n  D': {b}"
    if a.slot == b.slot:
        return
    # Only the slots differ: asked twice more, each side's fastest reply is compared, so
    # that a pause of the machine's is not taken for the target's work (which every run
    # of D pays); and two times a hair apart that straddle a slot's edge are not a
    # difference the target made: theirs must be a slot or more.
    for _ in range(2):
        n = next(ASKED)
        again = [ask(g, sql, n, user) for g in gates]
        a, b = (min(x, y, key=lambda r: r.seconds) for x, y in zip((a, b), again, strict=True))
    assert abs(a.seconds - b.seconds) < SLOT_S, (
        f"the reply hinges on the target unit: {sql}\n  D : {a}\n  D': {b}"
    )


SEARCH = settings(
    derandomize=True,
    database=None,
    deadline=None,
    max_examples=60,
    phases=[p for p in Phase if p is not Phase.explain],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
