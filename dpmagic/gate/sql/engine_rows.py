"""Each engine's rule for the row expressions it runs on private rows: none may raise
on any row. DuckDB's (``totality.total``) is the proof, else ``TRY``; Spark has no
``TRY``, so its rule is the proof alone, and it refuses, before anything is charged,
every row expression Spark would evaluate differently from DuckDB (``tests/system/
test_spark.py`` runs the golden cases and the shared accept corpus on both engines
and requires the same exact answers). The engine's profile (``engines/dialect.py``,
``engines/spark/dialect.py``) says which rule applies (``Dialect.has_try``); the
rules are here, among the passes whose proof they use.

* **No TRY**: Spark has no ``TRY(…)``. A row expression is accepted only if the
  totality proof (``totality.may_raise``) shows it cannot raise. The proof is made
  for DuckDB, and holds for Spark too: Spark computes integer arithmetic in the
  wider of its operands' types (an integer literal is at least an INT), never
  narrower than the narrowest width the proof checks; under ANSI mode it raises
  exactly where DuckDB raises (overflow, ``MIN // -1``, a text that is not a
  number cast implicitly), all of which the proof rules out; divisors are
  ``NULLIF(d, 0)`` in both. An expression the proof cannot accept, which DuckDB
  would answer under ``TRY``, is refused here with the reason.
* **Conditions are boolean**: DuckDB casts a number used as a ``WHERE`` to
  BOOLEAN; Spark will not, so a non-boolean condition is refused.
* **Semantics that differ** are refused or rewritten: a ``TRY_CAST`` of a double to
  an integer type rounds in DuckDB and truncates in Spark, so it is written
  ``TRY_CAST(ROUND(x) AS …)`` (both round half away from zero); a ``TRY_CAST`` of
  text to another type parses differently (``'1e3'``, spaces, signs) and is
  refused; so are ``FLOOR``/``CEIL`` of a double (a DOUBLE in DuckDB, a BIGINT in
  Spark), concatenation of a non-text value (numbers print differently),
  ``LIKE`` patterns with a backslash (Spark's default escape character) or more than
  two ``%`` (Spark backtracks: ``MAX_SPARK_WILDCARDS``), and the
  day-of-week and week numbering (the engines count from different days).
"""

from __future__ import annotations

from sqlglot import exp

from dpmagic.gate.engines.dialect import Dialect
from dpmagic.gate.failures import Refused
from dpmagic.gate.sql.resolve import Resolved
from dpmagic.gate.sql.totality import CONCATENATION, generated, kind, may_raise, total
from dpmagic.gate.sql.trees import display

INTEGER_TYPES = {
    exp.DataType.Type.TINYINT,
    exp.DataType.Type.SMALLINT,
    exp.DataType.Type.INT,
    exp.DataType.Type.BIGINT,
}
# Date parts whose numbering differs between the engines (Sunday = 0 or 1, …).
DIFFERING_DATE_PARTS = (exp.DayOfWeek, exp.WeekOfYear)
DIFFERING_UNITS = frozenset({"DOW", "DAYOFWEEK", "WEEK"})


class NotOnSpark(Refused):
    def __init__(self, what: str) -> None:
        super().__init__(f"this dataset is served by Spark, which cannot answer {what}")


def total_on(
    dialect: Dialect, tree: exp.Expression, resolved: Resolved, condition: bool = False
) -> exp.Expression:
    """``tree`` (a row expression over private rows) in a form that cannot raise on any
    row, by ``dialect``'s rule: with ``TRY``, DuckDB's ``totality.total``; without it,
    Spark's (``spark_total``). ``condition`` for a WHERE or ON."""
    if dialect.has_try:
        return total(tree, resolved, condition)
    return spark_total(tree, resolved, condition)


def spark_total(
    tree: exp.Expression, resolved: Resolved, condition: bool = False
) -> exp.Expression:
    """``tree`` as Spark runs it, proven unable to raise, or refused (``NotOnSpark``)
    where it might raise or Spark would answer differently (see the module's docstring)."""
    if may_raise(tree, resolved):
        raise NotOnSpark(
            f"{display(tree)}: it might fail on some row, and Spark has no TRY to make "
            "such a row NULL as DuckDB does"
        )
    if condition:
        found = kind(tree, resolved)
        if found is None or found.family not in ("bool", "null"):
            raise NotOnSpark(f"a condition that is not boolean ({display(tree)})")
    for node in tree.find_all(exp.Expression):  # every node, as walk() (typed Expr)
        _check(node, resolved)
    return _rounded_casts(generated(tree), tree, resolved)


# Spark compiles LIKE to a Java regular expression matched by backtracking: k ``%``
# cost up to n^(k-1) steps on a text of n characters (``'%a%b%z%'`` on one unit's ten
# texts of 1,024 characters: +5.9 s; five ``%``: past the 30 s timeout, its tasks
# still running half an hour later, ``benchmarks/per_unit_work.py``). Two ``%`` stay
# linear.
MAX_SPARK_WILDCARDS = 2


def _check(node: exp.Expression, r: Resolved) -> None:
    """Refuse ``node`` where Spark's answer would differ from DuckDB's."""
    if isinstance(node, exp.TryCast):
        source = kind(node.this, r)
        if source is not None and source.family == "text" and not node.to.is_type("text"):
            raise NotOnSpark(f"{display(node)}: Spark parses text as numbers differently")
    elif isinstance(node, exp.Floor | exp.Ceil):
        found = kind(node.this, r)
        if found is None or found.family != "int":
            raise NotOnSpark(f"{display(node)} of a non-integer (Spark's is a BIGINT)")
    elif isinstance(node, CONCATENATION):
        for operand in node.expressions if isinstance(node, exp.Concat) else node.args.values():
            if isinstance(operand, exp.Expression):
                found = kind(operand, r)
                if found is None or found.family not in ("text", "null"):
                    raise NotOnSpark(f"{display(node)}: Spark writes non-text values differently")
    elif isinstance(node, exp.Like | exp.ILike):
        pattern = node.expression
        if not isinstance(pattern, exp.Literal) or "\\" in pattern.this:
            raise NotOnSpark(f"{display(node)}: a backslash escapes in Spark's patterns")
        if pattern.this.count("%") > MAX_SPARK_WILDCARDS:
            raise NotOnSpark(
                f"{display(node)}: Spark matches LIKE by backtracking, so a pattern with "
                f"more than {MAX_SPARK_WILDCARDS} % can take time that grows with a power of "
                "the text's length (one person's long text could hold the query past its "
                "time limit); write it as several LIKE '%…%' joined by AND"
            )
    elif isinstance(node, DIFFERING_DATE_PARTS) or (
        isinstance(node, exp.Extract) and node.this.name.upper() in DIFFERING_UNITS
    ):
        raise NotOnSpark(f"{display(node)}: Spark numbers days of the week and weeks differently")


def _rounded_casts(out: exp.Expression, tree: exp.Expression, r: Resolved) -> exp.Expression:
    """``out`` (``generated(tree)``) with each ``TRY_CAST`` of a non-integer number to an
    integer type rounding first, as DuckDB's does. ``generated`` copies the tree node
    for node, so the casts of ``out`` and ``tree`` pair up in walk order."""
    casts = [n for n in tree.walk() if isinstance(n, exp.TryCast)]
    mine = [n for n in out.walk() if isinstance(n, exp.TryCast)]
    for original, cast in zip(casts, mine, strict=True):
        source = kind(original.this, r)
        if cast.to.this not in INTEGER_TYPES or (source is not None and source.family != "float"):
            continue
        if source is None:
            raise NotOnSpark(f"{display(original)}: the type it casts from is not known")
        cast.set("this", exp.Round(this=cast.this))
    return out
