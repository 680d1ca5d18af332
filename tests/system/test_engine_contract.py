"""The engine contract (``dpmagic/gate/engines/interface.py``), run against every engine
the registry knows: DuckDB under the ``system`` marker, Spark (``local[2]``) under
``spark``. An engine added to the registry is picked up by ``ENGINE_KINDS`` and must
pass the same checks before a dataset can name it:

* it is opened by the registry from a policy's dataset, with the interface's parts
  (a dialect profile, its versions, whether it answers in columns);
* the pipeline's generated SQL passes its vet, and its run gives the exact
  aggregates DuckDB computes on the raw source (the data fits the bounds, so no row
  is left out);
* what its guard must stop (an aggregate that returns row values) is refused by
  ``vet`` and by ``run`` alike, as a refusal (before any charge);
* a query past the timeout ends as ``OutOfResources``, and the store answers after;
* its versions are a function of the sources: reopened, the same; a changed source,
  new data version, the same policy version;
* ``public_facts`` gives the dataset back with its public keys, and ``close`` ends it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest

from dpmagic.gate.dp.accounting import make_accountant
from dpmagic.gate.engines.dialect import Dialect
from dpmagic.gate.engines.interface import ExactResult, OutOfResources, Store
from dpmagic.gate.engines.registry import ENGINES, open_store
from dpmagic.gate.engines.versions import Versions
from dpmagic.gate.failures import Refused
from dpmagic.gate.policy import EngineKind, Policy, parse_policy
from dpmagic.gate.sql.pipeline import Asked, analyse, generate
from tests.stores import answers_after, heavy

SEED = 20261126
UNITS = 400
# Each engine's own marker: DuckDB's store runs with the system suites, Spark's needs
# Java and a local Spark, with the spark suite.
MARKS = {EngineKind.DUCKDB: pytest.mark.system, EngineKind.SPARK: pytest.mark.spark}
ENGINE_KINDS = [pytest.param(kind, marks=MARKS[kind], id=kind.value) for kind in ENGINES]

# Every unit has one or two rows, in different groups: within the bounds (2 and 2), so
# the exact aggregates equal the raw source's.
SOURCE = f"""
    SELECT i AS pid, (i * 7) % 31 AS stay, (i + j) % 3 AS kind
    FROM range({UNITS}) t(i), range(2) u(j) WHERE j <= i % 2"""
QUERIES = {
    "SELECT COUNT(*) FROM visits": "SELECT COUNT(*) FROM src",
    "SELECT kind, COUNT(*) AS n, SUM(stay) AS s FROM visits GROUP BY kind":
        "SELECT kind, COUNT(*), SUM(stay) FROM src GROUP BY kind",
    "SELECT kind, COUNT(DISTINCT pid) AS u FROM visits WHERE stay > 10 GROUP BY kind":
        "SELECT kind, COUNT(DISTINCT pid) FROM src WHERE stay > 10 GROUP BY kind",
}  # fmt: skip


def _write(path: Path, sql: str) -> None:
    con = duckdb.connect()
    con.execute(f"COPY ({sql}) TO '{path}' (FORMAT parquet)")
    con.close()


def _policy(folder: Path, kind: EngineKind, timeout_s: float = 30.0) -> Policy:
    dataset: dict[str, object] = {
        "sources": {"visits": str(folder / "visits.parquet")},
        "privacy_unit": "pid",
        "max_partitions": 2,
        "max_rows_per_partition": 2,
        "user_budget": {"epsilon": 1e6},
        "engine": kind.value,
        "tables": {
            "visits": {
                "columns": {
                    "pid": {"type": "int"},
                    "stay": {"type": "int", "lower": 0, "upper": 30},
                    "kind": {"type": "int", "public_values": [0, 1, 2]},
                }
            }
        },
    }
    if kind is EngineKind.SPARK:
        dataset["spark"] = {"master": "local[2]"}
    raw = {
        "gate": {"state_dir": str(folder / "state"), "query_timeout_s": timeout_s},
        "datasets": {"v": dataset},
    }
    return parse_policy(raw, folder / "policy.toml")


@pytest.fixture(params=ENGINE_KINDS)
def kind(request: pytest.FixtureRequest) -> EngineKind:
    if request.param is EngineKind.SPARK:
        pytest.importorskip("pyspark", reason="the spark extra is not installed")
    return request.param


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    _write(tmp_path / "visits.parquet", SOURCE)
    return tmp_path


@pytest.fixture
def store(folder: Path, kind: EngineKind) -> Iterator[Store]:
    policy = _policy(folder, kind)
    opened = open_store(policy.dataset("v"), policy.gate)
    try:
        yield opened
    finally:
        opened.close()


def _exact(store: Store, folder: Path, sql: str) -> list[tuple]:
    policy = _policy(folder, EngineKind.DUCKDB)
    dataset = store.public_facts(policy.dataset("v"))
    plan = analyse(Asked(sql, {}, 1.0, 0.0), dataset, make_accountant(dataset.accountant))
    result = store.run(generate(plan, SEED, store).rewritten.sql)
    assert isinstance(result, ExactResult)
    return result.rows


def _canonical(rows: list[tuple]) -> list[tuple]:
    return sorted(tuple(int(v) if v is not None else None for v in row) for row in rows)


def test_the_registry_has_an_engine_for_every_kind_a_policy_can_name() -> None:
    assert set(ENGINES) == set(EngineKind)


def test_a_store_has_the_interfaces_parts(store: Store) -> None:
    assert isinstance(store.dialect, Dialect)
    assert isinstance(store.versions, Versions)
    assert isinstance(store.columnar, bool)


def test_generated_sql_is_vetted_and_gives_the_exact_aggregates(store: Store, folder: Path) -> None:
    raw = duckdb.connect()
    raw.execute(f"CREATE TABLE src AS {SOURCE}")
    for sql, reference in QUERIES.items():
        expected = raw.execute(reference).fetchall()
        found = _exact(store, folder, sql)
        # The engine's rows carry the measurements in the plan's order after the keys;
        # the reference has one column per measurement the plan keeps of the query.
        width = len(expected[0])
        assert _canonical([row[:width] for row in found]) == _canonical(expected), sql


def test_what_the_guard_must_stop_is_refused_by_vet_and_by_run(store: Store) -> None:
    for sql in ("SELECT array_agg(stay) FROM visits", "SELECT 1; SELECT 2"):
        with pytest.raises(Refused):
            store.vet(sql)
        with pytest.raises(Refused):
            store.run(sql)


def test_a_query_past_the_timeout_is_out_of_resources_and_the_store_answers_after(
    folder: Path, kind: EngineKind
) -> None:
    policy = _policy(folder, kind, timeout_s=1.0)
    store = open_store(policy.dataset("v"), policy.gate)
    try:
        started = time.monotonic()
        with pytest.raises(OutOfResources):
            store.run(heavy("stay"))
        assert time.monotonic() - started < 20
        assert answers_after(store, "SELECT COUNT(*) FROM visits") == [(UNITS * 3 // 2,)]
    finally:
        store.close()


def test_versions_follow_the_sources_and_the_policy(folder: Path, kind: EngineKind) -> None:
    def opened() -> Versions:
        policy = _policy(folder, kind)
        store = open_store(policy.dataset("v"), policy.gate)
        try:
            return store.versions
        finally:
            store.close()

    first, again = opened(), opened()
    assert first == again
    source = folder / "visits.parquet"
    _write(source, SOURCE.replace("% 31", "% 29"))
    os.utime(source, ns=(time.time_ns(), time.time_ns() + 1_000_000))
    changed = opened()
    assert changed.data != first.data
    assert changed.policy({"visits"}) == first.policy({"visits"})


def test_public_facts_keep_the_dataset_and_close_ends_the_store(
    folder: Path, kind: EngineKind
) -> None:
    policy = _policy(folder, kind)
    store = open_store(policy.dataset("v"), policy.gate)
    facts = store.public_facts(policy.dataset("v"))
    assert facts.name == "v"
    assert facts.tables["visits"].columns["kind"].public_values == (0, 1, 2)
    store.close()
