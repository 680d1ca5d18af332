"""The load-time half of per-unit bounding: each private table ranked and counted per
unit as a store prepares it (``sql/ranks.py`` states the whole scheme and its privacy
argument; its per-query half, the rooms each scan reads, is there).

At load (``prepare_sql``), each row of a private table gets its rank
``__dpmagic_rank`` (1, 2, …) within its unit, in an order drawn by a keyed hash,
under a secret seed, of the row's content and its copy number among identical rows
of the unit; ties are broken by the content itself, so the order is total. Rows whose
unit is NULL (or not of its declared type) belong to no one we can bound and are
dropped. Each kept row of a private table also carries, for every private table of
the dataset, its unit's count of rows there (``ROWS``).

Here, below the SQL passes, because every engine prepares its tables so (DuckDB's
``engines/duckdb/prepared.py``, Spark's ``engines/spark/prepare.py``) and reads the
names it stores; the passes import these names from here, never the other way.
"""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterable

import duckdb
from sqlglot import exp

from dpmagic.gate.failures import required
from dpmagic.gate.policy import DERIVED_UNIT, Column, Dataset, PolicyError, Table

RANK = "__dpmagic_rank"
ROWS = "__dpmagic_rows_"  # + a private table's name: its unit's count of kept rows there
STAGE = "__dpmagic_stage_"  # + a table's name: ranked, before the counts are added
SQL_TYPES = {
    "int": "BIGINT",
    "float": "DOUBLE",
    "str": "VARCHAR",
    "bool": "BOOLEAN",
    "date": "DATE",
}


def load_cap(dataset: Dataset) -> int:
    """The most rows of one unit any query's scan reads (``Dataset.load_cap``)."""
    return dataset.load_cap


def first_ranks(table: str, room: int) -> exp.Expression:
    """The filter that keeps each unit's first ``room`` ranks of ``table``: the rank
    itself, which every engine can read (a store that keeps ranks as row-id prefixes
    reads them so instead: ``dialect.Dialect.first_ranks``)."""
    return exp.LTE(this=exp.column(RANK, quoted=True), expression=exp.Literal.number(room))


def rank_end(table: str, room: int) -> str:
    """The name of the query parameter that holds how many rows of ``table`` have a
    rank of at most ``room``: the row id its first ``room`` ranks end before, where the
    table is stored in rank order. A name, so that the number, which depends on the
    data, is bound as the query runs and never written into SQL text, an error or a
    log. The table's name is hashed into it, so any table name gives an identifier."""
    digest = hashlib.sha256(table.encode()).hexdigest()[:16]
    return f"__dpmagic_end_{digest}_{room}"


def not_null_broken(table: str, column: str) -> str:
    """The refusal to start over data that breaks a ``not_null`` declaration: it names the
    table and the column, never a row or a value."""
    return (
        f"{table}.{column} is declared not_null, but some of its rows hold NULL (or a "
        "value that is not of its type): fix the data, or drop not_null"
    )


def bounded_by_units(dataset: Dataset, table: Table) -> bool:
    """Whether ``table`` is ranked and counted per unit at load."""
    return not table.public and dataset.privacy_unit is not None and table.unit_column is not None


def prepare_tables(
    con: duckdb.DuckDBPyConnection,
    dataset: Dataset,
    relations: dict[str, str],
    schema: str = "main",
    seed: int | None = None,
) -> None:
    """Create every table of ``relations`` (its name to a relation the gate wrote) in
    ``schema`` as ``prepare_sql`` makes it, then add to each private table the counts
    of kept rows per unit in every private table (see above), its rows stored in rank
    order.

    Why in rank order: every query's scan keeps ``rank <= room``, a filter DuckDB
    evaluates on every row it reads, unless the row group's smallest and largest rank
    (its zone map) already decide it. Stored as the window left them (by unit), every
    row group holds ranks from 1 to its largest, and the filter cost 3 ms of a 10M-row
    count's 15 (``benchmarks/plan_statistics.py``'s workload); in rank order, row groups
    of ranks within the room skip it and those beyond are not read, and it costs about
    0.5 ms. The order is a function of the ranks, which the bound already reads; what
    one unit changes is where each rank's rows begin and end, by its own rows, which
    moves the filter's work by at most a row group per rank within the room
    (docs/security.md, "Per-unit work")."""
    counted = [n for n in relations if bounded_by_units(dataset, dataset.tables[n])]
    for name in linked_first(dataset, relations):
        relation = relations[name]
        via = dataset.tables[name].via
        if via is not None:
            relation = _along_link(con, dataset, name, relation, schema)
        target = STAGE + name if name in counted else name
        select = prepare_sql(dataset, dataset.tables[name], relation, seed)
        con.execute(f"CREATE OR REPLACE TABLE {schema}.{quoted(target)} AS {select}")
        for col in dataset.tables[name].columns.values():
            if col.not_null:
                found = con.execute(
                    f"SELECT EXISTS (SELECT 1 FROM {schema}.{quoted(target)} "
                    f"WHERE {quoted(col.name)} IS NULL)"
                ).fetchone()
                if found is not None and found[0]:
                    raise PolicyError(not_null_broken(name, col.name))
    for name in counted:
        table = dataset.tables[name]
        columns, joins = ["__t.*"], []
        for i, other in enumerate(counted):
            kept = (
                f"SELECT {_unit(dataset.tables[other])} AS __u, "
                f"least(max({quoted(RANK)}), {load_cap(dataset)}) AS __n "
                f"FROM {schema}.{quoted(STAGE + other)} GROUP BY __u"
            )
            on = f"__t.{_unit(table)} = __c{i}.__u"
            if _unit_type(table) != _unit_type(dataset.tables[other]):
                on = f"CAST(__t.{_unit(table)} AS VARCHAR) = CAST(__c{i}.__u AS VARCHAR)"
            columns.append(f"COALESCE(__c{i}.__n, 0) AS {quoted(ROWS + other)}")
            joins.append(f"LEFT JOIN ({kept}) AS __c{i} ON {on}")
        # Stored in rank order (``stored_in_rank_order``).
        con.execute(
            f"CREATE OR REPLACE TABLE {schema}.{quoted(name)} AS SELECT {', '.join(columns)} "
            f"FROM {schema}.{quoted(STAGE + name)} AS __t {' '.join(joins)} "
            f"ORDER BY __t.{quoted(RANK)}"
        )
    for name in counted:
        con.execute(f"DROP TABLE {schema}.{quoted(STAGE + name)}")


def linked_first(dataset: Dataset, names: Iterable[str]) -> list[str]:
    """``names`` in an order that prepares a table after the one it reaches its unit
    through (``Table.via``), whose prepared key and unit its own units are read from."""
    todo, out = list(names), []
    while todo:
        ready = [
            n for n in todo
            if (via := dataset.tables[n].via) is None or via.table in out or via.table not in todo
        ]  # fmt: skip
        out += ready
        todo = [n for n in todo if n not in ready]
    return out


def _along_link(
    con: duckdb.DuckDBPyConnection, dataset: Dataset, name: str, relation: str, schema: str
) -> str:
    """``relation`` with each row's unit read along its table's link (``Table.via``):
    the unit of the row of the linked table whose key the row names, NULL (so the row
    is dropped, as any row without a unit) where none does. The key must be unique in
    the prepared linked table, else a row could name two units: the start is refused,
    naming the table and the column and no value."""
    table = dataset.tables[name]
    via = required(table.via, "the link a derived unit is read along")
    linked = dataset.tables[via.table]
    stage = f"{schema}.{quoted(STAGE + via.table)}"
    if not con.execute(f"SELECT 1 FROM duckdb_tables() WHERE table_name = '{STAGE}{via.table}'"
                       ).fetchone():  # fmt: skip
        raise PolicyError(f"{name}.{via.column} links to {via.table!r}, which is not in the data")
    key = quoted(via.key)
    repeats = con.execute(f"SELECT count({key}) <> count(DISTINCT {key}) FROM {stage}").fetchone()
    if repeats is not None and repeats[0]:
        raise PolicyError(
            f"{name}.{via.column} links to {via.table}.{via.key}, but that column is not a "
            "key: some of its values name several rows (fix the data, or link another column)"
        )
    own = stored(table.columns[via.column], f"__src.{quoted(via.column)}")
    return (
        f"(SELECT __src.*, __k.__u AS {quoted(DERIVED_UNIT)} FROM {relation} AS __src "
        f"LEFT JOIN (SELECT {key} AS __key, {_unit(linked)} AS __u FROM {stage}) AS __k "
        f"ON {own} = __k.__key)"
    )


def _unit(table: Table) -> str:
    return quoted(required(table.unit, "a private table's unit"))


def _unit_type(table: Table) -> str:
    return required(table.unit_column, "a private table's unit").type


def prepare_sql(dataset: Dataset, table: Table, source: str, seed: int | None = None) -> str:
    """``SELECT`` the prepared rows of ``table`` from the relation ``source``: its declared
    columns as ``stored``, and for a private table with a unit, ranked.

    ``source`` is SQL the gate wrote (a table name or a file reader), never
    user text. A table that declares no columns (a public one) is copied whole.
    """
    if not table.columns:
        return f"SELECT * FROM {source}"
    if not bounded_by_units(dataset, table):
        return f"SELECT {_stored_columns(table, '__src')} FROM {source} AS __src"
    seed = secrets.randbits(62) if seed is None else seed
    unit = required(table.unit_column, "a private table's unit")
    key = f'TRY_CAST(__row."{unit.name}" AS {SQL_TYPES[unit.type]})'
    columns = _stored_columns(table, "__row")
    if table.via is not None:  # read along the link (``_along_link``), already typed
        columns += f", {key} AS {quoted(DERIVED_UNIT)}"
    # __copy numbers identical rows, so that copies are ranked apart like any other rows.
    return (
        "WITH __rows AS (SELECT __src AS __row, row_number() OVER (PARTITION BY __src) AS __copy "
        f"FROM {source} AS __src) "
        f"SELECT {columns}, row_number() OVER (PARTITION BY {key} "
        f'ORDER BY hash(__row, __copy, {seed}), __row, __copy) AS "{RANK}" '
        f"FROM __rows WHERE {key} IS NOT NULL"
    )


def _stored_columns(table: Table, row: str) -> str:
    return ", ".join(
        f"{stored(c, f'{row}.{quoted(c.name)}')} AS {quoted(c.name)}"
        for c in table.columns.values()
    )


def stored(col: Column, raw: str) -> str:
    """A declared column as the gate stores it: its declared type (``TRY_CAST``: a value
    that is not one becomes NULL), clamped into its declared bounds (a text cut to its
    ``max_length`` characters), NULL staying NULL.
    Done once at load, it costs no query anything: the scan reads the column bare."""
    value = f"TRY_CAST({raw} AS {SQL_TYPES[col.type]})"
    if col.max_length is not None:
        # Text is cut to its declared length, which bounds the work on one row.
        return f"left({value}, {col.max_length})"
    if col.type in ("int", "float") and col.lower is not None and col.upper is not None:
        integral = col.type == "int"
        return clamp(value, col.lower, col.upper, integral)
    if col.dates is not None:
        lo, hi = (f"CAST('{d.isoformat()}' AS DATE)" for d in col.dates)
        return (
            f"(CASE WHEN {value} IS NULL THEN NULL WHEN {value} < {lo} THEN {lo} "
            f"WHEN {value} > {hi} THEN {hi} ELSE {value} END)"
        )
    return value


def clamp(value: str, lower: float, upper: float, integral: bool) -> str:
    """``value`` clamped into ``[lower, upper]`` as SQL text, NULL staying NULL."""
    lo, hi = number(lower, integral), number(upper, integral)
    # NaN compares above every number in DuckDB, so it is clamped to the upper bound.
    return (
        f"(CASE WHEN {value} IS NULL THEN NULL WHEN {value} < {lo} THEN {lo} "
        f"WHEN {value} > {hi} THEN {hi} ELSE {value} END)"
    )


def number(value: float, integral: bool) -> str:
    if integral:
        return str(int(value))
    return f"CAST('{float(value)!r}' AS DOUBLE)"


def quoted(name: str) -> str:
    """An identifier as DuckDB reads it whatever it holds."""
    return '"' + name.replace('"', '""') + '"'
