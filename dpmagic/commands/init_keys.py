"""Foreign keys found in the data, for sources that declare none (CSV and Parquet
files, a Spark catalog's tables: Spark's session catalog has no constraints).

``init`` offers a link from one table to another's key only as a fact the owner can
check: a column whose name says it names a row of another table (``o_custkey`` and
``c_custkey``, ``customer_id`` and ``customer.id``, one name in both), where that
table's column is unique in the data, the column itself is not (one row per key in
both is two lists of the same things, not a way to a person), and every value of the
column is one of its values. The data is the owner's own, read by the owner's
command; what it finds goes into the policy only with their yes (a prompt answered,
or ``--yes``), like the rows per unit ``init`` suggests. The gate checks a link's key
again when it prepares the data (a key that repeats stops it), so a link found here
that stops holding later is refused then, never served.
"""

from __future__ import annotations

from dpmagic.commands.init_data import Data, ForeignKey, InitError, ReadFailed, Table, ident

# Declared types a key can have (DuckDB's names, as ``init`` reads every source's).
_KEY_TYPES = ("TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT", "UTINYINT",
              "USMALLINT", "UINTEGER", "UBIGINT", "VARCHAR")  # fmt: skip


def with_found_keys(data: Data) -> Data:
    """``data`` with the links its tables' data shows, where it declares none."""
    try:
        found_keys(data)
    except ReadFailed as exc:
        raise InitError(f"cannot read the data to find its keys: {exc}") from None
    return data


def found_keys(data: Data) -> list[ForeignKey]:
    """The links the data shows between its tables, each added to its table's
    ``foreign_keys`` (marked ``found``); only where no table declares one."""
    if any(t.foreign_keys for t in data.tables.values()):
        return []
    out: list[ForeignKey] = []
    seen: dict[tuple[str, str], bool] = {}  # each column read for uniqueness once

    def unique(table: Table, column: str) -> bool:
        if (table.name, column) not in seen:
            seen[(table.name, column)] = data.unique(table, column)
        return seen[(table.name, column)]

    for table in data.tables.values():
        for column, ctype in table.columns:
            if not _key_type(ctype):
                continue
            targets = _named_targets(data, table, column)
            # A unique column is a table's own key: another table of one row per the
            # same key lists the same things, and no row reaches a person through it.
            if not targets or unique(table, column):
                continue
            for target, key in targets:
                if unique(target, key) and _included(data, table, column, target, key):
                    fk = ForeignKey(table.name, (column,), target.name, (key,), found=True)
                    table.foreign_keys.append(fk)
                    out.append(fk)
    return out


def _key_type(ctype: str | None) -> bool:
    """Whether a column of this declared type can be a key (a CSV's, undeclared, may)."""
    return ctype is None or ctype.split("(")[0].upper() in _KEY_TYPES


def _named_targets(data: Data, table: Table, column: str) -> list[tuple[Table, str]]:
    """The other tables' columns that ``column``'s name says it names: the same name;
    the same name after each one's prefix (``o_custkey``, ``c_custkey``); or the other
    table's name, singular or not, and its column (``customer_id``, ``customers.id``)."""
    name = column.lower()
    found = []
    for other in data.tables.values():
        if other.name == table.name:
            continue
        for key, ktype in other.columns:
            if not _key_type(ktype):
                continue
            k = key.lower()
            singular = other.name.lower().removesuffix("s")
            if (
                k == name
                or (_suffix(k) is not None and _suffix(k) == _suffix(name))
                or name in (f"{other.name.lower()}_{k}", f"{singular}_{k}")
            ):
                found.append((other, key))
    return found


def _suffix(name: str) -> str | None:
    """The name after its first ``_``, where it has a short prefix there (TPC-H's
    ``c_``, ``o_``, ``l_``, ``ps_``); None otherwise."""
    head, sep, tail = name.partition("_")
    return tail if sep and 0 < len(head) <= 3 and tail else None


def _included(data: Data, table: Table, column: str, target: Table, key: str) -> bool:
    """Whether every value of ``column`` (NULLs aside) is one of ``key``'s, and it has one."""
    c, k = ident(column), ident(key)
    row = data.row(
        f"SELECT count(__a.{c}), count(__a.{c}) FILTER (WHERE __b.{k} IS NULL) "
        f"FROM {table.relation} AS __a LEFT JOIN {target.relation} AS __b "
        f"ON CAST(__a.{c} AS VARCHAR) = CAST(__b.{k} AS VARCHAR)"
    )
    return bool(row and row[0] and row[1] == 0)
