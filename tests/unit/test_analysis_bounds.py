"""The analysis is bounded before anything is charged: the inlined query's size while
``resolve`` builds it, the generated SQL's length, a deadline on the analysis's CPU
time, and a cache of analyses kept per user and bounded in bytes (``sql/limits.py``,
``analysis_cache.py``).

The attack: a chain of CTEs each doubling a text column (``c1 AS (SELECT
patient_id, s || s AS s FROM c0)``, …) doubles the inlined query at each level;
30 levels never finished and held gigabytes. Each defence is also shown to be the
one that stops it: with the cap lifted, the same chain builds many times the cap.
"""

from __future__ import annotations

import gc
import textwrap
import threading
import time
import tracemalloc

import pytest

from dpmagic.gate import analysis_cache
from dpmagic.gate.analysis_cache import AnalysisCache
from dpmagic.gate.failures import Refused
from dpmagic.gate.sql import limits, pipeline
from dpmagic.gate.sql import resolve as resolve_module
from dpmagic.gate.sql.parse import parse
from dpmagic.gate.sql.resolve import resolve
from tests.gate_helpers import running_engine

POLICY = """
[gate]
state_dir = "state"

[datasets.clinic]
sources = { patients = "patients.csv", visits = "visits.csv" }
privacy_unit = "patient_id"
max_partitions = 4
max_rows_per_partition = 4
user_budget = { epsilon = 100.0 }
notebook_budget = { epsilon = 100.0 }
query_default = { epsilon = 0.5 }

[datasets.clinic.tables.patients.columns]
patient_id = { type = "int" }
age = { type = "int", lower = 0, upper = 100 }
sex = { type = "str", public_values = ["F", "M"] }

[datasets.clinic.tables.visits]
links = { patient_id = "patients.patient_id" }

[datasets.clinic.tables.visits.columns]
patient_id = { type = "int" }
department = { type = "str", public_values = ["primary care", "cardiology", "oncology"] }
note = { type = "str" }
cost = { type = "float", lower = 0, upper = 50000 }
stay_days = { type = "int", lower = 0, upper = 30 }
"""

TABLES = {
    "patients": ("patient_id,age,sex", [(i, 20 + i % 60, "FM"[i % 2]) for i in range(40)]),
    "visits": (
        "patient_id,department,note,cost,stay_days",
        [
            (i % 40, ("primary care", "cardiology", "oncology")[i % 3], f"n{i}", 10.0 * i, i % 30)
            for i in range(100)
        ],
    ),
}

TOO_LARGE = "the query expands to more than 20,000 nodes once its CTEs and subqueries are inlined"


def chain(levels: int) -> str:
    """A WITH chain where each level doubles a text column."""
    ctes = ["c0 AS (SELECT patient_id, note AS s FROM visits)"]
    for i in range(1, levels + 1):
        ctes.append(f"c{i} AS (SELECT patient_id, s || s AS s FROM c{i - 1})")
    return "WITH " + ", ".join(ctes) + f" SELECT COUNT(*) FROM c{levels} WHERE s = 'x'"


def derived(levels: int) -> str:
    """The same doubling through nested derived tables."""
    inner = "(SELECT patient_id, note AS s FROM visits)"
    for i in range(levels):
        inner = f"(SELECT patient_id, s || s AS s FROM {inner} AS d{i})"
    return f"SELECT COUNT(*) FROM {inner} AS top WHERE s = 'x'"


# A wide query an analyst could write: CTEs deriving columns used several times, a
# join, a semi-join, and a dozen aggregates.
WIDE = textwrap.dedent(
    """
    WITH v AS (
        SELECT patient_id, department, stay_days * 2 + 1 AS weighted,
               cost / 100 AS hundreds,
               CASE WHEN stay_days > 10 THEN 1 WHEN stay_days > 3 THEN 2 ELSE 3 END AS band
        FROM visits WHERE cost > 0
    ),
    w AS (SELECT patient_id, department, weighted + hundreds AS score, band, hundreds, weighted
          FROM v)
    SELECT w.department,
           COUNT(*) AS n, SUM(score) AS s, AVG(score) AS a, SUM(band) AS b,
           AVG(hundreds) AS h, SUM(CASE WHEN band = 1 THEN score ELSE 0 END) AS long_score,
           COUNT(*) FILTER (WHERE band = 2) AS mid, AVG(p.age) AS age,
           SUM(weighted) AS wsum, MEDIAN(hundreds) AS med
    FROM w JOIN patients AS p ON p.patient_id = w.patient_id
    WHERE p.patient_id IN (SELECT patient_id FROM visits WHERE stay_days < 25)
    GROUP BY w.department
    """
).strip()


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    with running_engine(tmp_path_factory.mktemp("bounds"), POLICY, TABLES) as e:
        yield e


def _spent(engine, user: str, notebook: str) -> float:
    return engine.ledger.spent(user, "clinic", notebook).epsilon


def _refused(engine, sql: str, user: str = "mallory", notebook: str = "attack") -> tuple:
    started = time.thread_time()
    with pytest.raises(Refused) as info:
        engine.query(user, {"sql": sql, "notebook": notebook, "fresh": True})
    return info.value, time.thread_time() - started


# -- the inlined query's size, capped while it is built --------------------------------


@pytest.mark.parametrize("levels", [12, 30])
@pytest.mark.parametrize("shape", [chain, derived], ids=["cte", "derived"])
def test_a_doubling_chain_is_refused_quickly_and_free(engine, shape, levels):
    err, took = _refused(engine, shape(levels))
    assert err.message.startswith(TOO_LARGE) and "simplify it" in err.message
    assert err.kind == "refused" and "\n" not in err.message
    assert took < 1.0  # before the caps: 0.95 s at 12 levels, doubling with each
    assert _spent(engine, "mallory", "attack") == 0.0


@pytest.mark.search  # a CPU-time bound near its limit under tracemalloc: with the searches
def test_the_cap_is_checked_while_building(engine):
    """At 30 levels the inlined query would have 2^30 times the first level's nodes:
    refused in milliseconds and a few megabytes, so never built (a check after the
    fact would need the whole tree first)."""
    dataset = engine.policy.dataset("clinic")
    parsed = parse(chain(30))
    tracemalloc.start()
    started = time.thread_time()
    try:
        with pytest.raises(limits.AnalysisLimit, match=TOO_LARGE):
            resolve(parsed, dataset)
        took = time.thread_time() - started
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert took < 1.0
    assert peak < 32 << 20


def test_the_count_stops_at_the_cap(engine, monkeypatch):
    """Refused at the first charge past the cap: the nodes counted are the cap plus
    at most one definition (a level of the chain, under the cap itself)."""
    counted = _counting_expansions(monkeypatch)
    with pytest.raises(limits.AnalysisLimit):
        resolve(parse(chain(30)), engine.policy.dataset("clinic"))
    (expansion,) = counted
    assert limits.MAX_EXPANDED_NODES < expansion.nodes < 2 * limits.MAX_EXPANDED_NODES


@pytest.mark.search  # the broken version, building six times the cap: with the searches
def test_without_the_cap_the_chain_grows_past_it(engine, monkeypatch):
    """The broken version: with the cap lifted, 13 levels build six times the cap
    and take many times as long as the refusal."""
    dataset = engine.policy.dataset("clinic")
    parsed = parse(chain(13))
    # The thread's CPU time with the cyclic collector held: in the whole suite a full
    # collection of the earlier tests' objects (0.3 s) once landed inside the refusal.
    gc.collect()
    gc.disable()
    try:
        started = time.thread_time()
        with pytest.raises(limits.AnalysisLimit):
            resolve(parsed, dataset)
        capped = time.thread_time() - started

        monkeypatch.setattr(limits, "MAX_EXPANDED_NODES", 10**12)
        counted = _counting_expansions(monkeypatch)
        started = time.thread_time()
        resolved = resolve(parsed, dataset)
        uncapped = time.thread_time() - started
    finally:
        gc.enable()
    (expansion,) = counted
    assert expansion.nodes > 6 * 20_000
    assert limits.nodes(resolved.tree) > 40_000  # the tree alone: twice the cap
    assert uncapped > 3 * capped


def test_a_wide_query_an_analyst_writes_is_answered(engine, monkeypatch):
    counted = _counting_expansions(monkeypatch)
    reply = engine.query("ann", {"sql": WIDE, "notebook": "wide"})
    assert len(reply["columns"]) == 11 and reply["rows"]
    assert _spent(engine, "ann", "wide") > 0
    # Hundreds of nodes, far under the cap.
    assert 300 < max(e.nodes for e in counted) < limits.MAX_EXPANDED_NODES // 20


def test_a_short_doubling_chain_is_still_answered(engine):
    """Two doublings of a 1,024-character column make 4,096 characters, the default
    ``max_text_length``; a third is refused for the text it could make, free."""
    reply = engine.query("ann", {"sql": chain(2), "notebook": "short"})
    assert reply["rows"]
    err, _ = _refused(engine, chain(3), notebook="short")
    assert "could make a text of up to 8,192 characters" in err.message


def test_an_exists_over_the_cap_is_refused_for_its_size(engine):
    """``resolve`` reads an EXISTS condition one way, then another, on a refusal: the
    cap's refusal must not be taken for a condition of the other kind."""
    ctes = chain(10).split(" SELECT COUNT(*)")[0]
    sql = (
        f"{ctes} SELECT COUNT(*) FROM patients AS p WHERE EXISTS (SELECT 1 FROM c10 "
        "WHERE c10.patient_id = p.patient_id AND c10.s = c10.s)"
    )
    err, _ = _refused(engine, sql)
    assert err.message.startswith(TOO_LARGE)


# -- the generated SQL's length ----------------------------------------------------------


def test_generated_sql_over_the_cap_is_refused_before_duckdb_reads_it(engine, monkeypatch):
    monkeypatch.setattr(limits, "MAX_GENERATED_CHARS", 200)
    vetted = []
    database = engine.databases["clinic"]
    monkeypatch.setattr(database, "vet", lambda sql: vetted.append(sql))
    err, _ = _refused(engine, "SELECT AVG(cost) AS a FROM visits", notebook="generated")
    assert err.message.startswith("the SQL generated for this query is longer than 200 ")
    assert vetted == []
    assert _spent(engine, "mallory", "generated") == 0.0


def test_generated_sql_cap_passes_real_queries(engine):
    analysis = engine.analysis(
        "ann", engine.policy.dataset("clinic"), _request(WIDE)
    )  # every pass, vet included
    assert len(analysis.rewritten.sql) < limits.MAX_GENERATED_CHARS // 4


# -- the deadline --------------------------------------------------------------------------


def test_past_the_deadline_a_query_is_refused_and_nothing_is_charged(engine, monkeypatch):
    monkeypatch.setattr(limits, "ANALYSIS_SECONDS", 0.0)
    err, _ = _refused(engine, "SELECT COUNT(*) AS n FROM visits", notebook="deadline")
    assert err.message.startswith("the analysis of this query took more than 0 s")
    assert "Nothing was charged" in err.message
    assert _spent(engine, "mallory", "deadline") == 0.0
    monkeypatch.undo()
    assert engine.query("mallory", {"sql": "SELECT COUNT(*) AS n FROM visits"})["rows"]


def test_the_deadline_stops_resolve_while_it_expands(engine, monkeypatch):
    """With the cap lifted (the broken version), 40 levels would never end; the
    deadline, looked at as ``resolve`` counts, refuses them within it."""
    monkeypatch.setattr(limits, "MAX_EXPANDED_NODES", 10**15)
    monkeypatch.setattr(limits, "ANALYSIS_SECONDS", 0.2)
    started = time.thread_time()
    err, _ = _refused(engine, chain(40), notebook="deadline-resolve")
    assert err.message.startswith("the analysis of this query took more than 0.2 s")
    assert time.thread_time() - started < 2.0
    assert _spent(engine, "mallory", "deadline-resolve") == 0.0


def test_the_deadline_counts_cpu_time_not_waiting(monkeypatch):
    """Other users' load (a thread waiting for the CPU or the GIL) does not bring
    a query's deadline closer: only its own CPU time counts."""
    monkeypatch.setattr(limits, "ANALYSIS_SECONDS", 0.05)
    with limits.deadline():
        time.sleep(0.2)
        limits.check_deadline()
        started = time.thread_time()
        while time.thread_time() - started < 0.1:
            pass
        with pytest.raises(limits.AnalysisLimit):
            limits.check_deadline()


def test_the_collectors_full_passes_are_left_off_the_clock(engine, monkeypatch):
    """A full pass of the garbage collector walks the whole heap, whatever the query;
    one that lands inside an analysis (forced here, over a heap made large) does not
    bring its deadline closer. The broken clock, the thread's plain CPU time, refuses
    the same query: a refusal that would follow from what else the process holds."""
    gc.disable()  # built without the passes its own growth would set off
    try:
        heap = [[i] for i in range(1_000_000)]  # a full pass over it takes 0.1 s or so
    finally:
        gc.enable()
    real_check = pipeline.check

    def check_then_collect(*args, **kwargs):
        gc.collect()
        return real_check(*args, **kwargs)

    gc.collect()  # frees what earlier tests left, which would make the pass timed below long
    started = time.thread_time()
    gc.collect()
    full_pass = time.thread_time() - started
    monkeypatch.setattr(pipeline, "check", check_then_collect)
    monkeypatch.setattr(limits, "ANALYSIS_SECONDS", full_pass / 2)
    sql = "SELECT COUNT(*) AS n FROM visits WHERE stay_days > {}"
    reply = engine.query("gc", {"sql": sql.format(1), "notebook": "gc", "dry_run": True})
    assert reply["plan"]
    monkeypatch.setattr(limits, "analysis_clock", time.thread_time)
    err, _ = _refused(engine, sql.format(2), notebook="gc-broken")
    assert err.message.startswith("the analysis of this query took more than")
    assert len(heap) == 1_000_000  # alive until here


def test_a_deadline_belongs_to_its_thread_and_the_outer_block(monkeypatch):
    monkeypatch.setattr(limits, "ANALYSIS_SECONDS", 0.0)
    seen = []
    with limits.deadline():
        monkeypatch.setattr(limits, "ANALYSIS_SECONDS", 100.0)
        with limits.deadline(), pytest.raises(limits.AnalysisLimit):  # the outer one holds
            limits.check_deadline()
        worker = threading.Thread(target=lambda: seen.append(limits.check_deadline()))
        worker.start()
        worker.join()
    assert seen == [None]
    limits.check_deadline()  # none outside


# -- the cache of analyses: per user, bounded in bytes ----------------------------------


def test_each_user_gets_their_own_analysis(engine, monkeypatch):
    """B's first query of a text A sent is analysed afresh, so its time says nothing
    about A; each user's repeat is served from their own entry."""
    calls = []
    real = engine._analysed_once

    def counting(dataset, request):
        calls.append(request.sql)
        return real(dataset, request)

    monkeypatch.setattr(engine, "_analysed_once", counting)
    sql = "SELECT department, COUNT(*) AS n FROM visits GROUP BY department"
    for user, expected in (("alice", 1), ("alice", 1), ("bob", 2), ("bob", 2), ("alice", 2)):
        engine.query(user, {"sql": sql, "notebook": "cache", "dry_run": True})
        assert len(calls) == expected, user


def test_an_entry_is_kept_at_its_estimated_size(engine):
    sql = "SELECT AVG(stay_days) AS a FROM visits WHERE cost > 5"
    before = engine._analyses.bytes
    analysis = engine.analysis("carol", engine.policy.dataset("clinic"), _request(sql))
    size = engine._analyses.bytes - before
    chars = len(analysis.rewritten.sql) + len(analysis.plan.checked.resolved.canonical)
    assert size == analysis_cache.BYTES_PER_CHAR * chars > 0


def test_the_byte_bound_evicts_the_least_recent():
    cache = AnalysisCache(entries=100, nbytes=1000, user_entries=100, user_bytes=1000)
    for key in "abcd":
        cache.put("u", key, key, 300)
    assert [cache.get("u", k) for k in "abcd"] == [None, "b", "c", "d"]
    assert cache.bytes == 900
    cache.get("u", "b")  # now the most recent
    cache.put("u", "e", "e", 300)
    assert [cache.get("u", k) for k in "bcde"] == ["b", None, "d", "e"]


def test_an_entry_over_a_users_share_is_not_kept():
    cache = AnalysisCache(entries=100, nbytes=10_000, user_entries=100, user_bytes=1000)
    cache.put("u", "huge", "value", 1001)
    assert cache.get("u", "huge") is None and cache.bytes == 0 and len(cache) == 0


def test_one_users_flood_evicts_only_their_own_entries():
    """Under the shared cache of old, B's distinct texts pushed A's entries out, so A
    could tell that B was busy; now B's quota binds first."""
    cache = AnalysisCache(entries=10, nbytes=10_000, user_entries=4, user_bytes=1000)
    for key in "xyz":
        cache.put("a", key, key, 100)
    for i in range(1000):
        cache.put("b", i, i, 100)
    assert [cache.get("a", k) for k in "xyz"] == ["x", "y", "z"]
    assert [cache.get("b", i) for i in range(996, 1000)] == [996, 997, 998, 999]
    assert len(cache) == 7 and cache.bytes == 700


def test_over_the_global_bound_the_largest_holder_loses_first():
    cache = AnalysisCache(entries=100, nbytes=1000, user_entries=100, user_bytes=600)
    cache.put("a", "x", "x", 300)
    for key in "pq":
        cache.put("b", key, key, 300)
    cache.put("c", "y", "y", 300)  # 1,200 bytes: b, holding the most, gives one up
    assert cache.get("a", "x") == "x" and cache.get("c", "y") == "y"
    assert [cache.get("b", k) for k in "pq"] == [None, "q"]
    assert cache.bytes == 900


def test_users_do_not_share_keys():
    cache = AnalysisCache()
    cache.put("a", ("d", "SELECT 1"), "a's", 10)
    assert cache.get("b", ("d", "SELECT 1")) is None
    assert cache.get("a", ("d", "SELECT 1")) == "a's"


# -- helpers -------------------------------------------------------------------------------


def _request(sql: str):
    from dpmagic.gate.request import QueryRequest

    return QueryRequest.from_body({"sql": sql})


def _counting_expansions(monkeypatch) -> list[limits.Expansion]:
    made: list[limits.Expansion] = []

    class Counted(limits.Expansion):
        def __init__(self) -> None:
            super().__init__()
            made.append(self)

    monkeypatch.setattr(resolve_module, "Expansion", Counted)
    return made


def test_the_rewrite_checks_the_deadline_per_aggregate(monkeypatch) -> None:
    """Hundreds of quantiles make the rewrite the longest pass (700 MEDIANs: 13 s on a
    loaded 2-core machine before its SQL was refused for its length): it checks the
    deadline for each, so a spent deadline stops it at the first; without the checks
    (the broken version) it runs through all 150."""
    from dpmagic.gate.sql import rewrite as rewrites
    from tests.gate_helpers import dataset, make_plan

    ds = dataset({"pid": {"type": "int"}, "x": {"type": "int", "lower": 0, "upper": 100}})
    sql = "SELECT " + ", ".join(f"MEDIAN(x + {i}) AS m{i}" for i in range(150)) + " FROM t"
    the_plan = make_plan(sql, ds)
    monkeypatch.setattr(limits, "ANALYSIS_SECONDS", 0.0)
    start = time.thread_time()
    with pytest.raises(limits.AnalysisLimit, match="took more than"), limits.deadline():
        rewrites.rewrite(the_plan, seed=3)
    stopped = time.thread_time() - start
    monkeypatch.setattr(rewrites, "check_deadline", lambda: None)
    start = time.thread_time()
    with limits.deadline():
        rewrites.rewrite(the_plan, seed=3)
    # Stopping still costs the work before the first quantile (about a twentieth of the
    # whole here, as that work grows with the aggregates too): five times is a margin.
    assert stopped * 5 < time.thread_time() - start
