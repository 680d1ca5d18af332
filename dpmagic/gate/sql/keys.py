"""The public values a GROUP BY key can take, from the query and policy alone.

Every released partition must be known before the data is read, or the set
of released keys would itself leak (a key seen only because one person has
it). A key's values are public when they are: a column's declared
``public_values``; true and false for a condition or a boolean column; the
literal outcomes of a ``CASE`` or ``IF``; or every integer in the declared
bounds of an integer expression (``age``, ``age // 10``). A key that is a column
the ``WHERE`` holds to literals (``l_shipmode IN ('MAIL', 'SHIP')``, or ``=`` in
every branch of an ``OR``) keeps only those of its values (``_held_to``): the
others' groups would be empty by the query's own text, and fewer partitions are
fewer a person can reach. The SQL keeps only rows whose key is one of these
values, and every one of them is released, empty or not.

Any other key is *private*: its values are read from the data and released
only through DP partition selection (``partition_selection``), which the plan
allows when the query has a δ to spend; otherwise it refuses with the reason
recorded here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from sqlglot import exp

from dpmagic.gate.engines.interface import MAX_PARTITIONS
from dpmagic.gate.failures import Refused
from dpmagic.gate.sql.trees import unparen
from dpmagic.gate.sql.value_range import ValueRange

if TYPE_CHECKING:
    from dpmagic.gate.sql.check import GroupKey
    from dpmagic.gate.sql.resolve import Resolved


@dataclass(frozen=True)
class KeyDomain:
    """The released values of one key; ``span`` marks a whole integer range. A private
    key has no values known in advance, and ``private`` says why they are not public."""

    values: tuple[object, ...]
    span: tuple[int, int] | None = None
    private: str | None = None


BOOLEANS = KeyDomain((False, True))


def key_domain(key: GroupKey, resolved: Resolved, iv: ValueRange | None) -> KeyDomain:
    domain = _declared_domain(key, resolved, iv)
    expr = unparen(key.expr)
    col = resolved.column(expr)
    where = resolved.tree.args.get("where")
    if not domain.values or col is None or where is None:
        return domain
    assert isinstance(expr, exp.Column)  # the only node ``resolved.column`` reads
    held = _held_to(where.this, _name(expr), col.type)
    if held is None:
        return domain
    kept = tuple(v for v in domain.values if v in held)
    # No declared value meets the filter: the answer is empty whatever is released.
    return KeyDomain(kept) if kept else domain


def _declared_domain(key: GroupKey, resolved: Resolved, iv: ValueRange | None) -> KeyDomain:
    expr = unparen(key.expr)
    col = resolved.column(expr)
    if col is not None and col.public_values is not None:
        return KeyDomain(tuple(col.public_values), _whole_range(col.public_values, col.type))
    if (col is not None and col.type == "bool") or isinstance(
        expr, exp.Predicate | exp.Connector | exp.Not | exp.Boolean
    ):
        return BOOLEANS
    literals = _literal_outcomes(expr, key.label)
    if literals is not None:
        return KeyDomain(literals)
    if iv is not None and iv.finite and iv.integral:
        lo, hi = int(iv.lo), int(iv.hi)
        if hi - lo + 1 <= MAX_PARTITIONS:
            return KeyDomain(tuple(range(lo, hi + 1)), (lo, hi))
        return KeyDomain(
            (),
            private=f"GROUP BY {key.label} has {hi - lo + 1} possible values under the declared "
            f"bounds; at most {MAX_PARTITIONS} public keys are released at once",
        )
    what = "use a CASE of literals"
    if col is not None:
        what = f"declare public_values for {col.name!r}"
    return KeyDomain(
        (),
        private=f"GROUP BY {key.label}: its values are not public: {what}, or group by a "
        "bounded integer or a condition",
    )


def _held_to(cond: exp.Expression, name: str, column_type: str) -> set[object] | None:
    """The values ``cond`` lets the column ``name`` take where it holds: ``=`` or ``IN``
    of literals of the column's type, met in every conjunct's reading (``AND``: their
    intersection) and in each branch of an ``OR`` (their union); None where it does
    not hold the column to literals (a NULL column fails ``=`` and ``IN`` alike)."""
    cond = unparen(cond)
    if isinstance(cond, exp.And | exp.Or):
        a = _held_to(cond.this, name, column_type)
        b = _held_to(cond.expression, name, column_type)
        if isinstance(cond, exp.Or):
            return None if a is None or b is None else a | b
        return b if a is None else a if b is None else a & b
    if isinstance(cond, exp.EQ):
        for side, other in ((cond.this, cond.expression), (cond.expression, cond.this)):
            if isinstance(side, exp.Column) and _name(side) == name:
                value = _literal(other, column_type)
                return None if value is None else {value}
        return None
    if isinstance(cond, exp.In) and not cond.args.get("query") and not cond.args.get("unnest"):
        this = unparen(cond.this)
        if not (isinstance(this, exp.Column) and _name(this) == name):
            return None
        values = [_literal(v, column_type) for v in cond.expressions]
        return None if any(v is None for v in values) else set(values)
    return None


def _literal(node: exp.Expression, column_type: str) -> object | None:
    """A literal's value as a declared value of a ``column_type`` column is written;
    None for anything else (a literal of another type is left to the SQL's casts)."""
    node = unparen(node)
    if isinstance(node, exp.Boolean):
        return node.this if column_type == "bool" else None
    if not isinstance(node, exp.Literal):
        return None
    if node.is_string:
        return node.this if column_type == "str" else None
    if column_type == "int" and node.is_int:
        return int(node.this)
    return None


def _name(column: exp.Column) -> str:
    return f"{column.table}.{column.name}"


def _whole_range(values: tuple[object, ...], column_type: str) -> tuple[int, int] | None:
    """The span of an int column's declared values when they are every integer between
    two ends (states 0..49): the SQL tests one range instead of a list."""
    ints = sorted(v for v in values if type(v) is int)
    if column_type != "int" or len(ints) != len(values):
        return None
    return (ints[0], ints[-1]) if ints == list(range(ints[0], ints[-1] + 1)) else None


def _literal_outcomes(expr: exp.Expression, label: str) -> tuple[object, ...] | None:
    """The values a CASE/IF of literals can give (NULL keys are never released)."""
    if isinstance(expr, exp.Case):
        branches = [b.args.get("true") for b in expr.args.get("ifs", [])]
        branches.append(expr.args.get("default"))
    elif isinstance(expr, exp.If):
        branches = [expr.args.get("true"), expr.args.get("false")]
    else:
        return None
    values: list[object] = []
    for b in branches:
        b = unparen(b) if b is not None else None
        if b is None or isinstance(b, exp.Null):
            continue
        if isinstance(b, exp.Boolean):
            value: object = b.this
        elif isinstance(b, exp.Literal):
            value = b.this if b.is_string else (int(b.this) if b.is_int else float(b.this))
        else:
            return None
        if value not in values:
            values.append(value)
    if not values:
        raise Refused(f"GROUP BY {label}: every outcome is NULL")
    if len({isinstance(v, str) for v in values}) > 1:
        raise Refused(f"GROUP BY {label}: its outcomes mix text and numbers")
    return tuple(values)
