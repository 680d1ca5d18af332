"""Releases inside a query: the tree rules (``staged_releases.py`` runs them).

A scalar subquery over private rows (``c_acctbal > (SELECT AVG(c_acctbal) FROM
customer)``) would enter the query as an exact value computed over everyone's rows.
Here it is released first, as a query of its own with its share of the query's ε;
the query around it then reads the released value as a literal. Why that is private:

- each stage is a differentially private release of its own (the gate's one-query
  path, its own bounds and noise), so by sequential composition the stages together
  cost the sum of their costs, which is what the query is charged;
- the last stage's SQL depends on the data only through the released values, which
  are public once released: whatever it then does with them (compare rows with it,
  put it in a ``CASE``) is post-processing, and costs nothing more.

What a stage may be: a subquery used as a value (not in ``FROM``, ``IN (…)`` or
``EXISTS``), not compared by ``=`` or ``<>`` (a noisy value would pick rows by its
noise: ``age = (SELECT MAX(age) …)`` is refused, saying to compare by order), that
stands alone: every table it names is its own or a CTE of the
query (a *correlated* subquery, one value per outer row, would need a release per
key: refused, saying so), and no subquery used as a value inside it. A stage must
release one value (one column, no ``GROUP BY``): checked from its plan, before any
stage is charged.

The value enters the last stage as a number literal of one shape whatever its
value (``float`` written with a point or an exponent, so the checks read a double),
so the last stage's analysis with a stand-in value (``STAND_IN``), done before any
stage runs, decides its refusals and its cost as the real one will; a stage that
released NULL enters as ``NULL``.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlglot import exp

from dpmagic.gate.failures import Refused
from dpmagic.gate.policy import Dataset
from dpmagic.gate.sql.parse import DIALECT
from dpmagic.gate.sql.released_tables import per_key
from dpmagic.gate.sql.stage_sql import MAX_STAGES, WITH, cell, is_value, literal_value, with_needed

# The value the last stage is analysed with before the stages run.
STAND_IN = 0.5
# The most keys a correlated subquery's release may hold for the query to read (its
# CASE, one WHEN a key, stays within the gate's limit on a query's length).
MAX_KEYS = 250


# What a stage released: one value, or (a correlated subquery) rows of keys and a value.
Released = float | None | list[list[object]]


@dataclass(frozen=True)
class Staged:
    """A query split into its stages: ``stages``, the SQL of each subquery released
    first (with the query's CTEs it reads), in order; ``keys``, for each, the columns
    of the query around it that a correlated one is released by (none for a value
    standing alone); and ``tree``, the query with each of them marked, to be filled
    with what they released (``filled``)."""

    tree: exp.Select
    stages: tuple[str, ...]
    keys: tuple[tuple[exp.Column, ...], ...] = ()
    kinds: tuple[tuple[str, ...], ...] = ()  # each key's declared type

    def filled(self, values: list[Released]) -> str:
        """The last stage's SQL: the query with each subquery's released value, or for
        a correlated one, the value of its row's key (``CASE``; NULL for a key the
        release does not hold)."""
        if len(values) != len(self.stages):
            raise ValueError("one value per stage")
        keys = self.keys or tuple(() for _ in self.stages)
        tree = self.tree.copy()
        marks = sorted(tree.find_all(exp.Placeholder), key=lambda m: int(m.name[len(MARK) :]))
        for mark, value, by in zip(marks, values, keys, strict=True):
            mark.replace(_by_key(by, value) if by else literal_value(value))  # type: ignore[arg-type]
        return tree.sql(dialect=DIALECT)

    def stand_ins(self) -> list[Released]:
        """What the last stage is analysed with before any release: ``STAND_IN`` for a
        value; for a correlated subquery, ``MAX_KEYS`` rows of keys of its keys' types,
        the most a release may hold, so the stand-in's work is the most the real
        one's can be."""
        kinds = self.kinds or tuple(() for _ in self.stages)
        return [
            [[*(_stand_in_key(t, i) for t in types), STAND_IN] for i in range(MAX_KEYS)]
            if types
            else STAND_IN
            for types in kinds
        ]


MARK = "__dpmagic_stage_"


def split(tree: exp.Select, dataset: Dataset | None = None) -> Staged | None:
    """``tree``'s stages, or None when it uses no subquery as a value. With ``dataset``,
    an unqualified column that none of a subquery's own tables declares is taken for
    the query around it (a correlated subquery), and refused as one."""
    found = [s for s in tree.find_all(exp.Subquery) if is_value(s)]
    if not found:
        return None
    if len(found) > MAX_STAGES:
        raise Refused(
            f"the query uses {len(found)} subqueries as values; at most {MAX_STAGES} are "
            "released before it"
        )
    ctes = _ctes(tree)
    out = tree.copy()
    copies = [s for s in out.find_all(exp.Subquery) if is_value(s)]
    stages = []
    keyed: list[tuple[exp.Column, ...]] = []
    kinds: list[tuple[str, ...]] = []
    for i, sub in enumerate(copies):
        select = sub.this
        while isinstance(select, exp.Subquery):
            select = select.this
        if not isinstance(select, exp.Select):
            raise Refused("a subquery used as a value must be one SELECT")
        if isinstance(_context(sub), exp.EQ | exp.NEQ | exp.NullSafeEQ | exp.NullSafeNEQ):
            raise Refused(
                "a subquery's value is released with noise, so = or <> with it would pick "
                "rows by the noise: compare with <, <=, >, >= or BETWEEN"
            )
        if any(is_value(s) for s in select.find_all(exp.Subquery)):
            raise Refused(
                "a subquery used as a value holds another one: release the inner value "
                "in a query of its own, then write it as a number"
            )
        by: tuple[exp.Column, ...] = ()
        if dataset is not None:
            keyed_stage = per_key(select, ctes, dataset)
            if keyed_stage is not None:
                stage, by, types = keyed_stage
                stages.append(stage)
                keyed.append(by)
                kinds.append(types)
                sub.replace(exp.Placeholder(this=f"{MARK}{i}"))
                continue
            _own_columns(select, dataset)
        stages.append(_stage_sql(select, ctes))
        keyed.append(by)
        kinds.append(())
        sub.replace(exp.Placeholder(this=f"{MARK}{i}"))
    return Staged(out, tuple(stages), tuple(keyed), tuple(kinds))


def _context(node: exp.Expression) -> exp.Expr | None:
    """What reads ``node``, parentheses aside."""
    parent = node.parent
    while isinstance(parent, exp.Paren):
        parent = parent.parent
    return parent


def _ctes(tree: exp.Select) -> dict[str, exp.CTE]:
    with_ = tree.args.get(WITH)
    if with_ is None:
        return {}
    return {cte.alias_or_name.lower(): cte for cte in with_.expressions}


def _stage_sql(select: exp.Select, ctes: dict[str, exp.CTE]) -> str:
    """The subquery as a query of its own, with the query's CTEs it reads (and those
    they read). A column qualified by a table the subquery does not name is the
    query around it: a correlated subquery, refused."""
    stage = select.copy()
    visible = {
        t.alias_or_name.lower() for t in stage.find_all(exp.Table)
    } | {  # and the aliases of its own subqueries in FROM
        s.alias_or_name.lower() for s in stage.find_all(exp.Subquery) if s.alias_or_name
    }
    for column in stage.find_all(exp.Column):
        if column.table and column.table.lower() not in visible:
            raise Refused(
                f"the subquery used as a value reads {column.table}.{column.name} of the "
                "query around it: one value per row of the query (a correlated subquery) "
                "is not released yet; release a value that stands alone"
            )
    return with_needed(stage, ctes)


def _own_columns(select: exp.Select, dataset: Dataset) -> None:
    """Refuse a subquery whose unqualified column none of its own declared tables has
    (``l_partkey = p_partkey``, ``p_partkey`` the query around it's): correlated."""
    tables = [dataset.table(t.name) for t in select.find_all(exp.Table)]
    if not tables or any(t is None for t in tables):
        return  # a CTE or an unknown table: the stage's own analysis says
    names = {c for t in tables if t is not None for c in t.columns}
    aliases = {e.alias.lower() for e in select.expressions if e.alias}
    for column in select.find_all(exp.Column):
        name = column.name.lower()
        if not column.table and name not in names and name not in aliases:
            raise Refused(
                f"the subquery used as a value reads {column.name}, a column of the query "
                "around it: one value per row of the query (a correlated subquery) is not "
                "released yet; release a value that stands alone"
            )


def _by_key(keys: tuple[exp.Column, ...], rows: list[list[object]]) -> exp.Expression:
    """A correlated subquery's released rows as the value of the row's key: ``CASE WHEN
    k = 1 THEN 2.5 … END``, NULL where no key was released."""
    if not rows:
        return exp.Null()
    ifs = []
    for row in rows:
        ties = [exp.EQ(this=k.copy(), expression=cell(v)) for k, v in zip(keys, row, strict=False)]
        value = row[-1]
        then = literal_value(None if value is None else float(value))  # type: ignore[arg-type]
        ifs.append(exp.If(this=exp.and_(*ties, copy=False), true=then))
    return exp.Case(ifs=ifs)  # built at once: ``Case.when`` copies the CASE at each WHEN


def _stand_in_key(kind: str, i: int) -> object:
    """A stand-in key of a column's type: the same literal shape a real one will have."""
    return str(i) if kind == "str" else i
