"""The durable privacy ledger: every charge, release, failure and replay.

The ledger is the one place where budget is decided, so it must hold under
concurrency and crashes. A debit reads what was spent and writes the new
charge inside a single ``BEGIN IMMEDIATE`` transaction: SQLite takes the
database's write lock before the read, so two gate threads (or two gate
processes on the same state directory) can never both see the same
remaining budget and both spend it.

Durability, one disk flush per query, off the query's path. The ledger runs
in WAL mode, where a commit appends to the write-ahead log and, under
``synchronous=FULL``, waits for the log to reach the disk (an fsync: 0.2 ms
on an idle disk, tens of milliseconds on a busy one, with the ledger's lock
held throughout); under ``synchronous=NORMAL`` it waits only for the
operating system to have the write. A NORMAL commit survives the gate's own
crash or ``kill -9`` (the kernel holds the write); only an operating-system
crash or a power cut before the next flush can roll it back, and WAL keeps
the file consistent when it does (SQLite's documentation on WAL and
``synchronous``).

A debit commits NORMAL, so it holds before the query touches any data
against everything the query itself could do to the gate (fail, time out,
exhaust memory, crash it). Then the log is flushed to the disk, which is what
FULL would have done inside the commit (``fdatasync`` of the ``-wal`` file;
the directory too, the first time), on a thread of its own while the query
runs (``Charge.durable``). Nothing about the query leaves before that flush:
``record_release`` and ``record_failure``, one of which every debited query
passes through before its reply, wait for it. So a result is still never
released on a charge any crash could forget; the flush no longer adds to the
query's time, nor holds the ledger's lock, and flushes that queue behind one
another are done as one (each covers every commit written before it began).
A grant commits FULL. The commits that follow a debit for the same
query are NORMAL, because losing one is safe:

- the stored release (``record_release``): exists, readable by every gate
  process, before the reply leaves, so a repeated query is replayed for free;
  after a power cut it may be gone, and then the same query is charged and
  answered afresh, with both charges counted: the accounting stays sound,
  only the replay is lost. The next durable commit (any debit) flushes it;
- a failure mark (``record_failure``): a charge stays spent as ``charged``
  or ``failed`` alike;
- a replay's audit line (``record_replay``), which costs nothing; and a
  reset, whose loss leaves the budget smaller, never larger.

A release is replayed only over the data and policy it was computed from: its
replay key (``ReplayKey``) is made of the query's own key and the dataset's
versions (``engines/versions.versions``), and the table ``replay_keys`` keeps each
key's parts, written with its debit. So when a query is answered afresh though
the same query was released before under other versions, the ledger can say
which changed (``fresh_because``). The table is created where it is missing, so a
ledger of an earlier release opens as it was; its releases, keyed by the query's
key alone, are told apart by having no parts.

Each charge is stored as ε, δ and ρ, each a sound bound on its release, and
spends compose by adding each of them up (``accounting.compose``). Only the
check against a limit depends on the accountant, which each debit names: a
gate may serve datasets under different accountants, and a dataset whose
accountant changes keeps every past charge counted.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sqlite3
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from fractions import Fraction
from pathlib import Path

from dpmagic.gate.dp.accounting import Accountant, Cost
from dpmagic.gate.failures import OverBudget, required
from dpmagic.gate.policy import Budget
from dpmagic.gate.service.reply import Reply

# Long enough that a burst of debits from many processes queues rather than
# fails; each transaction holds the lock for well under a millisecond.
BUSY_TIMEOUT_S = 30.0
SCHEMA_VERSION = 2  # 2: the replay_keys table

CHARGED, RELEASED, FAILED, REPLAYED = "charged", "released", "failed", "replayed"
# Admin actions, kept in the same log as the queries they affect.
GRANTED, RESET = "granted", "reset"
# The notebook column of an admin action that applies to the user as a whole;
# never a real notebook name, as the gate names a nameless notebook "unnamed".
WHOLE_USER = ""
# Statuses whose cost counts against the budget; a replay costs nothing.
_SPENDING = (CHARGED, RELEASED, FAILED)

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS entries (
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
    reply TEXT
)""",
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
    f"PRAGMA user_version = {SCHEMA_VERSION}",
)


# Why a query was answered afresh though the same query was released to the user before.
DATA_CHANGED = "the dataset changed since your earlier answer"
POLICY_CHANGED = "the policy changed since your earlier answer"
BOTH_CHANGED = "the dataset and the policy changed since your earlier answer"
UNVERSIONED = (
    "your earlier answer was released by an older gate, which kept no dataset version "
    "to tell whether the data or the policy changed since"
)


class ReplayKey(str):
    """A replay key: the text the ledger matches releases on, a hash of its parts.

    ``query``: the query's own key (its canonical SQL, parameters, cost, mechanisms:
    what the whole replay key was before versions joined it, so the releases of an
    older ledger are found by it); ``data`` and ``policy``: the versions of the data
    and of the policy facts it is answered over (``engines/versions.Versions``)."""

    query: str
    data: str
    policy: str

    def __new__(cls, query: str, data: str, policy: str) -> ReplayKey:
        text = json.dumps({"query": query, "data": data, "policy": policy}, sort_keys=True)
        key = super().__new__(cls, hashlib.sha256(text.encode()).hexdigest())
        key.query, key.data, key.policy = query, data, policy
        return key


@dataclass(frozen=True)
class Charge:
    """A debit: its ledger row, and when that row is on the disk."""

    id: int
    durable: Future[None]


class _Flusher:
    """Flushes the write-ahead log to the disk on a thread of its own, as a FULL commit
    would have, for commits already written (NORMAL). A flush covers every commit
    written before it began: a commit's ticket is the count of commits written when it
    returned, and a flush that starts with ``written >= ticket`` covers it. Requests
    that queue behind a flush are served by the next one, not one each.

    The log's file may have been replaced since a commit: SQLite copies the log into
    the database file (a checkpoint, which flushes the database file after the copy
    under NORMAL and FULL alike) before it starts the log again or, as the last
    connection closes (another gate process's), deletes it. A commit is then on the
    disk in the database file, or in the new log; the flush syncs whichever exists,
    and the folder when a new log file was made, since its name is in the folder."""

    def __init__(self, database: Path) -> None:
        self._database = database
        self._wal = database.with_name(database.name + "-wal")
        self._lock = threading.Lock()
        self._written = 0  # commits whose write the operating system has
        self._flushed = 0  # of those, the ones known to be on the disk
        self._log_file: int | None = None  # the inode of the log last flushed
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="dpmagic-ledger-flush")

    def committed(self) -> Future[None]:
        """Call after a NORMAL commit returns: its flush, done when it is on the disk."""
        with self._lock:
            self._written += 1
            ticket = self._written
        return self._thread.submit(self._flush, ticket)

    def _flush(self, ticket: int) -> None:
        with self._lock:
            if self._flushed >= ticket:
                return
            target = self._written
        # One thread runs this, so flushes never overlap; the lock guards the counts.
        try:
            fd = os.open(self._wal, os.O_RDONLY)
        except FileNotFoundError:  # checkpointed into the database file and deleted
            fd = os.open(self._database, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            inode = os.fstat(fd).st_ino
        finally:
            os.close(fd)
        if inode != self._log_file:  # a file made since the last flush: its name too
            folder = os.open(self._database.parent, os.O_RDONLY)
            try:
                os.fsync(folder)
            finally:
                os.close(folder)
            self._log_file = inode
        with self._lock:
            self._flushed = max(self._flushed, target)

    def close(self) -> None:
        self._thread.shutdown(wait=True)


class Ledger:
    """One SQLite file; safe to share between the gate's request threads.

    A single connection is serialised by a lock: request threads are
    short-lived, so a connection per thread would be opened and leaked per
    request. Other processes (a second gate, ``dpmagic budget``) are kept
    consistent by SQLite's own file locks.
    """

    def __init__(self, path: Path, accountant: Accountant) -> None:
        self.path = Path(path)
        self.accountant = accountant  # for debits that name none
        _private_file(self.path)
        self._lock = threading.Lock()
        self._tallies: dict[tuple[str, str], _Scopes] = {}
        self._db = sqlite3.connect(
            self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )
        self._db.row_factory = sqlite3.Row
        self._db.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        mode = self._db.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        self._db.execute("PRAGMA synchronous = FULL")  # until a commit asks for less
        # Where the file system cannot keep a WAL (SQLite then keeps its own journal),
        # debits commit FULL and are on the disk when they return.
        self._flusher = _Flusher(self.path) if mode.lower() == "wal" else None
        with self._transaction():
            for statement in _SCHEMA:
                self._db.execute(statement)
        # SQLite gives the -wal and -shm files the database file's mode; this
        # only tightens them if an older file was created more openly.
        for suffix in ("-wal", "-shm"):
            sidecar = self.path.with_name(self.path.name + suffix)
            if sidecar.exists() and sidecar.stat().st_uid == os.getuid():
                os.chmod(sidecar, 0o600)

    def debit(
        self,
        *,
        user: str,
        dataset: str,
        notebook: str,
        cost: Cost,
        user_limit: Budget,
        notebook_limit: Budget,
        sql: str,
        replay_key: str | None,
        accountant: Accountant | None = None,
    ) -> Charge:
        """Charge ``cost``, or raise OverBudget having written nothing.

        The charge survives the gate's crash when this returns, and the disk's loss of
        power once ``Charge.durable`` is done (see the module's docstring): recording
        its release or failure waits for that."""
        acc = accountant or self.accountant
        with self._lock, self._transaction(durable=self._flusher is None):
            (spent_user, user_limit), (spent_nb, notebook_limit) = self._standing(
                user, dataset, notebook, user_limit, notebook_limit
            )
            user_fits = acc.fits(spent_user, cost, user_limit)
            if not (user_fits and acc.fits(spent_nb, cost, notebook_limit)):
                # The refusal's words are made only for a refusal.
                show_delta = bool(cost.delta or user_limit.delta or notebook_limit.delta)
                need = acc.describe(cost)
                user_left = _left(acc, spent_user, user_limit, show_delta)
                why = self._fresh_because(user, dataset, replay_key)
                # A query that was replayed for free before: why it is charged now.
                because = "" if why is None else f"; not replayed: {why}"
                if not user_fits:
                    raise OverBudget(
                        f"needs {need} but only {user_left} is left for user {user} on dataset "
                        f"{dataset!r}{because}"
                    )
                nb_left = _left(acc, spent_nb, notebook_limit, show_delta)
                raise OverBudget(
                    f"needs {need} but only {nb_left} is left "
                    f"for notebook {notebook!r} ({user_left} left for user {user}){because}"
                )
            cursor = self._db.execute(
                "INSERT INTO entries (time, user, dataset, notebook, epsilon, delta, rho, sql,"
                " replay_key, status) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    _now(),
                    user,
                    dataset,
                    notebook,
                    cost.epsilon,
                    cost.delta,
                    cost.rho,
                    sql,
                    replay_key,
                    CHARGED,
                ),
            )
            charge_id = required(cursor.lastrowid, "the ledger row's id")
            if isinstance(replay_key, ReplayKey):
                self._db.execute(
                    "INSERT OR IGNORE INTO replay_keys (replay_key, query_key, data, policy)"
                    " VALUES (?, ?, ?, ?)",
                    (str(replay_key), replay_key.query, replay_key.data, replay_key.policy),
                )
        return Charge(charge_id, self._durable())  # after the commit, which it must follow

    def _durable(self) -> Future[None]:
        """The flush of the commit that just returned (done already if it was FULL)."""
        if self._flusher is not None:
            return self._flusher.committed()
        done: Future[None] = Future()
        done.set_result(None)
        return done

    def record_release(self, charge: Charge, reply: Reply) -> None:
        """Keep the released reply, its Arrow stream as written once for the reply
        (``service/reply.py``), so the same query can be replayed for free; returns
        once the charge is on the disk, so the reply may leave."""
        charge.durable.result()
        with self._lock, self._transaction(durable=False):
            self._db.execute(
                "UPDATE entries SET status = ?, reply = ? WHERE id = ?",
                (RELEASED, reply.stream, charge.id),
            )

    def record_failure(self, charge: Charge) -> None:
        """Mark a charge whose query failed; its cost stays spent. Returns once the
        charge is on the disk, so the failure may be told."""
        charge.durable.result()
        with self._lock, self._transaction(durable=False):
            self._db.execute("UPDATE entries SET status = ? WHERE id = ?", (FAILED, charge.id))

    def recent_failures(self, user: str, dataset: str, seconds: float) -> int:
        """How many of ``user``'s queries on ``dataset`` failed after the debit in the
        last ``seconds``, and since the owner last reset the user's budget there."""
        since = (datetime.now(UTC) - timedelta(seconds=seconds)).isoformat(timespec="microseconds")
        with self._lock:
            (count,) = self._db.execute(
                "SELECT COUNT(*) FROM entries WHERE user = ? AND dataset = ? AND status = ?"
                " AND time > ? AND time > COALESCE((SELECT MAX(time) FROM entries WHERE"
                " user = ? AND dataset = ? AND status = ?), '')",
                (user, dataset, FAILED, since, user, dataset, RESET),
            ).fetchone()
        return int(count)

    def find_release(self, user: str, dataset: str, replay_key: str) -> Reply | None:
        """The latest reply released to ``user`` for this replay key, if any (kept as an
        Arrow stream, or as the JSON text of an older gate: ``Reply.stored``)."""
        with self._lock:
            row = self._db.execute(
                "SELECT reply FROM entries WHERE user = ? AND dataset = ? AND replay_key = ?"
                " AND status = ? ORDER BY id DESC LIMIT 1",
                (user, dataset, replay_key, RELEASED),
            ).fetchone()
        return None if row is None else Reply.stored(row["reply"])

    def fresh_because(self, user: str, dataset: str, replay_key: str) -> str | None:
        """Why a query with no release under ``replay_key`` is answered afresh, when
        the same query was released to ``user`` before under other versions of the
        data or the policy (``DATA_CHANGED``, ``POLICY_CHANGED``, ``BOTH_CHANGED``;
        ``UNVERSIONED`` for a release of a ledger from before versions); None if it
        never was."""
        with self._lock:
            return self._fresh_because(user, dataset, replay_key)

    def _fresh_because(self, user: str, dataset: str, replay_key: str | None) -> str | None:
        if not isinstance(replay_key, ReplayKey):
            return None
        row = self._db.execute(
            "SELECT k.data, k.policy FROM replay_keys AS k JOIN entries AS e"
            " ON e.replay_key = k.replay_key WHERE k.query_key = ? AND e.user = ?"
            " AND e.dataset = ? AND e.status = ? ORDER BY e.id DESC LIMIT 1",
            (replay_key.query, user, dataset, RELEASED),
        ).fetchone()
        if row is None:
            older = self._db.execute(
                "SELECT 1 FROM entries WHERE user = ? AND dataset = ? AND replay_key = ?"
                " AND status = ? LIMIT 1",
                (user, dataset, replay_key.query, RELEASED),
            ).fetchone()
            return None if older is None else UNVERSIONED
        data, policy = row["data"] != replay_key.data, row["policy"] != replay_key.policy
        if data and policy:
            return BOTH_CHANGED
        if data:
            return DATA_CHANGED
        return POLICY_CHANGED if policy else None

    def reply(self, entry_id: int) -> dict | None:
        """The reply a released or replayed entry gave (a replay: the release it served)."""
        with self._lock:
            row = self._db.execute(
                "SELECT reply FROM entries WHERE status = ? AND id = (SELECT MAX(r.id)"
                " FROM entries AS r JOIN entries AS e ON r.user = e.user"
                " AND r.dataset = e.dataset AND r.replay_key = e.replay_key"
                " WHERE e.id = ? AND r.id <= e.id AND r.status = ?)",
                (RELEASED, entry_id, RELEASED),
            ).fetchone()
        return None if row is None else Reply.stored(row["reply"]).json()

    def record_replay(
        self, *, user: str, dataset: str, notebook: str, sql: str, replay_key: str
    ) -> None:
        """An audit line for an answer served again; it costs nothing."""
        with self._lock, self._transaction(durable=False):
            self._db.execute(
                "INSERT INTO entries (time, user, dataset, notebook, epsilon, delta, rho, sql,"
                " replay_key, status) VALUES (?, ?, ?, ?, 0, 0, 0, ?, ?, ?)",
                (_now(), user, dataset, notebook, sql, replay_key, REPLAYED),
            )

    def standing(
        self, user: str, dataset: str, notebook: str, user_base: Budget, notebook_base: Budget
    ) -> tuple[tuple[Cost, Budget], tuple[Cost, Budget]]:
        """What the user and the notebook spent, and their limits (``*_base`` plus
        grants), read together."""
        with self._lock:
            return self._standing(user, dataset, notebook, user_base, notebook_base)

    def spent(self, user: str, dataset: str, notebook: str | None = None) -> Cost:
        """What ``user`` spent on ``dataset``, in all notebooks or in one."""
        with self._lock:
            return self._spent(user, dataset, notebook)

    def history(
        self,
        *,
        user: str | None = None,
        dataset: str | None = None,
        notebook: str | None = None,
        limit: int | None = None,
    ) -> list[dict[str, object]]:
        """Audit rows, newest first; the stored replies are not part of them."""
        where, args = [], []
        for column, value in (("user", user), ("dataset", dataset), ("notebook", notebook)):
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        sql = (
            "SELECT id, time, user, dataset, notebook, sql, epsilon, delta, rho, status"
            " FROM entries"
            + (" WHERE " + " AND ".join(where) if where else "")
            + " ORDER BY id DESC"
        )
        if limit is not None:
            sql += " LIMIT ?"
            args.append(int(limit))
        with self._lock:
            rows = self._db.execute(sql, args).fetchall()
        return [{**dict(row), "replayed": row["status"] == REPLAYED} for row in rows]

    def close(self) -> None:
        if self._flusher is not None:
            self._flusher.close()  # every pending flush is done first
        with self._lock:
            self._db.close()

    def _standing(
        self, user: str, dataset: str, notebook: str, user_base: Budget, notebook_base: Budget
    ) -> tuple[tuple[Cost, Budget], tuple[Cost, Budget]]:
        whole = self._tally(user, dataset, None)
        # The read above brought every scope of the user on the dataset up to date.
        own = self._tally(user, dataset, notebook, refresh=False)
        return (
            (whole.spent(), whole.limit(user_base)),
            (own.spent(), own.limit(notebook_base)),
        )

    def _spent(self, user: str, dataset: str, notebook: str | None) -> Cost:
        return self._tally(user, dataset, notebook).spent()

    def _tally(self, user: str, dataset: str, notebook: str | None, refresh: bool = True) -> _Tally:
        """A scope's spending and grants since its last reset, brought up to date with the
        rows written since it was last read, by this process or any other.

        Summing a user's whole history on every query made each query cost time in
        proportion to it (6.5 ms a query after 1,000 queries, 82 ms after 10,000, with
        the ledger's lock held). The log only grows: rows are appended with increasing
        ids, and the one update a row receives (``charged`` to ``released`` or
        ``failed``) keeps it spending the same. So the totals over the rows up to some
        id never change, and each read adds only the rows after it. The sums are
        exact, rounded once when read: ``accounting.compose``'s ``math.fsum``."""
        scopes = self._tallies.setdefault((user, dataset), _Scopes())
        tally = scopes.tallies.get(notebook)
        if tally is None:  # a scope first read here: its rows up to where the others are
            tally = scopes.tallies[notebook] = _Tally()
            for row in self._rows(user, dataset, after=0, upto=scopes.seen):
                tally.apply(row, notebook)
        if not refresh:
            return tally
        # One read brings every scope of the user on the dataset up to date.
        for row in self._rows(user, dataset, after=scopes.seen):
            scopes.seen = row["id"]
            for scope, each in scopes.tallies.items():
                each.apply(row, scope)
        return tally

    def _rows(self, user: str, dataset: str, after: int, upto: int | None = None) -> list:
        return self._db.execute(
            "SELECT id, notebook, status, epsilon, delta, rho FROM entries"
            " WHERE user = ? AND dataset = ? AND id > ?"
            + ("" if upto is None else " AND id <= ?")
            + " ORDER BY id",
            (user, dataset, after) if upto is None else (user, dataset, after, upto),
        ).fetchall()

    # Admin actions (``dpmagic budget grant|reset``). A grant raises a limit by
    # an (ε, δ) amount; a reset forgets what was spent and granted before it.
    # Both are rows of the audit log, so the log alone explains every budget.

    def grant(
        self, *, user: str, dataset: str, notebook: str | None, amount: Budget, note: str
    ) -> None:
        """Raise the user's (or one notebook's) limit on ``dataset`` by ``amount``."""
        self._admin(user, dataset, notebook, amount, GRANTED, note)

    def reset(self, *, user: str, dataset: str, notebook: str | None, note: str) -> None:
        """Start the user's (or one notebook's) spending on ``dataset`` from zero.

        Released answers stay replayable: they were already paid for.
        """
        self._admin(user, dataset, notebook, Budget(0.0), RESET, note)

    def limit(self, base: Budget, user: str, dataset: str, notebook: str | None = None) -> Budget:
        """``base`` (the policy's limit) plus what was granted since the last reset."""
        with self._lock:
            return self._limit(base, user, dataset, notebook)

    def _admin(
        self,
        user: str,
        dataset: str,
        notebook: str | None,
        amount: Budget,
        status: str,
        note: str,
    ) -> None:
        scope = WHOLE_USER if notebook is None else notebook
        with self._lock, self._transaction(durable=status != RESET):
            self._db.execute(
                "INSERT INTO entries (time, user, dataset, notebook, epsilon, delta, rho, sql,"
                " status) VALUES (?, ?, ?, ?, ?, ?, 0, ?, ?)",
                (_now(), user, dataset, scope, amount.epsilon, amount.delta, note, status),
            )

    def _limit(self, base: Budget, user: str, dataset: str, notebook: str | None) -> Budget:
        return self._tally(user, dataset, notebook).limit(base)

    def _transaction(self, durable: bool = True) -> _Immediate:
        return _Immediate(self._db, durable)


class _Sum:
    """A running sum of floats, read as ``math.fsum`` of every value added (the exact sum,
    rounded once), in constant memory: an exact rational, plus the non-finite values."""

    def __init__(self) -> None:
        self._exact = Fraction(0)
        self._special: set[float] = set()

    def add(self, value: float) -> None:
        if math.isfinite(value):
            self._exact += Fraction(value)
        else:
            self._special.add(value)

    def value(self) -> float:
        return math.fsum(self._special) if self._special else float(self._exact)


@dataclass
class _Tally:
    """What counts in one scope (a user's, or one notebook's, on a dataset) among the
    ledger's rows read so far, since the scope's last reset."""

    epsilon: _Sum = field(default_factory=_Sum)
    delta: _Sum = field(default_factory=_Sum)
    rho: _Sum = field(default_factory=_Sum)
    granted_epsilon: _Sum = field(default_factory=_Sum)
    granted_delta: _Sum = field(default_factory=_Sum)

    def apply(self, row: sqlite3.Row, notebook: str | None) -> None:
        """Count one row for the scope of ``notebook`` (None: the whole user)."""
        scope = WHOLE_USER if notebook is None else notebook
        status, nb = row["status"], row["notebook"]
        # A whole-user reset applies to every notebook; a notebook's own reset
        # only to that notebook, so it never gives back the user's budget.
        if status == RESET and nb in (WHOLE_USER, scope):
            self.reset()
        elif status in _SPENDING and notebook in (None, nb):
            self.epsilon.add(row["epsilon"])
            self.delta.add(row["delta"])
            self.rho.add(row["rho"])
        elif status == GRANTED and nb == scope:
            self.granted_epsilon.add(row["epsilon"])
            self.granted_delta.add(row["delta"])

    def spent(self) -> Cost:
        return Cost(self.epsilon.value(), self.delta.value(), self.rho.value())

    def limit(self, base: Budget) -> Budget:
        """``base`` (the policy's limit) plus what was granted."""
        return Budget(
            base.epsilon + self.granted_epsilon.value(), base.delta + self.granted_delta.value()
        )

    def reset(self) -> None:
        self.epsilon, self.delta, self.rho = _Sum(), _Sum(), _Sum()
        self.granted_epsilon, self.granted_delta = _Sum(), _Sum()


@dataclass
class _Scopes:
    """The tallies of one user on one dataset (by notebook; None for the whole user),
    all brought up to row id ``seen``."""

    seen: int = 0
    tallies: dict[str | None, _Tally] = field(default_factory=dict)


class _Immediate:
    """``BEGIN IMMEDIATE`` … ``COMMIT``, rolled back on any exception; flushed to
    the disk before it returns unless ``durable`` is false (see the module's
    docstring for which commits may skip the flush)."""

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


def _left(accountant: Accountant, spent: Cost, limit: Budget, show_delta: bool) -> str:
    """``ε=0.5`` (``, δ=1e-06`` where δ is in play; ``ρ=…`` first under zCDP) for
    refusal messages."""
    left = accountant.view(spent, limit)["remaining"]
    text = f"ε={left['epsilon']:.6g}"
    if show_delta:
        text += f", δ={left['delta']:.3g}"
    return f"ρ={left['rho']:.6g} ({text})" if "rho" in left else text


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")
