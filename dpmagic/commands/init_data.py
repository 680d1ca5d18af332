"""What ``dpmagic init`` reads: the tables of the owner's data as it sees them (their
columns and declared types, the SQL that reads each, their foreign keys) and the one
way it runs SQL over them, by DuckDB or, for a Spark catalog's tables, by Spark
(``init_spark.py``). Apart from the questions (``init_policy.py``) and the keys found
in the data (``init_keys.py``), which both read it."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import duckdb

from dpmagic.gate.policy import SparkConfig

# What a DuckDB database is attached as to count its rows per unit.
DB = "__init_db"


class InitError(ValueError):
    """The skeleton cannot be written; the message says why in one line."""


class ReadFailed(Exception):
    """The data could not be read; the message is the engine's first line."""


class RowReader(Protocol):
    """Runs SQL written in DuckDB's dialect elsewhere (Spark), its first row."""

    def row(self, sql: str) -> tuple | None: ...


@dataclass(frozen=True)
class ForeignKey:
    """A foreign key: ``columns`` reference ``target``'s ``target_columns``. Declared
    by a DuckDB database (schema, not data: the database states it), or ``found`` in
    the data of sources that declare none (``init_keys.py``), which goes into the
    policy only with the owner's yes."""

    table: str
    columns: tuple[str, ...]
    target: str
    target_columns: tuple[str, ...]
    found: bool = False

    def __str__(self) -> str:
        return (
            f"{self.table}.{', '.join(self.columns)} → "
            f"{self.target}.{', '.join(self.target_columns)}"
        )

    @property
    def note(self) -> str:
        """What the owner reads of where the key comes from."""
        if self.found:
            return f"found in the data: {self}, each value one of a unique column's"
        return f"declared foreign key {self}"


@dataclass
class Table:
    """One table as ``init`` sees it: its columns (with their declared types, or
    None for a CSV's), the SQL that reads it (to count its rows per unit, for the
    owner's eyes) and its foreign keys."""

    name: str
    columns: list[tuple[str, str | None]]
    relation: str
    foreign_keys: list[ForeignKey] = field(default_factory=list)
    origin: str = ""  # how messages name it: a file's name, or the table's

    def column(self, name: str) -> str | None:
        """The column called ``name`` (as the gate compares names: case aside)."""
        return next((c for c, _ in self.columns if c.lower() == name.lower()), None)

    def names(self) -> str:
        return ", ".join(c for c, _ in self.columns)


@dataclass
class Data:
    """The tables of a dataset: files (``sources``), a DuckDB ``database``, or tables of
    a Spark ``catalog`` (table to its catalog name) reached with ``spark``'s settings
    and read through ``reader``."""

    tables: dict[str, Table]
    sources: dict[str, Path] = field(default_factory=dict)
    database: Path | None = None
    catalog: dict[str, str] = field(default_factory=dict)
    spark: SparkConfig | None = None
    reader: RowReader | None = None

    def row(self, sql: str) -> tuple | None:
        """The first row of ``sql`` (DuckDB's dialect) over the tables' relations: by
        DuckDB (the database attached read-only), or by the ``reader`` (Spark)."""
        if self.reader is not None:
            return self.reader.row(sql)
        con = duckdb.connect()
        try:
            if self.database is not None:  # read-only: init changes nothing in it
                con.execute(f"ATTACH {sql_string(str(self.database))} AS {DB} (READ_ONLY)")
            return con.execute(sql).fetchone()
        except duckdb.Error as exc:
            raise ReadFailed(str(exc).splitlines()[0]) from None
        finally:
            con.close()

    def unique(self, table: Table, column: str) -> bool:
        """Whether no value of ``column`` repeats in ``table`` (NULLs aside): the owner's
        own data, read to check or find a key; no value goes anywhere."""
        c = ident(column)
        row = self.row(f"SELECT count({c}) = count(DISTINCT {c}) FROM {table.relation}")
        return bool(row and row[0])


def ident(name: str) -> str:
    """A SQL identifier, quoted."""
    return '"' + name.replace('"', '""') + '"'


def sql_string(text: str) -> str:
    """A SQL string literal."""
    return "'" + text.replace("'", "''") + "'"
