"""Spark as a dataset's engine, on a real Spark (``local[2]``): marker ``spark``.

* **Same answers**: the golden cases (four policies), the shared accept corpus and
  queries over every construct the Spark profile rewrites, run on a DuckDB store
  and a Spark store over the same Parquet files, must give the same exact rows
  before noise, or be refused by Spark (before any charge) with the reason. The
  data's units fit the bounds, so no row is left out on either engine (which
  rows a unit keeps past its bounds depends on each engine's keyed hash).
* **Kept rows do not depend on partitioning**: the preparation of data whose units
  exceed the bounds gives the same ranks from one partition or seven, and a
  partial order (the broken version) does not.
* The guard, the timeout, the prepared tables' reuse, and why a refused
  expression is refused (ANSI mode raises on it: a data-dependent failure).
* A real gate process serving a Spark dataset over its socket.
"""

from __future__ import annotations

import re
import shutil
import time
from collections import Counter
from pathlib import Path

import duckdb
import pytest
from sqlglot import exp

pyspark = pytest.importorskip("pyspark", reason="the spark extra is not installed")

from dpmagic.client.errors import QueryRefused  # noqa: E402
from dpmagic.client.http_gate import Gate  # noqa: E402
from dpmagic.gate.dp.accounting import make_accountant  # noqa: E402
from dpmagic.gate.engines.duckdb.database import Database  # noqa: E402
from dpmagic.gate.engines.interface import OutOfResources  # noqa: E402
from dpmagic.gate.engines.spark.database import SparkDatabase  # noqa: E402
from dpmagic.gate.engines.spark.dialect import SPARK  # noqa: E402
from dpmagic.gate.engines.spark.guard import UnsafeSparkSQL  # noqa: E402
from dpmagic.gate.engines.spark.prepare import prepared_frame  # noqa: E402
from dpmagic.gate.failures import Failed  # noqa: E402
from dpmagic.gate.policy import Dataset, PolicyError, parse_policy  # noqa: E402
from dpmagic.gate.sql import engine_rows  # noqa: E402
from dpmagic.gate.sql.aggregates.registry import CATALOGUE  # noqa: E402
from dpmagic.gate.sql.clip import ClipBounds, ClipStage  # noqa: E402
from dpmagic.gate.sql.engine_rows import NotOnSpark  # noqa: E402
from dpmagic.gate.sql.pipeline import Asked, analyse, generate  # noqa: E402
from dpmagic.gate.sql.resolve import Resolved  # noqa: E402
from dpmagic.gate.sql.rewrite import rewrite  # noqa: E402
from dpmagic.gate.sql.totality import generated  # noqa: E402
from tests import shop  # noqa: E402
from tests.conftest import GateProcess  # noqa: E402
from tests.golden.run import HERE as GOLDEN  # noqa: E402
from tests.golden.run import cases  # noqa: E402
from tests.sql_grammar import AGGREGATE_SQL  # noqa: E402
from tests.stores import answers_after, heavy  # noqa: E402

pytestmark = pytest.mark.spark

SHARED = Path(__file__).resolve().parents[3] / "shared"
SEED = 20261124
MASTER = {"master": "local[2]"}

# The clinic's tables, every patient with 1 to 4 visits (the bounds are 4 and 4);
# values past the declared bounds, NULLs and mixed-case text on purpose.
CLINIC_SQL = {
    "patients": """
        SELECT i AS patient_id, (i * 37) % 101 AS age, ['F', 'M'][1 + i % 2] AS sex,
               ['CA', 'TX', 'NY'][1 + i % 3] AS state, i % 2 AS smoker
        FROM range(1, 301) t(i)""",
    "visits": """
        SELECT i AS patient_id, 2019 + (i + j) % 3 AS year,
               ['primary care', 'cardiology', 'oncology'][1 + (i * j) % 3] AS department,
               CASE WHEN (i + j) % 7 = 0 THEN NULL
                    ELSE ['alpha', 'Beta', 'gamma ray', 'Alpha%', ''][1 + (i + 2 * j) % 5] END
                 AS note,
               ((i * 131 + j * 17) % 52001) * 1.25 - 100 AS cost,
               (i + 3 * j) % 35 AS stay_days,
               DATE '2018-11-01' + ((i * 7 + j * 31) % 1300)::INT AS seen
        FROM range(1, 301) t(i), range(0, 4) u(j) WHERE j <= i % 4""",
    "regions": """
        SELECT * FROM (VALUES ('CA', 'west'), ('TX', 'south'), ('NY', 'east')) v(state, region)""",
    "answers": """
        SELECT 10 + (i * 13) % 100 AS age, (i * 7919) % 1200000 * 1.0 AS income,
               ['north', 'south'][1 + i % 2] AS region
        FROM range(500) t(i)""",
}
# Queries over each construct the Spark profile renders or rewrites (clinic policy).
CONSTRUCTS = [
    "SELECT COUNT(*) FROM visits WHERE TRY_CAST(cost AS INT) > 20000",
    "SELECT COUNT(*) FROM visits WHERE TRY_CAST(cost AS SMALLINT) IS NULL",
    "SELECT COUNT(*) FROM visits WHERE LENGTH(note) > 4",
    "SELECT COUNT(*) FROM visits WHERE LOWER(note) LIKE 'a%'",
    "SELECT COUNT(*) FROM visits WHERE note ILIKE 'ALPHA%'",
    "SELECT COUNT(*) FROM visits WHERE UPPER(TRIM(note)) = 'GAMMA RAY'",
    "SELECT COUNT(*) FROM visits WHERE SUBSTRING(note, 2, 3) = 'lph'",
    "SELECT COUNT(*) FROM visits WHERE LEFT(note, 1) = 'g' OR RIGHT(note, 2) = 'ta'",
    "SELECT COUNT(*) FROM visits WHERE note || '!' = 'Beta!'",
    "SELECT COUNT(*) FROM visits WHERE COALESCE(note, 'none') = 'none'",
    "SELECT SUM(ABS(stay_days - 10)) FROM visits",
    "SELECT SUM((stay_days - 20) // 3) AS q, SUM((stay_days - 20) % 3) AS r FROM visits",
    "SELECT SUM(stay_days * 2 - 1) FROM visits WHERE stay_days BETWEEN 3 AND 20",
    "SELECT SUM(GREATEST(stay_days, 5)), SUM(LEAST(stay_days, 5)) FROM visits",
    "SELECT SUM(ROUND(cost, -2)) AS c FROM visits",
    "SELECT SUM(ROUND(cost / 3, 1)) AS c FROM visits",
    "SELECT SUM(NULLIF(stay_days, 4)) FROM visits",
    "SELECT SUM(CASE WHEN department IN ('oncology', 'cardiology') THEN 1 ELSE 0 END) FROM visits",
    "SELECT year, AVG(cost) AS c FROM visits GROUP BY year",
    "SELECT department, VAR_POP(stay_days) AS v FROM visits GROUP BY department",
    "SELECT MONTH(seen) AS m, COUNT(*) FROM visits GROUP BY MONTH(seen)",
    "SELECT QUARTER(seen) AS q, DAYOFYEAR(seen) > 100 AS late, COUNT(*) FROM visits "
    "GROUP BY q, late",
    "SELECT COUNT(*) FROM visits WHERE seen BETWEEN DATE '2019-06-01' AND DATE '2020-06-01'",
    "SELECT COUNT(*) FROM visits WHERE EXTRACT(year FROM seen) = 2020 AND DAY(seen) < 10",
    "SELECT COUNT(DISTINCT department) FROM visits",
    "SELECT sex, SUM(age) FROM patients WHERE age > 40 GROUP BY sex",
    "SELECT p.state, SUM(v.stay_days) FROM patients p JOIN visits v "
    "ON v.patient_id = p.patient_id GROUP BY p.state",
    "SELECT COUNT(*) FROM patients p WHERE NOT EXISTS "
    "(SELECT 1 FROM visits v WHERE v.patient_id = p.patient_id AND v.year = 2021)",
    "SELECT department, COUNT(*) AS n FROM visits WHERE stay_days > 2 GROUP BY department",
    "SELECT SUM(stay_days) / COUNT(*) AS r FROM visits",
]


def _write_parquet(folder: Path) -> dict[str, Path]:
    folder.mkdir(parents=True, exist_ok=True)
    con = duckdb.connect()
    paths = {}
    for name, sql in CLINIC_SQL.items():
        paths[name] = folder / f"{name}.parquet"
        con.execute(f"COPY ({sql}) TO '{paths[name]}' (FORMAT parquet)")
    con.close()
    return paths


def _golden_raw(policy: str, paths: dict[str, Path]) -> tuple[str, dict]:
    import tomllib

    raw = tomllib.loads((GOLDEN / "policies" / f"{policy}.toml").read_text())
    ((name, dataset),) = raw["datasets"].items()
    dataset["sources"] = {t: str(paths[t]) for t in dataset["sources"]}
    return name, dataset


def _stores(
    tmp: Path, name: str, dataset: dict
) -> tuple[Dataset, Database, Dataset, SparkDatabase]:
    raw = {
        "gate": {"state_dir": str(tmp / "state")},
        "datasets": {
            name: dataset,
            name + "_spark": {**dataset, "engine": "spark", "spark": MASTER},
        },
    }
    policy = parse_policy(raw, tmp / "policy.toml")
    duck, spark = policy.dataset(name), policy.dataset(name + "_spark")
    duck_store, spark_store = Database(duck, policy.gate), SparkDatabase(spark, policy.gate)
    # As the engine does at start: public tables' keys, sizes and repeats (``sql/work.py``).
    return duck_store.public_facts(duck), duck_store, spark_store.public_facts(spark), spark_store


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return _write_parquet(tmp_path_factory.mktemp("spark-data"))


def _exact(
    sql: str, dataset: Dataset, store, delta: float, clip: ClipStage | None = None
) -> list[tuple]:
    """The exact rows the store returns for the gate's SQL of ``sql`` (of its ``clip``
    stage's release, if given)."""
    accountant = make_accountant(dataset.accountant)
    the_plan = analyse(Asked(sql, {}, 1e6, delta, clip=clip), dataset, accountant)
    return store.run(generate(the_plan, SEED, store).rewritten.sql).rows


def _same(a: list[tuple], b: list[tuple]) -> bool:
    """Equal as multisets of rows (the engines order rows, and a histogram's entries,
    as they like)."""

    def canonical(row: tuple) -> str:
        return repr(tuple(sorted(v.items()) if isinstance(v, dict) else v for v in row))

    return Counter(map(canonical, a)) == Counter(map(canonical, b))


def _agreement(tmp: Path, policy: str, queries: list[str], paths: dict[str, Path]) -> Counter:
    name, dataset = _golden_raw(policy, paths)
    duck, duck_store, spark, spark_store = _stores(tmp / policy, name, dataset)
    delta = duck.user_budget.delta / 100 if duck.user_budget.delta else 0.0
    tally: Counter = Counter()
    try:
        for sql in queries:
            expected = _exact(sql, duck, duck_store, delta)
            try:
                found = _exact(sql, spark, spark_store, delta)
            except NotOnSpark as refused:
                tally["refused: " + str(refused).split("cannot answer ", 1)[1][:40]] += 1
                continue
            assert _same(found, expected), (sql, found, expected)
            tally["same"] += 1
    finally:
        duck_store.close()
    return tally


def test_golden_cases_and_constructs_give_the_same_exact_rows_on_spark_and_duckdb(
    tmp_path: Path, data: dict[str, Path]
) -> None:
    by_policy: dict[str, list[str]] = {}
    for case in cases():
        by_policy.setdefault(case.policy, []).append(case.sql)
    by_policy["clinic"] += CONSTRUCTS
    tally: Counter = Counter()
    for policy, queries in by_policy.items():
        tally += _agreement(tmp_path, policy, queries, data)
    print("\nSpark against DuckDB (golden cases and constructs):", dict(tally))
    refused = sum(n for k, n in tally.items() if k.startswith("refused"))
    assert tally["same"] + refused == sum(len(q) for q in by_policy.values())
    assert refused == 1, tally  # ROUND(cost, -2): DuckDB answers it under TRY


def test_every_kind_of_the_aggregate_catalogue_gives_the_same_exact_rows(
    tmp_path: Path, data: dict[str, Path]
) -> None:
    """The catalogue's contract on Spark: every node type it registers, in every spelling
    ``tests/sql_grammar.AGGREGATE_SQL`` writes, gives the same exact rows before noise
    on Spark as on DuckDB (whose released values ``tests/unit/test_aggregate_catalogue``
    checks)."""
    calls = [
        re.sub(r"\bX\b", "age", t).format(q=0.25) for node in CATALOGUE for t in AGGREGATE_SQL[node]
    ]
    queries = [f"SELECT sex, {call} AS v FROM patients GROUP BY sex" for call in calls]
    tally = _agreement(tmp_path, "clinic", queries, data)
    print("\nSpark against DuckDB (the aggregate catalogue):", dict(tally))
    assert tally == Counter(same=len(queries)), tally


@pytest.mark.skipif(not (SHARED / "corpus").exists(), reason="../shared is not beside the repo")
def test_the_shared_accept_corpus_gives_the_same_exact_rows(tmp_path: Path) -> None:
    dataset = {
        "sources": {"pums": str(SHARED / "data" / "PUMS_dup.csv")},
        "privacy_unit": "pid",
        "max_partitions": 4,  # every person has at most 4 rows: nothing is left out
        "max_rows_per_partition": 4,
        "user_budget": {"epsilon": 1e7},
        "tables": {
            "pums": {
                "columns": {
                    "pid": {"type": "int"},
                    "age": {"type": "int", "lower": 0, "upper": 100},
                    "sex": {"type": "int", "public_values": [0, 1]},
                    "educ": {"type": "int", "public_values": list(range(1, 17))},
                    "race": {"type": "int", "public_values": list(range(1, 7))},
                    "income": {"type": "int", "lower": 0, "upper": 500000},
                    "married": {"type": "int", "public_values": [0, 1]},
                }
            }
        },
    }
    duck, duck_store, spark, spark_store = _stores(tmp_path, "pums", dataset)
    tally: Counter = Counter()
    for sql in (SHARED / "corpus" / "accept.sql").read_text().splitlines():
        if not sql.strip():
            continue
        expected = _exact(sql, duck, duck_store, 0.0)
        try:
            found = _exact(sql, spark, spark_store, 0.0)
        except NotOnSpark:
            tally["refused"] += 1
            continue
        assert _same(found, expected), (sql, found, expected)
        tally["same"] += 1
    duck_store.close()
    print("\nSpark against DuckDB (accept corpus):", dict(tally))
    assert tally == Counter(same=20), tally


# Joins along the shop's chain of links (lineitem → orders → customer).
SHOP_QUERIES = [
    "SELECT l_flag, COUNT(*), SUM(l_quantity) FROM lineitem GROUP BY l_flag",
    "SELECT o_priority, SUM(l_price) FROM lineitem JOIN orders ON l_orderkey = o_orderkey "
    "GROUP BY o_priority",
    "SELECT c_segment, COUNT(*) FROM lineitem JOIN orders ON l_orderkey = o_orderkey "
    "JOIN customer ON o_custkey = c_custkey GROUP BY c_segment",
    "SELECT COUNT(*) FROM orders WHERE EXISTS (SELECT * FROM lineitem "
    "WHERE l_orderkey = o_orderkey AND l_flag = 'R')",
    # TPC-H query 21's shape: EXISTS comparing an order's lines with the query's line.
    "SELECT l1.l_flag, COUNT(*) FROM lineitem l1, orders WHERE o_orderkey = l1.l_orderkey "
    "AND EXISTS (SELECT * FROM lineitem l2 WHERE l2.l_orderkey = l1.l_orderkey "
    "AND l2.l_partkey <> l1.l_partkey) AND NOT EXISTS (SELECT * FROM lineitem l3 "
    "WHERE l3.l_orderkey = l1.l_orderkey AND l3.l_partkey <> l1.l_partkey "
    "AND l3.l_quantity > 25) GROUP BY l1.l_flag",
    "SELECT o_priority, COUNT(*) FROM orders LEFT JOIN lineitem ON l_orderkey = o_orderkey "
    "AND l_flag = 'A' GROUP BY o_priority",
    # Per person: a histogram of orders per customer, and TPC-H query 13's shape.
    "SELECT n, COUNT(*) FROM (SELECT o_custkey, COUNT(*) AS n FROM orders GROUP BY o_custkey) "
    "AS per GROUP BY n",
    "SELECT c_count, COUNT(*) FROM (SELECT c_custkey, COUNT(o_orderkey) AS c_count, "
    "SUM(o_total) AS spent FROM customer LEFT JOIN orders ON c_custkey = o_custkey "
    "GROUP BY c_custkey) AS c WHERE spent > 100 GROUP BY c_count",
    # Per order, and per person and a column the person fixes (resolve.PerUnit's keys).
    "SELECT n, COUNT(*) FROM (SELECT l_orderkey, COUNT(*) AS n FROM lineitem "
    "GROUP BY l_orderkey) AS per GROUP BY n",
    "SELECT c_segment, AVG(n) FROM (SELECT c_custkey, c_segment, COUNT(*) AS n FROM orders "
    "JOIN customer ON o_custkey = c_custkey GROUP BY c_custkey, c_segment) AS per "
    "GROUP BY c_segment",
    # A correlated subquery's two stages (sql/staged.py): its release per key, then the
    # query reading each row's key's released value.
    "SELECT l2.l_flag, AVG(l2.l_price) AS value FROM lineitem AS l2 GROUP BY l2.l_flag",
    "SELECT COUNT(*) AS n FROM lineitem AS l1 WHERE l_price > CASE WHEN l1.l_flag = 'A' "
    "THEN 400.5 WHEN l1.l_flag = 'N' THEN 500.5 END",
]


def _shop(tmp: Path, repeat_a_key: bool = False) -> dict:
    """The shop's tables as Parquet and its policy with them as sources; bounds wide
    enough that no customer's rows are left out on either engine."""
    import tomllib

    tmp.mkdir(parents=True, exist_ok=True)
    shop.build(tmp / "shop.duckdb", keys=not repeat_a_key)
    con = duckdb.connect(str(tmp / "shop.duckdb"))
    if repeat_a_key:
        con.execute("INSERT INTO orders SELECT * FROM orders LIMIT 1")
    raw = tomllib.loads(shop.policy_text(tmp / "shop.duckdb", tmp / "state"))
    dataset = raw["datasets"]["shop"]
    del dataset["database"]
    dataset["max_rows_per_partition"] = 30
    dataset["sources"] = {}
    for name in ("customer", "orders", "lineitem", "part"):
        path = tmp / f"{name}.parquet"
        con.execute(f"COPY {name} TO '{path}' (FORMAT parquet)")
        dataset["sources"][name] = str(path)
    con.close()
    return dataset


def test_links_along_keys_give_the_same_exact_rows_on_spark(tmp_path: Path) -> None:
    duck, duck_store, spark, spark_store = _stores(tmp_path, "shop", _shop(tmp_path / "d"))
    try:
        for sql in SHOP_QUERIES:
            found = _exact(sql, spark, spark_store, 0.0)
            assert _same(found, _exact(sql, duck, duck_store, 0.0)), sql
            assert found, sql
    finally:
        duck_store.close()


def test_the_clips_first_release_gives_the_same_exact_rows_on_spark(tmp_path: Path) -> None:
    """``--clip``'s first release along the shop's links: each summed argument's
    candidates and the rows each person brings (one value a person,
    ``rewrite._unit_rows``, in a CTE of its own on Spark), counted alike."""
    duck, duck_store, spark, spark_store = _stores(tmp_path, "shop", _shop(tmp_path / "d"))
    try:
        for sql in SHOP_QUERIES[:3]:
            found = _exact(sql, spark, spark_store, 0.0, ClipBounds())
            assert _same(found, _exact(sql, duck, duck_store, 0.0, ClipBounds())), sql
            (row,) = found
            assert isinstance(row[-1], dict) and row[-1], sql  # rows per person: the last histogram
    finally:
        duck_store.close()


def test_public_reads_and_released_rests_give_duckdbs_rows_on_spark(tmp_path: Path) -> None:
    """A plain read of public tables, and the rest of a query over what it released
    first (``sql/released_tables.py``, here over rows given as released), rendered in
    each engine's dialect from the one vetted tree: the same rows on both."""
    from dpmagic.gate.public_reads import public_read, released_read
    from dpmagic.gate.sql.parse import parse
    from dpmagic.gate.sql.released_tables import tabled

    raw = {**_shop(tmp_path / "d"), "public_tables_readable": True}
    _duck, duck_store, spark, spark_store = _stores(tmp_path, "shop", raw)
    try:
        reads = [
            public_read(sql, {}, spark)
            for sql in (
                "SELECT p_brand, COUNT(*) AS n, MAX(p_partkey) AS top FROM part GROUP BY p_brand",
                "SELECT p_partkey FROM part WHERE p_brand LIKE 'Brand#1%' ORDER BY p_partkey",
            )
        ]
        found = tabled(parse(PER_PART_REST).tree, spark)
        assert found is not None
        rest = found.filled([[[1, 9.5], [2, 1.5], [3, None]]])
        reads.append(released_read(rest, spark, found.public))
        for read in reads:
            assert read is not None
            on_spark = spark_store.read_public(read)
            on_duck = duck_store.read_public(read)
            assert on_spark[0] == on_duck[0] and _same(on_spark[1], on_duck[1]), read.tree
            assert on_spark[1], read.tree
    finally:
        duck_store.close()


PER_PART_REST = (
    "SELECT p_brand, COUNT(*) AS n FROM part WHERE p_partkey < "
    "(SELECT AVG(l_quantity) FROM lineitem WHERE l_partkey = p_partkey) GROUP BY p_brand"
)


def test_a_repeated_key_refuses_the_spark_start_naming_no_value(tmp_path: Path) -> None:
    raw = {
        "gate": {"state_dir": str(tmp_path / "state")},
        "datasets": {"shop": {**_shop(tmp_path / "d", True), "engine": "spark", "spark": MASTER}},
    }
    policy = parse_policy(raw, tmp_path / "policy.toml")
    with pytest.raises(PolicyError) as info:
        SparkDatabase(policy.dataset("shop"), policy.gate)
    assert "lineitem.l_orderkey links to orders.o_orderkey" in str(info.value)
    assert "not a key" in str(info.value)


def _visits(tmp: Path, name: str, rows: int = 600) -> dict:
    """A dataset whose units exceed the bounds: patients with up to 12 visits, bounds 2/2."""
    con = duckdb.connect()
    path = tmp / f"{name}.parquet"
    con.execute(
        f"COPY (SELECT i % 50 AS patient_id, (i * 7) % 31 AS stay_days, i % 3 AS kind "
        f"FROM range({rows}) t(i)) TO '{path}' (FORMAT parquet)"
    )
    return {
        "sources": {"visits": str(path)},
        "privacy_unit": "patient_id",
        "max_partitions": 2,
        "max_rows_per_partition": 2,
        "user_budget": {"epsilon": 1.0},
        "engine": "spark",
        "spark": MASTER,
        "tables": {
            "visits": {
                "columns": {
                    "patient_id": {"type": "int"},
                    "stay_days": {"type": "int", "lower": 0, "upper": 30},
                    "kind": {"type": "int", "public_values": [0, 1, 2]},
                }
            }
        },
    }


def _one(tmp: Path) -> dict:
    """A policy (as parsed TOML) of the ``_visits`` dataset alone, named ``v``."""
    return {"gate": {"state_dir": str(tmp / "state")}, "datasets": {"v": _visits(tmp, "v")}}


def test_kept_rows_do_not_change_when_the_data_is_repartitioned(tmp_path: Path) -> None:
    from pyspark.sql import SparkSession, Window
    from pyspark.sql import functions as F

    raw = {"datasets": {"v": _visits(tmp_path, "v")}}
    dataset = parse_policy(raw, tmp_path / "p.toml").dataset("v")
    spark = SparkSession.builder.master("local[2]").getOrCreate()
    source = spark.read.parquet(str(tmp_path / "v.parquet"))
    table = dataset.tables["visits"]

    def ranks(frame, seed: int) -> list[tuple]:
        return sorted(tuple(r) for r in prepared_frame(frame, dataset, table, seed).collect())

    one = ranks(source.coalesce(1), 11)
    assert one == ranks(source.repartition(7, F.rand(3)), 11)
    assert one == ranks(source.repartition(3, "stay_days").sortWithinPartitions("kind"), 11)
    assert one != ranks(source.coalesce(1), 12)  # the seed does choose the rows

    # The broken version: ranks in an order with ties (by stay_days alone) do move.
    def partial(frame) -> list[tuple]:
        order = Window.partitionBy("patient_id").orderBy("kind")
        ranked = frame.withColumn("r", F.row_number().over(order))
        return sorted(tuple(r) for r in ranked.collect())

    assert partial(source.coalesce(1)) != partial(source.repartition(7, F.rand(3)))


def test_prepared_tables_are_reused_until_the_policy_or_the_sources_change(
    tmp_path: Path,
) -> None:
    raw = {
        "gate": {"state_dir": str(tmp_path / "state")},
        "datasets": {"v": _visits(tmp_path, "v")},
    }
    policy = parse_policy(raw, tmp_path / "p.toml")
    first = SparkDatabase(policy.dataset("v"), policy.gate)
    folder = Path(first.locations["visits"]).parent
    written = [folder, *folder.rglob("*")]
    assert any(p.suffix == ".parquet" for p in written)
    # A copy of the private data: the gate's alone, whatever Spark's umask made it.
    for path in (folder.parent, *written):
        assert path.stat().st_mode & 0o777 == (0o700 if path.is_dir() else 0o600), path
    made = folder.stat().st_mtime_ns
    next(p for p in written if p.suffix == ".parquet").chmod(0o644)
    started = time.monotonic()
    again = SparkDatabase(policy.dataset("v"), policy.gate)
    reuse_s = time.monotonic() - started
    assert again.locations == first.locations and folder.stat().st_mtime_ns == made
    assert all(p.stat().st_mode & 0o077 == 0 for p in written)  # made private at reuse too
    raw["datasets"]["v"]["max_rows_per_partition"] = 3
    changed = parse_policy(raw, tmp_path / "p.toml")
    other = SparkDatabase(changed.dataset("v"), changed.gate)
    assert Path(other.locations["visits"]).parent != folder
    assert not folder.exists()  # the older copy of the private data is gone
    print(f"\nreusing prepared tables: {reuse_s:.1f} s")
    assert (
        folder.parent.stat().st_mode & 0o077
    ) == 0 or folder.parent.parent.stat().st_mode & 0o077 == 0


def test_a_table_of_max_rows_is_not_served_on_spark(tmp_path: Path, monkeypatch) -> None:
    """As on DuckDB: the plan's proofs that a sum cannot overflow assume fewer than
    ``MAX_ROWS`` rows in every table (here lowered to the table's 600)."""
    from dpmagic.gate.engines import interface

    policy = parse_policy(_one(tmp_path), tmp_path / "p.toml")
    monkeypatch.setattr(interface, "MAX_ROWS", 601)
    assert SparkDatabase(policy.dataset("v"), policy.gate).run("SELECT COUNT(*) FROM visits")
    monkeypatch.setattr(interface, "MAX_ROWS", 600)
    with pytest.raises(PolicyError, match="table 'visits' has 600 rows or more"):
        SparkDatabase(policy.dataset("v"), policy.gate)


def test_a_catalog_table_is_a_source_and_new_files_in_it_prepare_it_anew(tmp_path: Path) -> None:
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.master("local[2]").getOrCreate()
    raw = _one(tmp_path)
    frame = spark.read.parquet(str(tmp_path / "v.parquet"))
    lake = tmp_path / "lake"
    spark.sql(f"CREATE DATABASE IF NOT EXISTS dpm_lake LOCATION '{lake}'")
    table = frame.write.mode("overwrite").option("path", str(lake / "visits"))
    table.saveAsTable("dpm_lake.visits")
    raw["datasets"]["v"]["sources"] = {"visits": "table:dpm_lake.visits"}
    policy = parse_policy(raw, tmp_path / "p.toml")
    store = SparkDatabase(policy.dataset("v"), policy.gate)
    assert store.run("SELECT COUNT(*) FROM visits").rows == [(600,)]
    folder = Path(store.locations["visits"]).parent
    frame.limit(100).write.mode("append").saveAsTable("dpm_lake.visits")
    again = SparkDatabase(policy.dataset("v"), policy.gate)
    assert Path(again.locations["visits"]).parent != folder
    assert again.run("SELECT COUNT(*) FROM visits").rows == [(700,)]
    spark.sql("DROP DATABASE dpm_lake CASCADE")


def test_two_spark_datasets_with_tables_of_one_name_each_read_their_own(tmp_path: Path) -> None:
    raw = _one(tmp_path)
    raw["datasets"]["w"] = _visits(tmp_path, "w", rows=420)
    policy = parse_policy(raw, tmp_path / "p.toml")
    v = SparkDatabase(policy.dataset("v"), policy.gate)
    w = SparkDatabase(policy.dataset("w"), policy.gate)
    assert v.run("SELECT COUNT(*) FROM visits").rows == [(600,)]
    assert w.run("SELECT COUNT(*) FROM visits").rows == [(420,)]


def test_a_query_past_the_timeout_is_stopped_and_the_session_answers_after(
    tmp_path: Path,
) -> None:
    raw = _one(tmp_path)
    raw["gate"]["query_timeout_s"] = 1.0
    policy = parse_policy(raw, tmp_path / "p.toml")
    store = SparkDatabase(policy.dataset("v"), policy.gate)
    started = time.monotonic()
    with pytest.raises(OutOfResources):
        store.run(heavy("stay_days"))  # seconds of work, none the optimiser can rule out
    assert time.monotonic() - started < 20
    assert answers_after(store, "SELECT COUNT(*) FROM visits") == [(600,)]


def test_the_guard_stops_sql_that_spark_itself_would_run(tmp_path: Path) -> None:
    raw = {
        "gate": {"state_dir": str(tmp_path / "state")},
        "datasets": {"v": _visits(tmp_path, "v")},
    }
    policy = parse_policy(raw, tmp_path / "p.toml")
    store = SparkDatabase(policy.dataset("v"), policy.gate)
    for sql in (
        "SELECT reflect('java.lang.System', 'getProperty', 'user.name')",
        "SELECT collect_list(stay_days) FROM visits",
    ):
        assert store.spark.sql(sql).collect()  # unguarded, Spark answers it
        with pytest.raises(UnsafeSparkSQL):
            store.vet(sql)
        with pytest.raises(UnsafeSparkSQL):
            store.run(sql)


def test_the_vet_runs_a_text_on_the_empty_views_each_time_it_is_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A text vetted before (for another user, whose query generated the same SQL) is
    run on the empty views again: a dry run is answered at once, unpadded, so a vet
    skipped for a text seen before would tell a user in its time that someone else
    asked it (docs/security.md, "Which replies are padded")."""
    raw = {
        "gate": {"state_dir": str(tmp_path / "state")},
        "datasets": {"v": _visits(tmp_path, "v")},
    }
    policy = parse_policy(raw, tmp_path / "p.toml")
    store = SparkDatabase(policy.dataset("v"), policy.gate)
    ran: list[str] = []
    real = store._empty.sql

    def counted(text: str, *args: object, **kwargs: object) -> object:
        ran.append(text)
        return real(text, *args, **kwargs)

    monkeypatch.setattr(store._empty, "sql", counted)
    sql = "SELECT COUNT(*) FROM visits"
    store.vet(sql)
    store.vet(sql)
    assert ran == [sql, sql]
    assert store.run(sql).rows == [(600,)]  # remembered for the guard at run time


def test_what_spark_refuses_would_fail_on_data_under_ansi_mode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The broken version of Spark's rule (every expression taken as total): the query
    passes the empty tables and then fails on the data, after a debit, because one
    unit's value overflows: the failure that the refusal prevents."""

    def trusting(
        tree: exp.Expression, resolved: Resolved, condition: bool = False
    ) -> exp.Expression:
        return generated(tree)

    raw = {
        "gate": {"state_dir": str(tmp_path / "state")},
        "datasets": {"v": _visits(tmp_path, "v")},
    }
    policy = parse_policy(raw, tmp_path / "p.toml")
    dataset = policy.dataset("v")
    store = SparkDatabase(dataset, policy.gate)
    sql = "SELECT COUNT(*) FROM visits WHERE patient_id * 4000000000000000000 > 5"
    the_plan = analyse(Asked(sql, {}, 1.0, 0.0), dataset, make_accountant(dataset.accountant))
    with pytest.raises(NotOnSpark):
        rewrite(the_plan, SEED, SPARK)
    monkeypatch.setattr(engine_rows, "spark_total", trusting)
    broken = rewrite(the_plan, SEED, SPARK).sql
    store.vet(broken)  # no row, no failure: the empty copy cannot see it
    with pytest.raises(Failed):
        store.run(broken)


def test_a_gate_process_serves_a_spark_dataset_over_its_socket(
    tmp_path: Path, short_dir: Path, data: dict[str, Path]
) -> None:
    shutil.copy(data["patients"], tmp_path / "patients.parquet")
    (tmp_path / "policy.toml").write_text(
        '[gate]\nstate_dir = "state"\nresponse_quantum_ms = 0\n\n'
        "[datasets.clinic]\n"
        'engine = "spark"\nspark = { master = "local[2]" }\n'
        'sources = { patients = "patients.parquet" }\nprivacy_unit = "patient_id"\n'
        "user_budget = { epsilon = 5.0 }\n"
        "[datasets.clinic.tables.patients.columns]\n"
        'patient_id = { type = "int" }\nage = { type = "int", lower = 0, upper = 100 }\n'
        'sex = { type = "str", public_values = ["F", "M"] }\n'
    )
    process = GateProcess(tmp_path / "policy.toml", f"unix:{short_dir / 'gate.sock'}")
    started = time.monotonic()
    process.start()
    try:
        start_s = time.monotonic() - started
        client = Gate(process.address)
        assert client.schema("clinic")["engine"] == "spark"
        sql = "SELECT sex, COUNT(*) AS n FROM patients GROUP BY sex"
        dry = client.query(sql, dataset="clinic", epsilon=1.0, dry_run=True).reply
        assert dry["engine"] == "spark" and dry["rows"] == []
        reply = client.query(sql, dataset="clinic", epsilon=1.0).reply
        assert sorted(r[0] for r in reply["rows"]) == ["F", "M"]
        # 150 each, Laplace noise of scale 1: |noise| > 30 has probability e^-30.
        assert all(abs(r[1] - 150) < 30 for r in reply["rows"])
        assert reply["budget"]["user"]["spent"]["epsilon"] == pytest.approx(1.0)
        with pytest.raises(QueryRefused, match="served by Spark"):
            client.query("SELECT COUNT(*) FROM patients WHERE age", dataset="clinic", epsilon=1.0)
        median = client.query("SELECT MEDIAN(age) FROM patients", dataset="clinic", epsilon=1.0)
        assert 0 <= median.reply["rows"][0][0] <= 100
        assert client.budget("clinic")["user"]["spent"]["epsilon"] == pytest.approx(2.0)
        print(f"\ngate start with Spark: {start_s:.1f} s")
    finally:
        process.stop()


def test_spark_datasets_keep_duckdb_datasets_unchanged() -> None:
    """A policy's DuckDB datasets do not start Spark: pyspark is imported only by a
    Spark dataset's store (``engines.open_store``)."""
    import subprocess
    import sys

    code = (
        "import sys, dpmagic.gate.engine, dpmagic.gate.sql.pipeline;print('pyspark' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
