"""Pass 7: run generated SQL on a locked, read-only DuckDB.

The database is opened once per dataset, read-only, with external access,
extension loading and configuration changes switched off; each query gets a
fresh connection (cursor) of its own, so no temporary object or setting
survives it, and a timer interrupts it at the policy's timeout. Datasets
declared by ``sources`` are first copied into a DuckDB file in the gate's
state directory, readable by the gate's user only.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, replace
from pathlib import Path

import duckdb

from dpmagic.gate.errors import Failed
from dpmagic.gate.policy import Dataset, GateConfig
from dpmagic.gate.sql.keys import MAX_PARTITIONS
from dpmagic.gate.sql.rewrite import SQL_TYPES

KEY_TYPES = ("int", "str", "bool")  # public columns whose values can serve as group keys


class QueryTimeout(Failed):
    def __init__(self) -> None:
        super().__init__(
            "the query ran past the gate's time limit and was stopped (it stays charged)"
        )


@dataclass(frozen=True)
class ExactResult:
    """Exact aggregates by partition: never leaves the gate un-noised."""

    rows: list[tuple]


class Database:
    def __init__(self, dataset: Dataset, gate: GateConfig) -> None:
        missing = [p for p in dataset.sources.values() if not p.exists()]
        if missing:
            raise FileNotFoundError(f"dataset {dataset.name!r}: source {missing[0]} not found")
        path = dataset.database
        if path is None:
            path = _materialise(dataset, gate.state_dir)
        elif not path.exists():
            raise FileNotFoundError(f"dataset {dataset.name!r}: database {path} not found")
        self.timeout_s = gate.query_timeout_s
        self._db = duckdb.connect(
            str(path),
            read_only=True,
            config={
                "enable_external_access": False,
                "autoinstall_known_extensions": False,
                "autoload_known_extensions": False,
                "allow_community_extensions": False,
                "memory_limit": gate.memory_limit,
                "threads": gate.threads,
                "lock_configuration": True,
            },
        )

    def run(self, sql: str) -> ExactResult:
        con = self._db.cursor()
        done = threading.Event()
        watchdog = threading.Thread(target=_interrupt_after, args=(con, done, self.timeout_s))
        watchdog.start()
        try:
            rows = con.execute(sql).fetchall()
        except duckdb.InterruptException:
            raise QueryTimeout() from None
        finally:
            done.set()
            watchdog.join()
            con.close()
        return ExactResult(rows=rows)

    def public_keys(self, dataset: Dataset) -> Dataset:
        """``dataset`` with each public table's undeclared key values read from the
        table itself: its contents are public, so grouping by one of its columns
        releases keys that are known before any private row is read."""
        tables = dict(dataset.tables)
        for table in dataset.tables.values():
            if not table.public:
                continue
            columns = dict(table.columns)
            for col in table.columns.values():
                if col.public_values is None and col.type in KEY_TYPES:
                    values = self._distinct(table.name, col.name, SQL_TYPES[col.type])
                    if values:
                        columns[col.name] = replace(col, public_values=values)
            tables[table.name] = replace(table, columns=columns)
        return replace(dataset, tables=tables)

    def _distinct(self, table: str, column: str, sql_type: str) -> tuple[object, ...] | None:
        """The distinct non-NULL values of a public column, if there are few enough
        to release as keys; ``None`` when there are too many or the table is absent."""
        con = self._db.cursor()
        try:
            rows = con.execute(
                f'SELECT DISTINCT TRY_CAST("{_ident(column)}" AS {sql_type}) AS v '
                f'FROM "{_ident(table)}" WHERE v IS NOT NULL ORDER BY v '
                f"LIMIT {MAX_PARTITIONS + 1}"
            ).fetchall()
        except duckdb.Error:
            return None
        finally:
            con.close()
        if not 0 < len(rows) <= MAX_PARTITIONS:
            return None
        return tuple(v for (v,) in rows)

    def close(self) -> None:
        self._db.close()


def _ident(name: str) -> str:
    return name.replace('"', '""')


def _interrupt_after(con: duckdb.DuckDBPyConnection, done: threading.Event, seconds: float) -> None:
    """Interrupt the query once its time is up, and keep at it until it stops: an
    interrupt that lands before DuckDB starts executing would otherwise be lost."""
    if done.wait(seconds):
        return
    while not done.is_set():
        con.interrupt()
        done.wait(0.01)


def _materialise(dataset: Dataset, state_dir: Path) -> Path:
    """Copy CSV/Parquet sources into a private DuckDB file, replaced at each start."""
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(state_dir, 0o700)
    target = state_dir / f"{dataset.name}.duckdb"
    partial = target.with_suffix(".loading")
    for p in (partial, partial.with_suffix(".loading.wal")):
        p.unlink(missing_ok=True)
    old = os.umask(0o077)
    try:
        con = duckdb.connect(str(partial))
        try:
            for table, source in dataset.sources.items():
                reader = "read_parquet" if source.suffix.lower() == ".parquet" else "read_csv_auto"
                con.execute(f'CREATE TABLE "{table}" AS SELECT * FROM {reader}(?)', [str(source)])
            con.execute("CHECKPOINT")
        finally:
            con.close()
    finally:
        os.umask(old)
    os.chmod(partial, 0o600)
    os.replace(partial, target)
    return target
