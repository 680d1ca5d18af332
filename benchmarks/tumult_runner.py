"""The visits queries in Tumult Analytics, run inside Tumult's own venv by
``benchmarks/spark.py --tumult`` (Tumult pins pyspark < 3.6 and pandas < 2 on
Python 3.11, so it cannot share the project's environment).

    python tumult_runner.py PARQUET --reps 3 --epsilon 1

Each query gets the same contribution bounds as the gate's policy
(``max_partitions = 3``, ``max_rows_per_partition = 3``): grouped by one column,
``MaxGroupsPerID(3)`` and ``MaxRowsPerGroupPerID(3)``; grouped by two, 9 rows per
person; ungrouped, 3 rows per person; the group keys public (``KeySet``), the
same clamping bounds, ε per query, on Spark ``local[2]``. Prints JSON: each
query's times in seconds (a warm-up run first, not timed) and its last answer.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

from pyspark.sql import SparkSession
from tmlt.analytics import (
    AddRowsWithID,
    KeySet,
    MaxGroupsPerID,
    MaxRowsPerGroupPerID,
    MaxRowsPerID,
    PureDPBudget,
    QueryBuilder,
    Session,
)

STATES = [f"S{i}" for i in range(50)]
DIAGNOSES = [f"D{i}" for i in range(20)]


def queries() -> dict[str, object]:
    by_state = KeySet.from_dict({"state": STATES})
    by_diagnosis = KeySet.from_dict({"diagnosis": DIAGNOSES})
    both = KeySet.from_dict({"state": STATES, "diagnosis": DIAGNOSES})
    visits = QueryBuilder("visits")
    return {
        "count by state": visits.enforce(MaxGroupsPerID("state", 3))
        .enforce(MaxRowsPerGroupPerID("state", 3))
        .groupby(by_state)
        .count(),
        "avg income by diagnosis": QueryBuilder("visits")
        .enforce(MaxGroupsPerID("diagnosis", 3))
        .enforce(MaxRowsPerGroupPerID("diagnosis", 3))
        .groupby(by_diagnosis)
        .average("income", 0, 200000),
        "sum income where age > 65": QueryBuilder("visits")
        .filter("age > 65")
        .enforce(MaxRowsPerID(3))
        .sum("income", 0, 200000),
        "count by state × diagnosis": QueryBuilder("visits")
        .enforce(MaxRowsPerID(9))
        .groupby(both)
        .count(),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("parquet")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--epsilon", type=float, default=1.0)
    args = parser.parse_args()
    # Tumult runs Python on the executors: this venv's, not the first python3 on PATH.
    os.environ["PYSPARK_PYTHON"] = sys.executable
    # Tumult keeps temporary tables in the session's warehouse: a folder of its own that
    # goes with the run, not spark-warehouse/ in the working directory.
    with tempfile.TemporaryDirectory() as warehouse:
        spark = (
            SparkSession.builder.master("local[2]")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "false")
            .config("spark.sql.warehouse.dir", warehouse)
            .getOrCreate()
        )
        spark.sparkContext.setLogLevel("ERROR")
        out = _run(spark, args.parquet, args.reps, args.epsilon)
        spark.stop()
    print(json.dumps(out, default=str))


def _run(spark: SparkSession, parquet: str, reps: int, epsilon: float) -> dict[str, dict]:
    frame = spark.read.parquet(parquet)
    session = Session.from_dataframe(
        privacy_budget=PureDPBudget(float("inf")),
        source_id="visits",
        dataframe=frame,
        protected_change=AddRowsWithID(id_column="person_id"),
    )
    out = {}
    for name, query in queries().items():
        times, rows = [], []
        for rep in range(reps + 1):
            start = time.perf_counter()
            rows = [list(r) for r in session.evaluate(query, PureDPBudget(epsilon)).collect()]
            if rep:  # the first run warms Spark up
                times.append(time.perf_counter() - start)
        out[name] = {"times": times, "answer": rows}
    return out


if __name__ == "__main__":
    main()
