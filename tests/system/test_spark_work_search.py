"""The search of tests/unit/test_work_search.py against the Spark engine (marker ``spark``).

The same grammar of shapes that multiply one unit's rows (self-joins to twelve
scans, ``USING``, CTE references, public joins on a key or a condition,
semi-joins with a join inside, private keys, ``COUNT(DISTINCT unit)``,
quantiles; and the operators' grammar: LIKE/ILIKE patterns, text functions over
multi-byte texts, CTE chains doubling a text) and the same neighbouring datasets
(D holds a target with 40 visits, ten times the load cap; D' does not), served by
Spark from Parquet files: both engines must agree on the reply's kind, status,
message and padding slot. Spark answers in about a second, so the slot is five
seconds and the budget small and fixed (derandomized).
"""

from __future__ import annotations

import csv
from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from hypothesis import given, settings

pytest.importorskip("pyspark", reason="the spark extra is not installed")

from dpmagic.gate.engine import Engine
from dpmagic.gate.policy import load_policy
from tests import work_search as search
from tests.gate_helpers import write_gate

pytestmark = pytest.mark.spark


def _spark_engine(folder: Path, with_target: bool) -> Engine:
    """The search's dataset as Parquet files, served by Spark on ``local[2]``."""
    policy = search.POLICY.replace("query_timeout_s = 4", "query_timeout_s = 60")
    write_gate(folder, policy, search.tables(with_target))
    con = duckdb.connect()
    for table in ("patients", "visits", "codes", "orders", "lines"):
        source, target = folder / f"{table}.csv", folder / f"{table}.parquet"
        with source.open() as f:
            header = next(csv.reader(f))
        types = {c: ("VARCHAR" if c in ("diag", "note", "memo") else "BIGINT") for c in header}
        con.execute(
            f"COPY (SELECT * FROM read_csv('{source}', header = true, columns = {types!r})) "
            f"TO '{target}' (FORMAT parquet)"
        )
    con.close()
    text = (folder / "policy.toml").read_text()
    text = text.replace('.csv"', '.parquet"').replace(
        "max_text_length = 65536",
        'max_text_length = 65536\nengine = "spark"\nspark = { master = "local[2]" }',
    )
    (folder / "policy.toml").write_text(text)
    return Engine(load_policy(folder / "policy.toml"))


@pytest.fixture(scope="module")
def spark_gates(tmp_path_factory) -> Iterator[tuple[Engine, Engine]]:
    engines = [
        _spark_engine(tmp_path_factory.mktemp(name), with_target)
        for name, with_target in (("spark_d", True), ("spark_d2", False))
    ]
    try:
        yield engines[0], engines[1]
    finally:
        for e in engines:
            e.close()


@settings(search.SEARCH, max_examples=12)
@given(sql=search.multiplying())
def test_no_spark_reply_hinges_on_one_units_work(spark_gates, sql: str, monkeypatch) -> None:
    monkeypatch.setattr(search, "SLOT_S", 5.0)
    search.compare(spark_gates, sql)


@settings(search.SEARCH, max_examples=10)
@given(sql=search.operating())
def test_no_spark_reply_hinges_on_one_units_text_work(spark_gates, sql: str, monkeypatch) -> None:
    monkeypatch.setattr(search, "SLOT_S", 5.0)
    search.compare(spark_gates, sql)
