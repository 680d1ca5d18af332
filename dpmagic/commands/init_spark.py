"""``dpmagic init`` over tables of a Spark catalog (``table:NAME`` sources).

The schema comes from the catalog (each table's declared Spark types, read as the
policy's), through the session the gate itself would open (``engines/spark/session``:
the same ``master`` or ``remote`` and settings). A Spark catalog declares no foreign
keys (Spark's session catalog refuses ``PRIMARY KEY``/``FOREIGN KEY`` for its
tables), so the links between its tables are found in the data (``init_keys.py``)
and written with the owner's yes. The counts ``init`` shows the owner (rows per
unit, whether a key is unique) run on Spark, their SQL rendered from DuckDB's dialect
by sqlglot.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import sqlglot

from dpmagic.commands.init_data import Data, InitError, ReadFailed, Table, ident
from dpmagic.commands.init_keys import with_found_keys
from dpmagic.gate.policy import CATALOG_PREFIX, SparkConfig

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.types import DataType

# Spark's type names -> the DuckDB names ``init`` maps to the policy's types.
_TYPES = {
    "tinyint": "TINYINT", "smallint": "SMALLINT", "int": "INTEGER", "bigint": "BIGINT",
    "float": "FLOAT", "double": "DOUBLE", "boolean": "BOOLEAN", "date": "DATE",
    "string": "VARCHAR", "timestamp": "TIMESTAMP", "timestamp_ntz": "TIMESTAMP",
}  # fmt: skip


class SparkSource:
    """A Spark session over the catalog's tables, each a temporary view named as the
    policy's table (views of this session alone)."""

    def __init__(self, spark: SparkSession) -> None:
        self.spark = spark

    def row(self, sql: str) -> tuple | None:
        try:
            rendered = sqlglot.transpile(sql, read="duckdb", write="spark")[0]
            found = self.spark.sql(rendered).head(1)
        except Exception as exc:  # Spark's errors are many classes, all one message
            raise ReadFailed(str(exc).strip().splitlines()[0][:300]) from None
        return tuple(found[0]) if found else None


def is_catalog_table(name: str) -> bool:
    """Whether a DATA argument names a catalog table (``table:lake.visits``)."""
    return name.startswith(CATALOG_PREFIX)


def read_catalog(names: list[str], config: SparkConfig) -> Data:
    """The tables ``names`` (each ``table:NAME``) of the catalog the session reaches,
    their declared types, and the links their data shows."""
    from dpmagic.gate.engines.spark.session import SparkMissing, isolated

    try:
        spark = isolated(config)
    except SparkMissing as exc:
        raise InitError(str(exc)) from None
    data = Data(tables={}, spark=config, reader=SparkSource(spark))
    for given in names:
        full = given.removeprefix(CATALOG_PREFIX)
        name = full.rsplit(".", 1)[-1].strip("`").lower()
        if name in data.tables:
            raise InitError(f"two catalog tables would both become table {name!r}: {given}")
        try:
            frame = spark.table(full)
        except Exception as exc:
            first = str(exc).strip().splitlines()[0][:300]
            raise InitError(f"{given}: cannot read it from Spark's catalog: {first}") from None
        frame.createOrReplaceTempView(name)
        columns: list[tuple[str, str | None]] = [
            (f.name, _type(f.dataType)) for f in frame.schema.fields
        ]
        data.tables[name] = Table(name, columns, ident(name), origin=full)
        data.catalog[name] = full
    return with_found_keys(data)


def _type(kind: DataType) -> str:
    """A Spark type as the DuckDB name ``init`` reads (a decimal as DECIMAL); one the
    policy has no type for keeps Spark's name (the skeleton leaves it undeclared)."""
    name = kind.simpleString()
    if name.startswith("decimal"):
        return "DECIMAL"
    return _TYPES.get(name.split("(")[0], name)
