"""``dpmagic init`` over a Spark catalog's tables, on a real Spark (``local[2]``):
marker ``spark``. Spark's session catalog declares no foreign keys (it refuses
``PRIMARY KEY``/``FOREIGN KEY`` for its tables), so the links between customers,
orders and lines are found in the data and written with the owner's --yes; the
policy serves the tables from the catalog (``table:NAME``), and a real gate answers
a count of lines, each line's customer read along the chain."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

pytest.importorskip("pyspark", reason="the spark extra is not installed")

from dpmagic.commands.cli import main
from dpmagic.gate.policy import load_policy
from tests.unit.test_init_links import _answer

pytestmark = pytest.mark.spark

CUSTOMERS, ORDERS_EACH, LINES_EACH = 300, 3, 2


@pytest.fixture
def lake(tmp_path: Path):
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.master("local[2]").getOrCreate()
    spark.sql(f"CREATE DATABASE IF NOT EXISTS dpm_init LOCATION '{tmp_path / 'lake'}'")
    spark.sql(
        f"SELECT id AS c_custkey, concat('n', id) AS c_name FROM range({CUSTOMERS})"
    ).write.saveAsTable("dpm_init.customer")
    spark.sql(
        f"SELECT id AS o_orderkey, id DIV {ORDERS_EACH} AS o_custkey "
        f"FROM range({CUSTOMERS * ORDERS_EACH})"
    ).write.saveAsTable("dpm_init.orders")
    spark.sql(
        f"SELECT id DIV {LINES_EACH} AS l_orderkey, CAST(1 + id % 50 AS DOUBLE) AS l_quantity, "
        f"array(id) AS l_tags FROM range({CUSTOMERS * ORDERS_EACH * LINES_EACH})"
    ).write.saveAsTable("dpm_init.lineitem")
    yield spark
    spark.sql("DROP DATABASE dpm_init CASCADE")


def test_init_reads_a_catalog_finds_its_links_and_a_gate_answers(lake, tmp_path: Path) -> None:
    out = tmp_path / "policy.toml"
    tables = [f"table:dpm_init.{t}" for t in ("customer", "orders", "lineitem")]
    code = main(
        ["init", *tables, "--spark-master", "local[2]", "--privacy-unit", "c_custkey",
         "--yes", "-o", str(out)]
    )  # fmt: skip
    assert code == 0
    raw = tomllib.loads(out.read_text())["datasets"]["dpm_init"]
    assert raw["engine"] == "spark" and raw["spark"] == {"master": "local[2]"}
    assert raw["sources"] == {t.rsplit(".", 1)[1]: t for t in tables}
    assert raw["tables"]["orders"]["links"] == {"o_custkey": "customer.c_custkey"}
    assert raw["tables"]["lineitem"]["links"] == {"l_orderkey": "orders.o_orderkey"}
    columns = raw["tables"]["lineitem"]["columns"]
    assert columns["l_quantity"] == {"type": "float"} and "l_tags" not in columns
    assert "l_tags: array<bigint> has no policy type yet" in out.read_text()
    ds = load_policy(out).dataset("dpm_init")
    ((n,),) = _answer(out, "SELECT COUNT(*) AS n FROM lineitem")
    # Each customer's six lines, as many as a group keeps of one person (±12 at 95%).
    true = CUSTOMERS * min(ORDERS_EACH * LINES_EACH, ds.max_rows_per_partition)
    assert abs(n - true) <= 0.25 * true


def test_catalog_tables_need_a_spark_and_are_not_mixed_with_files(tmp_path: Path, capsys) -> None:
    out = tmp_path / "policy.toml"
    assert main(["init", "table:dpm_init.customer", "--privacy-unit", "c", "-o", str(out)]) == 2
    assert "give --spark-master or --spark-remote" in capsys.readouterr().err
    (tmp_path / "a.csv").write_text("c\n1\n")
    code = main(["init", "table:x.y", str(tmp_path / "a.csv"), "--spark-master", "local[2]",
                 "--privacy-unit", "c", "-o", str(out)])  # fmt: skip
    assert code == 2 and "not both" in capsys.readouterr().err
    code = main(["init", "table:dpm_none.nothing", "--spark-master", "local[2]",
                 "--privacy-unit", "c", "-o", str(out)])  # fmt: skip
    assert code == 2 and "cannot read it from Spark's catalog" in capsys.readouterr().err
    assert not out.exists()
