"""Releases that the rest of a query only post-processes (the tree rules;
``staged_releases.answer_tabled`` runs them).

TPC-H's query 15 aggregates private lines per supplier in a CTE, then joins the
totals with the public supplier table and keeps the largest; query 20 compares a
public stock with a per-part-and-supplier sum of private lines, correlated on the
public keys. In both, every read of private rows sits in a part of the query that
is an aggregate of its own:

- a **table release**: a CTE that reads private rows and is read by the rest of the
  query (``revenue0``): released as a query of its own, its rows replacing its body;
- a **value release**: a subquery used as a value that reads private rows. Standing
  alone it releases one value, written into the query as a literal. *Correlated* by
  equalities with columns of the query around it (``l_partkey = ps_partkey AND
  l_suppkey = ps_suppkey``), it is released once for every key, grouped by its side
  of those equalities, and the query reads the value of its row's key from that
  released table; a key the release does not hold reads NULL.

Once released, those rows are public. The rest of the query reads nothing else but
public tables, so whatever it does with them (join, ``MAX``, compare by ``=``) is
post-processing: it is run exactly, as a plain read of public tables is
(``public_reads.py``), and costs nothing more. By sequential composition the query
costs the sum of its releases. Which parts are releases, and the SQL of each, is
decided from the text alone, before anything runs.

A query whose rest still reads private rows is not one of these: it goes the way of
``staged.py`` (values released first, then a release of its own) or the usual one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlglot import exp

from dpmagic.gate.failures import Refused
from dpmagic.gate.policy import Dataset
from dpmagic.gate.sql.parse import DIALECT
from dpmagic.gate.sql.stage_sql import MAX_STAGES, WITH, cell, is_value, literal_value, with_needed

# The name of a value release's table in the rest of the query, and its columns.
TABLE = "__dpmagic_release_"
KEY = "__k"
VALUE = "value"


@dataclass(frozen=True)
class Release:
    """One part of the query released first: ``sql``, its query; ``name``, the CTE the
    rest reads its rows as (None for a value written as a literal); ``columns``, that
    CTE's columns."""

    sql: str
    name: str | None
    columns: tuple[str, ...]


@dataclass(frozen=True)
class Tabled:
    """A query whose private reads are all releases: ``releases`` in order, and
    ``tree``, the rest of the query, to be filled with what they released
    (``filled``). ``public`` names the declared public tables the rest reads."""

    tree: exp.Select
    releases: tuple[Release, ...]
    public: tuple[str, ...]

    def filled(self, released: Sequence[Sequence[Sequence[object]] | None]) -> exp.Select:
        """The rest of the query over the released rows (``None``: a dry run's, none)."""
        if len(released) != len(self.releases):
            raise ValueError("one set of rows per release")
        tree = self.tree.copy()
        marks = {m.name: m for m in tree.find_all(exp.Placeholder)}
        for i, (release, rows) in enumerate(zip(self.releases, released, strict=True)):
            mark = marks[f"{MARK}{i}"]
            if release.name is None:
                cell = rows[0][0] if rows and rows[0] else None
                mark.replace(literal_value(None if cell is None else float(cell)))  # type: ignore[arg-type]
            else:
                mark.replace(_rows_table(release.columns, rows or []))
        return tree


MARK = "__dpmagic_release_mark_"


def tabled(tree: exp.Select, dataset: Dataset) -> Tabled | None:
    """``tree`` split into its releases and the rest, or None where the rest would
    still read private rows (or nothing in it reads them)."""
    out = tree.copy()
    with_ = out.args.get(WITH)
    listed = list(with_.expressions) if with_ is not None else []
    out.set(WITH, None)  # ``out`` is now the body; the CTEs are held in ``listed``
    ctes = {c.alias_or_name.lower(): c for c in listed}
    private = {name for name in ctes if _reads_private(ctes[name].this, ctes, dataset, set())}
    # The parts of the rest: the body, and the CTEs that read no private rows.
    outside = [out, *(ctes[n].this for n in ctes if n not in private)]
    named = {t.name.lower() for part in outside for t in _tables_outside_values(part)}
    table_releases = [n for n in ctes if n in private and n in named]
    if any(not _aggregates(ctes[n].this) for n in table_releases):
        return None  # a CTE that filters private rows: the rest reads them through it
    values = [
        s
        for part in outside
        for s in _values(part)
        if _reads_private(s.this, ctes, dataset, set(table_releases))
    ]
    if not table_releases and not values:
        return None
    if _rest_reads_private(named, ctes, dataset):
        return None
    if len(table_releases) + len(values) > MAX_STAGES:
        raise Refused(
            f"the query releases {len(table_releases) + len(values)} parts before it reads "
            f"them; at most {MAX_STAGES} are released in one query"
        )
    # Every release's SQL is written from the query as it was, before any is marked.
    releases: list[Release] = []
    for name in table_releases:
        select = ctes[name].this
        columns = tuple(e.alias_or_name for e in select.expressions)
        if any(not c or c == "*" for c in columns):
            raise Refused(f"name each column of {name}, the part of the query released first")
        releases.append(Release(with_needed(select, ctes), name, columns))
    lookups = []
    for sub in values:
        release, lookup, cte = _value_release(sub, ctes, dataset, len(releases))
        releases.append(release)
        lookups.append((sub, lookup, cte))
    for i, name in enumerate(table_releases):
        ctes[name].set("this", exp.Placeholder(this=f"{MARK}{i}"))
    added = []
    for sub, lookup, cte in lookups:
        sub.replace(lookup)
        if cte is not None:
            added.append(cte)
    # The private CTEs no release is are read only by releases: the rest drops them.
    dropped = private - set(table_releases)
    kept = [c for c in listed if c.alias_or_name.lower() not in dropped]
    if kept or added:
        out.set(WITH, exp.With(expressions=[*added, *kept]))
    public = sorted(
        {
            t.name.lower()
            for t in out.find_all(exp.Table)
            if (d := dataset.table(t.name.lower())) is not None and d.public
        }
    )
    return Tabled(out, tuple(releases), tuple(public))


def _value_release(
    sub: exp.Subquery, ctes: dict[str, exp.CTE], dataset: Dataset, index: int
) -> tuple[Release, exp.Expression, exp.CTE | None]:
    """A subquery used as a value, as a release: standing alone, one value written in
    as a literal; correlated by equalities, a table of values by key, read by a lookup
    of the row's key."""
    select = sub.this
    while isinstance(select, exp.Subquery):
        select = select.this
    if not isinstance(select, exp.Select) or len(select.expressions) != 1:
        raise Refused("a subquery used as a value must be one SELECT of one value")
    if any(is_value(s) for s in select.find_all(exp.Subquery)):
        raise Refused(
            "a subquery used as a value holds another one: release the inner value "
            "in a query of its own, then write it as a number"
        )
    mark = exp.Placeholder(this=f"{MARK}{index}")
    pairs, rest = _correlation(select, ctes, dataset)
    if not pairs:
        return Release(with_needed(select, ctes), None, ()), mark, None
    if select.args.get("group") or select.args.get("having"):
        raise Refused("a correlated subquery used as a value is released without GROUP BY")
    sql, columns = _keyed_stage(select, pairs, rest, ctes)
    name = f"{TABLE}{index}"
    ties = [
        exp.EQ(this=exp.column(key, table=name), expression=outer.copy())
        for key, (_, outer) in zip(columns, pairs, strict=False)
    ]
    lookup = exp.Subquery(
        this=exp.select(exp.column(columns[-1], table=name)).from_(name).where(exp.and_(*ties))
    )
    cte = exp.CTE(this=mark, alias=exp.TableAlias(this=exp.to_identifier(name)))
    return Release(sql, name, columns), lookup, cte


def per_key(
    select: exp.Select, ctes: dict[str, exp.CTE], dataset: Dataset
) -> tuple[str, tuple[exp.Column, ...], tuple[str, ...]] | None:
    """A correlated subquery used as a value in a query that reads private rows itself
    (``staged.py``): its release per key (the SQL), the outer columns its keys are
    matched with, and each key's declared type. None where it stands alone."""
    if len(select.expressions) != 1:
        raise Refused("a subquery used as a value must be one SELECT of one value")
    pairs, rest = _correlation(select, ctes, dataset)
    if not pairs:
        return None
    if select.args.get("group") or select.args.get("having"):
        raise Refused("a correlated subquery used as a value is released without GROUP BY")
    sql, _ = _keyed_stage(select, pairs, rest, ctes)
    kinds = tuple(_kind(inner, select, dataset) for inner, _ in pairs)
    return sql, tuple(outer for _, outer in pairs), kinds


def _kind(inner: exp.Expression, select: exp.Select, dataset: Dataset) -> str:
    """A key's declared type, from the subquery's own tables (``int`` where unknown:
    the stand-in's shape; a key of text is matched with text literals)."""
    if isinstance(inner, exp.Column):
        for table in select.find_all(exp.Table):
            declared = dataset.table(table.name.lower())
            names = (table.alias_or_name.lower(), table.name.lower())
            if (
                declared is not None
                and inner.name.lower() in declared.columns
                and (not inner.table or inner.table.lower() in names)
            ):
                return declared.columns[inner.name.lower()].type
    return "int"


def _keyed_stage(
    select: exp.Select,
    pairs: list[tuple[exp.Expression, exp.Column]],
    rest: list[exp.Expression],
    ctes: dict[str, exp.CTE],
) -> tuple[str, tuple[str, ...]]:
    """A correlated subquery's release: its value grouped by its side of the ties,
    with the conjuncts left; and the released table's columns."""
    columns = _names(pairs, select.expressions[0])
    stage = select.copy()
    keys = [
        inner.copy() if inner.alias_or_name == name else exp.alias_(inner.copy(), name)
        for (inner, _), name in zip(pairs, columns, strict=False)
    ]
    value = exp.alias_(stage.expressions[0].unalias().copy(), columns[-1])
    stage.set("expressions", [*keys, value])
    stage.set("where", exp.Where(this=exp.and_(*rest)) if rest else None)
    stage.set("group", exp.Group(expressions=[inner.copy() for inner, _ in pairs]))
    return with_needed(stage, ctes), columns


def _names(
    pairs: list[tuple[exp.Expression, exp.Column]], value: exp.Expression
) -> tuple[str, ...]:
    """The released table's columns: each key by its column's name where that is one
    and unique (``l_partkey``), else ``__k0``…; the value by its alias, else ``value``."""
    keys = [inner.name if isinstance(inner, exp.Column) else "" for inner, _ in pairs]
    wanted = value.alias or VALUE
    names = [*keys, wanted]
    if len({n.lower() for n in names}) != len(names) or not all(names):
        names = [*(f"{KEY}{i}" for i in range(len(pairs))), VALUE]
    return tuple(names)


def _correlation(
    select: exp.Select, ctes: dict[str, exp.CTE], dataset: Dataset
) -> tuple[list[tuple[exp.Expression, exp.Column]], list[exp.Expression]]:
    """The subquery's ties to the query around it, as (its side, the outer column)
    pairs from its WHERE's conjuncts ``inner = outer``, and the conjuncts left. Any
    other reading of an outer column is refused: one value per key is what is
    released, and the key must say which."""
    where = select.args.get("where")
    conjuncts = list(where.this.flatten()) if where is not None else []
    if where is not None and not isinstance(where.this, exp.And):
        conjuncts = [where.this]
    own = _own_names(select, ctes, dataset)
    pairs: list[tuple[exp.Expression, exp.Column]] = []
    rest: list[exp.Expression] = []
    for conjunct in conjuncts:
        tie = _tie(conjunct, own)
        if tie is not None:
            pairs.append(tie)
        else:
            rest.append(conjunct)
    outer = [c for part in [*rest, *select.expressions] for c in _outer_columns(part, own)]
    for clause in ("joins", "from"):
        for node in select.args.get(clause) or []:
            outer += _outer_columns(node, own)
    if outer:
        raise Refused(
            f"the subquery used as a value reads {outer[0].sql(dialect=DIALECT)} of the query "
            "around it other than by an equality with its own columns: it is released once "
            "a key, and ties like l_partkey = p_partkey say the key"
        )
    return pairs, rest


def _tie(conjunct: exp.Expression, own: _Names) -> tuple[exp.Expression, exp.Column] | None:
    """``inner = outer`` (either way round): an expression over the subquery's own
    columns equal to a column of the query around it."""
    if not isinstance(conjunct, exp.EQ):
        return None
    for inner, outer in (
        (conjunct.this, conjunct.expression),
        (conjunct.expression, conjunct.this),
    ):
        if (
            isinstance(outer, exp.Column)
            and not own.holds(outer)
            and not _outer_columns(inner, own)
            and inner.find(exp.Column) is not None
        ):
            return inner, outer
    return None


@dataclass(frozen=True)
class _Names:
    """What a subquery names as its own: its tables' aliases and their columns."""

    tables: frozenset[str]
    columns: frozenset[str] | None  # None: not all known (a table the policy lacks)

    def holds(self, column: exp.Column) -> bool:
        if column.table:
            return column.table.lower() in self.tables
        return self.columns is None or column.name.lower() in self.columns


def _own_names(select: exp.Select, ctes: dict[str, exp.CTE], dataset: Dataset) -> _Names:
    tables: set[str] = set()
    columns: set[str] | None = set()
    for table in select.find_all(exp.Table):
        tables |= {table.alias_or_name.lower(), table.name.lower()}
        name = table.name.lower()
        declared = dataset.table(name)
        if name in ctes:
            names = {e.alias_or_name.lower() for e in ctes[name].this.expressions}
        elif declared is not None:
            names = set(declared.columns)
        else:
            names = None
        columns = None if columns is None or names is None else columns | names
    for sub in select.find_all(exp.Subquery):
        if sub.alias_or_name:
            tables.add(sub.alias_or_name.lower())
            columns = None  # its columns are its SELECT's: the resolver judges them
    return _Names(frozenset(tables), None if columns is None else frozenset(columns))


def _outer_columns(node: exp.Expression, own: _Names) -> list[exp.Column]:
    return [c for c in node.find_all(exp.Column) if not own.holds(c)]


def _rows_table(columns: tuple[str, ...], rows: Sequence[Sequence[object]]) -> exp.Select:
    """Released rows as a table of literals: ``SELECT * FROM (VALUES …) AS t (cols)``,
    or one of no rows with the same columns."""
    if not rows:
        return exp.select(*(exp.alias_(exp.Null(), c) for c in columns)).limit(0)
    values = exp.Values(
        expressions=[exp.Tuple(expressions=[cell(v) for v in row]) for row in rows],
        alias=exp.TableAlias(
            this=exp.to_identifier("released"),
            columns=[exp.to_identifier(c) for c in columns],
        ),
    )
    return exp.select("*").from_(values)


def _aggregates(select: exp.Expression) -> bool:
    """Whether a CTE's body is an aggregate: grouped, or with an aggregate at its top."""
    if not isinstance(select, exp.Select):
        return False
    if select.args.get("group") is not None:
        return True
    return any(
        isinstance(node, exp.AggFunc) and node.parent_select is select
        for e in select.expressions
        for node in e.find_all(exp.AggFunc)
    )


def _with(tree: exp.Select) -> list[exp.CTE]:
    with_ = tree.args.get(WITH)
    return list(with_.expressions) if with_ is not None else []


def _rest_reads_private(named: set[str], ctes: dict[str, exp.CTE], dataset: Dataset) -> bool:
    """Whether the rest of the query names a private table itself (outside the CTEs
    and values released): it is then no post-processing, and goes another way."""
    return any(n not in ctes and _private_table(n, dataset) for n in named)


def _private_table(name: str, dataset: Dataset) -> bool:
    """A table that is not a declared public one: private, or unknown (the usual path
    then says which)."""
    declared = dataset.table(name)
    return declared is None or not declared.public


def _reads_private(
    node: exp.Expression, ctes: dict[str, exp.CTE], dataset: Dataset, released: set[str]
) -> bool:
    """Whether ``node`` reads private rows, through the query's CTEs (those in
    ``released`` read as released, public once they are)."""
    seen: set[str] = set()
    todo = [t.name.lower() for t in node.find_all(exp.Table)]
    while todo:
        name = todo.pop()
        if name in released or name in seen:
            continue
        seen.add(name)
        if name in ctes:
            todo += [t.name.lower() for t in ctes[name].this.find_all(exp.Table)]
        elif _private_table(name, dataset):
            return True
    return False


def _values(node: exp.Expression) -> list[exp.Subquery]:
    """The subqueries used as values in ``node``, outermost only."""
    out = []
    for sub in node.find_all(exp.Subquery):
        if not is_value(sub):
            continue
        parent = sub.parent
        nested = False
        while parent is not None and parent is not node:
            if isinstance(parent, exp.Subquery) and is_value(parent):
                nested = True
                break
            parent = parent.parent
        if not nested:
            out.append(sub)
    return out


def _tables_outside_values(node: exp.Expression) -> list[exp.Table]:
    """The tables ``node`` names outside its subqueries used as values."""
    inside = {id(t) for sub in _values(node) for t in sub.find_all(exp.Table)}
    return [t for t in node.find_all(exp.Table) if id(t) not in inside]
