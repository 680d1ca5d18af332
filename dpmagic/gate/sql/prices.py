"""What one evaluation of each row operator costs at its worst, in steps.

``work.py`` bounds the work one unit can add to a query as rows × steps a row;
this module says what the steps of one row are. A cost model calibrated on
typical inputs is a guess about the worst case, and an attacker supplies the
worst case: a ``LIKE`` once priced as the text's length times its wildcards
cost 1 s a row on an 80,000-character text against a 15,000-character
pattern. So every operator allowed in a row expression has a price here that
is a function of its inputs' size bounds alone (``bound.text_length``: a
column's ``max_length``, a literal's own length, the sums of concatenations,
the largest branch of a ``CASE``), set at twice or more the worst time
``benchmarks/operator_prices.py`` measures for it on its worst inputs: texts of
4-byte characters at the longest the bounds allow, and for ``LIKE``/``ILIKE``
patterns that make DuckDB's matcher retry the rest of the pattern at every
position of the text (``'%' + 'a' × m + '_b%'`` on a text of ``a``s). The
measurements and each price's margin are in docs/security.md ("Operator
prices"). An operator without a price is refused, free: its worst case is not
known, so it cannot be bounded.

A *step* is what the rest of ``work.py`` counts: one operator on one value,
about 3 ns of DuckDB's time (``policy.values.STEP_NS``). An operator costs one step plus its
per-character work:

* **scan** (``SCAN_PER_CHAR``): comparing, copying, concatenating and casting
  texts read or write each byte once. A comparison stops at the shorter
  operand; an ``IN`` compares with each item; a concatenation writes its
  result.
* **decode** (``DECODE_PER_CHAR``): ``TRIM``, ``SUBSTRING``, ``LEFT``,
  ``RIGHT`` and ``LENGTH`` walk the text's code points; a ``TRY_CAST`` parses
  its text.
* **fold** (``FOLD_PER_CHAR``): ``UPPER`` and ``LOWER`` (and ``ILIKE``, which
  folds its text first) map every code point through Unicode's case tables,
  the costliest per character (17 ns on 4-byte characters, 200 times the old
  model).
* **match** (``MATCH_PER_PAIR``): ``LIKE`` compares the pattern with the text
  at up to every position: text characters × (pattern characters + 1)
  comparisons. DuckDB's matcher (``LikeMatcher`` for patterns without ``_``,
  its general matcher otherwise) measured linear in the text for any number of
  ``%`` (``'%a%a%a%a%a_c'``: 0.68 as the exponent of the text's length), so the
  product is the worst case; Spark's backtracking matcher is kept to two ``%``
  (``sql/engine_rows.py``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

from sqlglot import exp

from dpmagic.gate.failures import Refused
from dpmagic.gate.sql.bound import CASE_EXPANSION, text_length
from dpmagic.gate.sql.check import CONCATENATION, DATE_PARTS, TEXT_FUNCTIONS
from dpmagic.gate.sql.resolve import Resolved
from dpmagic.gate.sql.totality import kind
from dpmagic.gate.sql.trees import display

# Steps per character, each at least twice the worst measured (docs/security.md).
SCAN_PER_CHAR = 2  # worst measured 3.2 ns (``=`` of two equal 4-byte texts)
DECODE_PER_CHAR = 12  # worst measured 16.9 ns (``TRIM`` of 4-byte texts)
FOLD_PER_CHAR = 32  # worst measured 52.3 ns (``LOWER`` of 2-byte texts, at load 2.3)
MATCH_PER_PAIR = 2  # worst measured 3.0 ns a text character × pattern character

Pricer = Callable[[exp.Expression, Resolved], float]


def price(node: exp.Expression, resolved: Resolved) -> int:
    """The steps one evaluation of ``node`` costs at its worst (its children apart)."""
    for cls in type(node).__mro__:
        pricer = PRICES.get(cls)
        if pricer is not None:
            return 1 + math.ceil(pricer(node, resolved))
    raise Refused(
        f"{display(node)}: the gate has no bound on the work of "
        f"{type(node).__name__.upper()} on one row, so it cannot run it on private rows"
    )


def _free(node: exp.Expression, r: Resolved) -> float:
    """Numbers, booleans, dates, NULL tests and names: one step, whatever the row."""
    return 0.0


def _compared(node: exp.Expression, r: Resolved) -> float:
    """A comparison reads both texts up to the shorter one's end; an ``IN`` compares
    with each item, a ``BETWEEN`` with both ends."""
    this = _chars(node.this, r)
    others = [node.args.get("expression"), node.args.get("low"), node.args.get("high")]
    others += node.args.get("expressions") or []
    read = sum(min(this, _chars(o, r)) for o in others if o is not None)
    return SCAN_PER_CHAR * read


def _written(node: exp.Expression, r: Resolved) -> float:
    """A concatenation writes its whole result."""
    return SCAN_PER_CHAR * text_length(node, r)


def _decoded(node: exp.Expression, r: Resolved) -> float:
    return DECODE_PER_CHAR * _chars(node.this, r)


def _folded(node: exp.Expression, r: Resolved) -> float:
    return FOLD_PER_CHAR * _chars(node.this, r)


def _matched(node: exp.Expression, r: Resolved) -> float:
    """A ``LIKE`` compares the pattern at up to every position of the text; an
    ``ILIKE`` first folds the text (which may grow by ``CASE_EXPANSION``)."""
    text = _chars(node.this, r)
    pattern = node.expression
    length = len(pattern.this) if isinstance(pattern, exp.Literal) else _chars(pattern, r)
    if isinstance(node, exp.ILike):
        folded = FOLD_PER_CHAR * text
        text *= CASE_EXPANSION
    else:
        folded = 0.0
    if isinstance(pattern, exp.Literal) and "%" not in pattern.this.rstrip("%"):
        # No ``%`` but a trailing run: the pattern is walked once, never retried (the
        # text is still read once: 2 µs for 1,024 4-byte characters).
        return folded + SCAN_PER_CHAR * text + MATCH_PER_PAIR * (length + 1)
    return folded + MATCH_PER_PAIR * text * (length + 1)


def _chars(node: exp.Expression, r: Resolved) -> float:
    """The most characters of a text value ``node`` can hold; 0 for a number, a date or
    a boolean, which compare in one step (a value whose kind is not known is taken as
    text, the dearer)."""
    found = kind(node, r)
    if found is not None and found.family != "text":
        return 0.0
    return text_length(node, r)


PRICES: dict[type[exp.Expression], Pricer] = {
    # Values and names.
    exp.Literal: _free, exp.Boolean: _free, exp.Null: _free, exp.Column: _free,
    exp.Identifier: _free, exp.DataType: _free, exp.Var: _free, exp.Paren: _free,
    exp.Cast: _free,  # only a date literal's CAST('…' AS DATE) reaches a row (``check``)
    # Numbers: one operator on one value.
    exp.Neg: _free, exp.Add: _free, exp.Sub: _free, exp.Mul: _free, exp.Div: _free,
    exp.IntDiv: _free, exp.Mod: _free, exp.Abs: _free, exp.Round: _free, exp.Floor: _free,
    exp.Ceil: _free, exp.Sqrt: _free,
    exp.Extract: _free, **dict.fromkeys(DATE_PARTS, _free),
    # Logic and choices: a branch's own work is priced on its own nodes.
    exp.And: _free, exp.Or: _free, exp.Not: _free, exp.Is: _free,
    exp.Case: _free, exp.If: _free, exp.Coalesce: _free, exp.Nullif: _compared,
    exp.Greatest: _compared, exp.Least: _compared,
    # Comparisons, which may read texts.
    exp.EQ: _compared, exp.NEQ: _compared, exp.GT: _compared, exp.GTE: _compared,
    exp.LT: _compared, exp.LTE: _compared, exp.NullSafeEQ: _compared,
    exp.NullSafeNEQ: _compared, exp.In: _compared, exp.Between: _compared,
    # Texts.
    exp.TryCast: _decoded, **dict.fromkeys(CONCATENATION, _written),
    exp.Upper: _folded, exp.Lower: _folded,
    **dict.fromkeys((t for t in TEXT_FUNCTIONS if t not in (exp.Upper, exp.Lower)), _decoded),
    exp.Like: _matched, exp.ILike: _matched,
}  # fmt: skip
