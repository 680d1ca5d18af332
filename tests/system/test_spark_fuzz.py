"""The error-oracle fuzzer against the Spark engine (marker ``spark``).

The same grammar and the same neighbouring datasets as
``tests/unit/test_fuzz_error_oracle.py``, from ``tests/error_oracle.py`` (D holds a
target unit at every declared edge: an id of 2^53+1, a value of 1e308, the only
numeric text, a 4,000-character text, dates 0001-01-01 and 9999-12-31; D' does not),
served by Spark from Parquet files instead of DuckDB: each generated query is asked
of an engine on D and one on D', and their kind, status, message, reply shape and
charge must be equal. Spark answers a query in about a second, so the budget is
small and fixed (derandomized); what Spark refuses it must refuse on both, for the
same reason.
"""

# ruff: noqa: F811 - the fuzzer's fixtures are tests/error_oracle.py's

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import duckdb
import pytest
from hypothesis import given, settings

pytest.importorskip("pyspark", reason="the spark extra is not installed")

from tests.error_oracle import (  # noqa: F401
    DEFAULT,
    POLICY,
    ROW_QUERIES,
    Pair,
    compare,
    engine_pair,
    folder,
    write_database,
)

pytestmark = pytest.mark.spark

SPARK_EXAMPLES = 200


def _spark_policy(folder: Path, name: str, with_target: bool) -> Path:
    """The fuzzer's dataset as Parquet files, served by Spark."""
    write_database(folder, name, with_target)
    con = duckdb.connect(str(folder / f"{name}.duckdb"), read_only=True)
    sources = []
    for table in ("t", "v", "o", "l", "r"):
        path = folder / f"{name}-{table}.parquet"
        con.execute(f"COPY {table} TO '{path}' (FORMAT parquet)")
        sources.append(f'{table} = "{path.name}"')
    con.close()
    spark = 'engine = "spark"\nspark = { master = "local[2]" }\n'
    text = POLICY.format(name=name).replace(
        f'database = "{name}.duckdb"', f"{spark}sources = {{ {', '.join(sources)} }}"
    )
    policy = folder / f"{name}-spark.toml"
    policy.write_text(text)
    return policy


@pytest.fixture(scope="module")
def spark_pair(folder: Path) -> Iterator[Pair]:
    yield from engine_pair(folder, _spark_policy)


@settings(DEFAULT, max_examples=SPARK_EXAMPLES)
@given(sql=ROW_QUERIES)
def test_spark_row_expressions_never_hinge_on_one_unit(spark_pair: Pair, sql: str) -> None:
    compare(spark_pair, sql)


def test_the_spark_fuzz_asked_spark_and_spark_answered_some(spark_pair: Pair) -> None:
    """The budget above is not spent on refusals alone: some queries reached Spark."""
    answered = [a for a, _ in spark_pair.seen.values() if a.kind == "ok"]
    assert len(spark_pair.seen) >= SPARK_EXAMPLES // 2
    assert answered, "no generated query was answered by Spark"
