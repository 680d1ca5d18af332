"""Pass 7: run generated SQL on a locked, read-only DuckDB.

The database is opened once per dataset, read-only, with external access,
extension loading and configuration changes switched off; each query gets a
fresh connection (cursor) of its own, so no temporary object or setting
survives it, and a timer interrupts it at the policy's timeout.

At start, the declared tables (from ``sources`` files or from the owner's
``database``) are copied into a DuckDB file in the gate's state directory,
readable by the gate's user only, with each private table truncated and
ranked per privacy unit once (``contribution.prepare_sql``), so that no
query has to sort the data to bound contributions.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path

import duckdb

from dpmagic.gate.errors import Failed
from dpmagic.gate.policy import Dataset, GateConfig
from dpmagic.gate.sql.contribution import prepare_sql


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
        if dataset.database is not None and not dataset.database.exists():
            raise FileNotFoundError(
                f"dataset {dataset.name!r}: database {dataset.database} not found"
            )
        path = _materialise(dataset, gate.state_dir)
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

    def close(self) -> None:
        self._db.close()


def _interrupt_after(con: duckdb.DuckDBPyConnection, done: threading.Event, seconds: float) -> None:
    """Interrupt the query once its time is up, and keep at it until it stops: an
    interrupt that lands before DuckDB starts executing would otherwise be lost."""
    if done.wait(seconds):
        return
    while not done.is_set():
        con.interrupt()
        done.wait(0.01)


def _materialise(dataset: Dataset, state_dir: Path) -> Path:
    """Copy the declared tables into a private DuckDB file, prepared for bounding and
    replaced at each start (with a fresh secret seed for the per-unit row order)."""
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
            if dataset.database is not None:
                con.execute("ATTACH ? AS __owner (READ_ONLY)", [str(dataset.database)])
                present = {
                    name.lower()
                    for (name,) in con.execute(
                        "SELECT table_name FROM duckdb_tables() WHERE database_name = '__owner'"
                    ).fetchall()
                }
                relations = {t: f'__owner."{t}"' for t in dataset.tables if t in present}
            else:
                relations = {t: _reader(p) for t, p in dataset.sources.items()}
            for name, relation in relations.items():
                select = prepare_sql(dataset, dataset.tables[name], relation)
                con.execute(f'CREATE TABLE "{name}" AS {select}')
            con.execute("CHECKPOINT")
        finally:
            con.close()
    finally:
        os.umask(old)
    os.chmod(partial, 0o600)
    os.replace(partial, target)
    return target


def _reader(source: Path) -> str:
    reader = "read_parquet" if source.suffix.lower() == ".parquet" else "read_csv_auto"
    return f"{reader}({_string(str(source))})"


def _string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
