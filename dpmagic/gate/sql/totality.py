"""Row expressions that cannot raise: proven total, or evaluated under ``TRY``.

A generated expression evaluated on private rows must never raise: an error
after the debit would answer differently on neighbouring datasets (``CASE
WHEN <one person's attributes> THEN <something that fails> END`` turns the
reply's status into a yes/no about that person, at any ε). Every row
expression the rewrite generates therefore goes through :func:`total`, which
applies one of two mechanisms, decided node by node:

1. **Proof.** :func:`may_raise` walks the expression and accepts it only if
   every node provably cannot raise for any value the policy allows: columns
   are read as stored at load (their declared type, clamped into declared
   bounds), so each node's interval (``bound.value_range``) and SQL type
   (:func:`kind`) are known. Integer arithmetic must stay inside the range of
   the narrowest integer type DuckDB may compute it in (TINYINT … HUGEINT:
   DuckDB computes in the operands' type and raises on overflow, it never
   widens); ``//`` and ``%`` must not divide the type's minimum by ``-1``;
   ``ROUND`` to tens must not round past the type's maximum; comparisons,
   ``CASE`` branches, ``COALESCE``/``GREATEST``/``LEAST``/``NULLIF`` and
   boolean operands must be of kinds DuckDB combines without a cast that can
   fail on a value (a text compared with a number is cast row by row). Floats
   never raise (DuckDB gives ``inf``/``NaN``), divisors are ``NULLIF(d, 0)``,
   decimal literals are doubles (no DECIMAL arithmetic is ever generated),
   ``TRY_CAST`` yields NULL instead of raising, text functions' positions and
   lengths are literals the checker has range-checked.
2. **TRY.** Anything the proof does not accept is evaluated inside DuckDB's
   ``TRY(…)``: an error on a row becomes NULL for that row alone, which the
   sensitivity analysis already covers, since it changes only that row's
   contribution (a NULL is left out of every aggregate; in a condition it
   drops the row). As a condition (``WHERE``, ``ON``), an expression that is
   not already boolean is cast to BOOLEAN inside the ``TRY``: the implicit
   cast of a text to a boolean is itself an error that depends on the value.

The proof is conservative: where it is unsure (a kind it cannot name, an
operand without finite bounds, a node type it has no rule for) it answers
"may raise", which costs only speed. Data-independent failures (a binder
error, a constant that overflows) are caught before the debit instead, by
running the generated SQL on an empty copy of the schema (``duckdb.database.vet``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from sqlglot import exp

from dpmagic.gate.failures import Refused
from dpmagic.gate.sql.bound import memoised, value_range
from dpmagic.gate.sql.check import CONCATENATION, DATE_PARTS, TEXT_POSITION_LIMIT, date_part
from dpmagic.gate.sql.resolve import Resolved
from dpmagic.gate.sql.value_range import ValueRange

# The integer types DuckDB computes in, by width: (minimum, maximum).
INT_RANGES = {bits: (-(2 ** (bits - 1)), 2 ** (bits - 1) - 1) for bits in (8, 16, 32, 64, 128)}
CAST_KINDS: dict[exp.DType, tuple[str, int]] = {
    exp.DataType.Type.TINYINT: ("int", 8),
    exp.DataType.Type.SMALLINT: ("int", 16),
    exp.DataType.Type.INT: ("int", 32),
    exp.DataType.Type.BIGINT: ("int", 64),
    exp.DataType.Type.FLOAT: ("float", 0),
    exp.DataType.Type.DOUBLE: ("float", 0),
    exp.DataType.Type.BOOLEAN: ("bool", 0),
}
COLUMN_KINDS = {"int": ("int", 64), "float": ("float", 0), "str": ("text", 0),
                "bool": ("bool", 0), "date": ("date", 0)}  # fmt: skip
NUMERIC = frozenset({"int", "float", "bool"})
BOOLEAN_LIKE = NUMERIC | {"null"}  # cast to BOOLEAN without failing on any value


@dataclass(frozen=True)
class Kind:
    """An expression's SQL type, as much of it as the proof needs.

    ``family`` is int, float, text, date, bool or null (an untyped NULL).
    ``bits`` is, for an integer, the *narrowest* width DuckDB may compute it
    in: an integer literal adapts to the other operand's type when it fits,
    so the width claimed here is never wider than DuckDB's, and a range
    check against it can only be stricter than needed.
    """

    family: str
    bits: int = 0


NULL = Kind("null")


def total(tree: exp.Expression, resolved: Resolved, condition: bool = False) -> exp.Expression:
    """``tree`` as generated SQL that cannot raise on any row (see the module's docstring).

    ``condition`` says the expression is used as a condition (``WHERE``, ``ON``),
    where DuckDB casts it to BOOLEAN."""
    out = generated(tree)
    if may_raise(tree, resolved):
        found = kind(tree, resolved)  # the top node alone: no memo needed
        if condition and (found is None or found.family != "bool"):
            out = exp.cast(out, exp.DataType.Type.BOOLEAN)
        return exp.Try(this=out)
    if condition:
        found = kind(tree, resolved)
        if found is None or found.family not in BOOLEAN_LIKE:
            return exp.Try(this=exp.cast(out, exp.DataType.Type.BOOLEAN))
    return out


def generated(tree: exp.Expression) -> exp.Expression:
    """The user's tree as the gate writes it: every divisor ``NULLIF(d, 0)`` (a zero
    divisor gives NULL), decimals doubles (no DECIMAL overflow), columns quoted.

    Divisors are wrapped in place, each node of the copy visited once: a transform
    that replaces a node does not descend into its replacement, which would leave
    a division nested in a divisor or dividend unguarded."""
    out = tree.copy()
    for node in [n for n in out.walk() if isinstance(n, exp.Div | exp.IntDiv | exp.Mod)]:
        divisor = node.expression
        node.set("expression", exp.Nullif(this=divisor, expression=exp.Literal.number(0)))

    def leaf(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Literal) and not node.is_string and not node.is_int:
            return exp.cast(exp.Literal.string(node.this), exp.DataType.Type.DOUBLE)
        if isinstance(node, exp.Column):
            return exp.column(node.name, table=node.table or None, quoted=True)
        return node

    return out.transform(leaf, copy=False)


def may_raise(tree: exp.Expression, resolved: Resolved) -> bool:
    """Whether some node of ``tree`` might raise for some value the policy allows.

    Kinds and intervals are remembered per node meanwhile, so the proof stays linear
    in the size of the tree (a 20,000-character query is analysed in milliseconds)."""
    with memoised(), _kinds_memoised():
        # every node is an Expression (walk() types them as its Expr trait)
        nodes = tree.find_all(exp.Expression)
        return any(_node_may_raise(node, resolved) for node in nodes)


def kind(node: exp.Expression, r: Resolved) -> Kind | None:
    """The kind of ``node``'s values; ``None`` where the proof cannot name one."""
    memo = _KINDS.get()
    if memo is None:
        return _kind(node, r)
    found = memo.get(id(node))
    if found is None:
        found = memo[id(node)] = (node, _kind(node, r))  # the node pins its id
    return found[1]


_KINDS: ContextVar[dict[int, tuple[exp.Expression, Kind | None]] | None] = ContextVar(
    "kind_memo", default=None
)


@contextmanager
def _kinds_memoised() -> Iterator[None]:
    token = _KINDS.set({})
    try:
        yield
    finally:
        _KINDS.reset(token)


def _kind(node: exp.Expression, r: Resolved) -> Kind | None:
    if isinstance(node, exp.Paren):
        return kind(node.this, r)
    if isinstance(node, exp.Column):
        col = r.column(node)
        return None if col is None else Kind(*COLUMN_KINDS[col.type])
    if _is_date_literal(node):
        return Kind("date")
    if isinstance(node, exp.Null):
        return NULL
    if isinstance(node, exp.Boolean):
        return Kind("bool")
    if isinstance(node, exp.Literal):
        if node.is_string:
            return Kind("text")
        if not node.is_int:
            return Kind("float")  # written as a DOUBLE by ``generated``
        return _int_literal(int(node.this))
    if isinstance(node, exp.TryCast):
        found = CAST_KINDS.get(node.to.this)
        return None if found is None else Kind(*found)
    if isinstance(node, _FLOAT_NODES):
        return Kind("float")
    if isinstance(node, _BINARY_ARITHMETIC):
        return _constant(node, r, _arithmetic(kind(node.this, r), kind(node.expression, r)))
    if isinstance(node, _UNARY_NUMERIC):
        inner = kind(node.this, r)
        if inner is None or inner.family not in ("int", "float"):
            return None
        return _constant(node, r, inner)
    if isinstance(node, _BOOLEAN_NODES):
        return Kind("bool")
    if isinstance(node, exp.Case):
        branches = [i.args["true"] for i in node.args.get("ifs", [])]
        return _common([*branches, node.args.get("default")], r)
    if isinstance(node, exp.If):
        return _common([node.args.get("true"), node.args.get("false")], r)
    if isinstance(node, _FIRST_OF):
        return _common([node.this, *node.expressions], r)
    if isinstance(node, exp.Nullif):
        return _common([node.this, node.expression], r)
    if isinstance(node, exp.Length) or date_part(node) is not None:
        return Kind("int", 64)
    if isinstance(node, _TEXT_NODES):
        return Kind("text")
    return None


_BOOLEAN_NODES = (
    exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ, exp.NullSafeNEQ,
    exp.In, exp.Between, exp.Is, exp.Like, exp.ILike, exp.And, exp.Or, exp.Not,
)  # fmt: skip
_TEXT_NODES = (exp.Upper, exp.Lower, exp.Trim, exp.Substring, exp.Left, exp.Right, *CONCATENATION)
_COMPARISONS = (
    exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE, exp.NullSafeEQ, exp.NullSafeNEQ,
)  # fmt: skip
# The classes ``_kind`` and ``_node_may_raise`` test for, as tuples built once: written
# ``A | B`` in the tests, each call built the union anew (a tenth of the proof's time).
_FLOAT_NODES = (exp.Div, exp.Sqrt, exp.Floor, exp.Ceil)
_BINARY_ARITHMETIC = (exp.Add, exp.Sub, exp.Mul, exp.IntDiv, exp.Mod)
_UNARY_NUMERIC = (exp.Neg, exp.Abs, exp.Round)
_FIRST_OF = (exp.Coalesce, exp.Greatest, exp.Least)
_OVERFLOWING = (exp.Add, exp.Sub, exp.Mul, exp.Neg, exp.Abs)
_INTEGER_DIVISIONS = (exp.IntDiv, exp.Mod)
_COMPARED = (*_COMPARISONS, exp.Between, exp.In)
_LIKES = (exp.Like, exp.ILike)
_CONNECTIVES = (exp.And, exp.Or, exp.Not)
_CHOOSING = (exp.Coalesce, exp.Greatest, exp.Least, exp.Nullif)
_TEXT_SLICES = (exp.Substring, exp.Left, exp.Right)
_EXTRACTS: tuple[type[exp.Expression], ...] = (exp.Extract, *DATE_PARTS)
_TEXT_FUNCTIONS = (exp.Upper, exp.Lower, exp.Length, exp.Trim)
# Nodes that never raise once their children cannot: they only combine values,
# and the kinds of those values are checked by the rules below where it matters.
_TOTAL_NODES = (
    exp.Column, exp.Literal, exp.Boolean, exp.Null, exp.Paren, exp.Is, exp.Identifier,
    exp.DataType, exp.Var, exp.TryCast, exp.Div, exp.Sqrt, exp.Floor, exp.Ceil,
    exp.Upper, exp.Lower, exp.Length, exp.Trim, *CONCATENATION,
)  # fmt: skip


def _node_may_raise(node: exp.Expression, r: Resolved) -> bool:
    """Whether ``node`` itself might raise, its children's values being any they can take."""
    if _is_date_literal(node):
        return False
    if isinstance(node, exp.Literal) and node.is_int:
        return abs(int(node.this)) >= 2**127  # wider than HUGEINT: DuckDB's BIGNUM
    if isinstance(node, _OVERFLOWING):
        return _overflows(node, r)
    if isinstance(node, _INTEGER_DIVISIONS):
        return _divides_minimum(node, r)
    if isinstance(node, exp.Round):
        return _round_overflows(node, r)
    if isinstance(node, _COMPARED):
        operands = [node.this, node.args.get("expression"), node.args.get("low"),
                    node.args.get("high"), *(node.args.get("expressions") or [])]  # fmt: skip
        return not comparable([o for o in operands if o is not None], r)
    if isinstance(node, _LIKES):
        found = kind(node.this, r)
        pattern = node.expression
        return not (
            found is not None
            and found.family in ("text", "null")
            and isinstance(pattern, exp.Literal)
            and pattern.is_string
        )
    if isinstance(node, _CONNECTIVES):
        return not all(_boolean_like(c, r) for c in node.iter_expressions())
    if isinstance(node, exp.Case):
        conditions = [i.this for i in node.args.get("ifs", [])]
        return kind(node, r) is None or not all(_boolean_like(c, r) for c in conditions)
    if isinstance(node, exp.If):
        return kind(node, r) is None or not _boolean_like(node.this, r)
    if isinstance(node, _CHOOSING):
        return kind(node, r) is None
    if isinstance(node, _TEXT_SLICES):
        return _text_arguments_may_raise(node, r)
    if isinstance(node, _EXTRACTS):
        arg = node.expression if isinstance(node, exp.Extract) else node.this
        found = kind(arg, r)
        return date_part(node) is None or found is None or found.family != "date"
    if isinstance(node, _TEXT_FUNCTIONS):
        found = kind(node.this, r)
        return found is None or found.family not in ("text", "null")
    return not isinstance(node, _TOTAL_NODES)


def _width(node: exp.Expression, r: Resolved) -> int | None:
    """An arithmetic node's integer width; 0 for a float (which never raises in DuckDB);
    None when its kind is unknown or not a number."""
    found = kind(node, r)
    if found is None or found.family not in ("int", "float"):
        return None
    return found.bits if found.family == "int" else 0


def _overflows(node: exp.Expression, r: Resolved) -> bool:
    """Integer ``+ - * -x ABS`` raise when the result leaves their type's range."""
    bits = _width(node, r)
    if bits is None:
        return True
    return bits > 0 and not _fits(node, r, bits)


def _divides_minimum(node: exp.IntDiv | exp.Mod, r: Resolved) -> bool:
    """``//`` and ``%`` of integers raise only for the type's minimum over ``-1`` (the
    divisor is ``NULLIF(d, 0)``, so never zero)."""
    bits = _width(node, r)
    if bits is None:
        return True
    if bits == 0:
        return False
    dividend, divisor = _range(node.this, r), _range(node.expression, r)
    if dividend is None or divisor is None:
        return True
    low = INT_RANGES[bits][0]
    return dividend.lo <= low and divisor.lo <= -1 <= divisor.hi


def _round_overflows(node: exp.Round, r: Resolved) -> bool:
    """``ROUND(x, -n)`` of an integer raises when rounding to ``10^n`` passes its type's
    maximum; the digits must be an integer literal DuckDB binds (INTEGER)."""
    found = kind(node, r)
    if found is None:
        return True
    digits = node.args.get("decimals")
    places = 0
    if digits is not None:
        if not (isinstance(digits, exp.Literal) and digits.is_int):
            return True
        places = int(digits.this)
        if abs(places) >= 2**31:
            return True
    if found.family == "float" or places >= 0:
        return found.family not in ("int", "float")
    if found.family != "int":
        return True
    span = _range(node.this, r)
    if span is None or not span.finite:
        return True
    step = 10 ** min(-places, 40)
    low, high = INT_RANGES[found.bits]
    return span.lo - step < low or span.hi + step > high


def _text_arguments_may_raise(node: exp.Expression, r: Resolved) -> bool:
    found = kind(node.this, r)
    if found is None or found.family not in ("text", "null"):
        return True
    for key in ("start", "length", "expression"):
        arg = node.args.get(key)
        if arg is None:
            continue
        if not (isinstance(arg, exp.Literal) and arg.is_int):
            return True
        if abs(int(arg.this)) > TEXT_POSITION_LIMIT:
            return True
    return False


def _fits(node: exp.Expression, r: Resolved, bits: int) -> bool:
    span = _range(node, r)
    if span is None or not span.finite:
        return False
    low, high = INT_RANGES[bits]
    return low <= span.lo and span.hi <= high


def _range(node: exp.Expression, r: Resolved) -> ValueRange | None:
    """The node's interval under the declared bounds, or None when it has none (a bound
    the analysis would refuse counts as none: the proof does not need it)."""
    try:
        return value_range(node, r)
    except Refused:
        return None


def comparable(operands: list[exp.Expression], r: Resolved) -> bool:
    """Whether DuckDB compares these without a per-row cast that can fail: numbers with
    numbers, texts with texts, dates with dates or with a date literal written as text
    (cast once, at bind time, from the literal)."""
    kinds = [kind(o, r) for o in operands]
    if any(k is None for k in kinds):
        return False
    families = {k.family for k in kinds if k is not None} - {"null"}
    if families <= NUMERIC or families in ({"text"}, {"date"}):
        return True
    if families == {"date", "text"}:
        texts = [o for o, k in zip(operands, kinds, strict=True) if k and k.family == "text"]
        return all(isinstance(o, exp.Literal) and o.is_string for o in texts)
    return False


def _boolean_like(node: exp.Expression, r: Resolved) -> bool:
    found = kind(node, r)
    return found is not None and found.family in BOOLEAN_LIKE


def _common(nodes: list[exp.Expression | None], r: Resolved) -> Kind | None:
    """The kind DuckDB combines branches into, where no branch needs a failing cast."""
    kinds = [kind(n, r) for n in nodes if n is not None]
    if any(k is None for k in kinds):
        return None
    known = [k for k in kinds if k is not None and k.family != "null"]
    if not known:
        return NULL
    families = {k.family for k in known}
    if families == {"int"}:
        return Kind("int", max(k.bits for k in known))
    if families <= NUMERIC:
        if families == {"bool"}:
            return Kind("bool")
        return Kind("float") if "float" in families else Kind("int", max(k.bits for k in known))
    if len(families) == 1:
        return known[0]
    return None


def _arithmetic(a: Kind | None, b: Kind | None) -> Kind | None:
    if a is None or b is None:
        return None
    families = {a.family, b.family} - {"null"}
    if not families:
        return Kind("int", 32)
    if not families <= {"int", "float"}:
        return None
    if "float" in families:
        return Kind("float")
    return Kind("int", max(a.bits, b.bits))


def _constant(node: exp.Expression, r: Resolved, found: Kind | None) -> Kind | None:
    """An integer expression without columns is folded to a literal by DuckDB (``-128`` is
    the TINYINT literal -128, not the negation of 128), which may type it as narrowly
    as its value fits: such an expression is claimed no wider than that."""
    if found is None or found.family != "int" or any(True for _ in node.find_all(exp.Column)):
        return found
    span = _range(node, r)
    if span is None or not span.finite:
        return found
    narrowest = max(_int_literal(int(span.lo)).bits, _int_literal(int(span.hi)).bits)
    return Kind("int", min(found.bits, narrowest)) if narrowest else found


def _int_literal(value: int) -> Kind:
    """The narrowest integer type holding ``value``: DuckDB casts a literal to the other
    operand's type where it fits, so no operation is computed narrower than this."""
    for bits, (low, high) in INT_RANGES.items():
        if low <= value <= high:
            return Kind("int", bits)
    return Kind("float")  # beyond HUGEINT: ``_node_may_raise`` refuses to prove it


def _is_date_literal(node: exp.Expression) -> bool:
    return (
        type(node) is exp.Cast
        and node.to.this == exp.DataType.Type.DATE
        and isinstance(node.this, exp.Literal)
        and node.this.is_string
    )
