"""The prepared copy of a dataset: made once, kept and reused across restarts.

At load the declared tables are copied into a DuckDB file in the gate's state
directory, readable by the gate's user only: each column cast to its declared
type and clamped into its bounds, each private table ranked and counted per
unit (``ranking.prepare_tables``). Copying 10M rows takes
seconds, so the file is kept and reused by later starts as long as nothing it
was made from has changed: its name carries a fingerprint of the sources
(path, size, modification time and inode of each file or folder entry) and of
every policy fact the preparation reads (tables, columns, types, bounds,
``max_length``, the unit, the contribution bounds), and of this module's
format. Change any of them and the next start prepares a new file and deletes
the old ones.

The fingerprint, and the dataset's versions the replay keys carry, are
``engines/versions.py``'s, shared with Spark; the file's name joins this engine's
``LAYOUT`` to the fingerprint.

The preparation holds to the policy's ``memory_limit`` and ``threads``, as the
queries do: beyond the limit DuckDB spills its sorts to a folder the preparation
makes for itself in the state directory (readable by the gate's user only) and
removes when done. Without it, the ranking of 10M rows held 1.1 GB at the first
start whatever the owner had set; with ``memory_limit = "256MB"``, 490 MB and a
start 1.8× as long (``docs/speed.md``).

Reusing a file keeps the secret seed its ranks were drawn with. The bound on
each unit's rows holds for every fixed seed (``sql/ranks.py``), so a seed
kept across restarts costs nothing; what changes each start is only the seed
of the per-query bounding after joins (``engine``).
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import duckdb

from dpmagic.gate.engines.ranking import prepare_tables
from dpmagic.gate.engines.versions import fingerprint
from dpmagic.gate.policy import Dataset, GateConfig

# A DuckDB setting's value, as ``duckdb.connect``'s ``config`` takes it.
Setting = str | bool | int | float | list[str]

log = logging.getLogger("dpmagic.gate")

SUFFIX = ".duckdb"
# How this engine lays the prepared rows out (1: each private table in rank order,
# ``ranking.prepare_tables``), in the file's name but not in the data's version: a copy
# of another layout is prepared anew at the next start, and the answers released
# over the old one, computed from the same data, are still replayed.
LAYOUT = "1"


def prepared_file(dataset: Dataset, gate: GateConfig) -> Path:
    """The dataset's prepared file in the gate's state directory: reused when its
    fingerprint matches, else made anew within the gate's memory limit."""
    state_dir = gate.state_dir
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(state_dir, 0o700)
    name = hashlib.sha256(f"{fingerprint(dataset)}:{LAYOUT}".encode()).hexdigest()
    target = state_dir / f"{dataset.name}.{name[:24]}{SUFFIX}"
    # One preparation at a time: the gate's workers start together
    # (``service/workers.py``), and the first prepares while the others wait, then reuse.
    with _preparing(state_dir):
        if target.exists():
            log.info("dataset %s: reusing its prepared tables", dataset.name)
            return target
        log.info("dataset %s: preparing its tables", dataset.name)
        _prepare(dataset, target, gate)
        # Older copies of the private data (other fingerprints, or the unversioned name
        # of earlier releases) are deleted, with their write-ahead logs.
        mine = re.compile(rf"{re.escape(dataset.name)}(\.[0-9a-f]{{24}})?{SUFFIX}(\.wal)?")
        for stale in state_dir.iterdir():
            if mine.fullmatch(stale.name) and stale != target:
                stale.unlink(missing_ok=True)
    return target


@contextmanager
def _preparing(state_dir: Path) -> Iterator[None]:
    """Hold a lock on the state directory itself (a ``flock``, dropped by the kernel if
    the process dies; no file of its own is left) across the check for a prepared file
    and its making."""
    fd = os.open(state_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _prepare(dataset: Dataset, target: Path, gate: GateConfig) -> None:
    """Write the prepared tables to ``target`` through a temporary file, so that a start
    interrupted halfway never leaves a file a later start would reuse; DuckDB spills
    past ``gate.memory_limit`` into a folder of its own, removed after."""
    partial = target.with_suffix(".loading")
    for p in (partial, partial.with_suffix(".loading.wal")):
        p.unlink(missing_ok=True)
    old = os.umask(0o077)
    spill = Path(tempfile.mkdtemp(prefix=f"{dataset.name}.spill.", dir=target.parent))
    try:
        config: dict[str, Setting] = {
            "memory_limit": gate.memory_limit,
            "threads": gate.threads,
            "temp_directory": str(spill),
        }
        con = duckdb.connect(str(partial), config=config)
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
        shutil.rmtree(spill, ignore_errors=True)
    os.chmod(partial, 0o600)
    os.replace(partial, target)


def _reader(source: Path) -> str:
    if source.is_dir():
        return f"read_parquet({_string(str(source / '**' / '*.parquet'))})"
    reader = "read_parquet" if source.suffix.lower() == ".parquet" else "read_csv_auto"
    return f"{reader}({_string(str(source))})"


def _string(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"
