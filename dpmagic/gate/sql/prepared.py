"""The prepared copy of a dataset: made once, kept and reused across restarts.

At load the declared tables are copied into a DuckDB file in the gate's state
directory, readable by the gate's user only: each column cast to its declared
type and clamped into its bounds, each private table ranked and counted per
unit (``contribution.prepare_tables``). Copying 10M rows takes
seconds, so the file is kept and reused by later starts as long as nothing it
was made from has changed: its name carries a fingerprint of the sources
(path, size, modification time and inode of each file or folder entry) and of
every policy fact the preparation reads (tables, columns, types, bounds,
``max_length``, the unit, the contribution bounds), and of this module's
format. Change any of them and the next start prepares a new file and deletes
the old ones.

The same identities, split, are the dataset's versions (``versions``): opaque ids
that the replay keys carry (``engine``), so that an answer is replayed only over
the data and the policy facts it was computed from. They are computed at start
from file metadata and the declarations, never from a value.

Reusing a file keeps the secret seed its ranks were drawn with. The bound on
each unit's rows holds for every fixed seed (``contribution``), so a seed
kept across restarts costs nothing; what changes each start is only the seed
of the per-query bounding after joins (``engine``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path

import duckdb

from dpmagic.gate.policy import Dataset
from dpmagic.gate.sql.contribution import prepare_tables

log = logging.getLogger("dpmagic.gate")

# Part of every fingerprint: a change to how tables are prepared must not reuse files
# prepared the old way.
FORMAT = "2"
SUFFIX = ".duckdb"


def prepared_file(dataset: Dataset, state_dir: Path) -> Path:
    """The dataset's prepared file: reused when its fingerprint matches, else made anew."""
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(state_dir, 0o700)
    target = state_dir / f"{dataset.name}.{fingerprint(dataset)[:24]}{SUFFIX}"
    if target.exists():
        log.info("dataset %s: reusing its prepared tables", dataset.name)
        return target
    log.info("dataset %s: preparing its tables", dataset.name)
    _prepare(dataset, target)
    # Older copies of the private data (other fingerprints, or the unversioned name of
    # earlier releases) are deleted, with their write-ahead logs.
    mine = re.compile(rf"{re.escape(dataset.name)}(\.[0-9a-f]{{24}})?{SUFFIX}(\.wal)?")
    for stale in state_dir.iterdir():
        if mine.fullmatch(stale.name) and stale != target:
            stale.unlink(missing_ok=True)
    return target


def fingerprint(dataset: Dataset) -> str:
    """A hash of everything the prepared file is made from (see the module's docstring)."""
    identity = {
        "format": FORMAT,
        "privacy_unit": dataset.privacy_unit,
        "max_partitions": dataset.max_partitions,
        "max_rows_per_partition": dataset.max_rows_per_partition,
        "tables": {
            t.name: {
                "public": t.public,
                "unit": t.unit,
                "links": t.links,
                "columns": {c.name: c.as_dict() for c in t.columns.values()},
            }
            for t in dataset.tables.values()
        },
        **_sources(dataset),
    }
    return _hash(identity)


# A dataset's settings that no answer depends on: what it may spend, and what is
# refused before any data is read. Every other setting, including any added later,
# is part of the policy's version (``versions``), so a change to it is never missed.
NOT_ANSWER_FACTS = frozenset(
    {
        "tables", "sources", "database", "catalog",  # versioned on their own
        "user_budget", "notebook_budget", "query_default", "max_unit_work",
        "max_resource_failures",
    }
)  # fmt: skip


@dataclass(frozen=True)
class Versions:
    """Opaque ids of what a dataset's answers are computed from, read at start.

    ``data``: the sources' identity (each file's path, size, modification time and
    inode, and the preparation's format; the caller may add more, as Spark's catalog
    tables), so it changes whenever the prepared data is made from changed files.
    ``settings``: the dataset's settings answers depend on (the privacy unit, the
    contribution bounds, the neighbouring relation, the accountant …: every one but
    ``NOT_ANSWER_FACTS``). ``tables``: each table's whole declaration (columns,
    types, bounds, public values, its unit, links and per-unit rows), ``shapes``:
    the same without its columns. Hashes only: no value of the data is in them."""

    data: str
    settings: str
    tables: dict[str, str] = field(default_factory=dict)
    shapes: dict[str, str] = field(default_factory=dict)

    def policy(self, read: set[str] | frozenset[str]) -> str:
        """The version of the policy facts a query reading the tables ``read`` depends
        on: the settings, those tables' declarations and every other table's shape
        (a private table's unit and per-unit rows shape what the preparation counts
        for all of them)."""
        facts = {
            "settings": self.settings,
            "tables": {t: self.tables[t] if t in read else self.shapes[t] for t in self.tables},
        }
        return _hash(facts)


def versions(dataset: Dataset, more: object = None) -> Versions:
    """``dataset``'s versions (``Versions``), from its declaration as the policy gives
    it (before the public facts read at start); ``more`` joins the data's identity."""
    settings = {k: v for k, v in asdict(dataset).items() if k not in NOT_ANSWER_FACTS}
    tables = {name: asdict(t) for name, t in dataset.tables.items()}
    return Versions(
        data=_hash({"format": FORMAT, **_sources(dataset), "more": more}),
        settings=_hash(settings),
        tables={name: _hash(t) for name, t in tables.items()},
        shapes={
            name: _hash({k: v for k, v in t.items() if k != "columns"})
            for name, t in tables.items()
        },
    )


def _sources(dataset: Dataset) -> dict[str, object]:
    return {
        "database": None if dataset.database is None else _stat(dataset.database),
        "sources": {t: _stat(p) for t, p in sorted(dataset.sources.items())},
    }


def _hash(identity: object) -> str:
    text = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _stat(path: Path) -> list[object]:
    """What identifies a source's contents without reading them: for a folder (a
    Parquet dataset), each of its files."""
    path = path.resolve()
    files = sorted(p for p in path.rglob("*") if p.is_file()) if path.is_dir() else [path]
    out: list[object] = []
    for f in files:
        st = f.stat()
        out.append([str(f), st.st_size, st.st_mtime_ns, st.st_ino])
    return out


def _prepare(dataset: Dataset, target: Path) -> None:
    """Write the prepared tables to ``target`` through a temporary file, so that a start
    interrupted halfway never leaves a file a later start would reuse."""
    partial = target.with_suffix(".loading")
    for p in (partial, partial.with_suffix(".loading.wal")):
        p.unlink(missing_ok=True)
    old = os.umask(0o077)
    try:
        con = duckdb.connect(str(partial))
        try:
            if dataset.database is not None:
                con.execute("ATTACH ? AS __owner (READ_ONLY)", [str(dataset.database)])
                present = {
                    name.lower()
                    for (name,) in con.execute(
                        "SELECT table_name FROM duckdb_tables() WHERE database_name = '__owner'"
                    ).fetchall()
                }
                relations = {t: f'__owner."{t}"' for t in dataset.tables if t in present}
            else:
                relations = {t: _reader(p) for t, p in dataset.sources.items()}
            prepare_tables(con, dataset, relations)
            con.execute("CHECKPOINT")
        finally:
            con.close()
    finally:
        os.umask(old)
    os.chmod(partial, 0o600)
    os.replace(partial, target)


def _reader(source: Path) -> str:
    if source.is_dir():
        return f"read_parquet({_string(str(source / '**' / '*.parquet'))})"
    reader = "read_parquet" if source.suffix.lower() == ".parquet" else "read_csv_auto"
    return f"{reader}({_string(str(source))})"


def _string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
