"""``dpmagic init``: a policy from the schema of data files or a DuckDB database,
and from the owner's answers about its tables.

The columns come from the *schema* only, and only where the source declares
one: bounds and public key lists are facts the data owner must declare from
knowledge of the domain: copying the observed minimum, maximum or distinct
values into a public file would itself leak the data. So would a type guessed
from the values: a CSV declares no types, and DuckDB's sniffer would make
``age`` a float for one person's ``41.5``, in a policy every user reads. A
Parquet file's or a DuckDB table's declared types are used; a CSV's columns
are written ``str`` (which any CSV text is) with a placeholder asking the owner
for the type. The skeleton leaves all of these as commented placeholders to
fill in, each marked ``TODO(dpmagic init)``; ``dpmagic serve`` refuses a policy
that still has one (:func:`unfilled` names them), so a skeleton is never served
by mistake.

Two facts per table decide most of a query's noise, and ``init`` asks for them
(:func:`plan`): which column holds the person (the privacy unit's column, or a
``links`` entry to another table's, offered from the foreign keys a DuckDB
database declares: schema, not data; a key may name a row of a table that itself
reaches the person, ``lineitem → orders → customer``, and the gate reads each row's
person along it), and how many rows one person may have
there (``max_rows_per_unit``: 1 makes a grouped count's error at ε = 1 ±3
instead of the ±48 of the dataset's 4 × 4 bounds). For the second, ``init``
counts the rows per unit in the data and shows the owner the distribution at
the prompt: the owner's own data, seen by its owner. It suggests a bound (the
99th percentile, rounded up to a coarse step so it says little), but a number
from the data goes into the public policy only with the owner's yes: a prompt
answered, a ``--rows-per-unit`` flag, or ``--yes``. Without a terminal and
without ``--yes`` nothing is asked and nothing counted goes in.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import duckdb

from dpmagic.commands.init_data import (
    DB,
    Data,
    ForeignKey,
    InitError,
    ReadFailed,
    Table,
    ident,
    sql_string,
)
from dpmagic.commands.init_keys import with_found_keys
from dpmagic.gate.engine import count_error_of
from dpmagic.gate.policy import (
    CATALOG_PREFIX,
    DEFAULT_QUANTUM_MS,
    PolicyError,
    SparkConfig,
    parse_policy,
)

# DuckDB type names (without precision) -> the policy's column types.
_TYPES: dict[str, str] = {
    **dict.fromkeys(
        (
            "TINYINT", "SMALLINT", "INTEGER", "BIGINT", "HUGEINT",
            "UTINYINT", "USMALLINT", "UINTEGER", "UBIGINT", "UHUGEINT",
        ),
        "int",
    ),
    **dict.fromkeys(("FLOAT", "DOUBLE", "DECIMAL"), "float"),
    "BOOLEAN": "bool",
    "DATE": "date",
    "VARCHAR": "str",
}  # fmt: skip
_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")
PLACEHOLDER = "TODO(dpmagic init)"
_COLUMNS_HEADER = re.compile(r"^\s*\[datasets\.(?:[^.\]]+|\"[^\"]*\")\.tables\.(.+)\.columns\]")
# The skeleton's contribution bounds where a table declares no max_rows_per_unit.
_GROUPS, _ROWS = 4, 4
# A DuckDB database file: its header holds this magic at this offset.
_DUCKDB_MAGIC, _DUCKDB_MAGIC_AT = b"DUCK", 8
# The share of units a suggested max_rows_per_unit keeps all the rows of.
SUGGEST_QUANTILE = 0.99


def is_database(path: Path) -> bool:
    """Whether ``path`` is a DuckDB database file, by its header (whatever its name)."""
    try:
        with path.open("rb") as fh:
            head = fh.read(_DUCKDB_MAGIC_AT + len(_DUCKDB_MAGIC))
    except OSError:
        return False
    return head[_DUCKDB_MAGIC_AT:] == _DUCKDB_MAGIC


def read_data(files: list[Path]) -> Data:
    """The tables of ``files``: one per CSV or Parquet file, or every table of one
    DuckDB database (which is a dataset of its own: ``database = …``)."""
    for path in files:
        if not path.is_file():
            raise InitError(f"{path}: no such file")
    databases = [p for p in files if is_database(p)]
    if databases and len(files) > 1:
        raise InitError(
            f"{databases[0]} is a DuckDB database, a dataset of its own: give it alone "
            "(a policy's dataset reads one database or files, not both)"
        )
    if databases:
        return with_found_keys(_read_database(databases[0]))
    data = Data(tables={})
    for path in files:
        name = _table_name(path)
        if name in data.tables:
            raise InitError(f"two files would both become table {name!r}: rename one")
        data.tables[name] = Table(name, describe(path), _reader(path), origin=path.name)
        data.sources[name] = path
    return with_found_keys(data)


def describe(path: Path) -> list[tuple[str, str | None]]:
    """(column, DuckDB type) for a CSV or Parquet file, from its schema only: a
    Parquet file's declared types; a CSV declares none, so its types are None (the
    names are read as the gate's load reads them, the types it sniffs are dropped)."""
    declared = path.suffix.lower() == ".parquet"
    con = duckdb.connect()
    try:
        rows = con.execute(f"DESCRIBE SELECT * FROM {_reader(path)}").fetchall()
    except duckdb.Error as exc:
        raise InitError(f"{path}: cannot read its schema: {str(exc).splitlines()[0]}") from None
    finally:
        con.close()
    return [(str(name), str(dtype) if declared else None) for name, dtype, *_ in rows]


def _reader(path: Path) -> str:
    """The SQL that reads a data file, as the gate's load reads it."""
    reader = "read_parquet" if path.suffix.lower() == ".parquet" else "read_csv_auto"
    return f"{reader}({sql_string(str(path))})"


def _read_database(path: Path) -> Data:
    """The main schema's tables of a DuckDB file (as the gate reads them), their
    declared types and foreign keys. Opened read-only: init changes nothing in it."""
    try:
        con = duckdb.connect(str(path), read_only=True)
    except duckdb.Error as exc:
        raise InitError(f"{path}: cannot open it: {str(exc).splitlines()[0]}") from None
    try:
        names = [
            str(n)
            for (n,) in con.execute(
                "SELECT table_name FROM duckdb_tables() WHERE database_name = current_database()"
                " AND schema_name = 'main' ORDER BY table_name"
            ).fetchall()
        ]
        keys = con.execute(
            "SELECT table_name, constraint_column_names, referenced_table, "
            "referenced_column_names FROM duckdb_constraints() WHERE constraint_type = "
            "'FOREIGN KEY' AND database_name = current_database() AND schema_name = 'main' "
            "ORDER BY table_name, constraint_index"
        ).fetchall()
        data = Data(tables={}, database=path)
        for name in names:
            if name.lower() in data.tables:
                raise InitError(f"{path}: tables {name!r} and another differ only in case")
            columns = con.execute(f"DESCRIBE {ident(name)}").fetchall()
            data.tables[name.lower()] = Table(
                name.lower(),
                [(str(c), str(t)) for c, t, *_ in columns],
                f"{DB}.{ident(name)}",
                origin=name.lower(),
            )
    except duckdb.Error as exc:
        raise InitError(f"{path}: cannot read its schema: {str(exc).splitlines()[0]}") from None
    finally:
        con.close()
    if not data.tables:
        raise InitError(f"{path}: the database has no tables")
    for table, cols, target, target_cols in keys:
        fk = ForeignKey(
            str(table).lower(),
            tuple(str(c) for c in cols),
            str(target).lower(),
            tuple(str(c) for c in target_cols),
        )
        if fk.table in data.tables:
            data.tables[fk.table].foreign_keys.append(fk)
    return data


# --- What the owner says ---------------------------------------------------------------


@dataclass
class Answers:
    """What the owner said on the command line, before any question: each table's
    unit column or link, its rows per unit, the tables left out, and ``yes``
    (take each default without asking)."""

    units: dict[str, str] = field(default_factory=dict)  # table -> its unit column
    links: dict[str, tuple[str, str]] = field(default_factory=dict)  # table -> (col, "t.c")
    rows: dict[str, int | None] = field(default_factory=dict)  # table -> bound (None: none)
    skip: set[str] = field(default_factory=set)
    yes: bool = False
    row_level: bool = False


def parse_answers(
    units: Iterable[str] = (),
    links: Iterable[str] = (),
    rows: Iterable[str] = (),
    skip: Iterable[str] = (),
    *,
    yes: bool = False,
    row_level: bool = False,
) -> Answers:
    """The flags' texts (``--unit T.C``, ``--link T.C=U.D``, ``--rows-per-unit T=N``,
    ``--skip T``) as :class:`Answers`; a malformed one is an :class:`InitError`
    showing the form it must have."""
    out = Answers(yes=yes, row_level=row_level, skip={t.strip().lower() for t in skip})
    for text in units:
        table, _, column = text.partition(".")
        if not table or not column:
            raise InitError(f"--unit {text}: must be TABLE.COLUMN, e.g. --unit visits.patient")
        out.units[table.lower()] = column
    for text in links:
        source, _, target = text.partition("=")
        table, _, column = source.strip().partition(".")
        if not table or not column or target.strip().count(".") != 1:
            raise InitError(
                f"--link {text}: must be TABLE.COLUMN=TABLE.COLUMN, "
                "e.g. --link visits.patient_id=patients.id"
            )
        out.links[table.lower()] = (column, target.strip().lower())
    for text in rows:
        table, _, value = text.partition("=")
        try:
            if not table:
                raise ValueError(text)
            out.rows[table.lower()] = _bound(value)
        except ValueError:
            raise InitError(
                f"--rows-per-unit {text}: must be TABLE=N (a whole number ≥ 1) or "
                "TABLE=none, e.g. --rows-per-unit patients=1"
            ) from None
    return out


def _bound(text: str) -> int | None:
    """A rows-per-unit answer: a whole number ≥ 1, or None for ``none`` (ValueError if
    neither)."""
    text = text.strip().lower()
    if text in ("none", "no", "n"):
        return None
    if text.isdigit() and int(text) >= 1:
        return int(text)
    raise ValueError(text)


class Prompter(Protocol):
    """Where ``init``'s questions go: ``say`` explains, ``ask`` reads one answer
    (raising EOFError when there are no more)."""

    def say(self, text: str) -> None: ...

    def ask(self, question: str) -> str: ...


class Terminal:
    """The owner at a terminal: questions on stdout, answers from stdin."""

    def say(self, text: str) -> None:
        print(text)

    def ask(self, question: str) -> str:
        return input(question)


def terminal() -> Terminal | None:
    """A :class:`Terminal` when stdin is one (someone is there to answer), else None."""
    try:
        return Terminal() if sys.stdin is not None and sys.stdin.isatty() else None
    except (AttributeError, ValueError):
        return None


# --- The decisions ---------------------------------------------------------------------


@dataclass
class Choice:
    """What the policy says of one private table: the column holding the unit, the
    table and column it links that column to (if any), its rows per unit, and why
    (a comment in the policy and a line of ``init``'s report)."""

    unit: str | None
    link: str | None = None
    link_note: str = ""
    # The link names a key of a table that reaches the person (not its person column):
    # ``unit`` is then the column that names the key, and the gate reads the person
    # along it.
    key: bool = False
    max_rows: int | None = None
    rows_note: str = ""
    asked_rows: bool = False  # the owner decided the bound (a flag, a prompt, --yes)


@dataclass
class Plan:
    """Everything the policy will say that is not in the data's schema."""

    data: Data
    privacy_unit: str | None
    row_level: bool
    choices: dict[str, Choice] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)  # table -> why
    stats: dict[str, UnitCounts] = field(default_factory=dict)

    def undecided(self) -> list[str]:
        """The tables whose rows per unit nobody decided (no terminal, no --yes)."""
        return [t for t, c in self.choices.items() if not c.asked_rows and c.max_rows is None]


@dataclass(frozen=True)
class UnitCounts:
    """How many rows each unit has in a table: the owner's own statistics, shown at
    the prompt, never written to the policy (only a bound the owner accepts is)."""

    units: int
    most: int
    median: int
    high: int  # the SUGGEST_QUANTILE quantile

    def suggestion(self) -> int:
        """The bound offered: the high quantile rounded up to 1, 2, 3, 4, 5, 6 or 8
        times a power of ten, so the public number says little of the exact counts."""
        return nice_ceiling(self.high)


def nice_ceiling(value: int) -> int:
    """The least of 1, 2, 3, 4, 5, 6, 8, 10, 20, 30, … that is at least ``value``."""
    power = 1
    while True:
        for step in (1, 2, 3, 4, 5, 6, 8):
            if step * power >= value:
                return step * power
        power *= 10


def plan(
    data: Data,
    privacy_unit: str | None,
    answers: Answers | None = None,
    prompter: Prompter | None = None,
) -> Plan:
    """Settle each table's unit column, link and rows per unit: from the flags
    (``answers``), then the data's declared schema, then the owner at ``prompter``
    (None: nobody to ask; ``answers.yes``: take each default without asking)."""
    answers = answers or Answers()
    ask = None if answers.yes else prompter
    if privacy_unit is None and not answers.row_level and ask is not None:
        privacy_unit = _ask_privacy_unit(data, ask)
        answers.row_level = privacy_unit is None
    result = Plan(data, privacy_unit, answers.row_level)
    _check_flags(data, answers, privacy_unit)
    if privacy_unit is None:
        if not answers.row_level:
            table = next(iter(data.tables.values()))
            raise InitError(
                f"name the column that identifies a person with --privacy-unit "
                f"({table.origin} has {table.names()}), or pass --row-level if each row "
                "is a person"
            )
        result.choices = {t: Choice(unit=None) for t in data.tables}
        return result
    _settle_units(result, answers, ask)
    return result


def _ask_privacy_unit(data: Data, ask: Prompter) -> str | None:
    """The privacy unit's column name, asked (None: each row is a person). Offered: the
    column the declared foreign keys reference in a table that references none (the
    root of the keys, where a person is listed), else the one name every table has."""
    roots = {
        fk.target_columns[0]
        for t in data.tables.values()
        for fk in t.foreign_keys
        if len(fk.target_columns) == 1
        and fk.target in data.tables
        and not data.tables[fk.target].foreign_keys
    }
    shared = set.intersection(*({c.lower() for c, _ in t.columns} for t in data.tables.values()))
    default = next(iter(roots)) if len(roots) == 1 else None
    if not roots and len(shared) == 1:
        default = next(iter(shared))
    ask.say("Which column names a person (the privacy unit, whose contribution is bounded)?")
    for t in data.tables.values():
        ask.say(f"  {t.name}: {t.names()}")
    ask.say("  Answer a column name, or rows if each row is a person (no unit).")
    everyone = {c.lower() for t in data.tables.values() for c, _ in t.columns}
    while True:
        shown = f"[{default}] " if default else ""
        answer = _read(ask, f"privacy unit? {shown}", "the privacy unit").strip() or default
        if answer and answer.lower() == "rows":
            return None
        if answer and answer.lower() in everyone:
            return answer
        ask.say(f"  {answer or 'an answer'!r}: name one of the columns above, or rows")


def _check_flags(data: Data, answers: Answers, privacy_unit: str | None) -> None:
    """Each flag names a table and columns the data has, and needs a privacy unit."""
    named = [
        *(("--unit", t) for t in answers.units),
        *(("--link", t) for t in answers.links),
        *(("--rows-per-unit", t) for t in answers.rows),
        *(("--skip", t) for t in answers.skip),
    ]
    for flag, table in named:
        if table not in data.tables:
            raise InitError(f"{flag} {table}: no such table (there are {', '.join(data.tables)})")
        if privacy_unit is None and flag != "--skip":
            raise InitError(f"{flag} needs --privacy-unit: units, links and bounds are a unit's")
    for table, column in answers.units.items():
        if data.tables[table].column(column) is None:
            raise InitError(
                f"--unit {table}.{column}: {table} has no column {column!r} "
                f"(it has {data.tables[table].names()})"
            )
    for table, (column, target) in answers.links.items():
        if data.tables[table].column(column) is None:
            raise InitError(
                f"--link {table}.{column}: {table} has no column {column!r} "
                f"(it has {data.tables[table].names()})"
            )
        other, _, other_column = target.partition(".")
        if other not in data.tables or data.tables[other].column(other_column) is None:
            raise InitError(f"--link {table}.{column}={target}: no such table and column")


def _settle_units(result: Plan, answers: Answers, ask: Prompter | None) -> None:
    """Each table's unit column and rows per unit, in rounds: a table whose foreign keys
    (or ``--link``) reach tables not yet settled waits for them, so the keys it is
    offered are those that can be links; in each round the tables holding a column
    named for the unit go first, as the tables others link to."""
    data, unit = result.data, result.privacy_unit
    assert unit is not None
    waiting = [t for t in data.tables if t not in answers.skip]
    for t in answers.skip:
        result.skipped[t] = "--skip"
    for t, (_, target) in answers.links.items():
        if t not in answers.skip:
            _adopt(result, target)

    def targets(t: str) -> set[str]:
        flagged = answers.links[t][1].split(".")[0] if t in answers.links else t
        return {fk.target for fk in data.tables[t].foreign_keys} | {flagged}

    while waiting:
        ready = [t for t in waiting if not (targets(t) - {t}) & set(waiting)] or waiting[:1]
        # (a cycle of keys: the first settles, its links wait no more)
        ready.sort(key=lambda t: data.tables[t].column(unit) is None)
        for name in ready:
            waiting.remove(name)
            if name not in result.choices:  # a link to it may have settled it already
                _settle_unit(result, data.tables[name], answers, ask)
            if name in result.choices:  # then its rows, while the owner has it in mind
                _settle_rows(result, name, result.choices[name], answers, ask)


def _adopt(result: Plan, target: str) -> None:
    """A link the owner states to a table not settled yet (no name or key decided it)
    settles that table: the column linked to is where its person is."""
    other, _, column = target.partition(".")
    table = result.data.tables.get(other)
    if table is None or other in result.choices or other in result.skipped:
        return
    if table.foreign_keys:  # it reaches the person through its keys: settled by them
        return
    held = table.column(column)
    named = table.column(result.privacy_unit or "")
    if held is not None and named in (None, held):
        result.choices[other] = Choice(held)


def _settle_unit(result: Plan, table: Table, answers: Answers, ask: Prompter | None) -> None:
    """One table's unit column: a flag's, else by name and declared key, else asked."""
    unit = result.privacy_unit
    assert unit is not None
    name = table.name
    if name in answers.links:
        column, target = answers.links[name]
        _adopt(result, target)
        why = _link_problem(result, target)
        if why:
            raise InitError(f"--link {name}.{column}={target}: {why}")
        result.choices[name] = Choice(
            table.column(column), target, "from --link", key=_names_a_key(result, target)
        )
        return
    if name in answers.units:
        result.choices[name] = Choice(table.column(answers.units[name]))
        return
    usable, unusable = _keys(result, table)
    by_name = table.column(unit)
    # A key the data shows is written without a question only with the owner's --yes.
    trusted = [fk for fk in usable if answers.yes or not fk.found]
    same = [fk for fk in trusted if fk.columns[0].lower() == (by_name or "").lower()]
    if by_name and (same or not trusted):
        # The column named for the unit holds it; a declared key from it is its link.
        fk = same[0] if same else None
        result.choices[name] = Choice(
            by_name,
            f"{fk.target}.{fk.target_columns[0]}" if fk else None,
            fk.note if fk else "",
        )
        return
    default = None
    if not by_name and len(usable) == 1:
        default = f"{usable[0].columns[0]}={usable[0].target}.{usable[0].target_columns[0]}"
    if ask is None and default is not None and (answers.yes or not usable[0].found):
        # The database declares it (schema, not data), or the owner said yes to what
        # the data shows.
        fk = usable[0]
        target = f"{fk.target}.{fk.target_columns[0]}"
        result.choices[name] = Choice(
            fk.columns[0], target, fk.note, key=_names_a_key(result, target)
        )
        return
    if ask is None:
        raise InitError(_unit_error(result, table, by_name, usable, unusable))
    lines = _unit_question(result, table, by_name, usable, unusable)
    for line in lines:
        ask.say(line)
    while True:
        answer = _read(ask, f"{name}: which column holds the person? " + (
            f"[{default}] " if default else ""), name)  # fmt: skip
        answer = answer.strip() or (default or "")
        problem = (
            _take_unit_answer(result, table, answer)
            if answer
            else "an answer is needed: COLUMN, COLUMN=TABLE.COLUMN or skip"
        )
        if problem is None:
            return
        ask.say(f"  {problem}")


def _unit_error(
    result: Plan,
    table: Table,
    by_name: str | None,
    usable: list[ForeignKey],
    unusable: list[tuple[ForeignKey, str]],
) -> str:
    """Why a table's unit column is not settled without a question, and the flags
    that settle it, on one line."""
    name, unit = table.name, result.privacy_unit
    links = [f"--link {fk.table}.{fk.columns[0]}={fk.target}.{fk.target_columns[0]}"
             for fk in usable]  # fmt: skip
    if by_name:
        found = (
            f"{table.origin}: has a column {by_name!r}, the privacy unit's name, and declares "
            f"{'foreign keys' if len(usable) > 1 else 'a foreign key'} to a person's table "
            f"({', '.join(str(fk) for fk in usable)}): say which holds the person: "
            f"--unit {name}.{by_name} or {' or '.join(links)}"
        )
    elif len(usable) == 1 and usable[0].found:
        found = (
            f"{table.origin}: has no privacy unit column {unit!r}; the data shows a key to a "
            f"person's table ({usable[0]}): write it with {links[0]}, or take it with --yes"
        )
    else:
        found = f"{table.origin}: has no privacy unit column {unit!r} (it has {table.names()})" + (
            f" and several foreign keys to a person's table: say which: {' or '.join(links)}"
            if links
            else f"; say which column holds the person: --unit {name}.COLUMN, or "
            f"--link {name}.COLUMN=TABLE.COLUMN"
        )
    if unusable:
        found += "; " + "; ".join(f"its foreign key {fk} cannot be a link: {why}"
                                  for fk, why in unusable)  # fmt: skip
    return f"{found}; or leave it out with --skip {name}"


def _keys(result: Plan, table: Table) -> tuple[list[ForeignKey], list[tuple[ForeignKey, str]]]:
    """The table's declared foreign keys that ``links`` can say today (one column, to
    the unit column of a table settled already), and the others with why not."""
    usable, unusable = [], []
    for fk in table.foreign_keys:
        why = (
            "a link is one column; this key has several"
            if len(fk.columns) != 1
            else _link_problem(result, f"{fk.target}.{fk.target_columns[0]}")
        )
        if not why:
            usable.append(fk)
        elif not fk.found:  # a key the data shows to a table of no person: not one to offer
            unusable.append((fk, why))
    return usable, unusable


def _link_problem(result: Plan, target: str) -> str | None:
    """Why a link to ``target`` ("table.column") cannot be written, or None: it names
    another table's person column, or a key (unique in the data) of a table settled
    already, through which the gate reads each row's person."""
    other, _, column = target.partition(".")
    if other in result.skipped:
        return f"{other} is left out of the policy"
    choice = result.choices.get(other)
    table = result.data.tables.get(other)
    if table is None:
        return f"no table {other!r}"
    if choice is None:
        return f"{other}'s own unit column is not settled yet (keys between them go in a circle)"
    if table.column(column) is None:
        return f"{other} has no column {column!r}"
    if _names_a_key(result, target) and not _unique(result.data, table, column):
        return (
            f"{target} is neither the person's column of {other} ({choice.unit}) nor a key: "
            "some of its values name several rows"
        )
    return None


def _names_a_key(result: Plan, target: str) -> bool:
    """Whether a link to ``target`` names a key of a settled table rather than its
    person's column (a chain: the gate reads the person along the key)."""
    other, _, column = target.partition(".")
    choice = result.choices.get(other)
    return choice is not None and (
        choice.key or choice.unit is None or choice.unit.lower() != column.lower()
    )


def _unique(data: Data, table: Table, column: str) -> bool:
    """Whether no value of ``column`` repeats in the data (the owner's own, read to
    check a link; no value goes anywhere)."""
    try:
        return data.unique(table, column)
    except ReadFailed as exc:
        raise InitError(f"{table.origin}: cannot read its column {column}: {exc}") from None


def person_of(result: Plan, name: str) -> tuple[str, str]:
    """SQL that reads table ``name`` with a column naming each row's person, and that
    column: the table and its unit column, or along its chain of key links the rows
    whose key names a row of the linked table, with that row's person (as the gate
    prepares them)."""
    table, choice = result.data.tables[name], result.choices[name]
    assert choice.unit is not None
    if not choice.key or choice.link is None:
        return table.relation, choice.unit
    other, _, key = choice.link.partition(".")
    relation, person = person_of(result, other)
    return (
        f"(SELECT __t.*, __k.__person FROM {table.relation} AS __t JOIN (SELECT "
        f"{ident(key)} AS __key, {ident(person)} AS __person FROM {relation}) AS __k "
        f"ON __t.{ident(choice.unit)} = __k.__key)",
        "__person",
    )


def _unit_question(
    result: Plan,
    table: Table,
    by_name: str | None,
    usable: list[ForeignKey],
    unusable: list[tuple[ForeignKey, str]],
) -> list[str]:
    """What the owner reads before saying which column of ``table`` holds the person."""
    unit = result.privacy_unit
    if by_name:
        lines = [
            "",
            f"{table.name} has a column {by_name!r}, the privacy unit's name, and declares "
            f"a foreign key from another column to a person: which one holds the person?",
            f"  {by_name}: named for the unit (answer {by_name})",
        ]
    else:
        lines = ["", f"{table.name} has no column {unit!r} (it has {table.names()})."]
    for fk in usable:
        lines.append(f"  {fk.note}: a link the policy can say")
    for fk, why in unusable:
        lines.append(f"  {fk.note}: cannot be a link yet: {why}")
    lines.append(
        "  Answer COLUMN (this table's column naming the person), COLUMN=TABLE.COLUMN "
        "(a link to another table's unit column), or skip (leave the table out)."
    )
    return lines


def _take_unit_answer(result: Plan, table: Table, answer: str) -> str | None:
    """Record an answer to the unit question; a problem with it is returned to say."""
    if answer.lower() == "skip":
        result.skipped[table.name] = "the owner's answer at init's question"
        return None
    source, _, target = answer.partition("=")
    column = table.column(source.strip())
    if column is None:
        return (
            f"{source.strip()!r} is not a column of {table.name} (it has {table.names()}); "
            "answer COLUMN, COLUMN=TABLE.COLUMN or skip"
        )
    if not target:
        result.choices[table.name] = Choice(column)
        return None
    target = target.strip().lower()
    if target.count(".") != 1:
        return f"{target!r} must be TABLE.COLUMN"
    _adopt(result, target)
    why = _link_problem(result, target)
    if why:
        return why
    declared = next(
        (
            fk
            for fk in table.foreign_keys
            if len(fk.columns) == 1
            and fk.columns[0].lower() == column.lower()
            and f"{fk.target}.{fk.target_columns[0]}".lower() == target
        ),
        None,
    )
    note = declared.note if declared else "the owner's answer"
    result.choices[table.name] = Choice(column, target, note, key=_names_a_key(result, target))
    return None


def _settle_rows(
    result: Plan, name: str, choice: Choice, answers: Answers, ask: Prompter | None
) -> None:
    """A table's ``max_rows_per_unit``: a flag's, ``--row-level``'s 1, else offered
    from the data's rows per unit (asked, or taken under --yes), else left out."""
    if name in answers.rows:
        choice.max_rows, choice.asked_rows, choice.rows_note = (
            answers.rows[name],
            True,
            "--rows-per-unit",
        )
        return
    if answers.row_level:
        choice.max_rows, choice.asked_rows, choice.rows_note = 1, True, "--row-level"
        return
    if ask is None and not answers.yes:
        return  # nobody to ask: no number from the data goes in unasked
    assert choice.unit is not None
    relation, person = person_of(result, name)
    stats = result.stats[name] = unit_counts(
        result.data, result.data.tables[name], person, relation
    )
    default = None if stats.units == 0 else stats.suggestion()
    choice.asked_rows = True
    if ask is None:  # --yes: the default, which the owner accepted in advance
        choice.max_rows, choice.rows_note = default, "--yes"
        return
    for line in _rows_question(result, name, choice.unit, stats):
        ask.say(line)
    shown = "none" if default is None else str(default)
    while True:
        answer = _read(ask, f"{name}: most rows one person may have here? [{shown}] ", name)
        if answer.strip().lower() in ("", "y", "yes"):
            choice.max_rows, choice.rows_note = default, "answered"
            return
        try:
            choice.max_rows, choice.rows_note = _bound(answer), "answered"
            return
        except ValueError:
            pass
        ask.say(f"  {answer.strip()!r}: answer a whole number ≥ 1, or none (or Enter: {shown})")


def unit_counts(data: Data, table: Table, column: str, relation: str | None = None) -> UnitCounts:
    """How many rows each unit has in ``table`` (units named in ``column`` of
    ``relation``, the table itself unless its person is read along a chain:
    ``person_of``; rows with none count for nobody): counted by DuckDB over the data,
    for the owner's eyes."""
    try:
        row = data.row(
            # The ordered-set form, which Spark reads too (sqlglot renders it there as
            # ``percentile_approx``, a value of the data within 1/10,000 of the rank).
            f"SELECT count(*), max(n), percentile_disc(0.5) WITHIN GROUP (ORDER BY n), "
            f"percentile_disc({SUGGEST_QUANTILE}) WITHIN GROUP (ORDER BY n) "
            f"FROM (SELECT count(*) AS n FROM {relation or table.relation} "
            f"WHERE {ident(column)} IS NOT NULL GROUP BY {ident(column)})"
        )
    except ReadFailed as exc:
        raise InitError(f"{table.origin}: cannot count its rows per {column}: {exc}") from None
    assert row is not None
    units, most, median, high = row
    return UnitCounts(int(units), int(most or 0), int(median or 0), int(high or 0))


def _rows_question(result: Plan, name: str, column: str, stats: UnitCounts) -> list[str]:
    """What the owner reads before bounding a table's rows per unit: the data's own
    counts (theirs to see; they go nowhere else) and what each choice costs."""
    unset = count_error_of(_GROUPS * _ROWS)
    if stats.units == 0:
        counts = f"{name} has no rows with a {column}: nothing to suggest from."
    elif stats.most == 1:
        counts = (
            f"{name}: each {column} has one row in the data ({stats.units:,} of them): "
            f"one row per person?"
        )
    else:
        counts = (
            f"{name}: rows per {column} in the data ({stats.units:,} of them): median "
            f"{stats.median}, {SUGGEST_QUANTILE:.0%} have at most {stats.high}, the most "
            f"{stats.most}."
        )
    return [
        "",
        counts,
        f"  max_rows_per_unit bounds each person's rows here; rows beyond it are left out. "
        f"A grouped count's 95% error at ε = 1 is ±{count_error_of(1)} at 1, "
        + (
            f"±{count_error_of(stats.suggestion())} at {stats.suggestion()}, "
            if stats.units and stats.suggestion() > 1
            else ""
        )
        + f"±{unset} with none (the dataset's {_GROUPS} × {_ROWS} bounds).",
        "  The number is public (users read the policy): answer what you know of the "
        "domain, a whole number, or none.",
    ]


def _read(ask: Prompter, question: str, table: str) -> str:
    """One answer; the end of stdin before it is an error, not a default taken."""
    try:
        return ask.ask(question)
    except EOFError:
        raise InitError(
            f"stdin ended before init's question about {table} was answered: answer it, "
            "or pass --yes to take each default, or the flags (--link, --unit, "
            "--rows-per-unit, --skip)"
        ) from None


# --- The policy's text -----------------------------------------------------------------


def skeleton(result: Plan, dataset: str, out: Path) -> str:
    """The TOML text of the policy ``result`` settles, written to live at ``out``. With
    ``--row-level`` and no privacy unit the dataset has none (each row is its own) and
    bounds of 1 × 1."""
    data, privacy_unit = result.data, result.privacy_unit
    base = out.resolve().parent
    if data.database is not None:
        where = f"database = {_string(os.path.relpath(data.database.resolve(), base))}"
    elif data.spark is not None:
        where = "\n".join([
            'engine = "spark"',
            f"spark = {{ {_spark_line(data.spark)} }}",
            "sources = { " + ", ".join(
                f"{_key(t)} = {_string(CATALOG_PREFIX + full)}"
                for t, full in data.catalog.items()
                if t in result.choices
            ) + " }",
        ])  # fmt: skip
    else:
        sources = ", ".join(
            f"{_key(t)} = {_string(os.path.relpath(p.resolve(), base))}"
            for t, p in data.sources.items()
            if t in result.choices
        )
        where = f"sources = {{ {sources} }}"
    kept = [data.tables[t] for t in result.choices]
    all_one = bool(result.choices) and all(c.max_rows == 1 for c in result.choices.values())
    lines = [
        "# Policy skeleton written by `dpmagic init` from the data's schema and the",
        "# owner's answers about its tables.",
        f"# Before serving it, settle every {PLACEHOLDER} below: declare public bounds",
        "# for the numeric columns you will aggregate and public_values for the columns",
        "# you will GROUP BY, from what you know of the domain, never from the data,",
        "# or delete the comment to leave the column without. `dpmagic serve` refuses",
        "# this file while one is left. Then review the budgets.",
        *(
            [
                "# A CSV file declares no column types, and a type guessed from its values",
                "# would publish them (one person's fraction makes a column of whole numbers",
                '# float): its columns are written "str", each with a TODO asking for its',
                "# type. Their names come from the file's first line: check that it is a",
                "# header, not a person's row.",
            ]
            if any(dtype is None for t in kept for _, dtype in t.columns)
            else []
        ),
        "",
        "[gate]",
        'state_dir = "state"          # ledger and audit log, next to this file',
        'accountant = "pure"',
        f"response_quantum_ms = {DEFAULT_QUANTUM_MS:g}  # replies leave on these ticks (0 = off)",
        "",
        f"[datasets.{_key(dataset)}]",
        where,
        *_unit_lines(privacy_unit, result.row_level or all_one),
        "user_budget = { epsilon = 10.0 }",
        "notebook_budget = { epsilon = 3.0 }",
        "query_default = { epsilon = 0.1 }",
        "# What all users together may spend: the number you can promise the data's",
        "# subjects (per-user budgets alone protect nothing against users who pool",
        "# their answers). With many users, set it, and share releases:",
        '# dataset_budget = { epsilon = 30.0, renew = "month" }',
        '# share_releases = "everyone"',
    ]
    for skipped, why in result.skipped.items():
        lines += ["", f"# Table {skipped} is left out ({why}): no query can read it."]
    for table in kept:
        choice = result.choices[table.name]
        lines += _table_lines(result, dataset, table, choice)
        lines += ["", f"[datasets.{_key(dataset)}.tables.{_key(table.name)}.columns]"]
        unit_column = choice.unit or privacy_unit or ""
        lines += [_column(name, dtype, unit_column) for name, dtype in table.columns]
    text = "\n".join(lines) + "\n"
    # The skeleton must load as it is, so the owner starts from a valid file.
    parse_policy(tomllib.loads(text), out.resolve())
    return text


def _table_lines(result: Plan, dataset: str, table: Table, choice: Choice) -> list[str]:
    """A table's own keys: its unit column when the name alone would not find it, its
    link, and its rows per unit, each commented with where it came from and, for the
    bound, what a count then costs. None of the data's counts go in."""
    if result.privacy_unit is None or choice.unit is None:
        return []
    keys = []
    named = table.column(result.privacy_unit)
    if (
        not choice.key
        and choice.unit.lower() != result.privacy_unit.lower()
        and (choice.link is None or named is not None)
    ):
        keys.append(f"unit = {_string(choice.unit)}   # this table's column naming the person")
    if choice.link is not None:
        keys.append(
            f"links = {{ {_key(choice.unit)} = {_string(choice.link)} }}  # {choice.link_note}"
        )
    if choice.max_rows is not None:
        what = "each row is one person" if choice.max_rows == 1 else "rows one person may have"
        keys.append(
            f"max_rows_per_unit = {choice.max_rows}   # {what}: a grouped count's 95% error "
            f"at ε = 1 is ±{count_error_of(choice.max_rows)}"
        )
    else:
        keys.append(
            f"# max_rows_per_unit = ?   rows one person may have here (1 where each row is "
            f"a person: a grouped count's 95% error at ε = 1 of ±{count_error_of(1)}, not "
            f"±{count_error_of(_GROUPS * _ROWS)})"
        )
    return ["", f"[datasets.{_key(dataset)}.tables.{_key(table.name)}]", *keys]


def write_skeleton(
    files: list[Path],
    privacy_unit: str | None,
    out: Path,
    *,
    dataset: str | None = None,
    force: bool = False,
    row_level: bool = False,
    answers: Answers | None = None,
    prompter: Prompter | None = None,
) -> Path:
    """Read ``files``, settle the plan (asking ``prompter``, if any) and write the
    policy to ``out``; refuses to replace a file unless ``force``."""
    answers = answers or Answers(row_level=row_level)
    answers.row_level = answers.row_level or row_level
    check_output(out, force)
    data = read_data(files)
    write_plan(plan(data, privacy_unit, answers, prompter), out, dataset=dataset, force=force)
    return out


def check_output(out: Path, force: bool) -> None:
    """Refuse before any question is asked, not after they are all answered."""
    if out.exists() and not force:
        raise InitError(f"{out} exists; pass --force to replace it")


def write_plan(result: Plan, out: Path, *, dataset: str | None = None, force: bool = False) -> Path:
    """Write the policy ``result`` settles to ``out`` (mode 0600, the gate's file); an
    existing file is replaced only with ``force``."""
    if not result.choices:
        raise InitError("every table is left out: a policy needs one")
    name = dataset or dataset_name(result.data)
    try:
        text = skeleton(result, name, out)
    except PolicyError as exc:
        raise InitError(str(exc)) from None
    # The policy is the gate's file: readable by its owner only (SECURITY.md, Deployment rules).
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if force else os.O_EXCL)
    try:
        fd = os.open(out, flags, 0o600)
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
    except FileExistsError:
        raise InitError(f"{out} exists; pass --force to replace it") from None
    except OSError as exc:
        raise InitError(f"{out}: {exc.strerror}") from None
    return out


def report(result: Plan) -> list[str]:
    """One line per table for the owner: its unit column and link, its bound and who
    decided it; then what nobody decided, and how to."""
    lines = []
    for name, choice in result.choices.items():
        if choice.unit is None:
            continue
        link = f", linked to {choice.link} ({choice.link_note})" if choice.link else ""
        person = choice.unit
        if choice.key:
            person, link = f"read along {choice.unit} → {choice.link} ({choice.link_note})", ""
        bound = (
            f"max_rows_per_unit = {choice.max_rows} ({choice.rows_note})"
            if choice.max_rows is not None
            else "no max_rows_per_unit" + (f" ({choice.rows_note})" if choice.rows_note else "")
        )
        lines.append(f"  {name}: the person is {person}{link}; {bound}")
    for name, why in result.skipped.items():
        lines.append(f"  {name}: left out ({why})")
    undecided = result.undecided()
    if undecided:
        lines.append(
            "asked nothing (stdin is not a terminal), so no max_rows_per_unit from the "
            f"data for {', '.join(undecided)}: pass --rows-per-unit TABLE=N (1 where each "
            "row is a person), or --yes to take init's suggestions from the data"
        )
    return lines


def _unit_lines(privacy_unit: str | None, row_level: bool) -> list[str]:
    """The dataset's unit and contribution bounds, each bound with what it costs: a
    count's 95% error at ε = 1 (``engine.count_error_of``)."""
    if privacy_unit is None:
        return [
            "# No privacy unit: each row is one person (--row-level), one row in one group.",
            'neighbouring = "add_remove"',
            "max_partitions = 1",
            "max_rows_per_partition = 1",
        ]
    groups, rows = (1, 1) if row_level else (_GROUPS, _ROWS)
    return [
        f"privacy_unit = {_string(privacy_unit)}",
        'neighbouring = "add_remove"',
        f"max_partitions = {groups}           # groups one unit may touch: a grouped count's "
        f"95% error at ε = 1 is ±{count_error_of(groups * rows)}",
        f"max_rows_per_partition = {rows}   # rows one unit may add to each group: a count's "
        f"95% error at ε = 1 is ±{count_error_of(rows)}",
    ]


def _spark_line(config: SparkConfig) -> str:
    """The ``spark`` table's keys: the master or Connect URL init read the catalog
    through, where the gate keeps its prepared tables, and the session's settings."""
    where = (
        f"remote = {_string(config.remote)}"
        if config.remote is not None
        else f"master = {_string(config.master or '')}"
    )
    if config.prepared is not None:
        where += f", prepared = {_string(config.prepared)}"
    if not config.conf:
        return where
    conf = ", ".join(f"{_string(k)} = {_string(v)}" for k, v in config.conf)
    return f"{where}, conf = {{ {conf} }}"


def _column(name: str, dtype: str | None, privacy_unit: str) -> str:
    if dtype is None:  # a CSV's column: the owner chooses its type
        decl = f"{_key(name)} = {{ type = {_string('str')} }}  # {PLACEHOLDER}: type = ?"
        if name.lower() == privacy_unit.lower():
            return f"{decl}  (int, float, str, bool or date)"
        return (
            f"{decl}, then lower = ?, upper = ? or public_values = [...]  (type: int, float, "
            "str, bool or date; public bounds to SUM/AVG it, public_values to GROUP BY it)"
        )
    base_type = dtype.split("(")[0].upper()
    ctype = _TYPES.get(base_type)
    if ctype is None:
        return f"# {_key(name)}: {dtype} has no policy type yet; left undeclared (not queryable)"
    decl = f"{_key(name)} = {{ type = {_string(ctype)} }}"
    if name.lower() == privacy_unit.lower():
        return decl
    if ctype in ("int", "float"):
        return f"{decl}  # {PLACEHOLDER}: lower = ?, upper = ?  (public bounds, to SUM/AVG it" + (
            "; or public_values = [...] to GROUP BY it)" if ctype == "int" else ")"
        )
    if ctype == "str":
        return f"{decl}  # {PLACEHOLDER}: public_values = [...]  (to GROUP BY it)"
    return decl


def unfilled(policy_text: str) -> list[str]:
    """``table.column (what)`` for each placeholder still in a policy's text.

    Placeholders are comments, invisible to TOML, so the text is read line by
    line, each under the last ``[...columns]`` header seen. A line that is all
    comment (the file's own instructions, a column commented out) has none.
    """
    return [f"{column} ({', '.join(names)})" for column, names in _placeholders(policy_text)]


def untyped(policy_text: str) -> list[str]:
    """``table.column`` for each column whose placeholder asks for its type (a CSV's)."""
    return [column for column, names in _placeholders(policy_text) if "type" in names]


def _placeholders(policy_text: str) -> list[tuple[str, list[str]]]:
    """(``table.column``, the keys it asks for) for each placeholder, in order."""
    table = "?"
    found = []
    for line in policy_text.splitlines():
        header = _COLUMNS_HEADER.match(line)
        if header:
            table = header.group(1).strip('"')
        elif PLACEHOLDER in line and not line.lstrip().startswith("#"):
            column = line.split("=", 1)[0].strip().strip('"')
            what = line.split(PLACEHOLDER, 1)[1].lstrip(": ").split("  ")[0]
            found.append((f"{table}.{column}", re.findall(r"(\w+) = ", what) or [what]))
    return found


def dataset_name(data: Data | list[Path]) -> str:
    """Named for the data, never for the policy file (``policy.toml`` would
    make it "policy"): the database's or one file's name, or the folder the
    files share."""
    if isinstance(data, Data) and data.catalog:  # the catalog's schema the tables share
        schemas = {full.rsplit(".", 1)[0] for full in data.catalog.values() if "." in full}
        name = schemas.pop().rsplit(".", 1)[-1] if len(schemas) == 1 else "data"
        return re.sub(r"[^a-z0-9_]+", "_", name.lower()).strip("_") or "data"
    if isinstance(data, Data):
        files = [data.database] if data.database is not None else list(data.sources.values())
    else:
        files = data
    folders = {p.resolve().parent for p in files}
    name = _table_name(files[0]) if len(files) == 1 or len(folders) > 1 else folders.pop().name
    return re.sub(r"[^a-z0-9_]+", "_", name.lower()).strip("_") or "data"


def _table_name(path: Path) -> str:
    return path.name.split(".")[0].lower()


def _key(name: str) -> str:
    return name if _BARE_KEY.match(name) else _string(name)


def _string(value: str) -> str:
    # A JSON string with ASCII escapes is a valid TOML basic string.
    return json.dumps(value)
