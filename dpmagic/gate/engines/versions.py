"""A dataset's identity and versions: what its prepared tables and its answers are made from.

The prepared copy (DuckDB's file, Spark's Parquet folders) is named by a
fingerprint of its sources (path, size, modification time and inode of each file
or folder entry), of every policy fact the preparation reads and of the
preparation's format: change any and the next start prepares anew. The same
identities, split, are the dataset's versions (``versions``): opaque ids that the
replay keys carry (``engine.py``), so that an answer is replayed only over the data
and the policy facts it was computed from. They come from file metadata and the
declarations, never from a value. Both engines share this module.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from dpmagic.gate.policy import Dataset

# The preparation's format, in every fingerprint and data version: bumped when the
# prepared tables' layout changes, so that an older copy is never reused.
FORMAT = "2"


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
        "max_row_work", "max_text_length", "max_resource_failures",
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
