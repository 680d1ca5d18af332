"""Which private scans of a join are *keyed*: joined by their table's unique key.

``dp/join_bounding.py`` has the rule and its proof: a keyed scan completes each row
of the join once at most, so it does not multiply a unit's joined rows, and keeps
the unit's first ``K`` ranks rather than what the scans before it leave. Without
it, a line joined to its order counted as lines × orders: TPC-H's customers kept 4
of their 60 lines.

A scan ``s`` is keyed when the join holds ``s.key = x.c``, where ``key`` is a column
a declared link names in ``s``'s table (``lineitem.l_orderkey → orders.o_orderkey``:
``o_orderkey``; the gate refuses to start where such a column repeats) and ``x``
another private scan of the same join, and the equality filters: a ``WHERE``
conjunct (inner joins' conditions are among them), or a conjunct of ``s``'s own
``LEFT JOIN`` condition. An equality in another scan's ``LEFT JOIN`` condition does
not key ``s``: ``s``'s rows without a match are kept there, one NULL row each. And
every keyed scan must reach an unkeyed one through its partners, so that the unkeyed
scans' rows determine each joined row: of two scans keyed only to each other
(``o1.o_orderkey = o2.o_orderkey``), the first is left unkeyed.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlglot import exp

from dpmagic.gate.policy import Dataset
from dpmagic.gate.sql.resolve import Scan
from dpmagic.gate.sql.trees import conjuncts, unparen


def keyed_rooms(
    scans: Sequence[Scan], terms: Sequence[exp.Expression], dataset: Dataset, cap: int
) -> list[int | None]:
    """Each private scan's room where it is keyed (None where it is not): ``cap``, or
    fewer where its table declares fewer rows a unit (``max_rows_per_unit``: a table of
    one row per person reads one), so the rank filter holds the declaration in the
    query. What a join the engine orders otherwise can hold is priced from these
    (``sql/work.py``)."""
    flags = keyed(scans, terms, dataset)
    return [
        min(cap, s.table.max_rows or cap) if flag else None
        for s, flag in zip(scans, flags, strict=True)
    ]


def unique_keys(dataset: Dataset) -> dict[str, frozenset[str]]:
    """Each table's columns that declared links name: unique, checked at start."""
    keys: dict[str, set[str]] = {}
    for table in dataset.tables.values():
        if table.via is not None:
            keys.setdefault(table.via.table, set()).add(table.via.key)
    return {name: frozenset(columns) for name, columns in keys.items()}


def keyed(scans: Sequence[Scan], terms: Sequence[exp.Expression], dataset: Dataset) -> list[bool]:
    """For each of ``scans`` (the private scans of one join, in order), whether it is
    keyed, reading the join's filters ``terms`` and the scans' own conditions."""
    names = {s.name: s for s in scans}
    keys = unique_keys(dataset)
    partners: dict[str, set[str]] = {s.name: set() for s in scans}

    def note(conj: exp.Expression, only: str | None) -> None:
        if not isinstance(conj, exp.EQ):
            return
        sides = (unparen(conj.this), unparen(conj.expression))
        for a, b in (sides, sides[::-1]):
            if not (isinstance(a, exp.Column) and isinstance(b, exp.Column)):
                continue
            if a.table not in names or b.table not in names or a.table == b.table:
                continue
            scan = names[a.table]
            if only not in (None, scan.name):
                continue
            if a.name.lower() in keys.get(scan.table.name, frozenset()):
                partners[scan.name].add(b.table)

    for term in terms:
        for conj in conjuncts(term):
            note(conj, None)
    for scan in scans:
        if scan.kind == "left" and scan.on is not None:
            for conj in conjuncts(scan.on):
                note(conj, scan.name)
    flags = {s.name: False for s in scans}
    waiting = [s.name for s in scans if partners[s.name]]
    anchored = {s.name for s in scans if not partners[s.name]}
    while waiting:
        ready = [n for n in waiting if partners[n] & anchored]
        if not ready:  # a circle of keyed scans: its first is left unkeyed
            anchored.add(waiting.pop(0))
            continue
        for name in ready:
            flags[name] = True
            anchored.add(name)
            waiting.remove(name)
    return [flags[s.name] for s in scans]
