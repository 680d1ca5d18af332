"""Building blocks for tests of the gate: a real ``Engine`` over rows a test gives
(``running_engine``, the one way tests build an engine from a policy and rows), a
policy in memory, and the analysis pipeline run pass by pass on DuckDB tables the
test creates."""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import duckdb
import pyarrow as pa

from dpmagic.gate.dp.accounting import PureAccountant
from dpmagic.gate.engine import Engine
from dpmagic.gate.engines.interface import ExactResult
from dpmagic.gate.engines.ranking import prepare_tables
from dpmagic.gate.policy import Dataset, Policy, load_policy, parse_policy
from dpmagic.gate.sql.bound import bound
from dpmagic.gate.sql.check import check
from dpmagic.gate.sql.noise import exact_vectors as noise_exact_vectors
from dpmagic.gate.sql.parse import parse
from dpmagic.gate.sql.plan import plan
from dpmagic.gate.sql.plan_types import Plan
from dpmagic.gate.sql.resolve import resolve
from dpmagic.gate.sql.rewrite import Rewritten, rewrite

Rows = tuple[str, Iterable[Sequence[object]]]  # a CSV header, and the rows under it


def write_gate(folder: Path, policy: str, tables: Mapping[str, Rows] | None = None) -> Policy:
    """``policy`` (TOML text) written to ``folder/policy.toml`` and ``tables`` (each
    to ``folder/NAME.csv``, as the policy's sources name them), the policy loaded."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, (header, rows) in (tables or {}).items():
        lines = [header] + [",".join("" if v is None else str(v) for v in row) for row in rows]
        (folder / f"{name}.csv").write_text("\n".join(lines) + "\n")
    (folder / "policy.toml").write_text(policy)
    return load_policy(folder / "policy.toml")


@contextmanager
def running_engine(
    folder: Path, policy: str, tables: Mapping[str, Rows] | None = None
) -> Iterator[Engine]:
    """A real ``Engine`` over ``write_gate``'s files, closed on exit; its state
    directory is the policy's."""
    engine = Engine(write_gate(folder, policy, tables))
    try:
        yield engine
    finally:
        engine.close()


def dataset(
    columns: dict[str, dict],
    *,
    unit: str | None = "pid",
    neighbouring: str = "add_remove",
    max_partitions: int = 2,
    max_rows: int = 2,
    table: str = "t",
    more_tables: dict[str, dict] | None = None,
    table_options: dict | None = None,
) -> Dataset:
    """A dataset of one table ``table`` with ``columns``, and ``more_tables`` as
    declared in a policy (``{"u": {"columns": {...}}, "pub": {"public": True, ...}}``)."""
    raw = {
        "datasets": {
            "d": {
                "sources": {table: "unused.csv"},
                "neighbouring": neighbouring,
                "max_partitions": max_partitions,
                "max_rows_per_partition": max_rows,
                "user_budget": {"epsilon": 10.0},
                "tables": {
                    table: {"columns": columns, **(table_options or {})},
                    **(more_tables or {}),
                },
                **({"privacy_unit": unit} if unit else {}),
            }
        }
    }
    return sized(parse_policy(raw, Path("policy.toml")).dataset("d"))


# The rows a public table is given where no gate read it (``sized``).
PUBLIC_ROWS = 100


def sized(ds: Dataset, rows: int = PUBLIC_ROWS) -> Dataset:
    """``ds`` with each public table given ``rows`` rows, as a gate reads them at start
    (``Database.public_facts``), for plans made from a policy alone: the work bound
    (``sql/work.py``) needs a public table's size."""
    tables = {n: replace(t, rows=rows) if t.public else t for n, t in ds.tables.items()}
    return replace(ds, tables=tables)


def make_plan(sql: str, ds: Dataset, epsilon: float = 1.0) -> Plan:
    return plan(bound(check(resolve(parse(sql), ds))), epsilon, 0.0, PureAccountant())


def run_exact(p: Plan, con: duckdb.DuckDBPyConnection, seed: int) -> ExactResult:
    """The rewritten query run on tables prepared from ``con``'s raw tables as the gate
    prepares them at load, under ``seed`` (which also seeds any per-query bounding)."""
    return run_rewritten(p, con, seed)[1]


def run_rewritten(
    p: Plan, con: duckdb.DuckDBPyConnection, seed: int
) -> tuple[Rewritten, ExactResult]:
    """``run_exact``, with the query it ran: rewritten as the gate's ``generate`` does."""
    con.execute("CREATE SCHEMA IF NOT EXISTS prepared")
    present = {name for (name,) in con.execute("SHOW TABLES").fetchall()}
    relations = {t: f'main."{t}"' for t in p.dataset.tables if t in present}
    prepare_tables(con, p.dataset, relations, schema="prepared", seed=seed)
    con.execute("SET schema = 'prepared'")
    try:
        rw = rewrite(p, seed=seed)
        return rw, ExactResult(con.execute(rw.sql).fetchall())
    finally:
        con.execute("SET schema = 'main'")


def exact_vectors(p: Plan, con: duckdb.DuckDBPyConnection, seed: int) -> dict[str, list]:
    """Exact per-partition values of each measurement, in its noise's units (a centred
    sum's as ``noise.exact_units`` computes it); for each selection, the histogram of
    candidate indices per partition."""
    rw, exact = run_rewritten(p, con, seed)
    units, histograms = noise_exact_vectors(p, rw, exact.rows, p.partitions)
    return {**units, **histograms}


def load_table(con: duckdb.DuckDBPyConnection, name: str, columns: list[str], rows: list[tuple]):
    con.execute(f'DROP TABLE IF EXISTS "{name}"')
    types = {"pid": "BIGINT", "g": "BIGINT", "x": "BIGINT", "y": "DOUBLE", "s": "VARCHAR"}
    cols = ", ".join(f'"{c}" {types.get(c, "DOUBLE")}' for c in columns)
    con.execute(f'CREATE TABLE "{name}" ({cols})')
    insert_rows(con, f'"{name}"', rows)


def insert_rows(con: duckdb.DuckDBPyConnection, table: str, rows: Iterable[Sequence[object]]):
    """``rows`` appended to ``table`` (its columns in order, or those it names: ``t (a,
    b)``) through one Arrow table. DuckDB's ``executemany`` runs one INSERT a row, 0.7 ms
    each (3 s of CPU for 4,000 rows); here each column's Arrow type is read from its
    values and DuckDB casts it to the table's type, as it casts a bound parameter."""
    columns = list(zip(*rows, strict=True))
    if not columns:
        return
    arrow = pa.table(
        [pa.array(list(c)) for c in columns], names=[f"c{i}" for i in range(len(columns))]
    )
    con.register("inserted_rows", arrow)
    try:
        con.execute(f"INSERT INTO {table} SELECT * FROM inserted_rows")
    finally:
        con.unregister("inserted_rows")


def neighbours(
    rows: list[tuple], units: int, user_level: bool, neighbouring: str, replacement: list[tuple]
) -> Iterator[list[tuple]]:
    """Each neighbour of ``rows`` (``(pid, …)`` tuples of ``units`` privacy units): one unit
    (a pid at user level, a row at row level) removed, or under ``substitute`` its rows
    replaced by ``replacement`` (a row-level unit has one row, or none: our relation
    admits both)."""
    if user_level:
        targets = [[r for r in rows if r[0] == pid] for pid in range(1, units + 1)]
    else:
        targets = [[r] for r in rows]
    for target in targets:
        kept = list(rows)
        for r in target:
            kept.remove(r)
        if neighbouring == "substitute":
            pid = target[0][0] if target else 99
            swap = replacement if user_level else replacement[:1]
            kept += [(pid, *r) for r in swap]
        yield kept


def slow_runs(monkeypatch, seconds: float) -> None:
    """Every DuckDB run of the gate waits ``seconds`` before its work: a run that is
    surely past a deadline of a millisecond whatever the machine's load (a real run
    over a small table takes about that millisecond, so a starved waiter could see it
    done before its deadline came)."""
    from dpmagic.gate.engines.duckdb import database

    within_limit = database.within_limit

    def slowed(work, *args, **kwargs):
        def late():
            time.sleep(seconds)
            return work()

        return within_limit(late, *args, **kwargs)

    monkeypatch.setattr(database, "within_limit", slowed)
