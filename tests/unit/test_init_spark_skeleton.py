"""The policy ``dpmagic init`` writes for a Spark catalog's tables: ``engine = "spark"``,
the session's settings as init reached the catalog (a master or a Connect URL, and
``--spark-conf``), each table a ``table:NAME`` source; it parses, and a gate reading it
would open the same session. (Reading a real catalog is the Spark suite's:
``tests/system/test_spark_init.py``.)"""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from dpmagic.commands.init_data import Data, InitError, Table
from dpmagic.commands.init_policy import Answers, dataset_name, plan, skeleton
from dpmagic.gate.policy import SparkConfig, parse_policy


def _catalog(config: SparkConfig) -> Data:
    tables = {
        "visits": Table(
            "visits", [("pid", "BIGINT"), ("cost", "DOUBLE")], '"visits"', origin="lake.visits"
        ),
    }
    return Data(tables=tables, catalog={"visits": "lake.visits"}, spark=config)


@pytest.mark.parametrize(
    ("config", "spark"),
    [
        (SparkConfig("local[2]", None), {"master": "local[2]"}),
        (
            SparkConfig(
                None, "sc://h:15002/;token=t", (("spark.executor.memory", "2g"),), "s3://b/p"
            ),
            {
                "remote": "sc://h:15002/;token=t",
                "prepared": "s3://b/p",
                "conf": {"spark.executor.memory": "2g"},
            },
        ),
    ],
)
def test_a_catalog_is_written_as_a_spark_dataset(
    tmp_path: Path, config: SparkConfig, spark: dict
) -> None:
    data = _catalog(config)
    assert dataset_name(data) == "lake"
    settled = plan(data, "pid", Answers(rows={"visits": 3}))
    out = tmp_path / "policy.toml"
    text = skeleton(settled, "lake", out)
    raw = tomllib.loads(text)["datasets"]["lake"]
    assert raw["engine"] == "spark" and raw["spark"] == spark
    assert raw["sources"] == {"visits": "table:lake.visits"}
    policy = parse_policy(tomllib.loads(text), out)
    ds = policy.dataset("lake")
    assert ds.spark is not None and (ds.spark.master, ds.spark.remote) == (
        config.master,
        config.remote,
    )
    assert ds.tables["visits"].max_rows == 3


def test_a_catalog_row_read_fails_as_one_clear_line() -> None:
    class Broken:
        def row(self, sql: str) -> tuple | None:
            from dpmagic.commands.init_data import ReadFailed

            raise ReadFailed("[TABLE_OR_VIEW_NOT_FOUND] gone")

    data = _catalog(SparkConfig("local[2]", None))
    data.reader = Broken()
    with pytest.raises(InitError) as info:
        plan(data, "pid", Answers(yes=True))
    assert (
        str(info.value)
        == "lake.visits: cannot count its rows per pid: [TABLE_OR_VIEW_NOT_FOUND] gone"
    )
