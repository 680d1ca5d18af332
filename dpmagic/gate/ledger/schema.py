"""The ledger's file: created private, opened in WAL mode, its tables and indexes made
or brought up to this version, and the one kind of transaction every write uses.

Why here, apart from what the ledger decides (``store.py``): how the file is made and
opened, and which commits wait for the disk, are the same for every row it holds.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from dpmagic.gate.ledger.scopes import FAILED, RESET

# Long enough that a burst of debits from many processes queues rather than
# fails; each transaction holds the lock for well under a millisecond.
BUSY_TIMEOUT_S = 30.0
# 2: the replay_keys table; 3: scopes and charged groups; 4: refusals; 5: a replay row
# may carry a charge (``serve_shared``), and releases are found by their key alone.
SCHEMA_VERSION = 5

_ENTRIES = """CREATE TABLE IF NOT EXISTS entries (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    time TEXT NOT NULL,
    user TEXT NOT NULL,
    dataset TEXT NOT NULL,
    notebook TEXT NOT NULL,
    epsilon REAL NOT NULL,
    delta REAL NOT NULL,
    rho REAL NOT NULL,
    sql TEXT NOT NULL,
    replay_key TEXT,
    status TEXT NOT NULL,
    reply TEXT,
    scope TEXT NOT NULL DEFAULT '',
    source INTEGER,
    reason TEXT
)"""
# Columns added since the first release, to a ledger of an earlier one where missing:
# an admin row's scope (``scopes.Scope.row_columns``; empty: a user's or a
# notebook's, as every earlier admin row is), the release a shared replay served, and
# why a refused query was refused.
_ADDED_COLUMNS = {
    "scope": "ALTER TABLE entries ADD COLUMN scope TEXT NOT NULL DEFAULT ''",
    "source": "ALTER TABLE entries ADD COLUMN source INTEGER",
    "reason": "ALTER TABLE entries ADD COLUMN reason TEXT",
}
_SCHEMA = (
    "CREATE INDEX IF NOT EXISTS entries_scope ON entries (user, dataset, notebook)",
    "CREATE INDEX IF NOT EXISTS entries_replay ON entries (user, dataset, replay_key)",
    # Each query reads only the rows appended since its scope was last read (``_tally``).
    "CREATE INDEX IF NOT EXISTS entries_appended ON entries (user, dataset, id)",
    # What each replay key is made of (``ReplayKey``), for ``fresh_because``.
    """CREATE TABLE IF NOT EXISTS replay_keys (
    replay_key TEXT PRIMARY KEY,
    query_key TEXT NOT NULL,
    data TEXT NOT NULL,
    policy TEXT NOT NULL
)""",
    "CREATE INDEX IF NOT EXISTS replay_keys_query ON replay_keys (query_key)",
    # The groups a charge's user was in when it was charged (``scopes.py``).
    """CREATE TABLE IF NOT EXISTS charged_groups (
    entry_id INTEGER NOT NULL,
    dataset TEXT NOT NULL,
    grp TEXT NOT NULL
)""",
    "CREATE INDEX IF NOT EXISTS charged_groups_group ON charged_groups (dataset, grp, entry_id)",
    "CREATE INDEX IF NOT EXISTS charged_groups_entry ON charged_groups (entry_id)",
    "CREATE INDEX IF NOT EXISTS entries_dataset ON entries (dataset, id)",
    # A key's releases and the replays that served them, for every user (``serve_shared``).
    "CREATE INDEX IF NOT EXISTS entries_key ON entries (dataset, replay_key, status)",
    # ``recent_failures``, asked before every query, reads these two small indexes
    # instead of every row its user ever wrote on the dataset (0.76 ms after 1,000).
    f"CREATE INDEX IF NOT EXISTS entries_failed ON entries (user, dataset, time)"
    f" WHERE status = '{FAILED}'",
    f"CREATE INDEX IF NOT EXISTS entries_user_resets ON entries (user, dataset, time)"
    f" WHERE status = '{RESET}' AND scope = ''",
)

# The statuses are written out, so that SQLite may read the partial indexes above,
# and the later of the window's start and the last reset bounds one range of the index,
# so the rows read are the failures counted, never those before a reset.
RECENT_FAILURES = (
    f"SELECT COUNT(*) FROM entries WHERE user = ? AND dataset = ? AND status = '{FAILED}'"
    " AND time > MAX(?, COALESCE((SELECT MAX(time) FROM entries WHERE user = ?"
    f" AND dataset = ? AND status = '{RESET}' AND scope = ''), ''))"
)


def open_ledger(path: Path) -> tuple[sqlite3.Connection, bool]:
    """The ledger at ``path`` opened (created 0600 in a 0700 folder where missing), its
    schema brought up to ``SCHEMA_VERSION``, and whether SQLite keeps it in WAL mode
    (where the file system cannot, it keeps its own journal, and debits commit FULL)."""
    _private_file(path)
    db = sqlite3.connect(
        path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
    )
    db.row_factory = sqlite3.Row
    db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
    mode = db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
    db.execute("PRAGMA synchronous = FULL")  # until a commit asks for less
    with Immediate(db, durable=True):
        db.execute(_ENTRIES)
        columns = {row["name"] for row in db.execute("PRAGMA table_info(entries)")}
        for name, statement in _ADDED_COLUMNS.items():
            if name not in columns:
                db.execute(statement)
        for statement in _SCHEMA:
            db.execute(statement)
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    # SQLite gives the -wal and -shm files the database file's mode; this
    # only tightens them if an older file was created more openly.
    for suffix in ("-wal", "-shm"):
        sidecar = path.with_name(path.name + suffix)
        if sidecar.exists() and sidecar.stat().st_uid == os.getuid():
            os.chmod(sidecar, 0o600)
    return db, mode.lower() == "wal"


class Immediate:
    """``BEGIN IMMEDIATE`` … ``COMMIT``, rolled back on any exception; flushed to
    the disk before it returns unless ``durable`` is false (``store.py``'s docstring
    says which commits may skip the flush)."""

    def __init__(self, db: sqlite3.Connection, durable: bool) -> None:
        self._db = db
        self._durable = durable

    def __enter__(self) -> None:
        if not self._durable:  # a pragma outside any transaction, under the ledger's lock
            self._db.execute("PRAGMA synchronous = NORMAL")
        self._db.execute("BEGIN IMMEDIATE")

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        try:
            self._db.execute("COMMIT" if kind is None else "ROLLBACK")
        finally:
            if not self._durable:
                self._db.execute("PRAGMA synchronous = FULL")


def _private_file(path: Path) -> None:
    """Create the ledger 0600 in a 0700 folder before SQLite opens it, so no
    other user can read the audit log (it holds every user's SQL)."""
    parent = path.parent
    if not parent.exists():
        parent.mkdir(mode=0o700, parents=True)
        os.chmod(parent, 0o700)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    os.close(fd)
