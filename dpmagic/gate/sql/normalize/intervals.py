"""Rule: a date or timestamp literal plus or minus an interval literal is one literal.

TPC-H writes its date windows as ``DATE '1998-12-01' - INTERVAL '68 days'`` and
``DATE '1994-01-01' + INTERVAL '1' YEAR``: constants of the query's text, public,
which the checks would otherwise read as arithmetic on a date. The fold computes
them as DuckDB does (``dateutil``'s ``relativedelta``, as sqlglot's simplifier
does): months and years move the calendar month and clamp the day to the month's
last (``DATE '2020-01-31' + INTERVAL 1 MONTH`` is ``2020-02-29``), then days, then
time. A date moved by whole days, months or years stays a ``DATE`` (DuckDB gives
a ``TIMESTAMP`` at midnight, equal to it in every comparison); moved by hours,
minutes or seconds it becomes a ``TIMESTAMP``. Folding is bottom-up, so
``DATE '1994-01-01' + INTERVAL 1 YEAR - INTERVAL 1 DAY`` is one literal.

Anything else (a column plus an interval, an interval of a non-literal or of a
unit this rule does not know) is left as written, for the checks to refuse.
"""

from __future__ import annotations

import re
from datetime import datetime

from dateutil.relativedelta import relativedelta
from sqlglot import exp
from sqlglot.optimizer.simplify import extract_date

# The units DuckDB and TPC-H write, singular, and what one of each moves.
UNITS = {
    "year": relativedelta(years=1),
    "quarter": relativedelta(months=3),
    "month": relativedelta(months=1),
    "week": relativedelta(weeks=1),
    "day": relativedelta(days=1),
    "hour": relativedelta(hours=1),
    "minute": relativedelta(minutes=1),
    "second": relativedelta(seconds=1),
}
# A count beyond this many units is not a date window: left for the checks (and
# ``datetime``'s own range) rather than computed.
MAX_COUNT = 100_000


def fold_intervals(tree: exp.Select) -> exp.Select:
    """Every ``literal ± INTERVAL`` in ``tree``, innermost first, as one literal."""
    for node in list(tree.find_all(exp.Add, exp.Sub))[::-1]:  # children before parents
        assert isinstance(node, exp.Add | exp.Sub)
        folded = _folded(node)
        if folded is not None:
            node.replace(folded)
    return tree


def _folded(node: exp.Add | exp.Sub) -> exp.Expression | None:
    left, right = node.this, node.expression
    if isinstance(node, exp.Add) and isinstance(left, exp.Interval):
        left, right = right, left  # INTERVAL + DATE is DATE + INTERVAL
    moved = _interval(right)
    value = extract_date(left) if isinstance(left, exp.Cast) else None
    if moved is None or value is None:
        return None
    sign = 1 if isinstance(node, exp.Add) else -1
    try:
        result = value + sign * moved
    except (OverflowError, ValueError):
        return None
    timestamp = isinstance(value, datetime) or _has_time(moved)
    if timestamp and not isinstance(result, datetime):
        result = datetime(result.year, result.month, result.day)
    kind = exp.DataType.build("TIMESTAMP" if timestamp else "DATE")
    text = result.isoformat(sep=" ") if isinstance(result, datetime) else result.isoformat()
    return exp.cast(exp.Literal.string(text), kind)


def _interval(node: exp.Expression) -> relativedelta | None:
    """``INTERVAL '68' DAYS``, ``INTERVAL '3' MONTH``, ``INTERVAL 2 HOUR``: the move."""
    if not isinstance(node, exp.Interval) or not isinstance(node.this, exp.Literal):
        return None
    unit = node.text("unit").lower().removesuffix("s")
    text = node.this.name.strip()
    if not unit:  # INTERVAL '68 days': the unit inside the text
        count, _, unit = text.partition(" ")
        text, unit = count, unit.strip().lower().removesuffix("s")
    if not re.fullmatch(r"[+-]?[0-9]{1,6}", text):  # SQL's digits; not Python's 1_000
        return None
    moves = int(text)
    if unit not in UNITS or abs(moves) > MAX_COUNT:
        return None
    return UNITS[unit] * moves


def _has_time(moved: relativedelta) -> bool:
    return bool(moved.hours or moved.minutes or moved.seconds or moved.microseconds)
