"""The utility preview of ``GET /v1/budget?preview=true``: for each kind of query (a count
of the dataset's unit table, the mean of each bounded numeric column), what one costs
at a stated accuracy and at the dataset's default ε, and how many more of them the
budgets that apply allow.

Every number is the gate's own, decided once: each kind is a real query text
planned as a request asking for it is (``analyse``, the engine's: the same passes,
defaults and accountant), so its cost is what the ledger would debit; its half-width
is what the dry run states for the plan (a count's noise at ``REPORT_ALPHA``, a
mean's ``expected.average_error`` over ``rows`` rows); and the number that fit is
``dp/preview``'s, by the accountant's own composition. A mean cannot be asked for by
accuracy (its interval depends on its noisy count: ``plan._accuracy_applies``), so
its ε is found by searching the plans for the least ε, to three significant digits,
whose stated half-width at ``rows`` rows is within the accuracy; it is the ε to ask
with. Nothing here reads data: a preview costs nothing and reveals only policy facts.

So the rows a mean is over cannot be the data's: a table's size is private (a
210-row dataset's preview said "over 1,000 rows" as if it knew). It is the caller's
``rows``, or ``DEFAULT_ROWS``, and the reply says which (``rows_basis``): the
notebook states the default as an assumption, not a fact about the data.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import ROUND_CEILING, Decimal
from functools import partial

from sqlglot import exp

from dpmagic.gate.dp.accounting import Accountant, Cost
from dpmagic.gate.dp.levels import REPORT_ALPHA
from dpmagic.gate.dp.preview import Standing, queries_that_fit
from dpmagic.gate.failures import GateError
from dpmagic.gate.policy import Dataset, Table
from dpmagic.gate.request import MIN_EPSILON, QueryRequest
from dpmagic.gate.sql.aggregates.parts import Avg, Measured
from dpmagic.gate.sql.expected import average_error
from dpmagic.gate.sql.parse import DIALECT
from dpmagic.gate.sql.plan_types import Plan

DEFAULT_ROWS = 1000
"""The rows a mean is over when the caller names none (one of the dry run's
``summary.GROUP_SIZES``): an assumption, never the data's size, which is private."""
EPSILON_DIGITS = 3
"""A mean's ε is rounded up to this many significant digits: one a user can type."""
# Geometric bisection steps from a bracket of a factor 2: ends within 2^(2^-12) ≈
# 1.0002 of each other, finer than the rounding to three digits.
_SEARCH_STEPS = 12

Analyse = Callable[[QueryRequest], Plan]
"""The engine's analysis of a request: its plan, refusing as a query would be refused."""


@dataclass(frozen=True)
class Kind:
    """A kind of query the preview prices: ``kind`` is ``"count"`` or ``"mean"``."""

    kind: str
    table: str
    column: str | None
    sql: str


@dataclass(frozen=True)
class Priced:
    """One way to ask for a kind: the request's fields (``ask``), what the gate charges
    for it, and the half-width at ``REPORT_ALPHA`` its plan states."""

    ask: dict[str, float]
    cost: Cost
    half_width: float


def kinds(dataset: Dataset) -> list[Kind]:
    """A count of the unit table, and the mean of each numeric column of a private table
    with both bounds declared: not the unit's column or a link (identifiers, not
    measures), nor a randomized-response one (whose error depends on the answers)."""
    private = [t for t in dataset.tables.values() if not t.public]
    found = [Kind("count", unit.name, None, _sql(exp.Count(this=exp.Star()), unit.name))
             for unit in _unit_table(private)]  # fmt: skip
    for table in private:
        for column in table.columns.values():
            if (
                column.type in ("int", "float")
                and column.bounded
                and column.randomized_response is None
                and column.name != table.unit
                and column.name not in table.links
            ):
                mean = exp.Avg(this=exp.column(column.name))
                found.append(Kind("mean", table.name, column.name, _sql(mean, table.name)))
    return found


def at_accuracy(kind: Kind, analyse: Analyse, accuracy: float, rows: int) -> Priced:
    """A count asked with ``accuracy`` (the least cost the plan finds for it), or a
    mean asked with the least ε whose stated half-width at ``rows`` rows is within it."""
    if kind.kind == "count":
        the_plan = analyse(QueryRequest.from_body({"sql": kind.sql, "accuracy": accuracy}))
        ask = {"accuracy": accuracy, "alpha": REPORT_ALPHA}
        return Priced(ask, the_plan.cost, half_width(the_plan, rows))

    def at(epsilon: float) -> Plan:
        return analyse(QueryRequest.from_body({"sql": kind.sql, "epsilon": epsilon}))

    start = at_default(kind, analyse, rows).ask["epsilon"]
    epsilon = _least_epsilon(lambda e: half_width(at(e), rows), accuracy, start)
    the_plan = at(epsilon)
    return Priced(_asked(the_plan), the_plan.cost, half_width(the_plan, rows))


def at_default(kind: Kind, analyse: Analyse, rows: int) -> Priced:
    """The kind asked with neither ε nor accuracy: at the dataset's default."""
    the_plan = analyse(QueryRequest.from_body({"sql": kind.sql}))
    return Priced(_asked(the_plan), the_plan.cost, half_width(the_plan, rows))


def half_width(the_plan: Plan, rows: int) -> float:
    """The half-width at ``REPORT_ALPHA`` the dry run states for the plan's one output
    (``summary``): a count's noise's, a mean's expected error over ``rows`` rows."""
    (parts,) = the_plan.parts.values()
    if isinstance(parts, Avg):
        return average_error(the_plan, parts, REPORT_ALPHA) / rows
    if not isinstance(parts, Measured):
        raise TypeError(f"the preview prices counts and means, not {type(parts).__name__}")
    return the_plan.measurement(parts.name).noise.half_width(REPORT_ALPHA)


@dataclass(frozen=True)
class PreviewRequest:
    """What ``GET /v1/budget`` asked the preview for: the accuracy to price each kind
    at (none: only at the default ε), and the rows a mean is over."""

    accuracy: float | None = None
    rows: int = DEFAULT_ROWS


def utility_preview(
    dataset: Dataset,
    accountant: Accountant,
    analyse: Analyse,
    standings: Sequence[Standing],
    asked: PreviewRequest,
) -> dict[str, object]:
    """The ``preview`` object of ``GET /v1/budget`` (docs/http-api.md): per kind, the
    way to ask at the accuracy (when one is asked) and at the default ε, each with its cost,
    half-width and the number of such queries that fit ``standings``; a way the
    gate would refuse says why instead."""

    def option(price: Callable[[], Priced]) -> dict[str, object]:
        try:
            priced = price()
        except GateError as exc:
            return {"refused": exc.message}
        return {
            "ask": priced.ask,
            "cost": priced.cost.as_dict(),
            "half_width": priced.half_width,
            "alpha": REPORT_ALPHA,
            "fits": queries_that_fit(accountant, standings, priced.cost),
        }

    accuracy, rows = asked.accuracy, asked.rows
    entries = []
    for kind in kinds(dataset):
        entries.append(
            {
                "kind": kind.kind,
                "table": kind.table,
                "column": kind.column,
                "rows": rows if kind.kind == "mean" else None,
                "sql": kind.sql,
                "at_accuracy": None
                if accuracy is None
                else option(partial(at_accuracy, kind, analyse, accuracy, rows)),
                "at_default": option(partial(at_default, kind, analyse, rows)),
            }
        )
    return {
        "accuracy": accuracy,
        "alpha": REPORT_ALPHA,
        "rows": rows,
        "rows_basis": rows_basis(rows),
        "kinds": entries,
    }


def rows_basis(rows: int) -> str:
    """Where the rows a mean's half-width is over came from: ``"default"``, the preview's
    assumption (``DEFAULT_ROWS``: the gate cannot know the data's size without spending
    budget), or ``"asked"``, the caller's ``rows``. The HTTP route fills in the default
    for a request without ``rows``, so asking for exactly ``DEFAULT_ROWS`` reads as the
    default: the same number, and the same assumption."""
    return "default" if rows == DEFAULT_ROWS else "asked"


def _unit_table(private: list[Table]) -> list[Table]:
    """The table the privacy unit is declared in (its unit column no link to another
    table), else the first private table (rows are the units); none in a dataset
    without private tables."""
    roots = [t for t in private if t.unit is not None and t.via is None and t.unit not in t.links]
    return (roots or private)[:1]


def _sql(aggregate: exp.Expression, table: str) -> str:
    """``SELECT aggregate FROM table``, names quoted where SQL needs it."""
    query = exp.select(aggregate).from_(exp.Table(this=exp.to_identifier(table)))
    return query.sql(dialect=DIALECT)


def _asked(the_plan: Plan) -> dict[str, float]:
    """The (ε, δ) an ε-asked plan was asked at, the policy's defaults filled in."""
    return {"epsilon": the_plan.unit_cost.epsilon, "delta": the_plan.unit_cost.delta}


def _least_epsilon(error: Callable[[float], float], accuracy: float, start: float) -> float:
    """The least ε, rounded up to ``EPSILON_DIGITS`` significant digits, with ``error(ε)
    ≤ accuracy``: doubled or halved from ``start`` to a bracket, bisected, rounded up,
    then checked (and stepped up) on the plan itself, so a plan whose error is not
    exactly monotone in ε still gets an ε that meets the accuracy."""
    high = start
    while error(high) > accuracy:
        high *= 2
    low = high / 2
    while low >= MIN_EPSILON and error(low) <= accuracy:
        high, low = low, low / 2
    if low < MIN_EPSILON:
        return _round_up(high)
    for _ in range(_SEARCH_STEPS):  # error(low) > accuracy ≥ error(high)
        mid = math.sqrt(low * high)
        low, high = (low, mid) if error(mid) <= accuracy else (mid, high)
    epsilon = _round_up(high)
    while error(epsilon) > accuracy:
        epsilon = _round_up(epsilon, step=1)
    return epsilon


def _round_up(value: float, step: int = 0) -> float:
    """``value`` rounded up to ``EPSILON_DIGITS`` significant digits, then ``step`` units
    of the last digit more. From its shortest decimal (``repr``), which orders floats as
    they are ordered: the float nearest the result is never below ``value``, and a
    value already of those digits stays itself."""
    exact = Decimal(repr(value))
    unit = Decimal(1).scaleb(exact.adjusted() - EPSILON_DIGITS + 1)
    digits = (exact / unit).to_integral_value(rounding=ROUND_CEILING) + step
    return float(digits * unit)
