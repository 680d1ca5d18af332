"""Pass 7 on Spark: generated SQL run over the prepared tables, with a timeout.

The session sees the prepared tables as temporary views of the dataset's table
names, over the Parquet the preparation wrote (``prepare``); the guard
(``guard``) passes only SQL that reads those views. Before the debit each query
is run on empty views of the same schema in a session of its own (``vet``), so
that a failure that depends on no data is a free refusal, as on DuckDB. After
the debit it runs under a job tag, waited for until the run's deadline and no
longer, its jobs cancelled from then until its work ends (``engines/deadline.py``);
its rows are collected into the gate's process, batch by batch where
``keep`` (the private keys' noisy threshold) reduces them. Executors compute
exact aggregates only: noise, the ledger and the release never leave the gate.
"""

from __future__ import annotations

import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from decimal import Decimal
from typing import TYPE_CHECKING

from dpmagic.gate.engines.deadline import within_limit
from dpmagic.gate.engines.dialect import Dialect
from dpmagic.gate.engines.interface import (
    KEY_TYPES,
    MAX_PARTITIONS,
    VETTED_CACHE_SIZE,
    Batches,
    ExactResult,
    OutOfResources,
    PublicRead,
    drawn_timeout,
    within_max_rows,
)
from dpmagic.gate.engines.spark import session as sessions
from dpmagic.gate.engines.spark.dialect import SPARK
from dpmagic.gate.engines.spark.guard import guard
from dpmagic.gate.engines.spark.prepare import (
    FORMAT,
    SPARK_TYPES,
    catalog_identity,
    prepared_tables,
)
from dpmagic.gate.engines.versions import versions
from dpmagic.gate.failures import Failed, Refused
from dpmagic.gate.policy import Dataset, GateConfig

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


log = logging.getLogger("dpmagic.gate")

BATCH_ROWS = 65_536
# A run's jobs past its deadline are cancelled again at most this often.
CANCEL_EVERY_S = 0.05
# How often a cancelled run looks whether its tasks have ended.
TASKS_POLL_S = 0.05


class CannotRunOnSpark(Refused):
    """Generated SQL that fails on empty views of the tables: the failure cannot
    depend on the data, so its first line (Spark's error class) is quoted."""

    def __init__(self, error: Exception) -> None:
        text = str(error).strip()
        first = text.splitlines()[0] if text else type(error).__name__
        super().__init__(f"Spark cannot run this query: {first[:300]}")


class SparkDatabase:
    """A Spark dataset's tables as the engine queries them (``duckdb.database.Database``'s
    interface: ``dialect``, ``vet``, ``run``, ``public_facts``, ``close``)."""

    dialect: Dialect = SPARK
    columnar = False  # its rows come through Spark's Python rows (``run``)

    def __init__(self, dataset: Dataset, gate: GateConfig) -> None:
        config = dataset.spark
        if config is None:
            raise ValueError(f"dataset {dataset.name!r} has no [spark] settings")
        missing = [t for t in dataset.tables if t not in dataset.sources | dataset.catalog]
        if missing:
            raise FileNotFoundError(
                f"dataset {dataset.name!r}: table {missing[0]!r} has no source (a Spark "
                "dataset reads each table from Parquet, CSV or table:NAME in its catalog)"
            )
        absent = [p for p in dataset.sources.values() if not p.exists()]
        if absent:
            raise FileNotFoundError(f"dataset {dataset.name!r}: source {absent[0]} not found")
        self.timeout_s = gate.query_timeout_s
        self.tables = frozenset(dataset.tables)
        self.public = frozenset(n for n, t in dataset.tables.items() if t.public)
        self._vetted: set[str] = set()
        self._lock = threading.Lock()
        self.spark = sessions.isolated(config)
        self._classic = config.remote is None
        root = config.prepared or str(gate.state_dir / "spark")
        if config.prepared is None:
            (gate.state_dir / "spark").mkdir(mode=0o700, parents=True, exist_ok=True)
        self.locations = prepared_tables(self.spark, dataset, root, remote=not self._classic)
        self.versions = versions(
            dataset, more={"spark": FORMAT, "catalog": catalog_identity(self.spark, dataset)}
        )
        self._views(self.spark, empty=False)
        # Counted once, at start: the plan's proofs that sums cannot overflow rely on it.
        for name in sorted(self.locations):
            within_max_rows(dataset, name, self.spark.table(name).count())
        # The empty copy lives in a session of its own: same names, no row.
        self._empty = sessions.isolated(config)
        self._views(self._empty, empty=True)

    def _views(self, spark: SparkSession, empty: bool) -> None:
        for name, location in self.locations.items():
            frame = spark.read.parquet(location)
            if empty:
                frame = spark.createDataFrame([], frame.schema)
            frame.createOrReplaceTempView(name)

    def vet(self, sql: str) -> None:
        """Refuse, before the debit, SQL the guard will not run or that fails on empty
        views of the tables (a failure no data can be in). The verdict is remembered for
        the guard at run time but not consulted here, as on DuckDB
        (``duckdb.database.Database.vet``): the engine vets a text once per user, and a dry run
        or a replay is answered at once, unpadded, so a vet skipped because another
        user's query generated the same text would show in its time (docs/security.md,
        "Which replies are padded")."""
        guard(sql, self.tables)
        try:
            self._empty.sql(sql).collect()
        except Exception as exc:  # Spark raises many kinds; none holds data here
            raise CannotRunOnSpark(exc) from None
        with self._lock:
            if len(self._vetted) >= VETTED_CACHE_SIZE:
                self._vetted.clear()
            self._vetted.add(sql)

    def run(
        self,
        sql: str,
        keep: Callable[[list[tuple]], list[tuple]] | None = None,
        batches: Batches | None = None,
    ) -> ExactResult:
        """The exact rows, waited for until the run's deadline and no longer
        (``deadline.within_limit``): Spark stops a task where it looks for an interrupt
        (between records; inside a regular expression, not at all), and the reply does
        not wait for it; its job group is cancelled from the deadline until its work
        ends. Spark's errors are not quoted: after the debit, a message could carry a
        value. Never in columns (``columnar`` is false): ``batches`` is refused."""
        if batches is not None:
            raise ValueError("Spark's results come as rows: this store is not columnar")
        if sql not in self._vetted:
            guard(sql, self.tables)
        tag = f"dpmagic-{uuid.uuid4().hex}"

        def work() -> ExactResult:
            with self._tagged(tag):
                frame = self.spark.sql(sql)
                if keep is None:
                    return ExactResult(rows=[_exact(r) for r in frame.collect()])
                rows: list[tuple] = []
                batch: list[tuple] = []
                for r in frame.toLocalIterator():
                    batch.append(_exact(r))
                    if len(batch) >= BATCH_ROWS:
                        rows.extend(keep(batch))
                        batch = []
                rows.extend(keep(batch))
                return ExactResult(rows=rows, thresholded=True)

        try:
            return within_limit(
                work, drawn_timeout(self.timeout_s), _Cancel(self, tag), _out_of_memory
            )
        except (OutOfResources, Failed):
            raise
        except Exception as exc:
            log.error("Spark query failed after the debit: %s", type(exc).__name__)
            raise Failed() from None

    def read_public(self, read: PublicRead) -> tuple[list[str], list[tuple], bool]:
        """A query over public tables only, vetted on its tree already
        (``public_reads.py``), rendered in Spark's dialect: the guard again, with the
        public tables as the only tables and the public read's allow-list for its
        functions, then run under the time limit, at most its limit of rows fetched.
        Spark's errors are quoted: over public tables, nothing charged, they hold the
        query and public values at most."""
        sql = read.sql("spark")
        guard(sql, self.public, read.allowed)
        tag = f"dpmagic-{uuid.uuid4().hex}"

        def work() -> tuple[list[str], list[tuple], bool]:
            with self._tagged(tag):
                frame = self.spark.sql(sql)
                rows = [_exact(r) for r in frame.limit(read.limit + 1).collect()]
                return list(frame.columns), rows[: read.limit], len(rows) > read.limit

        try:
            return within_limit(
                work, drawn_timeout(self.timeout_s), _Cancel(self, tag), _out_of_memory
            )
        except (OutOfResources, Failed):
            raise
        except Exception as exc:
            raise CannotRunOnSpark(exc) from None

    @contextmanager
    def _tagged(self, tag: str) -> Iterator[None]:
        """The job group (or Connect's tag) ``tag`` around the work of the thread that
        runs a query, whose jobs cancelling it interrupts, task threads too; a failed
        run waits for its tasks to end before it returns."""
        if self._classic:
            self.spark.sparkContext.setJobGroup(tag, "dpmagic query", interruptOnCancel=True)
        else:
            self.spark.addTag(tag)
        try:
            yield
        except BaseException:
            self._until_tasks_end(tag)
            raise
        finally:
            if self._classic:
                self.spark.sparkContext.setJobGroup("", "")
            else:
                self.spark.removeTag(tag)

    def _until_tasks_end(self, tag: str) -> None:
        """Return once no task of the run's jobs is running. A cancelled job fails at
        once on the driver, but its tasks go on until they next look for an interrupt,
        which a regular expression never does (a ``LIKE`` with five ``%`` kept a core
        busy 41 s after its job had failed): the run's place is kept until then
        (``deadline.py``). Over Spark Connect the client cannot see the tasks."""
        if not self._classic:
            return
        tracker = self.spark.sparkContext.statusTracker()
        while True:
            jobs = [tracker.getJobInfo(job) for job in tracker.getJobIdsForGroup(tag)]
            stages = [tracker.getStageInfo(s) for j in jobs if j is not None for s in j.stageIds]
            if not any(stage is not None and stage.numActiveTasks > 0 for stage in stages):
                return
            time.sleep(TASKS_POLL_S)

    def cancel(self, tag: str) -> None:
        """Cancel the jobs of one run (``run``'s tag)."""
        if self._classic:
            self.spark.sparkContext.cancelJobGroup(tag)
        else:
            self.spark.interruptTag(tag)

    def public_facts(self, dataset: Dataset) -> Dataset:
        """As ``duckdb.database.Database.public_facts``: a public table's distinct values of each
        key column, when there are few enough, become declared keys; its rows and each
        column's most repeated value's rows bound what a join with it costs."""
        from pyspark.sql import functions as F

        tables = dict(dataset.tables)
        for table in dataset.tables.values():
            if not table.public or table.name not in self.locations:
                continue
            columns = dict(table.columns)
            frame = self.spark.table(table.name)
            for col in table.columns.values():
                most = frame.groupBy(col.name).count().agg(F.max("count")).collect()[0][0]
                columns[col.name] = replace(col, repeats=int(most or 0))
                if col.public_values is not None or col.type not in KEY_TYPES:
                    continue
                values = (
                    frame.select(F.col(col.name).try_cast(SPARK_TYPES[col.type]).alias("v"))
                    .where("v IS NOT NULL")
                    .distinct()
                    .orderBy("v")
                    .limit(MAX_PARTITIONS + 1)
                    .collect()
                )
                if 0 < len(values) <= MAX_PARTITIONS:
                    found = tuple(v for (v,) in values)
                    columns[col.name] = replace(
                        columns[col.name], public_values=found, values_read=True
                    )
            tables[table.name] = replace(table, columns=columns, rows=frame.count())
        return replace(dataset, tables=tables)

    def close(self) -> None:
        """The session stays: it is the process's, shared by its Spark datasets."""
        self._vetted.clear()


class _Cancel:
    """A run's jobs as the watchdog interrupts them: cancelled at most every
    ``CANCEL_EVERY_S`` (each a call into the JVM), until the run's work ends."""

    def __init__(self, store: SparkDatabase, tag: str) -> None:
        self._store, self._tag = store, tag
        self._last = -math.inf

    def interrupt(self) -> None:
        now = time.monotonic()
        if now - self._last >= CANCEL_EVERY_S:
            self._last = now
            self._store.cancel(self._tag)


def _out_of_memory(error: BaseException) -> bool:
    """Whether Spark failed a run for want of memory (told as running out of time,
    ``OutOfResources``)."""
    return "OutOfMemory" in type(error).__name__ + str(error)[:2000]


def _exact(row: object) -> tuple:
    """A Spark row as DuckDB's would be: an exact DECIMAL(38,0) sum as an integer."""
    return tuple(
        int(v) if isinstance(v, Decimal) and v == v.to_integral_value() else v
        for v in row  # type: ignore[attr-defined]
    )
