"""The policy's typed values, which every pass reads: datasets, tables, columns, budgets.

Everything here is public by definition: it is written by the owner, shown to
users by ``/v1/schema``, and never derived from the data. The file's shape is
checked in ``schema.py`` and turned into these values in ``parsing.py``.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Literal

ColumnType = Literal["int", "float", "str", "bool", "date"]
# The most rows a plain read of public tables returns unless the policy says otherwise.
DEFAULT_PUBLIC_ROW_LIMIT = 10_000
COLUMN_TYPES: tuple[str, ...] = ("int", "float", "str", "bool", "date")
# Characters of a text value kept at load unless a column declares ``max_length``: the
# work any expression does on one row is then bounded, so one unit's rows cannot
# slow a query by much (SECURITY.md, per-unit work).
DEFAULT_MAX_LENGTH = 1024
MAX_MAX_LENGTH = 1_000_000
# ``max_partitions × max_rows_per_partition``, the most rows of one unit a query
# reads, is at most this: fewer than 2^40 units (``engines.interface.MAX_ROWS``) with this many
# rows each then fit a 64-bit count, and the exact sums' overflow proofs hold.
MAX_UNIT_ROWS = 2**22
# The most steps of work one unit may add to a query (``sql/work.py``), unless a dataset
# sets ``max_unit_work``: about 50 ms of DuckDB's time at the 3 ns a step measured
# (``benchmarks/per_unit_work.py``), well under the default padding quantum.
DEFAULT_MAX_UNIT_WORK = 2**24
# What one step of ``sql/work.py`` stands for: about 3 ns of DuckDB's time.
STEP_NS = 3
# The rows of one DuckDB vector. DuckDB checks for an interrupt only between vectors,
# and under ``TRY`` a row that raises sends its whole vector through the slow path.
VECTOR_ROWS = 2048
# The most of the padding quantum one vector's rows may cost at their price
# (``max_row_work``); each price is at least twice the worst time measured
# (``sql/prices.py``), so a run past its time limit stops within half a quantum.
VECTOR_SHARE_OF_QUANTUM = 1.0
# The longest text a row expression may make (concatenations, case mappings), unless
# a dataset sets ``max_text_length``; at least every text column's ``max_length``.
DEFAULT_MAX_TEXT_LENGTH = 4 * DEFAULT_MAX_LENGTH
DEFAULT_QUANTUM_MS = 250.0


def row_work_limit(quantum_ms: float) -> int:
    """The most steps one row may cost (``max_row_work``) so that a vector of them
    costs at most ``VECTOR_SHARE_OF_QUANTUM`` of the padding quantum (the default
    quantum's where padding is off: a run must still stop soon after its limit)."""
    quantum_ns = (quantum_ms or DEFAULT_QUANTUM_MS) * 1e6
    return int(VECTOR_SHARE_OF_QUANTUM * quantum_ns / (VECTOR_ROWS * STEP_NS))


# Queries of one user that may fail after the debit (out of time or memory) in a day,
# before the gate refuses that user's queries on the dataset (``engine._within_failures``).
DEFAULT_MAX_RESOURCE_FAILURES = 3


class AccountantKind(StrEnum):
    """How a dataset's spending composes (``accounting``): pure ε-DP, approximate
    (ε, δ)-DP, or zero-concentrated DP with Gaussian noise."""

    PURE = "pure"
    APPROX = "approx"
    ZCDP = "zcdp"


class Neighbouring(StrEnum):
    """Which datasets are neighbours: one unit added or removed, or one unit's rows
    replaced by any others."""

    ADD_REMOVE = "add_remove"
    SUBSTITUTE = "substitute"


class EngineKind(StrEnum):
    """What runs a dataset's generated SQL: DuckDB in the gate's process (one machine),
    or Apache Spark (a local session, a cluster or Spark Connect)."""

    DUCKDB = "duckdb"
    SPARK = "spark"


@dataclass(frozen=True)
class SparkConfig:
    """How the gate reaches Spark: ``master`` (``local[2]``, ``spark://host:7077``) for a
    session the gate starts, or ``remote`` (``sc://host:15002``) for Spark Connect;
    ``conf`` is passed to the session as it is (the gate's own settings win);
    ``prepared`` is where the prepared tables are written (a folder or URI only the
    gate's principal can read; default: ``spark/`` in the gate's state directory)."""

    master: str | None
    remote: str | None
    conf: tuple[tuple[str, str], ...] = ()
    prepared: str | None = None

    @property
    def where(self) -> str:
        """The master, or the Connect URL cut to its host and port: its parameters may
        hold a token, which neither the schema nor the gate's log repeats."""
        if self.master:
            return self.master
        return (self.remote or "").split(";", 1)[0].removesuffix("/")

    def as_dict(self) -> dict[str, object]:
        """The public part, for ``/v1/schema``: where Spark runs, not how it is set."""
        return {"master" if self.master else "remote": self.where}


CATALOG_PREFIX = "table:"  # a source read from Spark's catalog by name
ACCOUNTANTS: tuple[str, ...] = tuple(AccountantKind)
ENGINES: tuple[str, ...] = tuple(EngineKind)
NEIGHBOURING: tuple[str, ...] = tuple(Neighbouring)


class PolicyError(ValueError):
    """The policy file is malformed; the message names the key at fault."""


@dataclass(frozen=True)
class RandomizedResponse:
    """How a column's values were collected: each respondent reported their true
    value with probability ``p``, else one drawn uniformly from the column's
    ``public_values``. The gate debiases counts and means over such a column
    (see ``sql/randomized.py``); the data holds only the reported values."""

    p: float

    def as_dict(self) -> dict[str, float]:
        return {"p": self.p}


class Period(StrEnum):
    """How often a renewing budget starts afresh (``ledger/scopes.py``)."""

    DAY = "day"
    WEEK = "week"
    MONTH = "month"


PERIODS = tuple(p.value for p in Period)


class Sharing(StrEnum):
    """Who is served an answer another user was released (``share_releases``)."""

    NONE = "none"
    GROUP = "group"  # users who share a group with the one it was released to
    EVERYONE = "everyone"


SHARINGS = tuple(s.value for s in Sharing)


@dataclass(frozen=True)
class Budget:
    """A privacy amount in (ε, δ) terms: a limit, a spend or a default. A limit may
    ``renew`` each period: then it bounds what is spent within one period."""

    epsilon: float
    delta: float = 0.0
    renew: Period | None = None

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"epsilon": self.epsilon, "delta": self.delta}
        if self.renew is not None:
            out["renew"] = self.renew.value
        return out


@dataclass(frozen=True)
class Column:
    """A column as the owner declared it; bounds and keys are public facts."""

    name: str
    type: ColumnType
    lower: float | None = None
    upper: float | None = None
    public_values: tuple[object, ...] | None = None
    dates: tuple[dt.date, dt.date] | None = None  # a date column's bounds
    randomized_response: RandomizedResponse | None = None
    max_length: int | None = None  # a text column's characters kept at load
    # A public table's column: the most rows sharing one stored value (read at start).
    repeats: int | None = None
    # A public table's column whose ``public_values`` are the values the table holds,
    # read at start: a key of it needs no list in the SQL, only NOT NULL.
    values_read: bool = False
    # The owner's fact that no row holds NULL here, checked at load: an average of it
    # then shares the query's COUNT(*) rather than spending on its own COUNT(column).
    not_null: bool = False

    @property
    def bounded(self) -> bool:
        return self.lower is not None and self.upper is not None

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"type": self.type}
        if self.lower is not None:
            out["lower"] = self.lower
        if self.upper is not None:
            out["upper"] = self.upper
        if self.public_values is not None:
            out["public_values"] = list(self.public_values)
        if self.dates is not None:
            out["lower"], out["upper"] = (d.isoformat() for d in self.dates)
        if self.randomized_response is not None:
            out["randomized_response"] = self.randomized_response.as_dict()
        if self.max_length is not None:
            out["max_length"] = self.max_length
        if self.not_null:
            out["not_null"] = True
        return out


# The column the gate adds, when it prepares the data, to a table that reaches its
# privacy unit through a key (``Table.via``): each row's unit, read along the link.
# Not declared, so no query can name it; only the gate's own SQL reads it.
DERIVED_UNIT = "__dpmagic_unit"


@dataclass(frozen=True)
class Via:
    """How a table reaches its unit through another table's unique key: its column
    ``column`` names a row of ``table`` by that table's column ``key``, whose unit
    (of type ``unit_type``) is the row's (``lineitem.l_orderkey → orders.o_orderkey``,
    and orders' unit is ``o_custkey``)."""

    column: str
    table: str
    key: str
    unit_type: ColumnType


@dataclass(frozen=True)
class Table:
    """A declared table. ``unit`` names the column holding the privacy unit
    (``None`` for public tables and row-level datasets): a declared column, or
    ``DERIVED_UNIT`` where the table reaches its unit through a key (``via``);
    ``links`` maps a column to the ``table.column`` it references, as the owner
    declared."""

    name: str
    public: bool
    columns: dict[str, Column]
    unit: str | None = None
    links: dict[str, str] = field(default_factory=dict)
    rows: int | None = None  # a public table's rows, read at start (its contents are public)
    # A private table's most rows per unit, as the owner declares (1: a row per person).
    max_rows: int | None = None
    via: Via | None = None

    @property
    def unit_column(self) -> Column | None:
        """The column that holds each row's unit: declared, or the one the gate adds."""
        if self.unit is None:
            return None
        if self.via is not None:
            return Column(name=DERIVED_UNIT, type=self.via.unit_type, not_null=True)
        return self.columns.get(self.unit)


@dataclass(frozen=True)
class Dataset:
    name: str
    database: Path | None
    sources: dict[str, Path]
    privacy_unit: str | None
    neighbouring: Neighbouring
    max_partitions: int
    max_rows_per_partition: int
    user_budget: Budget
    notebook_budget: Budget
    query_default: Budget
    tables: dict[str, Table]
    accountant: AccountantKind = AccountantKind.PURE
    group_size: int = 1
    engine: EngineKind = EngineKind.DUCKDB
    spark: SparkConfig | None = None
    # Spark only: tables read from the session's catalog by name (``"table:db.name"``).
    catalog: dict[str, str] = field(default_factory=dict)
    max_unit_work: int = DEFAULT_MAX_UNIT_WORK  # ``sql/work.py``
    # The most steps one row may cost (``sql/work.py``), from the gate's padding quantum.
    max_row_work: int = row_work_limit(DEFAULT_QUANTUM_MS)
    # The longest text a row expression may make (``sql/work.py``).
    max_text_length: int = DEFAULT_MAX_TEXT_LENGTH
    max_resource_failures: int = DEFAULT_MAX_RESOURCE_FAILURES
    # The policy's ``max_partitions × max_rows_per_partition``: the most rows of one unit
    # a query reads before its filters (``ranking.load_cap``), kept when a request
    # tightens its bounds, so that a tighter bound chooses among the rows the query
    # keeps rather than reading fewer of them. 0: the product of the two above.
    load_rows: int = 0
    # Budgets shared by many users: every user's spending on the dataset, and each
    # named group's members' (``Policy.groups``); None where the owner set none.
    dataset_budget: Budget | None = None
    group_budgets: dict[str, Budget] = field(default_factory=dict)
    share_releases: Sharing = Sharing.NONE
    # Queries over public tables only answered exactly and free (``public_reads.py``),
    # at most this many rows each.
    public_tables_readable: bool = False
    public_row_limit: int = DEFAULT_PUBLIC_ROW_LIMIT

    @property
    def load_cap(self) -> int:
        """The most rows of one unit any query's scan reads (its first ``load_cap``
        ranks): the policy's bound, whatever tighter bounds a request chose."""
        return self.load_rows or self.max_partitions * self.max_rows_per_partition

    def table(self, name: str) -> Table | None:
        return self.tables.get(name.lower())

    def as_dict(self) -> dict[str, object]:
        """The public schema and policy facts served by ``/v1/schema``."""
        return {
            "dataset": self.name,
            "privacy_unit": self.privacy_unit,
            "neighbouring": self.neighbouring,
            "max_partitions": self.max_partitions,
            "max_rows_per_partition": self.max_rows_per_partition,
            "max_unit_work": self.max_unit_work,
            "max_row_work": self.max_row_work,
            "max_text_length": self.max_text_length,
            "max_resource_failures": self.max_resource_failures,
            "user_budget": self.user_budget.as_dict(),
            "notebook_budget": self.notebook_budget.as_dict(),
            "query_default": self.query_default.as_dict(),
            **({"dataset_budget": self.dataset_budget.as_dict()} if self.dataset_budget else {}),
            **(
                {"group_budgets": {g: b.as_dict() for g, b in self.group_budgets.items()}}
                if self.group_budgets
                else {}
            ),
            "share_releases": self.share_releases.value,
            "public_tables_readable": self.public_tables_readable,
            "accountant": self.accountant,
            "group_size": self.group_size,
            "engine": self.engine,
            **({"spark": self.spark.as_dict()} if self.spark else {}),
            "tables": {
                t.name: {
                    "public": t.public,
                    "columns": {c.name: c.as_dict() for c in t.columns.values()},
                    # A unit read along a key is the gate's own column: its links say it.
                    **({"unit": t.unit} if t.unit and t.via is None else {}),
                    **({"links": dict(t.links)} if t.links else {}),
                    **({"max_rows_per_unit": t.max_rows} if t.max_rows else {}),
                }
                for t in self.tables.values()
            },
        }


@dataclass(frozen=True)
class GateConfig:
    listen: str
    state_dir: Path
    accountant: AccountantKind = AccountantKind.PURE
    tokens_file: Path | None = None
    # Padding is on unless the owner turns it off (0): the default covers the gate's
    # own reply-time jitter for cheap queries (benchmarks/reply_jitter.py, docs/policy.md).
    response_quantum_ms: float = DEFAULT_QUANTUM_MS
    query_timeout_s: float = 30.0
    memory_limit: str = "2GB"
    threads: int = 2
    # Processes answering requests (``service/workers.py``); 1: the gate is one process.
    workers: int = 1


@dataclass(frozen=True)
class Policy:
    path: Path
    gate: GateConfig
    datasets: dict[str, Dataset] = field(default_factory=dict)
    # The ``[groups]`` table: group name → its members' user names.
    groups: dict[str, frozenset[str]] = field(default_factory=dict)

    def dataset(self, name: str | None) -> Dataset:
        """The named dataset, or the only one when no name is given."""
        if name is None:
            if len(self.datasets) == 1:
                return next(iter(self.datasets.values()))
            raise PolicyError(
                "name a dataset: this gate serves " + ", ".join(sorted(self.datasets))
            )
        try:
            return self.datasets[name]
        except KeyError:
            raise PolicyError(
                f"unknown dataset {name!r}; this gate serves " + ", ".join(sorted(self.datasets))
            ) from None
