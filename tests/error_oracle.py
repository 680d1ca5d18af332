"""The error-oracle fuzzer's parts: neighbouring datasets D and D' (D holds a target
unit at every declared edge), written by ``write_database``; the grammar over their
schema (``ROW_QUERIES``, ``RELEASE_QUERIES``); the gates on both (the ``folder`` and
``pair`` fixtures, one per module); ``compare``, which asks both and fails on any
difference; and the two budgets (``DEFAULT``, ``FUZZ``). Shared by
tests/unit/test_fuzz_error_oracle.py (the default budget),
tests/system/test_fuzz_error_oracle.py (the long runs and real gate processes) and
tests/system/test_spark_fuzz.py (the same datasets served by Spark)."""

from __future__ import annotations

import datetime as dt
import itertools
import json
import os
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pytest
from hypothesis import HealthCheck, Phase, event, note, settings
from hypothesis import strategies as st

from dpmagic.gate.engine import Engine
from dpmagic.gate.failures import Failed, GateError
from dpmagic.gate.policy import load_policy
from dpmagic.gate.request import QueryRequest
from tests.sql_grammar import Schema, swarm

# The target unit: its id is past the 53 bits a double holds exactly, and its rows
# hold the ends of every declared range, NULLs, the only numeric text, a long text,
# and dates at the ends of the calendar.
TARGET = 2**53 + 1
LONG_NOTE = "z" * 4000

POLICY = """
[gate]
state_dir = "state-{name}"

[datasets.d]
database = "{name}.duckdb"
privacy_unit = "pid"
max_partitions = 2
max_rows_per_partition = 3
user_budget = {{ epsilon = 1e12 }}
query_default = {{ epsilon = 0.1 }}

[datasets.d.tables.t.columns]
pid = {{ type = "int" }}
age = {{ type = "int", lower = 0, upper = 120 }}
income = {{ type = "int", lower = 0, upper = 1000000 }}
grade = {{ type = "int", public_values = [1, 2, 3, 4, 5] }}
score = {{ type = "float", lower = -1000.0, upper = 1000.0 }}
w = {{ type = "float" }}
note = {{ type = "str" }}
city = {{ type = "str", public_values = ["a", "b", "c"] }}
seen = {{ type = "date", lower = 2000-01-01, upper = 2030-12-31 }}
born = {{ type = "date" }}
flag = {{ type = "bool" }}

[datasets.d.tables.v.columns]
pid = {{ type = "int" }}
amount = {{ type = "int", lower = 0, upper = 10000 }}
kind = {{ type = "str", public_values = ["x", "y"] }}
paid = {{ type = "date", lower = 2020-01-01, upper = 2020-12-31 }}

[datasets.d.tables.o]
links = {{ pid = "t.pid" }}
[datasets.d.tables.o.columns]
oid = {{ type = "int" }}
pid = {{ type = "int" }}
total = {{ type = "float", lower = 0.0, upper = 500.0 }}

[datasets.d.tables.l]
links = {{ oid = "o.oid" }}
[datasets.d.tables.l.columns]
oid = {{ type = "int" }}
qty = {{ type = "int", lower = 1, upper = 50 }}
tag = {{ type = "str", public_values = ["p", "q"] }}

[datasets.d.tables.r]
public = true
[datasets.d.tables.r.columns]
city = {{ type = "str" }}
pop = {{ type = "int", lower = 0, upper = 100 }}
"""

T_COLUMNS = "pid, age, income, grade, score, w, note, city, seen, born, flag"
T_TYPES = (
    "pid BIGINT, age BIGINT, income BIGINT, grade BIGINT, score DOUBLE, w DOUBLE, "
    "note VARCHAR, city VARCHAR, seen DATE, born DATE, flag BOOLEAN"
)
D = dt.date
TARGET_T = [
    (TARGET, 120, 1_000_000, 5, 1000.0, 1e308, "127", "c", D(2030, 12, 31), D(9999, 12, 31), True),
    (TARGET, 0, 0, 1, -1000.0, -1e308, LONG_NOTE, None, D(2000, 1, 1), D(1, 1, 1), None),
]
TARGET_V = [(TARGET, 10000, "y", D(2020, 12, 31)), (TARGET, 0, None, D(2020, 1, 1))]
# The target's orders (keys past a double's exact integers, as its id) and their lines,
# which reach the target only through the orders' keys (``l.oid → o.oid → t.pid``).
TARGET_O = [(TARGET, TARGET, 500.0), (TARGET + 2, TARGET, None)]
TARGET_L = [(TARGET, 50, "q"), (TARGET, 1, None), (TARGET + 2, 50, "p")]
PEOPLE = 24


def _others() -> tuple[list[tuple], list[tuple]]:
    """Everyone but the target: ordinary values, some NULLs, one or two rows each."""
    t, v = [], []
    for pid in range(1, PEOPLE + 1):
        for copy in range(1 + pid % 2):
            t.append(
                (
                    pid,
                    18 + (pid * 7 + copy) % 50,
                    1000 * pid,
                    1 + pid % 5,
                    pid * 10.5 - 100,
                    pid * 1.25,
                    None if pid % 7 == 0 else f"n{pid}",
                    (None, "a", "b")[pid % 3],
                    D(2001, 1, 1) + dt.timedelta(days=200 * pid + copy),
                    D(1950 + pid, 1 + pid % 12, 1),
                    None if pid % 5 == 0 else pid % 2 == 0,
                )
            )
        v.append((pid, 100 * pid, ("x", "y")[pid % 2], D(2020, 1 + pid % 12, 15)))
    return t, v


def _orders() -> tuple[list[tuple], list[tuple]]:
    """Everyone's orders but the target's (none to two a person) and one to three lines
    an order; one line names an order nobody has, and belongs to no one."""
    o, line = [], [(999_999, 7, "p")]
    for pid in range(1, PEOPLE + 1):
        for k in range(pid % 3):
            oid = 10 * pid + k
            o.append((oid, pid, None if oid % 11 == 0 else float(oid % 400)))
            line += [(oid, 1 + (oid + j) % 50, ("p", "q", None)[j]) for j in range(1 + oid % 3)]
    return o, line


def write_database(folder: Path, name: str, with_target: bool) -> Path:
    t, v = _others()
    o, line = _orders()
    if with_target:
        t, v, o, line = t + TARGET_T, v + TARGET_V, o + TARGET_O, line + TARGET_L
    con = duckdb.connect(str(folder / f"{name}.duckdb"))
    con.execute(f"CREATE TABLE t ({T_TYPES})")
    con.executemany(f"INSERT INTO t ({T_COLUMNS}) VALUES ({', '.join('?' * 11)})", t)
    con.execute("CREATE TABLE v (pid BIGINT, amount BIGINT, kind VARCHAR, paid DATE)")
    con.executemany("INSERT INTO v VALUES (?, ?, ?, ?)", v)
    con.execute("CREATE TABLE o (oid BIGINT, pid BIGINT, total DOUBLE)")
    con.executemany("INSERT INTO o VALUES (?, ?, ?)", o)
    con.execute("CREATE TABLE l (oid BIGINT, qty BIGINT, tag VARCHAR)")
    con.executemany("INSERT INTO l VALUES (?, ?, ?)", line)
    con.execute(
        "CREATE TABLE r AS SELECT * FROM (VALUES ('a', 10), ('b', 20), ('c', 30)) x(city, pop)"
    )
    con.close()
    policy = folder / f"{name}.toml"
    policy.write_text(POLICY.format(name=name))
    return policy


# -- the grammar over this schema ----------------------------------------------------

T_FAMILIES = {
    "number": ("t.pid", "t.age", "t.income", "t.grade", "t.score", "t.w"),
    "text": ("t.note", "t.city"),
    "date": ("t.seen", "t.born"),
    "bool": ("t.flag",),
}
V_FAMILIES = {
    "number": ("v.pid", "v.amount"),
    "text": ("v.kind",),
    "date": ("v.paid",),
    "bool": (),
}
T_TARGETS = (
    f"t.pid = {TARGET}",
    "t.age = 120 AND t.income = 1000000",
    "t.note = '127'",
    "t.born = CAST('0001-01-01' AS DATE)",
)
V_TARGETS = (f"v.pid = {TARGET}", "v.amount = 10000 AND v.kind = 'y'")
# Lines joined to their orders: the columns of both, the target's rows found by either.
LO_FAMILIES = {
    "number": ("l.oid", "l.qty", "o.oid", "o.pid", "o.total"),
    "text": ("l.tag",),
    "date": (),
    "bool": (),
}
LO_TARGETS = (f"o.pid = {TARGET}", f"l.oid = {TARGET + 2}", "l.qty = 50 AND o.total = 500.0")


def _merge(*families: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    return {f: tuple(itertools.chain(*(x[f] for x in families))) for f in families[0]}


SCHEMAS = {
    "t": Schema(T_FAMILIES, T_TARGETS),
    "v": Schema(V_FAMILIES, V_TARGETS),
    "t JOIN v ON v.pid = t.pid": Schema(_merge(T_FAMILIES, V_FAMILIES), T_TARGETS),
    "t JOIN r ON r.city = t.city": Schema(
        _merge(T_FAMILIES, {"number": ("r.pop",), "text": ("r.city",), "date": (), "bool": ()}),
        T_TARGETS,
    ),
}
LINKED = "l JOIN o ON l.oid = o.oid"
SCHEMAS[LINKED] = Schema(LO_FAMILIES, LO_TARGETS)
SCHEMAS["t JOIN o ON o.pid = t.pid JOIN l ON o.oid = l.oid"] = Schema(
    _merge(T_FAMILIES, LO_FAMILIES), (*T_TARGETS, *LO_TARGETS)
)
ROW_QUERIES = swarm(SCHEMAS)
RELEASE_QUERIES = swarm(
    {f: SCHEMAS[f] for f in ("t", "t JOIN v ON v.pid = t.pid", LINKED)}, placement="released"
)
# Row conditions in the other places rows are filtered: a semi-join's subquery (over
# t: its own ``t``), and a LEFT JOIN's condition beside the unit equality.
SEMI_QUERIES = swarm({"t": SCHEMAS["t"]}, placement="semi_joined")
LEFT_QUERIES = swarm(
    {f: SCHEMAS[f] for f in ("t JOIN v ON v.pid = t.pid", LINKED)}, placement="left_joined"
)
# Per-person subqueries (``resolve.PerUnit``): over t, and over lines joined to their
# orders, grouped by the orders' person.
PER_PERSON_QUERIES = st.one_of(
    swarm({"t": SCHEMAS["t"]}, placement="per_person"),
    swarm({LINKED: SCHEMAS[LINKED]}, placement="per_person_linked"),
)
# Row expressions compared with a value released first (``sql/staged.py``).
STAGED_QUERIES = swarm({f: SCHEMAS[f] for f in ("t", LINKED)}, placement="staged")
KEYED_QUERIES = swarm({"t": SCHEMAS["t"]}, placement="staged_by_key")


# -- the gates -----------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    kind: str  # ok, or the error kind the server maps to a status (failures.py)
    status: int
    message: str
    shape: tuple  # of an answer: columns, number of rows, cost, plan (all data-free)
    charged: tuple[float, float]  # what the ledger holds for the query's notebook


class Pair:
    """Gates on D (``with_target``) and D' (``without``); each query text is asked once,
    on both, in a notebook of its own, so every answer is charged afresh. Outcomes are
    kept by text: Hypothesis often draws the same text again, and replays a failing
    one while it shrinks."""

    def __init__(self, with_target: Engine, without: Engine) -> None:
        self.with_target = with_target
        self.without = without
        self.started = time.monotonic()
        self.first_mismatch: str | None = None
        self.seen: dict[str, tuple[Outcome, Outcome]] = {}

    def __repr__(self) -> str:  # Hypothesis prints the arguments of a failing example
        return f"Pair({len(self.seen)} queries asked)"


@pytest.fixture(scope="module")
def folder() -> Iterator[Path]:
    """On tmpfs where there is one: each query's debit is flushed to the disk."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="dpm-fuzz-", dir=base) as name:
        yield Path(name)


def engine_pair(folder: Path, write: Callable[[Path, str, bool], Path]) -> Iterator[Pair]:
    """Two engines over the policies ``write`` makes, with the target unit and without
    it; closed when the caller's fixture ends."""
    engines = [
        Engine(load_policy(write(folder, name, with_target)))
        for name, with_target in (("with", True), ("without", False))
    ]
    try:
        yield Pair(*engines)
    finally:
        for e in engines:
            e.close()


@pytest.fixture(scope="module")
def pair(folder: Path) -> Iterator[Pair]:
    yield from engine_pair(folder, write_database)


USER = "fuzzer"
EPSILON = 0.1


def _ask(engine: Engine, sql: str, notebook: str) -> Outcome:
    body = {"sql": sql, "epsilon": EPSILON, "fresh": True, "notebook": notebook}
    try:
        reply = engine.query(USER, body)
    except GateError as exc:
        kind, status, message, shape = exc.kind, exc.status, exc.message, ()
    except Exception as exc:  # what the server answers to any other exception
        kind, status, message, shape = "failed", 500, Failed().message, ()
        event(f"the engine raised {type(exc).__name__}")
    else:
        kind, status, message = "ok", 200, ""
        shape = (
            tuple(reply["columns"]),
            len(reply["rows"]),
            json.dumps(reply["cost"], sort_keys=True),
            json.dumps(reply["plan"], sort_keys=True, default=str),
        )
    spent = engine.ledger.spent(USER, "d", notebook)
    return Outcome(kind, status, message, shape, (spent.epsilon, spent.delta))


def _duckdb_error(engine: Engine, sql: str) -> str:
    """Why a query failed after its debit, as DuckDB said it (the gate hides this
    text from users; the test may read it to name what it found)."""
    dataset = engine.policy.dataset("d")
    request = QueryRequest.from_body({"sql": sql, "epsilon": EPSILON})
    try:
        analysis = engine.analysis(USER, dataset, request)
    except Exception as exc:
        return f"the analysis raised {type(exc).__name__}: {str(exc)[:300]}"
    try:
        engine.databases["d"].run(analysis.rewritten.sql)
    except (duckdb.Error, GateError) as exc:
        return f"{type(exc).__name__}: {str(exc)[:300]}"
    return "DuckDB ran it without an error"


def _before_the_noise(o: Outcome) -> Outcome:
    if o.kind == "refused":
        return o
    return Outcome("charged", 0, "", (), o.charged)


def ask_both(pair: Pair, sql: str) -> tuple[Outcome, Outcome]:
    """``sql``'s outcomes on D and D', each asked once in a notebook of its own."""
    if sql not in pair.seen:
        notebook = f"nb{len(pair.seen)}"
        pair.seen[sql] = (_ask(pair.with_target, sql, notebook), _ask(pair.without, sql, notebook))
    return pair.seen[sql]


def compare(pair: Pair, sql: str, release_level: bool = False) -> None:
    a, b = ask_both(pair, sql)
    event(f"outcome: {a.kind}")
    if release_level:
        # Post-processing of noisy values may succeed on one and fail on the other;
        # what the gate decides before the noise (a refusal, its text, the charge) may not.
        a, b = _before_the_noise(a), _before_the_noise(b)
    if a == b:
        return
    failed = pair.with_target if a.kind == "failed" else pair.without
    why = _duckdb_error(failed, sql) if "failed" in (a.kind, b.kind) else ""
    if pair.first_mismatch is None:
        pair.first_mismatch = (
            f"first mismatch at query {len(pair.seen)} of this module, "
            f"{time.monotonic() - pair.started:.1f} s after the gates started"
        )
    note(pair.first_mismatch)
    raise AssertionError(
        f"the reply hinges on the target unit: {sql}\n  D : {a}\n  D': {b}\n  DuckDB: {why}"
    )


# -- properties: a fixed budget in the default run, thousands under -m fuzz -----------

DEFAULT = settings(
    derandomize=True,
    phases=[p for p in Phase if p is not Phase.explain],  # explain reruns every example
    database=None,
    deadline=None,
    max_examples=400,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
FUZZ = settings(
    DEFAULT,
    derandomize=False,
    database=settings.default.database,
    max_examples=4000,
)
