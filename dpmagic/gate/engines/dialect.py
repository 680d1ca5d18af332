"""What differs between the engines the gate's SQL runs on: one profile each.

``rewrite`` builds the query as a sqlglot tree; where an engine's SQL differs (its
keyed hash, its exact sum, how it counts rows per quantile candidate, how it reads a
unit's first ranks), the rewrite asks the profile, and the profile renders the
finished tree. DuckDB's profile is here; Spark's is ``engines/spark/dialect.py``. How
a row expression is kept from raising, and what Spark refuses, are rules of the SQL
passes (``sql/engine_rows.py``), chosen by the profile's ``has_try``: the profiles
import nothing from the passes, which import them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from sqlglot import exp

from dpmagic.gate.engines.ranking import first_ranks, rank_end


@dataclass(frozen=True)
class Dialect:
    """An engine's SQL, as far as the gate's generated queries need it."""

    sqlglot: str  # the sqlglot dialect the tree is rendered in
    # Whether quantiles' counts per candidate are gathered apart from the other
    # aggregates (``rewrite._histograms_apart``), for an engine without ``histogram``.
    histograms_apart: bool = False
    # Whether every ranked table is stored in rank order, checked by the store that
    # holds it (``engines/duckdb/database.py``), so that a unit's first ``k`` ranks
    # are the rows before a row id (``first_ranks``).
    rank_prefixes: bool = False
    # Whether the rows a query keeps are read inline wherever they are used
    # (``AS NOT MATERIALIZED``): DuckDB would otherwise write ``kept_rows`` out once
    # it is read twice (``rewrite._joined_light``), 2-3x a filtered sum's time.
    inline_kept_rows: bool = False
    # Whether the engine has ``TRY(…)``, which makes a row expression that raises on a
    # row NULL there: which rule keeps its row expressions from raising
    # (``sql/engine_rows.total_on``: DuckDB's proof else TRY, or Spark's proof alone).
    has_try: bool = True

    def first_ranks(self, table: str, room: int) -> exp.Expression:
        """The filter that keeps each unit's first ``room`` ranks of a private table.

        Stored in rank order, those rows are the table's first ``n`` rows, ``n`` their
        number: ``rowid < n`` reads them without a comparison per row, where
        ``rank <= room`` beside a query's own filter cost DuckDB 14 ms of a filtered
        100M-row sum's 95 (its scan then evaluates two filters, and builds a selection
        for the second). ``n`` depends on the data, so it is a parameter
        (``ranking.rank_end``) that the store binds as it runs the SQL. The rows read are
        the same, so is the work one unit can add (docs/security.md, "Per-unit work")."""
        if not self.rank_prefixes:
            return first_ranks(table, room)
        return exp.LT(
            this=exp.column("rowid"), expression=exp.Placeholder(this=rank_end(table, room))
        )

    def hash(self, *args: exp.Expression) -> exp.Expression:
        """A keyed 64-bit hash of ``args`` (the seed among them), for row orders."""
        return exp.Anonymous(this="hash", expressions=list(args))

    def exact_sum(self, value: exp.Expression, widest: float, rows: int) -> exp.Expression:
        """An exact sum of fewer than ``rows`` integers of magnitude at most ``widest``
        (``plan_types.partition_rows``).

        Where ``rows · widest < 2^63`` every partial sum, in whatever order DuckDB
        adds the rows and merges its threads' states, has magnitude below ``2^63``: a
        64-bit accumulator cannot overflow, so DuckDB's ``sum_no_overflow`` (a BIGINT
        state with no overflow check) is exact, and faster than ``SUM``, which adds
        into 128 bits (10M rows: a sum 24.3 → 21.1 ms, an average 36.8 → 24.8 ms with
        its count apart). Otherwise each value is a BIGINT summed into a HUGEINT
        (whose overflow the plan has ruled out: ``plan.SUM_LIMIT``), or a HUGEINT when
        one value may not fit 64 bits. Whether the short path is taken depends on the
        plan alone (the bounds and the query's shape), never on the data."""
        if fits_64_bits(widest, rows):
            return exp.Anonymous(
                this="sum_no_overflow", expressions=[exp.cast(value, exp.DataType.Type.BIGINT)]
            )
        wide = widest >= 2.0**62
        kind = exp.DataType.Type.INT128 if wide else exp.DataType.Type.BIGINT
        return exp.Sum(this=exp.cast(value, kind))

    def grid_sum(self, value: exp.Expression, widest: float, rows: int) -> exp.Expression:
        """An exact sum of fewer than ``rows`` floats ``value`` (in grid units, each at
        most ``widest``), each rounded to an integer. DuckDB's cast of a float to an
        integer type rounds to the nearest (half to even), so the cast does the
        rounding; a ``ROUND`` before it made a 10M-row average's SQL 7% slower. The
        sum's bounds hold whichever way a value is rounded (``plan_types.grid_bounds``)."""
        return self.exact_sum(value, widest + 1, rows)  # rounded up by at most 1

    def trimmed_sum(self, value: exp.Expression, trim: float, widest: float) -> exp.Expression:
        """The exact sum of the integers ``value`` (of magnitude at most ``widest``, a
        float rounded to the nearest) left after dropping the ``m = FLOOR(trim·n)``
        smallest and ``m`` largest of a partition's ``n`` non-NULL ones: its sorted list
        of values, sliced (``trimmed_mean``). ``trim`` is written as the decimal it is,
        so ``m`` is exact. A sum of fewer than 2^63 values of magnitude below 2^63 fits
        the HUGEINT DuckDB's ``list_sum`` adds BIGINTs into."""
        kind = exp.DataType.Type.INT128 if widest >= 2.0**62 else exp.DataType.Type.BIGINT
        values = exp.Filter(
            this=exp.Anonymous(this="list", expressions=[exp.cast(value, kind)]),
            expression=exp.Where(
                this=exp.Not(this=exp.Is(this=value.copy(), expression=exp.Null()))
            ),
        )
        ordered = exp.Anonymous(
            this="list_sort",
            expressions=[values, exp.Literal.string("ASC"), exp.Literal.string("NULLS LAST")],
        )
        first, last = trimmed_window(value, trim)
        kept = exp.Anonymous(this="list_slice", expressions=[ordered, first, last])
        return exp.Anonymous(this="list_sum", expressions=[kept])

    def histogram(self, value: exp.Expression) -> exp.Expression:
        """The count of rows per value (a quantile's candidate index), NULLs left out."""
        counts = exp.Anonymous(this="histogram", expressions=[value])
        kept = exp.Where(this=exp.Not(this=exp.Is(this=value.copy(), expression=exp.Null())))
        return exp.Filter(this=counts, expression=kept)

    def render(self, tree: exp.Expression) -> str:
        return tree.sql(dialect=self.sqlglot)

    @property
    def engine(self) -> str:
        """The engine's name as replies and the dry run give it."""
        return "DuckDB"


def trimmed_window(value: exp.Expression, trim: float) -> tuple[exp.Expression, exp.Expression]:
    """The 1-based positions ``m + 1`` and ``n − m`` of the first and last of a partition's
    ``n`` sorted non-NULL ``value``s kept by a trimmed sum, ``m = FLOOR(trim·n)``."""
    n = exp.Count(this=value.copy())
    fraction = exp.Literal.number(repr(float(trim)))  # a DECIMAL literal: exact
    m = exp.cast(exp.Floor(this=exp.Mul(this=fraction, expression=n)), exp.DataType.Type.BIGINT)
    first = exp.Add(this=m, expression=exp.Literal.number(1))
    return first, exp.Sub(this=n.copy(), expression=m.copy())


def fits_64_bits(widest: float, rows: int) -> bool:
    """Whether every sum of fewer than ``rows`` integers of magnitude at most ``widest``
    lies strictly within a signed 64-bit integer's range, computed exactly in integers
    (a float product could round below ``2^63``)."""
    return math.ceil(widest) * rows < 2**63


DUCKDB = Dialect("duckdb", inline_kept_rows=True)
