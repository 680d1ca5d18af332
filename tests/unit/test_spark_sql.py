"""Spark as a dataset's engine, without Spark: the policy keys, the Spark dialect
profile (what it renders, what it refuses and why) and the Spark guard's allow-list.
What Spark then answers is ``tests/system/test_spark.py`` (marker ``spark``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlglot

from dpmagic.gate.dp.accounting import make_accountant
from dpmagic.gate.engines.spark.dialect import SPARK
from dpmagic.gate.engines.spark.guard import UnsafeSparkSQL, guard
from dpmagic.gate.policy import EngineKind, PolicyError, load_policy, parse_policy
from dpmagic.gate.sql.engine_rows import NotOnSpark
from dpmagic.gate.sql.pipeline import Asked, analyse
from dpmagic.gate.sql.rewrite import rewrite
from tests.gate_helpers import sized
from tests.golden.run import HERE as GOLDEN
from tests.golden.run import cases, plan_of

SEED = 7


def _raw(**dataset: object) -> dict:
    return {
        "datasets": {
            "d": {
                "sources": {"t": "t.parquet"},
                "privacy_unit": "pid",
                "user_budget": {"epsilon": 1.0},
                "tables": {"t": {"columns": {"pid": {"type": "int"}}}},
                **dataset,
            }
        }
    }


def test_engine_defaults_to_duckdb_and_spark_is_declared_with_a_master_or_a_remote() -> None:
    policy = parse_policy(_raw(), Path("p.toml"))
    assert policy.dataset("d").engine == EngineKind.DUCKDB
    assert policy.dataset("d").as_dict()["engine"] == "duckdb"
    spark = parse_policy(
        _raw(engine="spark", spark={"master": "local[2]", "conf": {"spark.a": 1, "b": True}}),
        Path("p.toml"),
    ).dataset("d")
    assert spark.engine == EngineKind.SPARK
    assert spark.spark is not None and spark.spark.master == "local[2]"
    assert spark.spark.conf == (("b", "true"), ("spark.a", "1"))
    assert spark.as_dict()["spark"] == {"master": "local[2]"}  # the conf is not served
    url = "sc://cluster:443/;token=SECRET;x-databricks-cluster-id=c1"
    remote = parse_policy(
        _raw(engine="spark", spark={"remote": url, "prepared": "dbfs:/gate"}), Path("p.toml")
    ).dataset("d")
    assert remote.spark is not None and remote.spark.remote == url
    # /v1/schema says where Spark runs; the URL's parameters (a token) stay in the policy.
    assert remote.as_dict()["spark"] == {"remote": "sc://cluster:443"}
    assert "SECRET" not in repr(remote.as_dict())


@pytest.mark.parametrize(
    ("dataset", "message"),
    [
        ({"engine": "postgres"}, "engine must be one of duckdb, spark"),
        ({"engine": "spark"}, "datasets.d.spark is required"),
        ({"engine": "spark", "spark": {}}, "exactly one of `master`"),
        ({"engine": "spark", "spark": {"master": "local", "remote": "sc://h:1"}}, "exactly one"),
        ({"engine": "spark", "spark": {"remote": "http://h:1"}}, "Spark Connect URL"),
        ({"engine": "spark", "spark": {"remote": "sc://h:1"}}, "names `prepared`"),
        ({"engine": "spark", "spark": {"master": ""}}, "master must be a non-empty string"),
        ({"engine": "spark", "spark": {"master": "local", "port": 1}}, "unknown key 'port'"),
        ({"engine": "spark", "spark": {"master": "local", "conf": {"a": [1]}}}, "conf.a must"),
        ({"spark": {"master": "local"}}, 'only a dataset with engine = "spark"'),
    ],
)
def test_bad_engine_settings_are_refused_with_the_key_at_fault(dataset, message) -> None:
    with pytest.raises(PolicyError, match=None) as caught:
        parse_policy(_raw(**dataset), Path("p.toml"))
    assert message in str(caught.value)


def test_catalog_tables_are_sources_of_spark_datasets_only() -> None:
    spark = parse_policy(
        _raw(engine="spark", spark={"master": "local"}, sources={"t": "table:lake.t"}),
        Path("p.toml"),
    ).dataset("d")
    assert spark.catalog == {"t": "lake.t"} and spark.sources == {}
    with pytest.raises(PolicyError, match='only a dataset with engine = "spark" reads'):
        parse_policy(_raw(sources={"t": "table:lake.t"}), Path("p.toml"))


def test_a_spark_dataset_reads_sources_not_a_duckdb_file() -> None:
    raw = _raw(engine="spark", spark={"master": "local[2]"})
    raw["datasets"]["d"].pop("sources")
    raw["datasets"]["d"]["database"] = "data.duckdb"
    with pytest.raises(PolicyError, match="a Spark dataset declares `sources`"):
        parse_policy(raw, Path("p.toml"))


def test_spark_datasets_of_one_gate_share_one_session() -> None:
    raw = _raw(engine="spark", spark={"master": "local[2]"})
    other = dict(raw["datasets"]["d"], spark={"master": "local[1]"})
    raw["datasets"]["e"] = other
    with pytest.raises(PolicyError, match="same master or remote"):
        parse_policy(raw, Path("p.toml"))


@pytest.mark.parametrize("case", cases(), ids=lambda c: c.name)
def test_each_golden_case_renders_for_spark(case) -> None:
    """Every golden case renders Spark SQL that the Spark guard passes, with Spark's
    keyed hash and exact sum, quantiles counted by GROUP BY, and no DuckDB-only
    construct."""
    dataset = load_policy(GOLDEN / "policies" / f"{case.policy}.toml").dataset(None)
    sql = rewrite(plan_of(case), SEED, SPARK).sql
    guard(sql, frozenset(dataset.tables))
    assert sqlglot.parse_one(sql, dialect="spark") is not None
    for duckdb_only in ("HASH(", "HUGEINT", "INT128", "TRY(", "HISTOGRAM", '"'):
        assert duckdb_only not in sql.upper().replace("XXHASH64(", "")
    if "SUM(" in sql:
        assert "SUM(CAST(" in sql
    if "QUANTILE" in case.sql.upper() or "MEDIAN" in case.sql.upper():
        assert "MAP_FROM_ENTRIES(COLLECT_LIST(STRUCT(`__c`, `__n`)))" in sql


QUERIES_SPARK_REFUSES = {
    # The proof cannot show these total: DuckDB answers them under TRY.
    "SELECT COUNT(*) FROM visits WHERE patient_id * patient_id > 5": "Spark has no TRY",
    "SELECT SUM(stay_days) FROM visits WHERE TRY_CAST(note AS INT) > 1": "parses text",
    "SELECT COUNT(*) FROM visits WHERE stay_days": "condition that is not boolean",
    "SELECT COUNT(*) FROM visits WHERE FLOOR(cost) > 10": "non-integer",
    "SELECT COUNT(*) FROM visits WHERE note || stay_days = 'a1'": "non-text values",
    "SELECT COUNT(*) FROM visits WHERE note LIKE 'a\\%'": "backslash",
    "SELECT COUNT(*) FROM visits WHERE DAYOFWEEK(seen) = 1": "days of the week",
    "SELECT COUNT(*) FROM visits WHERE EXTRACT(week FROM seen) = 1": "weeks",
}


@pytest.mark.parametrize("sql", sorted(QUERIES_SPARK_REFUSES))
def test_what_spark_would_answer_differently_is_refused_and_duckdb_answers(sql) -> None:
    dataset = sized(load_policy(GOLDEN / "policies" / "clinic.toml").dataset(None))
    accountant = make_accountant(dataset.accountant)
    the_plan = analyse(Asked(sql, {}, 1.0, 0.0), dataset, accountant)
    rewrite(the_plan, SEED)  # DuckDB's profile takes it
    with pytest.raises(NotOnSpark) as refused:
        rewrite(the_plan, SEED, SPARK)
    assert QUERIES_SPARK_REFUSES[sql] in str(refused.value)
    assert "served by Spark" in str(refused.value)


@pytest.mark.parametrize(
    ("sql", "kind"),
    [
        ("SELECT SUM(stay_days) FROM visits", "BIGINT"),  # 30 × 2^40 rows fit a BIGINT
        ("SELECT SUM(cost) FROM visits", "BIGINT"),  # on its grid, 50,000 × 2^k fit too
        ("SELECT SUM(stay_days * 1000000000) FROM visits", "DECIMAL(38, 0)"),  # 3e10 × 2^40
    ],
)
def test_spark_sums_in_bigint_only_where_no_table_could_overflow_one(sql, kind) -> None:
    dataset = sized(load_policy(GOLDEN / "policies" / "clinic.toml").dataset(None))
    the_plan = analyse(Asked(sql, {}, 1.0, 0.0), dataset, make_accountant(dataset.accountant))
    rendered = rewrite(the_plan, SEED, SPARK).sql
    assert f" AS {kind}))" in rendered
    assert rendered.count("SUM(") == 1


@pytest.mark.parametrize(
    ("sql", "kind"),
    [
        # 5,000,000 × 2^40 rows fit a BIGINT: one scan reads fewer than 2^40 rows.
        ("SELECT SUM(age * 50000) FROM patients", "BIGINT"),
        # A public join repeats a unit's rows: up to max_rows_per_partition (4) each of
        # 2^40 units, 5,000,000 × 2^42 > 2^63 (in BIGINT, its sum could overflow).
        (
            "SELECT SUM(p.age * 50000) FROM patients p JOIN regions r ON p.state = r.state",
            "DECIMAL(38, 0)",
        ),
    ],
)
def test_a_joined_sum_counts_a_units_repeated_rows_before_summing_in_bigint(sql, kind) -> None:
    dataset = sized(load_policy(GOLDEN / "policies" / "clinic.toml").dataset(None))
    the_plan = analyse(Asked(sql, {}, 1.0, 0.0), dataset, make_accountant(dataset.accountant))
    rows = 2**40 if "JOIN" not in sql else 2**40 * dataset.max_rows_per_partition
    assert the_plan.partition_rows == rows
    assert f" AS {kind}))" in rewrite(the_plan, SEED, SPARK).sql


def test_a_double_cast_to_an_integer_rounds_first_on_spark() -> None:
    dataset = sized(load_policy(GOLDEN / "policies" / "clinic.toml").dataset(None))
    sql = "SELECT COUNT(*) FROM visits WHERE TRY_CAST(cost AS INT) = 3"
    the_plan = analyse(Asked(sql, {}, 1.0, 0.0), dataset, make_accountant(dataset.accountant))
    assert "TRY_CAST(ROUND(`__s0`.`cost`) AS INT)" in rewrite(the_plan, SEED, SPARK).sql
    assert "TRY_CAST(__s0.cost AS INT)" in rewrite(the_plan, SEED).sql.replace('"', "")


ATTACKS = [
    "SELECT reflect('java.lang.System', 'getProperty', 'user.home')",
    "SELECT java_method('java.lang.Runtime', 'getRuntime')",
    "SELECT * FROM read_files('/etc/passwd')",
    "SELECT * FROM parquet.`../other/secret`",
    "SELECT * FROM other_db.visits",
    "SELECT * FROM spark_catalog.default.visits",
    "SELECT * FROM secrets",
    "SELECT collect_list(note) FROM visits",
    "SELECT first(note) FROM visits",
    "SELECT my_udf(note) FROM visits",
    "SELECT current_user()",
    "SELECT input_file_name() FROM visits",
    "SELECT COUNT(*) FROM visits TABLESAMPLE (10 PERCENT)",
    "SELECT COUNT(*) FROM visits; SELECT 1",
    "DROP TABLE visits",
    "SET spark.sql.ansi.enabled = false",
    "SELECT explode(array(note)) FROM visits",
    "SELECT * FROM visits LATERAL VIEW explode(array(1)) t AS x",
    "SELECT map_from_entries(collect_list(struct(note, note))) FROM visits",  # text values
    "SELECT collect_list(struct(stay_days, note)) FROM visits",
    "SELECT map_from_entries(collect_list(struct(upper(note), 1))) FROM visits",
    "SELECT map_from_entries(collect_list(struct(__c, __n))) "
    "FROM (SELECT note AS __c, COUNT(*) AS __n FROM visits GROUP BY note) AS __counted",
    "SELECT map_from_entries(collect_list(struct(__c, __n))) "
    "FROM (SELECT __v_q AS __c, __v_q AS __n FROM visits) AS __counted",
    "SELECT /*+ BROADCAST(visits) */ COUNT(*) FROM visits",
]


@pytest.mark.parametrize("sql", ATTACKS)
def test_the_spark_guard_refuses_what_the_gate_never_generates(sql) -> None:
    with pytest.raises(UnsafeSparkSQL):
        guard(sql, frozenset({"visits", "patients"}))


def test_the_spark_guard_passes_what_the_gate_generates() -> None:
    tables = frozenset({"visits", "patients", "regions"})
    guard("WITH k AS (SELECT note FROM visits) SELECT COUNT(*) FROM k", tables)
    guard("SELECT SUM(CAST(stay_days AS DECIMAL(38, 0))), xxhash64(1, 2) FROM visits", tables)


@pytest.mark.parametrize(
    ("pattern", "refused"),
    [("%cardio%", False), ("heart%", False), ("%a%b%", True), ("%a%b%z%", True)],
)
def test_spark_refuses_like_patterns_it_would_match_by_backtracking(pattern, refused) -> None:
    """Spark compiles LIKE to a backtracking regular expression: past two %, one person's
    long text can hold a query (and Spark's task slots) for a power of its length."""
    dataset = sized(load_policy(GOLDEN / "policies" / "clinic.toml").dataset(None))
    sql = f"SELECT COUNT(*) FROM visits WHERE note LIKE '{pattern}'"
    the_plan = analyse(Asked(sql, {}, 1.0, 0.0), dataset, make_accountant(dataset.accountant))
    if refused:
        with pytest.raises(NotOnSpark, match="backtracking"):
            rewrite(the_plan, SEED, SPARK)
    else:
        assert "LIKE" in rewrite(the_plan, SEED, SPARK).sql
