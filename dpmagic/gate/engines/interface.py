"""What the gate needs of an engine, whichever holds a dataset: the interface.

An engine (DuckDB's in ``engines/duckdb/``, Spark's in ``engines/spark/``) is a
``Store`` per dataset, opened by the registry (``engines/registry.py``). It
prepares the dataset's tables once (each private table ranked and counted per
unit, ``engines/ranking.py``), vets the SQL the gate generated before the debit (its own
parser's guard), runs it under a drawn time limit (``drawn_timeout``) and answers
exact aggregates (``ExactResult``) that never leave the gate un-noised; its
dialect profile (``engines/dialect.py``) says where its SQL differs. What any
engine must do is checked against each by one contract test
(``tests/system/test_engine_contract.py``).
"""

from __future__ import annotations

import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa
from sqlglot import exp

from dpmagic.gate.engines.dialect import Dialect
from dpmagic.gate.engines.versions import Versions
from dpmagic.gate.failures import Failed
from dpmagic.gate.policy import Dataset, PolicyError

# Every table a gate serves has fewer rows than this (each store refuses a larger one
# at open: ``within_max_rows``); with it the rewrite's sums are proven not to overflow
# before the query runs (``plan_types.partition_rows``), in 64 bits where the values
# are narrow enough (``engines/dialect.fits_64_bits``).
MAX_ROWS = 2**40

# The most public keys released at once (``sql/keys.py``, ``sql/plan.py``): a store
# reads a column's declared keys from the data only where there are at most this many.
MAX_PARTITIONS = 100_000

KEY_TYPES = ("int", "str", "bool")  # public columns whose values can serve as group keys

# Generated SQL texts the guard has passed, remembered: the engine generates the same
# text for the same query (its plan is cached, its seed fixed per start).
VETTED_CACHE_SIZE = 1024

# A query's time limit is drawn at random for each run, between this share below
# ``query_timeout_s`` and ``query_timeout_s`` itself (``drawn_timeout``).
TIMEOUT_JITTER = 0.25


def drawn_timeout(limit: float) -> float:
    """A run's time limit, uniform in ``[(1 − TIMEOUT_JITTER) × limit, limit]`` from the
    operating system's secure generator, counted on the run's share of the engine
    (``sharing.py``) and waited for no longer (``deadline.py``).

    Why. One unit moves a query's running time by at most its bounded work
    (``sql/work.py``), milliseconds; a query tuned to end within that of a fixed
    limit would fail on D and not on D' without the unit. Against a limit drawn over
    a quarter of ``query_timeout_s`` (7.5 s at the default), that difference moves
    the chance of failing by at most ``work time / (TIMEOUT_JITTER × limit)``: about
    0.1% a query at 10 ms, each failure charged and counted against the user's
    ``max_resource_failures`` (docs/security.md)."""
    return limit * (1 - TIMEOUT_JITTER * secrets.randbelow(2**32) / 2**32)


class OutOfResources(Failed):
    """A run stopped for want of time or memory, told alike for either (which one ran
    out, and when, could follow the data), and not before ``release_at`` (the
    monotonic time of the run's deadline): an out-of-memory error that came early
    leaves when a time-out would have. ``memory`` says which, to the gate only
    (``admission.py`` retries a memory failure under load; the reply is the same)."""

    def __init__(self, release_at: float, memory: bool = False) -> None:
        super().__init__(
            "the query ran out of the gate's time or memory and was stopped; it stays "
            "charged. Ask it over fewer rows, joins or groups"
        )
        self.release_at = release_at
        self.memory = memory


@dataclass(frozen=True)
class ExactResult:
    """Exact aggregates by partition: never leaves the gate un-noised."""

    rows: list[tuple]
    # Whether private keys' noisy threshold was already applied batch by batch.
    thresholded: bool = False
    # The result in columns, when the caller asked for them (``Database.run``'s
    # ``batches``); ``rows`` is then empty.
    table: pa.Table | None = None


Batches = Callable[[pa.RecordBatch], pa.RecordBatch]


@dataclass(frozen=True)
class PublicRead:
    """A query over public tables only, as the gate will run it (``public_reads.py``):
    the vetted tree, never the user's text, which each engine renders in its own
    dialect (``sql``); at most ``limit`` rows fetched; and ``allowed``, the node kinds
    the gate's vetting let through, which an engine whose own guard parses the
    rendered text again checks it against (Spark's)."""

    tree: exp.Select
    limit: int
    allowed: tuple[type[exp.Expression], ...]

    def sql(self, dialect: str) -> str:
        return self.tree.sql(dialect=dialect)


class Store(Protocol):
    """What the engine needs of a dataset's tables, whichever engine holds them."""

    dialect: Dialect
    # Whether ``run`` can fetch the result in columns (``batches``).
    columnar: bool
    # What its answers are computed from, as opaque ids (``prepared.versions``): read
    # from the declared dataset as the store opens, before any public fact is added.
    versions: Versions

    def vet(self, sql: str) -> None: ...

    def run(
        self,
        sql: str,
        keep: Callable[[list[tuple]], list[tuple]] | None = None,
        batches: Batches | None = None,
    ) -> ExactResult: ...

    def public_facts(self, dataset: Dataset) -> Dataset: ...

    def close(self) -> None: ...


def within_max_rows(dataset: Dataset, table: str, rows: int) -> None:
    """Refuse to serve a table of ``MAX_ROWS`` rows or more, on which the plan's
    proofs that sums and counts cannot overflow (``plan_types.partition_rows``) would not
    hold. Checked once, as the gate opens the dataset: no query depends on it."""
    if rows >= MAX_ROWS:
        raise PolicyError(
            f"dataset {dataset.name!r}: table {table!r} has {MAX_ROWS:,} rows or more, "
            "more than the gate's exact sums are proven for"
        )
