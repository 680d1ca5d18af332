"""Pass 7: run generated SQL on a locked, read-only DuckDB.

The database is opened once per dataset, read-only, with external access,
extension loading and configuration changes switched off; each query gets a
fresh connection (cursor) of its own, so no temporary object or setting
survives it; the store waits for its work until the run's deadline and no longer,
and the gate's one timeout thread interrupts DuckDB from then until the work ends
(``engines/deadline.py``).

The database is the dataset's prepared copy (``prepared``): the declared
tables in a DuckDB file in the gate's state directory, readable by the gate's
user only, each private table ranked and counted per privacy unit
once (``ranking.prepare_tables``), so that no query has to sort the data
to bound contributions; made at the first start and reused by later ones.

Before anything runs, DuckDB's own parser (independent of the sqlglot one
the analysis passes use) checks the SQL: exactly one ``SELECT``, reading only
the dataset's declared tables and its own CTEs, with no table function but
``range``/``generate_series``/``unnest``, no catalog, settings, variable or
file function, no aggregate that returns row values, no sampling clause, no
``SHOW``/``DESCRIBE``/``SUMMARIZE`` and no recursive CTE.
The locked configuration stops what touches files, extensions and settings;
this guard stops what a read-only connection would still answer (catalog
functions, ``query()``, a second statement), so that even SQL the analysis
wrongly let through could not read more than declared tables.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
import threading
import warnings
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TypeVar

import duckdb
import pyarrow as pa

from dpmagic.gate.engines.deadline import within_limit
from dpmagic.gate.engines.dialect import DUCKDB
from dpmagic.gate.engines.duckdb.prepared import Setting, prepared_file
from dpmagic.gate.engines.interface import (
    KEY_TYPES,
    MAX_PARTITIONS,
    VETTED_CACHE_SIZE,
    Batches,
    ExactResult,
    PublicRead,
    drawn_timeout,
    within_max_rows,
)
from dpmagic.gate.engines.ranking import RANK, SQL_TYPES, bounded_by_units, load_cap, rank_end
from dpmagic.gate.engines.versions import versions
from dpmagic.gate.failures import Refused, required
from dpmagic.gate.policy import Column, Dataset, GateConfig, PolicyError, Table

log = logging.getLogger("dpmagic.gate")
T = TypeVar("T")


class UnsafeSQL(Refused):
    """SQL the execution guard will not run: a bug of the gate's, caught before the debit."""

    def __init__(self) -> None:
        super().__init__("the gate will not run the SQL it generated for this query")


class CannotRun(Refused):
    """Generated SQL that fails on an empty copy of the tables: whatever made it fail
    (a binder error, a constant that overflows) does not depend on the data."""

    def __init__(self, error: duckdb.Error) -> None:
        # The copy holds no row, so the message can quote the query, never data.
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        super().__init__(f"DuckDB cannot run this query: {first}")


# Table functions the generated SQL may use: they produce numbers, never read state.
TABLE_FUNCTIONS = frozenset({"range", "generate_series", "unnest"})
# Scalar functions that read the catalog, settings, variables, files or the environment.
STATE_FUNCTIONS = frozenset(
    {"query", "query_table", "getvariable", "glob", "sniff_csv", "error", "version", "getenv"}
)
STATE_PREFIXES = ("duckdb_", "pragma_", "read_", "current_", "pg_", "json_", "parquet_")
# Aggregates whose result is a row's value (or a list of them): never what noise is added to.
# (``histogram`` is not one: quantiles count rows per public candidate with it.)
VALUE_AGGREGATES = frozenset(
    {
        "list", "array_agg", "string_agg", "group_concat", "listagg",
        "any_value", "arbitrary", "first", "last", "arg_max", "arg_min", "argmax", "argmin",
        "max_by", "min_by", "mode", "bitstring_agg",
    }
)  # fmt: skip


# DuckDB's common-subexpression optimiser hoists an expression written twice inside a
# ``TRY(…)`` out of it, where its error is no longer caught (``TRY(CASE WHEN (pid * pid)
# IS NULL … LEAST(1, pid * pid) END)`` overflowed on one unit's row): off everywhere.
TRY_BREAKING_OPTIMIZERS = "common_subexpressions"
# DuckDB's runtime join filters are built from the join's build side as it runs (its
# smallest and largest key): one unit's extreme value turns them off, and then every
# other row is compared with the whole public table (a condition join on 1M units:
# +2.6 s from one unit, benchmarks/per_unit_work.py). Off: a plan's work then follows
# its SQL, not one unit's values.
DATA_DEPENDENT_OPTIMIZERS = "join_filter_pushdown"
# The configuration of every connection that runs generated SQL: no file, network,
# extension or setting can be reached from it, and ``TRY`` means what it says.
LOCKED: dict[str, Setting] = {
    "enable_external_access": False,
    "autoinstall_known_extensions": False,
    "autoload_known_extensions": False,
    "allow_community_extensions": False,
    # A name DuckDB's Python client does not find as a table would otherwise be read
    # from the calling Python frame's variables (a DataFrame of the gate's own); the
    # guard refuses undeclared names first, and this makes DuckDB refuse them too.
    "python_enable_replacements": False,
    "lock_configuration": True,
    "disabled_optimizers": f"{TRY_BREAKING_OPTIMIZERS},{DATA_DEPENDENT_OPTIMIZERS}",
}
# DuckDB's optimisers that plan from the data's statistics: off in the database
# (``Database.run``).
STATISTICS_OPTIMIZERS = (
    f"{TRY_BREAKING_OPTIMIZERS},{DATA_DEPENDENT_OPTIMIZERS},statistics_propagation,"
    "compressed_materialization"
)
# Beyond this load cap, ranked tables keep the rank filter (``Database._rank_ends``
# lists a row count per room).
MAX_PREFIX_ROOMS = 4096
PLAIN_CATALOG = "prepared"  # the name the database attaches the prepared file under
# How long closing waits for runs past their deadline to stop.
CLOSE_WAIT_S = 30.0
# Rows fetched at a time when each batch is reduced as it arrives.
BATCH_ROWS = 65_536
# DuckDB warns that a cursor's result is copied once more on its way to Arrow; a
# relation's would not be, but the guard leaves the cursor a result a relation cannot
# follow, and the copy of 100,000 rows costs nothing measurable (19.6 ms either way).
ARROW_COPY_WARNING = "Arrow output on a DB-API result"
warnings.filterwarnings("ignore", ARROW_COPY_WARNING, UserWarning)


class Database:
    """A DuckDB dataset's prepared file, locked and read-only (see the module's docstring)."""

    columnar = True

    def __init__(self, dataset: Dataset, gate: GateConfig) -> None:
        missing = [p for p in dataset.sources.values() if not p.exists()]
        if missing:
            raise FileNotFoundError(f"dataset {dataset.name!r}: source {missing[0]} not found")
        if dataset.database is not None and not dataset.database.exists():
            raise FileNotFoundError(
                f"dataset {dataset.name!r}: database {dataset.database} not found"
            )
        path = prepared_file(dataset, gate)
        self.versions = versions(dataset)
        self.timeout_s = gate.query_timeout_s
        self.tables = frozenset(name.lower() for name in dataset.tables)
        self.public = frozenset(t.name for t in dataset.tables.values() if t.public)
        # Runs whose connection is open, their work stopped or not (``close`` waits).
        self._working = threading.Condition()
        self._runs = 0
        # The guard's verdict, and the parameters a text names, are functions of the SQL
        # text and ``tables`` alone.
        self._vetted: dict[str, tuple[str, ...]] = {}
        # One DuckDB instance holds the file, so that the policy's ``memory_limit`` (one
        # buffer pool per instance) bounds all of it: a second, which planned from the
        # statistics and answered the start's own reads, held 25 MB more at rest.
        # Where DuckDB spills a query's sorts and joins past the memory limit: a folder
        # of the gate's own in its state directory (0700), removed at close. DuckDB's
        # default is ``.tmp`` in the working directory, where a copy of private rows
        # could be read by others and outlive a killed gate.
        self._spill = Path(tempfile.mkdtemp(prefix=f"{dataset.name}.queries.", dir=path.parent))
        self._db = _without_statistics(path, gate, self._spill)
        self._empty = _empty_copy(self._db)
        # Read-only, so checked once: the plan's proofs that sums cannot overflow rely on it.
        for name in sorted(self.tables):
            rows = self._one(f'SELECT COUNT(*) FROM "{_ident(name)}"')
            try:
                within_max_rows(dataset, name, rows)
            except PolicyError:
                self.close()
                raise
        # Where each ranked table's first ranks end (``Dialect.first_ranks``), if every one
        # is stored in rank order; read once, as the data is.
        self._ends = self._rank_ends(dataset)
        self.dialect = replace(DUCKDB, rank_prefixes=self._ends is not None)

    def vet(self, sql: str) -> None:
        """Refuse, before the debit, SQL the guard will not run or that fails for reasons
        that do not depend on the data: it is run on an empty copy of the tables (same
        names, same types, no row), which binds, optimises (folding constants) and
        executes it. Row expressions cannot fail on data (``totality``), so SQL that
        passes here fails on the real tables only for want of time or memory. The
        verdict is a function of the SQL text alone, remembered for the guard at run
        time, but not consulted here: the engine vets a text once per user (its
        analyses are kept per user), and a dry run or a replay is answered at once,
        unpadded, so a vet skipped because another user's query generated the same
        text would show in its time (docs/security.md, "Which replies are padded")."""
        con = self._empty.cursor()
        try:
            statement, names = self._walked(con, sql)
            # The copy has no rows: every table's first ranks end at row 0. The statement
            # the walk had DuckDB parse is the one run (0.6 ms rather than 1 ms for the
            # text, which DuckDB would parse and prepare again).
            con.execute(statement, dict.fromkeys(names, 0) or None).fetchall()
        except duckdb.Error as exc:
            raise CannotRun(exc) from None
        finally:
            con.close()
        self._remember(sql, names)

    def run(
        self,
        sql: str,
        keep: Callable[[list[tuple]], list[tuple]] | None = None,
        batches: Batches | None = None,
    ) -> ExactResult:
        """The exact rows; with ``batches``, in columns instead (Arrow record batches of
        ``BATCH_ROWS``, each reduced by ``batches`` as it is fetched: no Python object
        per value; 100,000 groups fetched in 21 ms rather than 70).

        Memory is bounded without a per-query limit: DuckDB's ``memory_limit`` is per
        database (one per gate), and it has no per-connection or per-query limit; the locked
        configuration could not change it per query anyway. With public keys the result is
        at most ``MAX_PARTITIONS`` rows, refused at planning otherwise, and is fetched
        whole: measured with ``benchmarks/fetch_memory.py`` (1M rows, 100,000 partitions),
        117 MB peak fetched whole, 108 MB in batches, 92 MB for the query alone, while the
        release pass needs every row at once. With private keys the result has a row per key
        found, as many as the table has rows: ``keep`` (the noisy threshold) then reduces
        each batch as it is fetched, so only the kept keys are ever held in Python; so it
        does, with keys declared value by value and tested at fetch
        (``Plan.listed_at_fetch``), for the keys nobody declared.

        Every query is planned without the data's statistics (``_without_statistics``: each
        column's smallest and largest value, and the runtime join filters built from
        them, off), so that its plan is a function of the SQL alone. With them, one
        unit's values decided the plan's work for every other row, beyond anything
        its own rows could add: a condition join with a public table, pruned by the
        column's largest value where no unit had a large one, compared every row with
        the whole table once the target's large value was there (300,000 units:
        +868 ms from one unit with statistics, +56 ms without;
        ``benchmarks/per_unit_work.py``); and planning could fail where the
        statistics let the optimiser fold an expression it then could not rebind
        (``'' <= CASE WHEN pid = <a value no unit has> THEN '' END``), a failure that
        depended on the data. The price is speed: 1.3–1.5× on simple aggregates of
        3M rows (count by a key 5.7 → 7.4 ms), where the statistics let DuckDB pick
        a perfect hash and compress its intermediates."""
        return self._execute(self._db, sql, keep, catalog=PLAIN_CATALOG, batches=batches)

    def read_public(self, read: PublicRead) -> tuple[list[str], list[tuple], bool]:
        """A query over public tables only, vetted on its tree already
        (``public_reads.py``): walked again as DuckDB parses it with the public tables
        as the only tables (``_walk``), run under the time limit, at most its limit of
        rows fetched. The columns, the rows, and whether there were more."""
        sql, limit = read.sql("duckdb"), read.limit
        con = self._db.cursor()
        con.execute(f"USE {PLAIN_CATALOG}")

        def work() -> tuple[list[str], list[tuple], bool]:
            if self._walk(con, sql, self.public):
                raise UnsafeSQL()  # a parameter: none is a public read's
            try:
                cursor = con.execute(sql)
                columns = [d[0] for d in cursor.description or []]
                rows = cursor.fetchmany(limit + 1)
            except duckdb.Error as exc:
                if _ran_out(exc):
                    raise
                # Over public tables only: DuckDB's words quote the query and public
                # values at most, and nothing was charged.
                raise CannotRun(exc) from None
            return columns, rows[:limit], len(rows) > limit

        return self._within_limit(con, work)

    def _execute(
        self,
        db: duckdb.DuckDBPyConnection,
        sql: str,
        keep: Callable[[list[tuple]], list[tuple]] | None,
        catalog: str | None = None,
        batches: Batches | None = None,
    ) -> ExactResult:
        con = db.cursor()
        if catalog is not None:  # each cursor starts in the in-memory catalog
            con.execute(f"USE {catalog}")

        def work() -> ExactResult:
            names = self._guard(con, sql)
            cursor = con.execute(sql, self._parameters(names))
            if batches is not None:
                reader = required(cursor.to_arrow_reader(BATCH_ROWS), "the result's batches")
                kept = [batches(batch) for batch in reader]
                table = pa.Table.from_batches(kept, schema=reader.schema)
                return ExactResult(rows=[], table=table)
            if keep is None:
                return ExactResult(rows=cursor.fetchall())
            rows: list[tuple] = []
            while batch := cursor.fetchmany(BATCH_ROWS):
                rows.extend(keep(batch))
            return ExactResult(rows=rows, thresholded=True)

        return self._within_limit(con, work)

    def _within_limit(self, con: duckdb.DuckDBPyConnection, work: Callable[[], T]) -> T:
        """``work`` on ``con``, waited for until the run's deadline only
        (``deadline.within_limit``): DuckDB looks for an interrupt between vectors, and
        how long one vector takes follows its rows; the reply does not wait for it. The
        connection is closed once its work has truly ended, and ``close`` waits for it."""

        def closed() -> None:
            con.close()
            with self._working:
                self._runs -= 1
                self._working.notify_all()

        with self._working:
            self._runs += 1
        return within_limit(work, drawn_timeout(self.timeout_s), con, _ran_out, close=closed)

    def public_facts(self, dataset: Dataset) -> Dataset:
        """``dataset`` with facts read from each public table itself, whose contents are
        public: its undeclared key values (grouping by one of its columns releases keys
        known before any private row is read), its rows and each column's most repeated
        value's rows (how many rows one row joined to it can match: ``sql/work.py``)."""
        tables = dict(dataset.tables)
        for table in dataset.tables.values():
            if not table.public or table.name not in self.tables:
                continue
            columns = dict(table.columns)
            for col in table.columns.values():
                if col.public_values is None and col.type in KEY_TYPES:
                    values = self._distinct(table.name, col.name, SQL_TYPES[col.type])
                    if values:
                        columns[col.name] = replace(col, public_values=values, values_read=True)
                columns[col.name] = replace(columns[col.name], repeats=self._repeats(table, col))
            rows = self._one(f'SELECT COUNT(*) FROM "{_ident(table.name)}"')
            tables[table.name] = replace(table, columns=columns, rows=rows)
        return replace(dataset, tables=tables)

    def _repeats(self, table: Table, col: Column) -> int:
        """The most rows of a public table that share one stored value of ``col``."""
        name, column = _ident(table.name), _ident(col.name)
        found = self._one(
            f'SELECT max(n) FROM (SELECT COUNT(*) AS n FROM "{name}" GROUP BY "{column}")'
        )
        return found or 0

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        """A connection of the database in the prepared file's catalog (each cursor
        starts in the in-memory one)."""
        con = self._db.cursor()
        con.execute(f"USE {PLAIN_CATALOG}")
        return con

    def _one(self, sql: str) -> int:
        con = self._cursor()
        try:
            (value,) = required(con.execute(sql).fetchone(), "a count's row")
        finally:
            con.close()
        return int(value or 0)

    def _distinct(self, table: str, column: str, sql_type: str) -> tuple[object, ...] | None:
        """The distinct non-NULL values of a public column, if there are few enough
        to release as keys; ``None`` when there are too many or the table is absent."""
        con = self._cursor()
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
        """Close the database once the runs abandoned at their deadline have stopped
        (they are being interrupted), or after ``CLOSE_WAIT_S``."""
        with self._working:
            self._working.wait_for(lambda: self._runs == 0, CLOSE_WAIT_S)
        self._db.close()
        self._empty.close()
        shutil.rmtree(self._spill, ignore_errors=True)

    def _guard(self, con: duckdb.DuckDBPyConnection, sql: str) -> tuple[str, ...]:
        """Raise ``UnsafeSQL`` unless ``sql`` passes (see the module's docstring); the
        names of the parameters it takes. Parsing and walking DuckDB's tree takes about
        2 ms, as long as the rest of a small query, so a text that passed once is not
        walked again."""
        names = self._vetted.get(sql)
        if names is None:
            names = self._walk(con, sql)
            self._remember(sql, names)
        return names

    def _remember(self, sql: str, names: tuple[str, ...]) -> None:
        if len(self._vetted) >= VETTED_CACHE_SIZE:
            self._vetted.clear()
        self._vetted[sql] = names

    def _walk(
        self, con: duckdb.DuckDBPyConnection, sql: str, tables: frozenset[str] | None = None
    ) -> tuple[str, ...]:
        """The guard's walk of DuckDB's own parse of ``sql``, reading only ``tables`` (the
        declared ones unless given); the parameters it names, each of them where a
        ranked table's first ranks end (nothing else may be one)."""
        return self._walked(con, sql, tables)[1]

    def _walked(
        self, con: duckdb.DuckDBPyConnection, sql: str, tables: frozenset[str] | None = None
    ) -> tuple[duckdb.Statement, tuple[str, ...]]:
        """``_walk``, and the one statement DuckDB parsed ``sql`` to, ready to run."""
        tables = self.tables if tables is None else tables
        statements = con.extract_statements(sql)
        if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT:
            raise UnsafeSQL()
        (text,) = required(
            con.execute("SELECT json_serialize_sql(?)", [sql]).fetchone(), "the parsed query"
        )
        nodes: list[dict] = []  # every object of the tree: each check below reads this list
        tree = json.loads(text, object_hook=_gathered(nodes))
        if tree.get("error"):
            raise UnsafeSQL()
        readable = tables | {key.lower() for key in _values(nodes, "key")}  # and the CTEs
        for node in nodes:
            if not _safe(node, readable):
                raise UnsafeSQL()
        names = tuple(sorted(_values(nodes, "key", "named_param_map")))
        if any(name not in (self._ends or {}) for name in names):
            raise UnsafeSQL()
        return statements[0], names

    def parameters(self, sql: str) -> dict[str, int] | None:
        """The values ``run`` binds to ``sql``'s parameters, for running it elsewhere on
        the same prepared file (``benchmarks/per_pass.py`` times the SQL alone)."""
        con = self._cursor()
        try:
            return self._parameters(self._guard(con, sql))
        finally:
            con.close()

    def _parameters(self, names: tuple[str, ...]) -> dict[str, int] | None:
        """The values of the parameters ``names``: where ranked tables' first ranks end.
        They depend on the data, so they are bound here and written nowhere else."""
        if not names:
            return None
        ends = required(self._ends, "the ends of the ranks, for a text that names them")
        return {name: ends[name] for name in names}

    def _rank_ends(self, dataset: Dataset) -> dict[str, int] | None:
        """For each ranked table and each room up to the load cap, how many of its rows
        have a rank of at most that room (by the name of its parameter, ``ranking.rank_end``);
        ``None`` unless every ranked table is stored in rank order, so that those rows are
        the ones before that row id (``ranking.prepare_tables`` stores them so; a file an
        earlier gate prepared otherwise keeps the rank filter), or where the load cap is
        too large to list."""
        cap = load_cap(dataset)
        if dataset.privacy_unit is None or cap > MAX_PREFIX_ROOMS:
            return None
        ends: dict[str, int] = {}
        for table in dataset.tables.values():
            if not bounded_by_units(dataset, table) or table.name.lower() not in self.tables:
                continue
            if any(c.lower() == "rowid" for c in table.columns):
                return None  # ``rowid`` would name the column, not the row
            con = self._cursor()
            try:
                ranks = con.execute(
                    f'SELECT "{RANK}", COUNT(*), MIN(rowid), MAX(rowid) '
                    f'FROM "{_ident(table.name)}" GROUP BY ALL ORDER BY 1'
                ).fetchall()
            finally:
                con.close()
            below, ending = 0, []  # ending[r - 1]: the rows ranked at most r
            for rank, (value, count, first, last) in enumerate(ranks, start=1):
                if (value, first, last) != (rank, below, below + count - 1):
                    return None
                below += count
                ending.append(below)
            for room in range(1, cap + 1):
                ends[rank_end(table.name, room)] = (
                    ending[min(room, len(ending)) - 1] if ending else 0
                )
        return ends


def _without_statistics(path: Path, gate: GateConfig, spill: Path) -> duckdb.DuckDBPyConnection:
    """The prepared file, read-only, attached to an in-memory database whose optimiser
    does not use the data's statistics, its catalog the default, spilling into
    ``spill``; then locked (no file, extension or setting reachable; ``LOCKED``)."""
    db = duckdb.connect(
        ":memory:",
        config={
            **LOCKED,
            "enable_external_access": True,  # to attach the file; switched off below
            "lock_configuration": False,
            "disabled_optimizers": STATISTICS_OPTIMIZERS,
            "memory_limit": gate.memory_limit,
            "threads": gate.threads,
            "temp_directory": str(spill),
        },
    )
    db.execute(f"ATTACH {_literal(str(path))} AS {PLAIN_CATALOG} (READ_ONLY)")
    db.execute(f"USE {PLAIN_CATALOG}")
    db.execute("SET enable_external_access = false")
    db.execute("SET lock_configuration = true")
    return db


def _ran_out(error: BaseException) -> bool:
    """Whether DuckDB stopped a run for want of memory (or was interrupted: only ever
    after the run's deadline, when its reply has already left)."""
    return isinstance(error, (duckdb.OutOfMemoryException, duckdb.InterruptException))


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _empty_copy(db: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """An in-memory database with ``db``'s tables, column for column, and no row."""
    empty = duckdb.connect(":memory:", config={**LOCKED, "threads": 1, "lock_configuration": False})
    columns: dict[str, list[str]] = {}
    for table, column, sql_type in db.execute(
        "SELECT table_name, column_name, data_type FROM duckdb_columns() "
        f"WHERE database_name = '{PLAIN_CATALOG}' AND schema_name = 'main' "
        "ORDER BY table_name, column_index"
    ).fetchall():
        columns.setdefault(table, []).append(f'"{_ident(column)}" {sql_type}')
    for table, cols in columns.items():
        empty.execute(f'CREATE TABLE "{_ident(table)}" ({", ".join(cols)})')
    empty.execute("SET lock_configuration = true")
    return empty


def _safe(node: dict, tables: frozenset[str]) -> bool:
    kind = node.get("type")
    if kind in ("SHOW_REF", "RECURSIVE_CTE_NODE") or node.get("sample"):
        return False
    if kind == "BASE_TABLE":
        return (
            not node.get("catalog_name")
            and node.get("schema_name", "") in ("", "main")
            and str(node.get("table_name", "")).lower() in tables
        )
    if kind == "TABLE_FUNCTION":
        function = node.get("function") or {}
        return str(function.get("function_name", "")).lower() in TABLE_FUNCTIONS
    if node.get("class") == "FUNCTION":
        name = str(node.get("function_name", "")).lower()
        return (
            not node.get("catalog")
            and not node.get("schema")
            and name not in STATE_FUNCTIONS | VALUE_AGGREGATES
            and not name.startswith(STATE_PREFIXES)
        )
    return True


def _gathered(into: list[dict]) -> Callable[[dict], dict]:
    """A ``json.loads`` hook that puts every JSON object of DuckDB's serialised parse
    tree into ``into`` as the parser builds it (nested ones first), so that no second
    walk of the tree is needed to find them."""

    def gather(node: dict) -> dict:
        into.append(node)
        return node

    return gather


def _values(nodes: list[dict], key: str, field: str = "map") -> list[str]:
    """Every ``key`` of an entry of a ``field`` list among ``nodes`` (``_gathered``): the CTE
    names (a ``cte_map``'s ``map``), or the parameters' names (a statement's
    ``named_param_map``)."""
    return [
        entry[key]
        for node in nodes
        if isinstance(node.get(field), list)
        for entry in node[field]
        if isinstance(entry, dict) and isinstance(entry.get(key), str)
    ]


def _ident(name: str) -> str:
    return name.replace('"', '""')
