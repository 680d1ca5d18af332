"""Pass 2: names against the public schema, and the FROM clause flattened.

Every column reference is bound to one declared column of one *scan* (a
table read once, named ``__s0``, ``__s1``, … in the generated SQL). Derived
tables and CTEs that are row transformations (filters, projections, derived
columns) are merged into the query that reads them: their columns become the
expressions that define them and their filters join the query's own, so the
passes after this one see a single SELECT over a join of declared tables,
which is what the per-unit contribution bounding needs to see.

Joins keep every output row attributable to exactly one privacy unit: the
first private table's unit is the row's unit, and every other private table
must be joined to it on its unit column (directly or through declared
links), so a join never mixes two units' rows. Public tables may be joined
freely. Only the policy is consulted, so a refusal says nothing about data.
"""

from __future__ import annotations

import difflib
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from functools import cached_property

from sqlglot import exp

from dpmagic.gate.failures import PublicOnly, Refused, required
from dpmagic.gate.policy import Column, Dataset, Table
from dpmagic.gate.sql.limits import AnalysisLimit, Expansion, nodes
from dpmagic.gate.sql.parse import DIALECT, Parsed
from dpmagic.gate.sql.per_unit import derived_table, per_unit_values
from dpmagic.gate.sql.trees import conjuncts
from dpmagic.gate.sql.unit_keys import fixed_by_unit
from dpmagic.gate.sql.value_range import ValueRange

# sqlglot 30 names these arguments with a trailing underscore.
FROM = "from_" if "from_" in exp.Select.arg_types else "from"
WITH = "with_" if "with_" in exp.Select.arg_types else "with"
PRESENT = "__present"  # a left-joined scan's marker column: TRUE where a row matched
UNIT_OUTPUT = "__unit"  # a per-person subquery's unit, where it does not select it
SEMI = "__semi"  # the table qualifier of a semi-join's stand-in column

_BOOL = Column(name=PRESENT, type="bool", lower=0, upper=1)

Env = dict[str, dict[str, exp.Expression]]  # visible relation -> column -> its definition
# The CTEs a SELECT sees, by name: each one's body and the CTEs its body sees.
Ctes = dict[str, tuple[exp.Expression, "Ctes"]]


@dataclass(frozen=True)
class Scan:
    """One read of a declared table, joined to the scans before it.

    ``kind`` is ``from`` for the first scan, ``inner`` or ``left`` after it;
    ``on`` is a left join's condition (inner join conditions are filters).
    """

    name: str
    table: Table
    kind: str
    on: exp.Expression | None = None
    # A subquery grouped by the unit, read as a table of one row per unit.
    per_unit: PerUnit | None = None


@dataclass(frozen=True)
class PerUnit:
    """A subquery in ``FROM`` grouped by the privacy unit or by a key within one unit
    (an order: ``sql/per_unit.py`` has the bounds): computed exactly, per unit, in SQL
    of its own over ``scans`` (a join on the unit in which each unit keeps at most
    ``rows`` rows, ``ranks.room_reads``) filtered by ``where``, one row per unit and
    ``keys`` (each named where the subquery selects it), holding ``unit``, its keys
    and each of ``values`` (its name and its aggregate over ``scans``). The query
    around it reads it as the table its scan names: one row per unit where the unit
    fixes its keys (``unit_keys``), else at most ``rows`` (a unit's rows hold at most
    that many distinct keys), each value a column declared by its bound, so what one
    unit adds to the query around it is that many rows within those bounds, whatever
    its rows inside. The SQL groups by the unit and the keys: each row is one unit's
    whatever the keys are."""

    scans: tuple[Scan, ...]
    where: exp.Expression | None
    unit: exp.Column
    values: tuple[tuple[str, exp.Expression], ...]
    rows: int
    bounds: tuple[ValueRange, ...]  # each value's, which the SQL clamps it into
    bases: tuple[str, ...]  # why each value lies within its bound, for the dry run
    keys: tuple[tuple[str | None, exp.Expression], ...] = ()  # (output name, key)


@dataclass(frozen=True)
class SemiJoin:
    """``lhs IN (SELECT value FROM scans WHERE where)``, standing in the tree as the
    boolean column ``__semi.<name>``.

    Stable in either of two forms: the subquery reads public tables only, or
    ``lhs`` and ``value`` are both privacy-unit columns, so a unit's rows pass
    or fail on that unit's own rows alone.
    """

    name: str
    lhs: exp.Expression
    scans: tuple[Scan, ...]
    value: exp.Expression
    where: exp.Expression | None
    exists: bool = False  # EXISTS: never NULL, and NULLs on either side never match
    # ``GROUP BY value HAVING …``: the values whose rows (all one unit's: ``value`` is the
    # unit or a key within one unit) meet a condition on their aggregates.
    grouped: bool = False
    having: exp.Expression | None = None
    # EXISTS's further conditions between a subquery row and the query's row (``l2.
    # l_suppkey <> l1.l_suppkey``), with the two rows' units equal: allowed only when
    # ``value = lhs`` keeps both rows one unit's (``_one_person``), so a row's answer
    # reads its own unit's rows alone. The SQL is then a correlated EXISTS.
    correlated: exp.Expression | None = None


@dataclass(frozen=True)
class Resolved:
    """One SELECT over a join of scans, every column qualified by its scan.

    ``tree`` has no FROM: its WHERE holds every filter of the query and of
    the subqueries merged into it. ``unit`` is the column holding each row's
    privacy unit (``None`` for row-level privacy).
    """

    tree: exp.Select
    canonical: str
    dataset: Dataset
    scans: tuple[Scan, ...]
    unit: exp.Column | None
    semijoins: tuple[SemiJoin, ...] = ()

    def column(self, node: exp.Expression) -> Column | None:
        """The declared column a qualified reference reads, if it is one."""
        if not isinstance(node, exp.Column) or not node.table:
            return None
        if node.name == PRESENT or node.table == SEMI:
            return _BOOL
        scan = self.scan(node.table)
        if scan is not None and node.name == scan.table.unit:
            return scan.table.unit_column
        return None if scan is None else scan.table.columns.get(node.name)

    def scan(self, name: str) -> Scan | None:
        return self._scans_by_name.get(name)

    @cached_property
    def _scans_by_name(self) -> dict[str, Scan]:
        """Each scan name's first scan among the query's, its semi-joins' and its
        per-person subqueries' (in that order), gathered once: every column the passes
        look up asks for its scan."""
        inner = (s.per_unit.scans for s in self.scans if s.per_unit is not None)
        found: dict[str, Scan] = {}
        for s in itertools.chain(self.scans, *(j.scans for j in self.semijoins), *inner):
            found.setdefault(s.name, s)
        return found

    def is_unit(self, node: exp.Expression) -> bool:
        """Whether ``node`` reads a privacy-unit column (of any private scan)."""
        if not isinstance(node, exp.Column) or not node.table:
            return False
        scan = self.scan(node.table)
        return scan is not None and scan.table.unit == node.name

    def within_unit(self, node: exp.Expression) -> bool:
        """Whether ``node`` is a key whose rows all lie within one unit along the declared
        links (``_within_unit``: a line's order, an order's key)."""
        return _within_unit(node, self.scans, self.dataset)


def resolve(parsed: Parsed, dataset: Dataset) -> Resolved:
    """The query as one SELECT over scans; refused (``limits.AnalysisLimit``) as soon as
    inlining would build more than ``limits.MAX_EXPANDED_NODES`` nodes."""
    flat = _Flattener(dataset, itertools.count(), Expansion())
    tree = parsed.tree
    if tree.find(exp.TableSample):
        raise Refused("sampling clauses (USING SAMPLE, TABLESAMPLE) are not allowed")
    ctes = flat.ctes(tree, {})
    flat.top_ctes = ctes
    env, filters = flat.from_clause(tree, ctes, "from")
    aliases = {e.alias.lower() for e in tree.expressions if e.alias}

    out = exp.Select()
    for key, value in tree.args.items():
        if key in (FROM, WITH, "joins") or value is None:
            continue
        out.set(key, value)
    out.set(
        "expressions",
        [flat.substitute(e, env, frozenset(), "the SELECT list") for e in tree.expressions],
    )
    where = tree.args.get("where")
    if where is not None:
        filters.append(flat.substitute(where.this, env, frozenset(), "WHERE"))
    along_links(flat.scans, filters)
    if filters:
        out.set("where", exp.Where(this=exp.and_(*filters, copy=False)))
    for key, place in (("group", "GROUP BY"), ("having", "HAVING"), ("order", "ORDER BY")):
        node = tree.args.get(key)
        if node is not None:
            out.set(key, flat.substitute(node, env, frozenset(aliases), place))
    scans = tuple(flat.scans)
    if any(s.per_unit for s in scans) and sum(not s.table.public for s in scans) > 1:
        raise Refused(
            "a per-person subquery is read on its own (or joined with public tables): "
            "join the tables inside it, on the person"
        )
    return Resolved(
        tree=out,
        canonical=parsed.canonical,
        dataset=dataset,
        scans=scans,
        unit=_unit(scans, filters, dataset),
        semijoins=tuple(flat.semijoins),
    )


class _Flattener:
    """Walks FROM clauses, creating scans and collecting filters.

    Every copy it makes is first charged to ``expansion`` (shared with the semi-joins'
    own flatteners): the text's expressions as ``substitute`` copies them, each
    definition a column reference inlines, each scan's columns. A CTE read at several
    places is inlined at each, and its columns' definitions at each of their uses, so
    the inlined query can be exponentially larger than the text; the charge refuses it
    before the copy that would pass the cap is made.
    """

    def __init__(self, dataset: Dataset, names: Iterator[int], expansion: Expansion) -> None:
        self.dataset = dataset
        self.names = names  # scan numbers, shared with the semi-joins' own flatteners
        self.expansion = expansion
        self.top_ctes: Ctes = {}
        self.semijoins: list[SemiJoin] = []
        self.scans: list[Scan] = []
        self.using: set[str] = set()  # JOIN … USING columns: either side's is the same

    def ctes(self, select: exp.Select, outer: Ctes) -> Ctes:
        with_ = select.args.get(WITH)
        if with_ is None:
            return outer
        if with_.args.get("recursive"):
            raise Refused("WITH RECURSIVE is not allowed")
        ctes = dict(outer)
        for cte in with_.expressions:
            if cte.args.get("alias") is not None and cte.args["alias"].columns:
                raise Refused("name a CTE's columns inside its SELECT, not after its name")
            ctes[cte.alias_or_name.lower()] = (cte.this, ctes)
        return ctes

    def from_clause(self, select: exp.Select, ctes: Ctes, kind: str) -> tuple[Env, list]:
        source = select.args.get(FROM)
        if source is None:
            raise Refused("the query has no FROM clause")
        env, filters = self.item(source.this, ctes, kind)
        for join in select.args.get("joins") or []:
            jkind = _join_kind(join)
            if kind == "left":
                raise Refused("the right side of a LEFT JOIN must be one table or a row filter")
            right, right_filters = self.item(join.this, ctes, jkind)
            if set(right) & set(env):
                raise Refused(f"the name {sorted(set(right) & set(env))[0]!r} is used twice")
            env = {**env, **right}
            names = [c.name.lower() for c in join.args.get("using") or []]
            self.using |= set(names)
            conds: list[exp.Expression] = [
                exp.EQ(this=exp.column(n, table=t1), expression=exp.column(n, table=t2))
                for n in names
                for t1, t2 in [(_owner(env, n, exclude=right), next(iter(right)))]
            ]
            on = join.args.get("on")
            if on is not None:
                conds.append(on)
            conds = [self.substitute(c, env, frozenset(), "ON") for c in conds]
            if jkind == "left":
                scan = self.scans[-1]
                # The right side's own filters narrow which of its rows match.
                self.scans[-1] = Scan(scan.name, scan.table, "left", _and(conds + right_filters))
                env = {
                    **env,
                    **{r: _guard_all(cols, scan.name, self.expansion) for r, cols in right.items()},
                }
            else:
                filters += right_filters + conds
        return env, filters

    def item(self, node: exp.Expression, ctes: Ctes, kind: str) -> tuple[Env, list]:
        alias = node.alias_or_name.lower() if node.alias_or_name else ""
        if isinstance(node, exp.Table) and isinstance(node.this, exp.Identifier):
            if node.args.get("alias") is not None and node.args["alias"].columns:
                raise Refused("column aliases after a table name are not supported")
            if node.this.quoted and ("/" in node.name or "." in node.name):
                raise Refused("reading files is not allowed: FROM must name a declared table")
            if node.args.get("catalog") or (
                node.args.get("db") and node.text("db").lower() != "main"
            ):
                raise Refused(f"unknown table {node.sql(dialect=DIALECT)!r}")
            if not node.args.get("db") and node.name.lower() in ctes:
                body, scope = ctes[node.name.lower()]
                if not isinstance(body, exp.Select):
                    raise Refused(f"{_name(body)} is not supported in FROM: use one SELECT")
                return self.derived(body, scope, alias, kind)
            table = self.dataset.table(node.name)
            if table is None:
                raise Refused(
                    f"unknown table {node.name!r}; "
                    + _did_you_mean(node.name.lower(), self.dataset.tables)
                    + "declared: "
                    + ", ".join(sorted(self.dataset.tables))
                )
            name = f"__s{next(self.names)}"
            self.expansion.add(3 * len(table.columns))  # a column, its name and its table's
            self.scans.append(Scan(name, table, kind))
            cols: dict[str, exp.Expression] = {c: exp.column(c, table=name) for c in table.columns}
            return {alias or table.name: cols}, []
        if isinstance(node, exp.Subquery):
            if node.args.get("alias") is not None and node.args["alias"].columns:
                raise Refused("name a subquery's columns inside its SELECT, not after its alias")
            inner = node.this
            if not isinstance(inner, exp.Select):
                raise Refused(f"{_name(inner)} is not supported in FROM: use one SELECT")
            return self.derived(inner, ctes, alias, kind)
        raise Refused(f"FROM must name a declared table, not {_describe(node)}")

    def derived(self, select: exp.Select, ctes: Ctes, alias: str, kind: str) -> tuple[Env, list]:
        """A subquery or CTE read in FROM: merged when it is a row transformation, read
        as a table of one row per unit when it groups by the unit (``per_unit``)."""
        if select.args.get("group") is not None:
            return self.per_unit(select, ctes, alias, kind)
        _row_transformation(select)
        ctes = self.ctes(select, ctes)
        env, filters = self.from_clause(select, ctes, kind)
        where = select.args.get("where")
        if where is not None:
            filters.append(self.substitute(where.this, env, frozenset(), "WHERE"))
        cols: dict[str, exp.Expression] = {}
        for item in select.expressions:
            if isinstance(item, exp.Star):
                for rel in env.values():
                    for c, e in rel.items():
                        cols.setdefault(c, e)
                continue
            if isinstance(item, exp.Column) and isinstance(item.this, exp.Star):
                named = env.get(item.table.lower())
                if named is None:
                    raise Refused(f"unknown table or alias {item.table!r}")
                for c, e in named.items():
                    cols.setdefault(c, e)
                continue
            name = item.alias_or_name.lower()
            expr = item.this if isinstance(item, exp.Alias) else item
            cols[name] = self.substitute(expr, env, frozenset(), "a subquery's SELECT list")
        return {alias or f"__derived{len(self.scans)}": cols}, filters

    def per_unit(self, select: exp.Select, ctes: Ctes, alias: str, kind: str) -> tuple[Env, list]:
        """A subquery grouped by the privacy unit: its rows resolved on their own (a join
        on the unit, as any query's), its values bounded per unit (``sql/per_unit.py``),
        and one scan standing for it, of a table of one row per unit."""
        for key, what in (
            ("order", "ORDER BY"), ("limit", "LIMIT"), ("offset", "OFFSET"),
            ("distinct", "DISTINCT"), ("qualify", "QUALIFY"), ("windows", "WINDOW"),
            ("laterals", "LATERAL"), ("pivots", "PIVOT"),
        ):  # fmt: skip
            if select.args.get(key):
                raise Refused(
                    f"{what} inside a per-person subquery is not supported: filter the "
                    "persons in the query around it (WHERE n > 3) or in its HAVING"
                )
        sub = _Flattener(self.dataset, self.names, self.expansion)
        sub.top_ctes = self.top_ctes
        ctes = sub.ctes(select, ctes)
        env, filters = sub.from_clause(select, ctes, "from")
        where = select.args.get("where")
        if where is not None:
            filters.append(sub.substitute(where.this, env, frozenset(), "WHERE"))
        if sub.semijoins:
            raise Refused("IN (SELECT …) and EXISTS inside a per-person subquery are not supported")
        along_links(sub.scans, filters)
        scans = tuple(sub.scans)
        unit = _unit(scans, filters, self.dataset)
        group = select.args["group"].expressions
        keys = [sub.substitute(k, env, frozenset(), "GROUP BY") for k in group]
        by_unit = [k for k in keys if _unit_of(k, scans) is not None]
        within = [k for k in keys if _within_unit(k, scans, self.dataset)]
        if unit is None or not (by_unit or within):
            raise Refused(
                "GROUP BY inside a subquery in FROM must group by the privacy unit, or by a "
                "key within one person (an order), with any other keys beside it: each row "
                "is then one person's, computed from their rows (visits per patient); other "
                "groups would mix several persons' rows"
            )
        others = [k for k in keys if _unit_of(k, scans) is None]
        rows = _unit_rows(scans, self.dataset)

        def row_range(node: exp.Expression) -> ValueRange | None:
            read = _private_read(node, scans)
            col = None if read is None else read[0].table.columns.get(read[1])
            if col is None or col.type not in ("int", "float") or not col.bounded:
                return None
            return ValueRange(float(col.lower), float(col.upper), col.type == "int")  # type: ignore[arg-type]

        unit_name, items, trees = UNIT_OUTPUT, [], []
        written: dict[str, str] = {}  # a value's resolved text -> the user's, for its basis
        grouped = {k.sql(dialect=DIALECT): k for k in others}
        named: dict[str, str] = {}  # a key's text -> its output name
        key_columns: list[Column] = []
        for item in select.expressions:
            name = item.alias_or_name.lower()
            expr = item.this if isinstance(item, exp.Alias) else item
            tree = sub.substitute(expr, env, frozenset(), "a per-person subquery's SELECT")
            if _unit_of(tree, scans) is not None:
                unit_name = name
                continue
            text = tree.sql(dialect=DIALECT)
            if text in grouped and text not in named:
                named[text] = name
                key_columns.append(_key_column(name, tree, scans))
                continue
            items.append(exp.alias_(tree, name))
            trees.append((name, tree))
            written[tree.sql(dialect=DIALECT)[:60]] = expr.sql(dialect=DIALECT)[:60]
        name = f"__s{next(self.names)}"
        having = select.args.get("having")
        persons = None  # HAVING: a filter on the per-person values, in the query around it
        if having is not None:
            outputs = frozenset(n for n, _ in trees)
            cond = sub.substitute(having.this, env, outputs, "HAVING")
            found = {t.sql(dialect=DIALECT): n for n, t in trees}

            def value(node: exp.Expression) -> exp.Expression:
                if isinstance(node, exp.AggFunc):
                    key = node.sql(dialect=DIALECT)
                    if key not in found:  # an aggregate HAVING alone reads: a hidden value
                        found[key] = f"__having{len(found)}"
                        items.append(exp.alias_(node.copy(), found[key]))
                        trees.append((found[key], node.copy()))
                    return exp.column(found[key], table=name)
                if isinstance(node, exp.Column) and not node.table and node.name in outputs:
                    return exp.column(node.name, table=name)
                return node

            persons = cond.transform(value)
        shaped = exp.Select(expressions=items, group=exp.Group(expressions=[unit.copy()]))
        values = per_unit_values(shaped, rows, lambda k: _unit_of(k, scans) is not None, row_range)
        root = required(_private_read(unit, scans), "the per-person subquery's unit")[0]
        unit_type = required(root.table.unit_column, "a private table's unit").type
        # One row a unit where it fixes every other key; else a row for each distinct
        # key among the unit's at most ``rows`` rows.
        one = fixed_by_unit(scans, [t for f in filters for t in conjuncts(f)], others)
        table = derived_table(
            f"__per_unit{name}",
            Column(unit_name, unit_type),
            values,
            key_columns,
            max_rows=1 if one else rows,
        )
        per = PerUnit(
            scans,
            _and(filters) if filters else None,
            unit,
            tuple(trees),
            rows,
            tuple(v.range for v in values),
            tuple(_in_words(v.basis, written) for v in values),
            tuple((named.get(k.sql(dialect=DIALECT)), k) for k in others),
        )
        self.expansion.add(3 * len(table.columns))
        self.scans.append(Scan(name, table, kind, per_unit=per))
        cols: dict[str, exp.Expression] = {
            c: exp.column(c, table=name) for c in table.columns if not c.startswith("__having")
        }
        return {alias or table.name: cols}, [persons] if persons is not None else []

    def substitute(
        self,
        node: exp.Expression,
        env: Env,
        aliases: frozenset[str],
        place: str,
    ) -> exp.Expression:
        """A copy of ``node`` with each column replaced by what it reads, and each
        ``IN (SELECT …)`` by a semi-join's stand-in."""

        def semi(n: exp.Expression) -> exp.Expression:
            if isinstance(n, exp.In) and n.args.get("query") is not None:
                return self.semi_join(n, env)
            if isinstance(n, exp.Exists):
                return self.exists(n, env)
            return n

        self.expansion.add(nodes(node))
        node = node.transform(semi)  # a copy: the one the swaps below change in place
        for n in node.walk():
            if isinstance(n, exp.Subquery | exp.Exists) or (
                isinstance(n, exp.Select) and n is not node
            ):
                raise Refused(
                    "subqueries in expressions are not supported: a value computed over "
                    "private rows would enter the query exactly (join or filter instead)"
                )

        def charge(definition: exp.Expression) -> None:
            self.expansion.add(self.expansion.size(definition))

        def swap(n: exp.Expression) -> exp.Expression:
            if not isinstance(n, exp.Column) or n.table == SEMI:
                return n
            if isinstance(n.this, exp.Star):
                raise Refused("SELECT * would release rows: select aggregates instead")
            return _lookup(n, env, aliases, place, self.using, charge)

        out = node.transform(swap, copy=False)
        # Counted again, exactly (an estimate would compound along a chain of CTEs):
        # a walk of what was just built and charged, cheaper than building it.
        self.expansion.remember(out, nodes(out))
        return out

    def semi_join(self, node: exp.In, env: Env) -> exp.Expression:
        query = node.args["query"]
        select = query.this if isinstance(query, exp.Subquery) else query
        if not isinstance(select, exp.Select):
            raise Refused("IN (…) takes one SELECT")
        if select.args.get(FROM) is None:
            return _constant_in(node, select)
        grouped = select.args.get("group") is not None
        _row_transformation(select, grouped=grouped)
        if len(select.expressions) != 1 or isinstance(select.expressions[0], exp.Star):
            raise Refused("IN (SELECT …) must select exactly one column")
        sub = _Flattener(self.dataset, self.names, self.expansion)
        ctes = sub.ctes(select, self.top_ctes)
        sub_env, filters = sub.from_clause(select, ctes, "from")
        where = select.args.get("where")
        if where is not None:
            filters.append(sub.substitute(where.this, sub_env, frozenset(), "WHERE"))
        item = select.expressions[0]
        value = sub.substitute(
            item.this if isinstance(item, exp.Alias) else item, sub_env, frozenset(), "IN (…)"
        )
        lhs = self.substitute(node.this, env, frozenset(), "IN (…)")
        having = self._having(select, sub, sub_env, value) if grouped else None
        return self._semi(sub, filters, lhs, value, exists=False, grouped=grouped, having=having)

    def _having(
        self, select: exp.Select, sub: _Flattener, env: Env, value: exp.Expression
    ) -> exp.Expression | None:
        """``IN (SELECT k … GROUP BY k HAVING …)``: grouped by the value it selects, which
        must be the unit or a key within one unit (an order), so that each group is one
        unit's rows; its condition compares aggregates of them with numbers."""
        group = select.args["group"].expressions
        keys = [sub.substitute(k, env, frozenset(), "GROUP BY") for k in group]
        scans = tuple(sub.scans)
        if len(keys) != 1 or keys[0] != value or not _within_one_unit(value, scans):
            raise Refused(
                "IN (SELECT k … GROUP BY k HAVING …) must group by the value it selects, the "
                "privacy unit or a key that names one person's row (an order): each group "
                "is then one person's rows"
            )
        having = select.args.get("having")
        if having is None:
            return None
        cond = sub.substitute(having.this, env, frozenset(), "HAVING")
        for node in cond.walk():
            if isinstance(node, exp.AggFunc) and not isinstance(node, GROUP_AGGREGATES):
                raise Refused(f"{_name(node)} is not allowed in HAVING here: COUNT, SUM, AVG, "
                              "MIN or MAX of the rows, compared with numbers")  # fmt: skip
            if isinstance(node, exp.AggFunc) or _under_aggregate(node):
                continue
            if not isinstance(node, HAVING_NODES):
                raise Refused(
                    f"{_name(node)} is not allowed in HAVING here: compare COUNT, SUM, AVG, "
                    "MIN or MAX of the rows with numbers"
                )
        return cond

    def exists(self, node: exp.Exists, env: Env) -> exp.Expression:
        """``EXISTS (SELECT … WHERE inner = outer AND …)``: the one equality with the
        outer query makes it ``outer IN (SELECT inner … WHERE …)``. Further conditions
        comparing the subquery's row with the query's (TPC-H q21's ``l2.l_suppkey <>
        l1.l_suppkey``) are allowed when one of the equalities keeps both rows one
        person's (``_one_person``): each row's answer then reads its own person's rows
        alone, as a condition on a join on the unit does."""
        select = node.this
        if not isinstance(select, exp.Select):
            raise Refused("EXISTS (…) takes one SELECT")
        _row_transformation(select)
        sub = _Flattener(self.dataset, self.names, self.expansion)
        ctes = sub.ctes(select, self.top_ctes)
        sub_env, filters = sub.from_clause(select, ctes, "from")
        where = select.args.get("where")
        both = {**env, **sub_env}  # the subquery's own names first, as in SQL
        tied: list[tuple[exp.Expression, tuple[exp.Expression, exp.Expression] | None]] = []
        for conj in conjuncts(where.this) if where is not None else []:
            try:
                filters.append(sub.substitute(conj, sub_env, frozenset(), "WHERE"))
                continue
            except AnalysisLimit:
                raise
            except Refused as exc:
                refused = exc
            if conj.find(exp.Exists, exp.Subquery, exp.Select):
                outer = set(env) - set(sub_env)
                if not any(c.table.lower() in outer for c in conj.find_all(exp.Column)):
                    raise refused  # its own subquery's refusal, not a correlation's
                raise Refused("EXISTS (SELECT …): a condition on the query's row may not "
                              "hold a subquery of its own")  # fmt: skip
            pair = _correlation(conj, sub, sub_env, self, env)
            tied.append((sub.substitute(conj, both, frozenset(), "EXISTS"), pair))
        if not tied:
            raise Refused("EXISTS (SELECT …) must be tied to the query by an equality")
        if len(tied) == 1 and tied[0][1] is not None:
            return self._semi(sub, filters, tied[0][1][1], tied[0][1][0], exists=True)
        inner_scans, outer_scans = tuple(sub.scans), tuple(self.scans)
        ties = [
            (c, p[0], p[1])
            for c, p in tied
            if p is not None and _one_person(p[0], inner_scans, p[1], outer_scans)
        ]
        if not ties:
            raise Refused(
                "EXISTS (SELECT …) comparing its rows with the query's row must tie them to "
                "one person by one equality AND the rest: inner.pid = outer.pid, or a key "
                "along a declared link (l2.l_orderkey = l1.l_orderkey)"
            )
        tie, value, lhs = ties[0]
        extra = [c for c, _ in tied if c is not tie]
        same = _units_equal(exp.EQ(this=value, expression=lhs), inner_scans + outer_scans)
        extra += [same] if same is not None else []
        return self._semi(sub, filters, lhs, value, exists=True, correlated=extra)

    def _semi(
        self,
        sub: _Flattener,
        filters: list[exp.Expression],
        lhs: exp.Expression,
        value: exp.Expression,
        exists: bool,
        grouped: bool = False,
        having: exp.Expression | None = None,
        correlated: list[exp.Expression] | None = None,
    ) -> exp.Expression:
        private = [s for s in sub.scans if not s.table.public]
        if private:
            along_links(sub.scans, filters)
            _unit(tuple(sub.scans), filters, self.dataset)
            if not _one_person(value, tuple(sub.scans), lhs, tuple(self.scans)):
                raise Refused(
                    "IN (SELECT …) or EXISTS over a private table must match privacy units "
                    "(t.pid IN (SELECT pid FROM …)): otherwise a unit's rows would depend "
                    "on other units' rows"
                )
        self.semijoins.extend(sub.semijoins)
        name = f"__j{len(self.semijoins)}"
        where = _and(filters) if filters else None
        semi = SemiJoin(name, lhs, tuple(sub.scans), value, where, exists, grouped, having)
        self.semijoins.append(replace(semi, correlated=_and(correlated)) if correlated else semi)
        return exp.column(name, table=SEMI)


def _correlation(
    conj: exp.Expression, sub: _Flattener, sub_env: Env, outer: _Flattener, env: Env
) -> tuple[exp.Expression, exp.Expression] | None:
    """``(inner, outer)`` when ``conj`` equates a subquery column and a query column."""
    if not isinstance(conj, exp.EQ):
        return None
    for a, b in ((conj.this, conj.expression), (conj.expression, conj.this)):
        try:
            inner = sub.substitute(a, sub_env, frozenset(), "EXISTS")
            there = outer.substitute(b, env, frozenset(), "EXISTS")
        except AnalysisLimit:
            raise
        except Refused:
            continue
        return inner, there
    return None


def _lookup(
    node: exp.Column,
    env: Env,
    aliases: frozenset[str],
    place: str,
    using: set[str],
    charge: Callable[[exp.Expression], None],
) -> exp.Expression:
    """What ``node`` reads, copied; ``charge`` is told of each definition before it is
    copied or rendered."""
    name = node.name.lower()
    if not node.table and place == "ORDER BY" and name in aliases:
        return exp.column(name)  # ORDER BY names an output first, as in DuckDB
    if node.table:
        rel = env.get(node.table.lower())
        if rel is None:
            raise Refused(f"unknown table or alias {node.table!r} in {node.sql(dialect=DIALECT)}")
        if name not in rel:
            raise Refused(
                f"unknown column {node.name!r} in {node.table!r}; "
                + _did_you_mean(name, rel)
                + "declared: "
                + ", ".join(sorted(rel))
            )
        charge(rel[name])
        return _wrap(rel[name])
    found = [rel[name] for rel in env.values() if name in rel]
    if not found:
        if name in aliases:
            return exp.column(name)
        visible = {c for rel in env.values() for c in rel}
        raise Refused(
            f"unknown column {node.name!r} in {place}; "
            + _did_you_mean(name, visible)
            + "declared: "
            + ", ".join(sorted(visible))
        )
    if len(found) > 1 and name not in using:
        for f in found[1:]:  # rendered to be compared: as much work as a copy
            charge(f)
        first = found[0].sql(dialect=DIALECT)
        if any(f.sql(dialect=DIALECT) != first for f in found[1:]):
            raise Refused(f"column {node.name!r} is ambiguous: qualify it with its table")
    charge(found[0])
    return _wrap(found[0])


def _did_you_mean(name: str, names: Iterable[str]) -> str:
    """``did you mean 'age'? `` when ``names`` has names close to ``name`` (at most
    three, closest first), else nothing. ``names`` are the public schema's and the
    query's own (its aliases): never a value of the data."""
    close = difflib.get_close_matches(name, sorted(names), n=3, cutoff=0.6)
    if not close:
        return ""
    quoted = [repr(c) for c in close]
    either = quoted[0] if len(quoted) == 1 else ", ".join(quoted[:-1]) + " or " + quoted[-1]
    return f"did you mean {either}? "


def _wrap(definition: exp.Expression) -> exp.Expression:
    copy = definition.copy()
    if isinstance(copy, exp.Column | exp.Literal | exp.Paren | exp.Boolean | exp.Null):
        return copy
    return exp.Paren(this=copy)


def _constant_in(node: exp.In, select: exp.Select) -> exp.In:
    """``x IN (SELECT 1)``, a subquery of one constant and nothing else, as the list it
    is (``x IN (1)``): its value is in the query's text, public. Any other subquery
    without FROM is refused, saying how to write a list."""
    items = select.expressions
    rest = [k for k, v in select.args.items() if k != "expressions" and v]
    constant = len(items) == 1 and not any(
        isinstance(n, exp.Column | exp.Star | exp.AggFunc | exp.Window | exp.Subquery)
        or (isinstance(n, exp.Select) and n is not select)
        for n in items[0].walk()
    )
    if rest or not constant:
        raise Refused(
            "IN (SELECT …) without FROM reads no table: write the values as a list, x IN (1, 2)"
        )
    value = items[0].this if isinstance(items[0], exp.Alias) else items[0]
    return exp.In(this=node.this, expressions=[value.copy()])


# What a grouped semi-join's HAVING may hold beside its aggregates: comparisons of them
# with numbers, joined by AND, OR and NOT.
GROUP_AGGREGATES = (exp.Count, exp.Sum, exp.Avg, exp.Min, exp.Max)
HAVING_NODES = (
    exp.GT, exp.GTE, exp.LT, exp.LTE, exp.EQ, exp.NEQ, exp.And, exp.Or, exp.Not, exp.Paren,
    exp.Literal, exp.Neg,
)  # fmt: skip


def _under_aggregate(node: exp.Expr) -> bool:
    """Whether ``node`` is inside an aggregate's argument (a row expression: checked
    with the row rules, ``check``)."""
    return node.find_ancestor(exp.AggFunc) is not None


def _one_person(
    inner: exp.Expression,
    inner_scans: tuple[Scan, ...],
    outer: exp.Expression,
    outer_scans: tuple[Scan, ...],
) -> bool:
    """Whether ``inner = outer`` puts a subquery's row and the query's row in one unit:
    both read the unit column, or the equality follows a declared key link
    (``link_pair``). Then a semi-join over private rows reads, for each row, only its
    own unit's rows, whatever else the subquery compares them on."""
    units = _unit_of(inner, inner_scans) is not None and _unit_of(outer, outer_scans) is not None
    return units or link_pair(inner, inner_scans, outer, outer_scans) is not None


def _within_one_unit(node: exp.Expression, scans: tuple[Scan, ...]) -> bool:
    """Whether every row holding one value of ``node`` is one unit's: the unit column,
    or the column a table reaches its unit through (rows naming one key name one
    linked row, whose unit each of them holds: ``Table.via``)."""
    if _unit_of(node, scans) is not None:
        return True
    read = _private_read(node, scans)
    return (
        read is not None and read[0].table.via is not None and read[0].table.via.column == read[1]
    )


def _row_transformation(select: exp.Select, grouped: bool = False) -> None:
    """Refuse a subquery in FROM that is more than filters and derived columns (with
    ``grouped``, a semi-join's ``GROUP BY`` and ``HAVING``, judged by ``_having``)."""
    for key, what in (
        ("group", "GROUP BY"), ("having", "HAVING"), ("order", "ORDER BY"), ("limit", "LIMIT"),
        ("offset", "OFFSET"), ("distinct", "DISTINCT"), ("qualify", "QUALIFY"),
        ("windows", "WINDOW"), ("laterals", "LATERAL"), ("pivots", "PIVOT"),
    ):  # fmt: skip
        if grouped and key in ("group", "having"):
            continue
        if select.args.get(key):
            raise Refused(
                f"{what} inside a subquery in FROM depends on exact values of private rows: "
                "a subquery may only filter rows and derive columns"
            )
    for item in select.expressions:
        for n in item.walk():
            if isinstance(n, exp.AggFunc | exp.Window):
                raise Refused(
                    "aggregates inside a subquery in FROM are not supported: a subquery may "
                    "only filter rows and derive columns"
                )


def _join_kind(join: exp.Join) -> str:
    side = (join.side or "").upper()
    kind = (join.kind or "").upper()
    if join.args.get("method") or kind in ("SEMI", "ANTI", "ASOF", "POSITIONAL"):
        raise Refused(f"{(join.args.get('method') or kind).upper()} joins are not supported")
    if side in ("RIGHT", "FULL"):
        raise Refused(f"{side} JOIN is not supported: put the private table first, LEFT JOIN")
    if side == "LEFT":
        return "left"
    if kind not in ("", "INNER", "CROSS", "OUTER"):
        raise Refused(f"{kind} JOIN is not supported")
    return "inner"


def _owner(env: Env, name: str, exclude: Env) -> str:
    owners = [r for r, cols in env.items() if name in cols and r not in exclude]
    if not owners:
        raise Refused(f"USING ({name}): no table on the left has that column")
    return owners[0]


def _guard_all(
    cols: dict[str, exp.Expression], scan: str, expansion: Expansion
) -> dict[str, exp.Expression]:
    """A derived column of a left-joined subquery is NULL where no row matched,
    as in SQL, even when its expression would give a value on NULL columns."""
    present = exp.column(PRESENT, table=scan)
    out: dict[str, exp.Expression] = {}
    for name, e in cols.items():
        if isinstance(e, exp.Column):
            out[name] = e
        else:
            size = expansion.size(e) + 5  # CASE WHEN present (3 nodes) THEN e
            expansion.add(size)
            out[name] = exp.Case(ifs=[exp.If(this=present.copy(), true=e.copy())])
            expansion.remember(out[name], size)
    return out


def _and(conds: list[exp.Expression]) -> exp.Expression:
    if not conds:
        return exp.true()
    both = exp.and_(*conds, copy=False)
    if not isinstance(both, exp.Expression):  # typed by its Condition trait; an AND node
        raise RuntimeError("internal error: AND of the conditions is not an expression")
    return both


def _unit(scans: tuple[Scan, ...], filters: list, dataset: Dataset) -> exp.Column | None:
    """The column that names each row's unit; refuses joins that would mix units."""
    private = [s for s in scans if not s.table.public]
    if not private:
        raise PublicOnly(
            "the query reads only public tables, which this dataset does not serve "
            "plainly: the owner can allow it with public_tables_readable = true"
        )
    if dataset.privacy_unit is None:
        if len(scans) > 1:
            raise Refused(
                "joins need a privacy unit: without one a joined row would belong to "
                "several rows' owners (declare privacy_unit in the policy)"
            )
        return None
    root = private[0]
    if root.kind == "left":
        raise Refused(
            f"table {root.table.name!r} is on the optional side of a LEFT JOIN: put a "
            "private table first"
        )
    parent = {s.name: s.name for s in private}

    def find(x: str) -> str:
        while parent[x] != x:
            x = parent[x]
        return x

    def tie(cond: exp.Expression, only: str | None) -> None:
        for conj in conjuncts(cond):
            if not isinstance(conj, exp.EQ):
                continue
            a, b = _unit_of(conj.this, scans), _unit_of(conj.expression, scans)
            if a and b and (only is None or only in (a, b)):
                parent[find(a)] = find(b)

    for f in filters:
        tie(f, None)
    for s in private:
        if s.kind == "left" and s.on is not None:
            tie(s.on, s.name)
    for s in private[1:]:
        if find(s.name) != find(root.name):
            raise Refused(
                f"joining {root.table.name!r} and {s.table.name!r} must match their privacy "
                f"units ({_person_join(root.table, s.table)}): otherwise a joined row would "
                "mix two units' data"
            )
    return exp.column(required(root.table.unit, "a private table's unit"), table=root.name)


def _in_words(basis: str, written: dict[str, str]) -> str:
    """A per-person value's basis, its aggregate named as the user wrote it."""
    for resolved_text, text in written.items():
        if basis.startswith(resolved_text):
            return text + basis[len(resolved_text) :]
    return basis


def _unit_rows(scans: tuple[Scan, ...], dataset: Dataset) -> int:
    """The most rows one unit keeps in a per-person subquery's join: the load cap, or
    less by the tables' own ``max_rows_per_unit`` (their product), as ``ranks.join_cap``
    decides for a query of its own; ``room_reads`` holds the join to it."""
    cap = dataset.load_cap
    product = 1
    for scan in scans:
        if scan.table.public:
            continue
        if scan.table.max_rows is None:
            return cap
        product *= scan.table.max_rows
    return min(cap, product)


def _person_join(a: Table, b: Table) -> str:
    """How ``a`` and ``b`` join on one person, in the columns a user can write."""
    for x, y in ((a, b), (b, a)):
        if x.via is not None and x.via.table == y.name:
            return f"{x.name}.{x.via.column} = {y.name}.{x.via.key}"
    if a.via is None and b.via is None:
        return f"{a.name}.{a.unit} = {b.name}.{b.unit}"
    return "along the links the policy declares, or on the privacy unit"


def along_links(scans: list[Scan], filters: list[exp.Expression]) -> None:
    """For each join along a declared link (``lineitem.l_orderkey = orders.o_orderkey``,
    or two rows naming the same key of a linked table), add the equality of the two
    rows' units, to ``filters`` or to the left join's condition it is in.

    Why added rather than trusted: the join is then a join on the unit, which is what
    the bounding and the refusal of mixed joins read (``_unit``), whatever the key
    holds. Each row's unit was read along this very key when the data was prepared,
    so on data that keeps the policy's links the equality drops nothing; on data
    that breaks them it can drop rows, and never pair two persons' rows."""
    found = tuple(scans)
    for conj in [c for f in filters for c in conjuncts(f)]:
        equal = _units_equal(conj, found)
        if equal is not None:
            filters.append(equal)
    for i, scan in enumerate(scans):
        if scan.kind == "left" and scan.on is not None:
            extra = [e for c in conjuncts(scan.on) if (e := _units_equal(c, found)) is not None]
            if extra:
                scans[i] = Scan(scan.name, scan.table, scan.kind, _and([scan.on, *extra]))


def _units_equal(conj: exp.Expression, scans: tuple[Scan, ...]) -> exp.Expression | None:
    if not isinstance(conj, exp.EQ):
        return None
    pair = link_pair(conj.this, scans, conj.expression, scans)
    if pair is None:
        return None
    a, b = pair
    return exp.EQ(
        this=exp.column(required(a.table.unit, "a linked table's unit"), table=a.name),
        expression=exp.column(required(b.table.unit, "a linked table's unit"), table=b.name),
    )


def link_pair(
    a: exp.Expression, a_scans: tuple[Scan, ...], b: exp.Expression, b_scans: tuple[Scan, ...]
) -> tuple[Scan, Scan] | None:
    """The scans of ``a`` and ``b`` when ``a = b`` follows a declared key link: one
    side is the column a table reaches its unit through (``Table.via``) and the other
    the key it names, or both sides name the same key of the same linked table. Then
    the two rows belong to one unit: the unit of the one row the key names."""
    ra, rb = _private_read(a, a_scans), _private_read(b, b_scans)
    if ra is None or rb is None:
        return None
    (sa, an), (sb, bn) = ra, rb
    for x, xc, y, yc in ((sa, an, sb, bn), (sb, bn, sa, an)):
        via = x.table.via
        if via is not None and (via.column, via.table, via.key) == (xc, y.table.name, yc):
            return sa, sb
    va, vb = sa.table.via, sb.table.via
    if va is not None and vb is not None and (va.column, vb.column) == (an, bn):
        return (sa, sb) if (va.table, va.key) == (vb.table, vb.key) else None
    return None


def _private_read(node: exp.Expression, scans: tuple[Scan, ...]) -> tuple[Scan, str] | None:
    """The private scan and the column ``node`` reads, if it is a bare column."""
    while isinstance(node, exp.Paren):
        node = node.this
    if not isinstance(node, exp.Column):
        return None
    scan = next((s for s in scans if s.name == node.table), None)
    return None if scan is None or scan.table.public else (scan, node.name)


def _within_unit(node: exp.Expression, scans: tuple[Scan, ...], dataset: Dataset) -> bool:
    """Whether ``node`` is a key whose rows all lie within one unit: a column a declared
    link reads (a line's ``l_orderkey``: its order, and so its person, is one), or the
    unique key of a linked table a link names (``orders.o_orderkey``)."""
    read = _private_read(node, scans)
    if read is None:
        return False
    scan, column = read
    via = scan.table.via
    if via is not None and column == via.column:
        return True
    return any(
        t.via is not None and t.via.table == scan.table.name and t.via.key == column
        for t in dataset.tables.values()
    )


def _key_column(name: str, tree: exp.Expression, scans: tuple[Scan, ...]) -> Column:
    """A per-person subquery's key as the query around it reads it: declared as the
    column it is (its type, bounds and public values), under its output name."""
    read = _private_read(tree, scans)
    column = None if read is None else read[0].table.columns.get(read[1])
    if column is None:
        raise Refused(
            f"{tree.sql(dialect=DIALECT)[:60]}: a per-person subquery's GROUP BY key must be "
            "a column of a private table it reads"
        )
    return replace(column, name=name)


def _unit_of(node: exp.Expression, scans: tuple[Scan, ...]) -> str | None:
    while isinstance(node, exp.Paren):
        node = node.this
    if not isinstance(node, exp.Column):
        return None
    scan = next((s for s in scans if s.name == node.table), None)
    if scan is None or scan.table.public or scan.table.unit != node.name:
        return None
    return scan.name


def _name(node: exp.Expr) -> str:
    if isinstance(node, exp.AnonymousAggFunc):  # a function sqlglot has no node for
        return node.name
    return type(node).__name__.upper()


def _describe(node: exp.Expression | None) -> str:
    if isinstance(node, exp.Table) and isinstance(node.this, exp.Func | exp.Anonymous):
        return f"the table function {node.this.sql(dialect=DIALECT).split('(')[0]}()"
    if isinstance(node, exp.Table) and not isinstance(node.this, exp.Identifier):
        return f"the table function {node.sql(dialect=DIALECT).split('(')[0]}()"
    return "that" if node is None else node.sql(dialect=DIALECT)[:60]
