"""Which engine holds a dataset: the registry, one entry per ``engine`` of the policy.

DuckDB's ``Database`` (``engines/duckdb/database.py``) and Spark's ``SparkDatabase``
(``spark/database.py``) each meet ``sql.execute.Store``; this module alone knows
both, so neither engine's module imports the other. Spark is imported only when a
dataset asks for it (pyspark is an optional extra)."""

from __future__ import annotations

from collections.abc import Callable

from dpmagic.gate.engines.duckdb.database import Database
from dpmagic.gate.engines.interface import Store
from dpmagic.gate.policy import Dataset, EngineKind, GateConfig


def _spark(dataset: Dataset, gate: GateConfig) -> Store:
    from dpmagic.gate.engines.spark.database import SparkDatabase  # pyspark only when used

    return SparkDatabase(dataset, gate)


ENGINES: dict[EngineKind, Callable[[Dataset, GateConfig], Store]] = {
    EngineKind.DUCKDB: Database,
    EngineKind.SPARK: _spark,
}


def open_store(dataset: Dataset, gate: GateConfig) -> Store:
    """The dataset's tables on the engine its policy names (prepared, or reused)."""
    return ENGINES[dataset.engine](dataset, gate)
