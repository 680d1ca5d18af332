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
A grant commits FULL. Serving a shared release to a user who had not learned it
charges budgets too (``serve_shared``), and is made durable as a debit is, before
the answer leaves. The commits that follow a debit for the same query are NORMAL,
because losing one is safe:

- the stored release (``record_release``): exists, readable by every gate
  process, before the reply leaves, so a repeated query is replayed for free;
  after a power cut it may be gone, and then the same query is charged and
  answered afresh, with both charges counted: the accounting stays sound,
  only the replay is lost. The next durable commit (any debit) flushes it;
- a failure mark (``record_failure``): a charge stays spent as ``charged``
  or ``failed`` alike;
- a replay's audit line (``record_replay``, or ``serve_shared``'s where it
  charges nothing), which costs nothing; and a
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
import os
import sqlite3
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from dpmagic.gate.dp.accounting import Accountant, Cost
from dpmagic.gate.failures import OverBudget, required
from dpmagic.gate.policy import Budget
from dpmagic.gate.service.budget_scopes import (
    ADMIN,
    CHARGED,
    FAILED,
    GRANTED,
    GROUP_SEPARATOR,
    REFUSED,
    RELEASED,
    RENEWED,
    REPLAYED,
    RESET,
    SPENDING,
    Scope,
    ScopeKind,
    Tally,
    admin_target,
    charged_to,
    renewal_due,
)
from dpmagic.gate.service.reply import Reply

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
# an admin row's scope (``budget_scopes.Scope.row_columns``; empty: a user's or a
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
    # The groups a charge's user was in when it was charged (``budget_scopes``).
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
_RECENT_FAILURES = (
    f"SELECT COUNT(*) FROM entries WHERE user = ? AND dataset = ? AND status = '{FAILED}'"
    " AND time > MAX(?, COALESCE((SELECT MAX(time) FROM entries WHERE user = ?"
    f" AND dataset = ? AND status = '{RESET}' AND scope = ''), ''))"
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


@dataclass(frozen=True)
class SharedRelease:
    """An answer released to another user, served to the asker (``share_releases``):
    its ledger row, when and at what cost it was released; and what serving it
    charged the asker (``charged``, zero when the release already counted against
    every budget they are under) and where (``charged_to``)."""

    entry_id: int
    time: str
    cost: Cost
    reply: Reply
    charged: Cost
    charged_to: tuple[Scope, ...]


@dataclass
class _Served:
    """One release of a replay key, and what of one asker's it counts against so far
    (``Ledger._releases_of``): which of their groups, and which users of the two that
    matter (its own, and the asker if they were charged for it)."""

    id: int
    time: str
    cost: Cost
    groups: set[str]
    users: set[str]


class Ledger:
    """One SQLite file; safe to share between the gate's request threads.

    A single connection is serialised by a lock: request threads are
    short-lived, so a connection per thread would be opened and leaked per
    request. Other processes (a second gate, ``dpmagic budget``) are kept
    consistent by SQLite's own file locks.
    """

    def __init__(
        self, path: Path, accountant: Accountant, clock: Callable[[], datetime] | None = None
    ) -> None:
        self.path = Path(path)
        self.accountant = accountant  # for debits that name none
        # The time rows are stamped with and renewals' periods are read from (UTC).
        self._clock = clock or (lambda: datetime.now(UTC))
        _private_file(self.path)
        self._lock = threading.Lock()
        self._cursors: dict[str, _Cursor] = {}
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
            self._db.execute(_ENTRIES)
            columns = {row["name"] for row in self._db.execute("PRAGMA table_info(entries)")}
            for name, statement in _ADDED_COLUMNS.items():
                if name not in columns:
                    self._db.execute(statement)
            for statement in _SCHEMA:
                self._db.execute(statement)
            self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
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
        limits: Sequence[tuple[Scope, Budget]],
        sql: str,
        replay_key: str | None,
        groups: Iterable[str] = (),
        accountant: Accountant | None = None,
    ) -> Charge:
        """Charge ``cost`` against every budget in ``limits`` (each scope's policy
        limit, before grants), or raise OverBudget naming the first one it does not
        fit, having written nothing. ``groups``: the user's groups now, which the
        charge counts for from now on, whatever later becomes of their membership.

        All the budgets are read and the charge written in one transaction, so
        concurrent debits (threads or processes) never overspend any of them. The
        charge survives the gate's crash when this returns, and the disk's loss of
        power once ``Charge.durable`` is done (see the module's docstring): recording
        its release or failure waits for that."""
        acc = accountant or self.accountant
        now = self._clock()
        with self._lock, self._transaction(durable=self._flusher is None):
            self._refresh(dataset)
            standing = [(scope, *self._standing(scope, base, now)) for scope, base in limits]
            for scope, spent, limit, _due in standing:
                if not acc.fits(spent, cost, limit):
                    self._refuse(acc, cost, scope, standing, user, replay_key)
            when = _text(now)
            for scope, _spent, _limit, due in standing:
                if due is not None:  # the period's first charge: its renewal, before it
                    self._insert_admin(scope, Budget(0.0), due[0], due[1], when)
            cursor = self._db.execute(
                "INSERT INTO entries (time, user, dataset, notebook, epsilon, delta, rho, sql,"
                " replay_key, status) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    when,
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
            self._db.executemany(
                "INSERT INTO charged_groups (entry_id, dataset, grp) VALUES (?, ?, ?)",
                [(charge_id, dataset, group) for group in sorted(set(groups))],
            )
            if isinstance(replay_key, ReplayKey):
                self._db.execute(
                    "INSERT OR IGNORE INTO replay_keys (replay_key, query_key, data, policy)"
                    " VALUES (?, ?, ?, ?)",
                    (str(replay_key), replay_key.query, replay_key.data, replay_key.policy),
                )
        return Charge(charge_id, self._durable())  # after the commit, which it must follow

    def check(
        self,
        *,
        user: str,
        dataset: str,
        cost: Cost,
        limits: Sequence[tuple[Scope, Budget]],
        accountant: Accountant | None = None,
    ) -> None:
        """Raise the OverBudget ``debit`` would for ``cost`` now, writing nothing: a
        query of several releases asks it for their sum before its first debit, so
        that it is not charged for stages it cannot finish."""
        acc = accountant or self.accountant
        now = self._clock()
        with self._lock:
            self._refresh(dataset)
            standing = [(scope, *self._standing(scope, base, now)) for scope, base in limits]
            for scope, spent, limit, _due in standing:
                if not acc.fits(spent, cost, limit):
                    self._refuse(acc, cost, scope, standing, user, None)

    def _refuse(
        self,
        acc: Accountant,
        cost: Cost,
        scope: Scope,
        standing: list[tuple[Scope, Cost, Budget, tuple[str, str] | None]],
        user: str,
        replay_key: str | None,
    ) -> None:
        """Raise the refusal of a charge that does not fit ``scope``'s budget: what it
        needs, what is left there, and which budget that is (typed, in ``budget``)."""
        show_delta = bool(cost.delta or any(limit.delta for _s, _c, limit, _d in standing))
        need = acc.describe(cost)
        left = {s: _left(acc, spent, limit, show_delta) for s, spent, limit, _d in standing}
        why = self._fresh_because(user, scope.dataset, replay_key)
        # A query that was replayed for free before: why it is charged now.
        because = "" if why is None else f"; not replayed: {why}"
        if scope.kind == ScopeKind.USER:
            where = f"for user {scope.holder} on dataset {scope.dataset!r}"
        elif scope.kind == ScopeKind.NOTEBOOK:
            whole = Scope.user(scope.dataset, scope.holder)
            where = f"for notebook {scope.notebook!r}" + (
                f" ({left[whole]} left for user {scope.holder})" if whole in left else ""
            )
        else:
            where = "of " + scope.describe()
        raise OverBudget(
            f"needs {need} but only {left[scope]} is left {where}{because}", scope.as_dict()
        )

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

    def record_refusal(
        self, *, user: str, dataset: str, notebook: str, sql: str, reason: str
    ) -> None:
        """Keep a query refused before its debit, with the reason its user was told: no
        cost, and counted by no budget (``SPENDING`` and ``ADMIN`` leave it out), so the
        owner's log shows what was asked and why it was refused."""
        with self._lock, self._transaction(durable=False):
            self._db.execute(
                "INSERT INTO entries (time, user, dataset, notebook, epsilon, delta, rho, sql,"
                " status, reason) VALUES (?, ?, ?, ?, 0, 0, 0, ?, ?, ?)",
                (_text(self._clock()), user, dataset, notebook, sql, REFUSED, reason),
            )

    def recent_failures(self, user: str, dataset: str, seconds: float) -> int:
        """How many of ``user``'s queries on ``dataset`` failed after the debit in the
        last ``seconds``, and since the owner last reset the user's budget there."""
        since = _text(self._clock() - timedelta(seconds=seconds))
        with self._lock:
            (count,) = self._db.execute(
                _RECENT_FAILURES, (user, dataset, since, user, dataset)
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

    def serve_shared(
        self,
        *,
        user: str,
        dataset: str,
        notebook: str,
        replay_key: str,
        groups: Iterable[str],
        everyone: bool,
        limits: Sequence[tuple[Scope, Budget]],
        sql: str,
        accountant: Accountant | None = None,
    ) -> SharedRelease | None:
        """Serve ``user`` another user's release of this replay key, charging it to each
        budget they are under that it does not count against yet; None where there is
        none they may be served (to anyone when ``everyone``, else one that counts
        against one of ``groups``, the user's groups now, or one they learned before).

        The rule (docs/privacy.md, "Shared releases"): an answer is served only where
        its release counts against every budget its asker is under. The dataset's
        counts every release. A group counts it if it was charged to the group when
        released, or when served to a member who had not learned it. The user counts
        it if it was released to them or charged to them when served before; a user
        who had learned it is served it again free, as their own answers are (and
        whatever groups they joined since, as a charge records the groups of its
        moment). Whatever is missing, the user's budget (with the notebook's drawn
        from it) and each of their groups' it was not charged to, is charged the
        release's cost, checked against each such budget as a debit is (OverBudget,
        nothing written, where it does not fit). Of several releases of the key
        (answered afresh with ``fresh``, or in groups that could not share), the one
        that charges the fewest budgets is served, the first of those alike: one the
        user learned before, so a user is never served two answers to one question.

        Finding the release, reading what it counts against and writing the replay
        row with its charge are one transaction, so two users served the same
        release at once (threads or gate processes) never both charge a group they
        share: the second reads the first's charge. The replay row names the
        release it served (``source``) and carries what was charged, to the groups
        it names; a charge is on the disk before this returns, as a debit's is
        before its release."""
        acc = accountant or self.accountant
        now = self._clock()
        mine = frozenset(groups)
        with self._lock, self._transaction(durable=self._flusher is None):
            releases = self._releases_of(dataset, replay_key, user, mine)
            chosen: tuple[int, _Served, frozenset[str]] | None = None
            for release in releases:
                knows = user in release.users
                if not (knows or everyone or mine & release.groups):
                    continue
                missing = frozenset() if knows else mine - release.groups
                price = 0 if knows else 1 + len(missing)
                if chosen is None or price < chosen[0]:
                    chosen = (price, release, missing)
            if chosen is None:
                return None
            price, release, missing = chosen
            charged, charged_to, standing = Cost(0.0), (), []
            if price:
                charged = release.cost
                due = [
                    (scope, base)
                    for scope, base in limits
                    if scope.kind in (ScopeKind.USER, ScopeKind.NOTEBOOK)
                    or (scope.kind == ScopeKind.GROUP and scope.holder in missing)
                ]
                self._refresh(dataset)
                standing = [(scope, *self._standing(scope, base, now)) for scope, base in due]
                for scope, spent, limit, _due in standing:
                    if not acc.fits(spent, charged, limit):
                        self._refuse(acc, charged, scope, standing, user, replay_key)
                charged_to = tuple(scope for scope, *_ in standing)
            when = _text(now)
            for scope, _spent, _limit, renewal in standing:
                if renewal is not None:  # the period's first charge: its renewal first
                    self._insert_admin(scope, Budget(0.0), renewal[0], renewal[1], when)
            cursor = self._db.execute(
                "INSERT INTO entries (time, user, dataset, notebook, epsilon, delta, rho, sql,"
                " replay_key, status, source) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (when, user, dataset, notebook, charged.epsilon, charged.delta, charged.rho,
                 sql, replay_key, REPLAYED, release.id),
            )  # fmt: skip
            row_id = required(cursor.lastrowid, "the ledger row's id")
            self._db.executemany(
                "INSERT INTO charged_groups (entry_id, dataset, grp) VALUES (?, ?, ?)",
                [(row_id, dataset, group) for group in sorted(missing) if price],
            )
            (stored,) = self._db.execute(
                "SELECT reply FROM entries WHERE id = ?", (release.id,)
            ).fetchone()
        if price:
            self._durable().result()  # the charge on the disk before the answer leaves
        return SharedRelease(
            release.id, release.time, release.cost, Reply.stored(stored), charged, charged_to
        )

    def _releases_of(
        self, dataset: str, replay_key: str, user: str, mine: frozenset[str]
    ) -> list[_Served]:
        """Every release of ``replay_key`` on ``dataset``, first first, with what of the
        asker's it counts against: which of their groups ``mine`` (charged when it was
        released, or when served to a member who had not learned it), and whether
        ``user`` (its own user, or one charged when served it: a zero-cost replay row,
        a user's own replay or one served free by an older gate, counts nowhere).

        Read by three indexed lookups, never the stored replies: the key's releases
        (a few), the user's own rows of the key, and the asker's groups' charges among
        the key's rows; none reads a group's or the dataset's whole history, and
        nothing is decided per row in Python."""
        rows = self._db.execute(
            "SELECT id, time, user, epsilon, delta, rho FROM entries"
            " WHERE dataset = ? AND replay_key = ? AND status = ? ORDER BY id",
            (dataset, replay_key, RELEASED),
        ).fetchall()
        if not rows:
            return []
        paid = {
            source
            for (source,) in self._db.execute(
                "SELECT DISTINCT source FROM entries INDEXED BY entries_replay WHERE user = ?"
                " AND dataset = ? AND replay_key = ? AND status = ? AND source IS NOT NULL"
                " AND (epsilon > 0 OR delta > 0 OR rho > 0)",
                (user, dataset, replay_key, REPLAYED),
            )
        }
        counted: dict[int, set[str]] = {}
        if mine:
            marks = ", ".join("?" * len(mine))
            for release, group in self._db.execute(
                # The key's rows first (CROSS JOIN keeps that order), each looked up in
                # charged_groups by its id: the other way round would read every
                # charge of the asker's groups, a history that only grows.
                "SELECT DISTINCT COALESCE(e.source, e.id), g.grp FROM entries AS e"
                " CROSS JOIN charged_groups AS g ON g.entry_id = e.id WHERE g.dataset = ?"
                f" AND g.grp IN ({marks}) AND e.dataset = ? AND e.replay_key = ?"
                " AND e.status IN (?, ?)",
                (dataset, *sorted(mine), dataset, replay_key, RELEASED, REPLAYED),
            ):
                counted.setdefault(release, set()).add(group)
        return [
            _Served(
                row["id"],
                row["time"],
                Cost(row["epsilon"], row["delta"], row["rho"]),
                counted.get(row["id"], set()),
                {row["user"]} | ({user} if row["id"] in paid else set()),
            )
            for row in rows
        ]

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
        """The reply a released or replayed entry gave (a replay: the release it served,
        the user's own or, shared, another's)."""
        with self._lock:
            row = self._db.execute(
                "SELECT reply FROM entries WHERE status = ? AND id = COALESCE("
                "(SELECT source FROM entries WHERE id = ?), (SELECT MAX(r.id)"
                " FROM entries AS r JOIN entries AS e ON r.user = e.user"
                " AND r.dataset = e.dataset AND r.replay_key = e.replay_key"
                " WHERE e.id = ? AND r.id <= e.id AND r.status = ?))",
                (RELEASED, entry_id, entry_id, RELEASED),
            ).fetchone()
        return None if row is None else Reply.stored(row["reply"]).json()

    def record_replay(
        self,
        *,
        user: str,
        dataset: str,
        notebook: str,
        sql: str,
        replay_key: str,
        source: int | None = None,
    ) -> None:
        """An audit line for an answer served again; it costs nothing. ``source``: the
        release it served, when that was another user's (a shared release)."""
        with self._lock, self._transaction(durable=False):
            self._db.execute(
                "INSERT INTO entries (time, user, dataset, notebook, epsilon, delta, rho, sql,"
                " replay_key, status, source) VALUES (?, ?, ?, ?, 0, 0, 0, ?, ?, ?, ?)",
                (_text(self._clock()), user, dataset, notebook, sql, replay_key, REPLAYED, source),
            )

    def now(self) -> datetime:
        """The ledger's time (UTC), which renewals' periods are read from."""
        return self._clock()

    def standing(self, limits: Sequence[tuple[Scope, Budget]]) -> list[tuple[Cost, Budget]]:
        """What each scope spent, and its limit (the policy's ``base`` plus grants),
        read together; a renewing budget whose period ended reads as renewed."""
        when = self._clock()
        with self._lock:
            for dataset in {scope.dataset for scope, _ in limits}:
                self._refresh(dataset)
            return [self._standing(scope, base, when)[:2] for scope, base in limits]

    def spent(self, user: str, dataset: str, notebook: str | None = None) -> Cost:
        """What ``user`` spent on ``dataset``, in all notebooks or in one (since the
        last reset; renewals aside)."""
        scope = (
            Scope.user(dataset, user)
            if notebook is None
            else Scope.of_notebook(dataset, user, notebook)
        )
        with self._lock:
            return self._tally(scope).spent()

    def notebooks(self, dataset: str, user: str | None = None) -> list[tuple[str, str]]:
        """Each (user, notebook) the log names on ``dataset`` (a user's own admin rows
        as notebook ``WHOLE_USER``), sorted: the users' and notebooks' budgets there is
        something to show of, read without the rows themselves."""
        where, args = "dataset = ? AND scope = ''", [dataset]
        if user is not None:
            where += " AND user = ?"
            args.append(user)
        with self._lock:
            rows = self._db.execute(
                f"SELECT DISTINCT user, notebook FROM entries WHERE {where}"
                " ORDER BY user, notebook",
                args,
            ).fetchall()
        return [(row["user"], row["notebook"]) for row in rows]

    def history(
        self,
        *,
        user: str | None = None,
        dataset: str | None = None,
        notebook: str | None = None,
        status: str | None = None,
        limit: int | None = None,
        refusals: bool = True,
    ) -> list[dict[str, object]]:
        """Audit rows, newest first; the stored replies are not part of them. Each row
        names the budget scope of an admin action (``scope``: empty for a user's or a
        notebook's, as before scopes), for a charge the groups it counted for, and for
        a refusal its reason; ``refusals=False`` leaves refusals out (a user's own
        history shows what was charged or replayed)."""
        where, args = [], []
        if not refusals:
            where.append("e.status <> ?")
            args.append(REFUSED)
        for column, value in (
            ("user", user),
            ("dataset", dataset),
            ("notebook", notebook),
            ("status", status),
        ):
            if value is not None:
                where.append(f"e.{column} = ?")
                args.append(value)
        sql = (
            "SELECT e.id, e.time, e.user, e.dataset, e.notebook, e.sql, e.epsilon, e.delta,"
            " e.rho, e.status, e.scope, e.source, e.reason, (SELECT group_concat(g.grp,"
            " char(31)) FROM charged_groups AS g WHERE g.entry_id = e.id) AS groups"
            " FROM entries AS e"
            + (" WHERE " + " AND ".join(where) if where else "")
            + " ORDER BY e.id DESC"
        )
        if limit is not None:
            sql += " LIMIT ?"
            args.append(int(limit))
        with self._lock:
            rows = self._db.execute(sql, args).fetchall()
        return [
            {
                **{k: v for k, v in dict(row).items() if k != "groups"},
                "groups": row["groups"].split(GROUP_SEPARATOR) if row["groups"] else [],
                "replayed": row["status"] == REPLAYED,
            }
            for row in rows
        ]

    def close(self) -> None:
        if self._flusher is not None:
            self._flusher.close()  # every pending flush is done first
        with self._lock:
            self._db.close()

    def _standing(
        self, scope: Scope, base: Budget, now: datetime
    ) -> tuple[Cost, Budget, tuple[str, str] | None]:
        """A scope's spending and limit, and the renewal row a charge now must write
        first (whose period's spending then reads as none); its dataset refreshed
        (``_refresh``) by the caller."""
        tally = self._tally(scope, refresh=False)
        due = renewal_due(tally, base, now)
        renewed = due is not None and due[0] == RENEWED
        return (Cost(0.0) if renewed else tally.spent(), tally.limit(base), due)

    def _tally(self, scope: Scope, refresh: bool = True) -> Tally:
        """A scope's spending and grants since its last reset, brought up to date with the
        rows written since it was last read, by this process or any other.

        Summing a scope's whole history on every query made each query cost time in
        proportion to it (6.5 ms a query after 1,000 queries, 82 ms after 10,000, with
        the ledger's lock held). The log only grows: rows are appended with increasing
        ids, and the one update a row receives (``charged`` to ``released`` or
        ``failed``) keeps it spending the same. So the totals over the rows up to some
        id never change, and each read adds only the rows after it: one read of the
        dataset's new rows brings every scope of it read before up to date. The sums
        are exact, rounded once when read (``accounting.Composition``: ``math.fsum``'s sum)."""
        cursor = self._cursors.setdefault(scope.dataset, _Cursor())
        tally = cursor.tallies.get(scope)
        if tally is None:  # a scope first read here: its rows up to where the others are
            tally = cursor.tallies[scope] = Tally()
            for row in self._scope_rows(scope, cursor.seen):
                _count(row, scope, tally)
        if refresh:
            self._refresh(scope.dataset)
        return tally

    def _refresh(self, dataset: str) -> None:
        """Bring every scope of ``dataset`` read before up to date with the rows written
        since, by the scopes each row counts for: one read, however many scopes a
        debit checks (``refresh=False`` for the others)."""
        cursor = self._cursors.setdefault(dataset, _Cursor())
        for row in self._rows("e.dataset = ? AND e.id > ?", (dataset, cursor.seen)):
            cursor.seen = row["id"]
            if row["status"] in SPENDING:
                for target in charged_to(row, dataset):
                    if (each := cursor.tallies.get(target)) is not None:
                        each.spend(row)
            elif row["status"] in ADMIN:
                for target, each in cursor.tallies.items():
                    _count(row, target, each)

    def _scope_rows(self, scope: Scope, upto: int) -> list[sqlite3.Row]:
        """The rows up to id ``upto`` that may count for ``scope`` (``_count`` decides)."""
        if scope.kind == ScopeKind.DATASET:
            return self._rows("e.dataset = ? AND e.id <= ?", (scope.dataset, upto))
        if scope.kind == ScopeKind.GROUP:
            return self._rows(
                "e.dataset = ? AND e.id <= ? AND (e.id IN (SELECT entry_id FROM charged_groups"
                " WHERE dataset = ? AND grp = ?) OR (e.scope = 'group' AND e.user = ?))",
                (scope.dataset, upto, scope.dataset, scope.holder, scope.holder),
            )
        return self._rows(
            "e.user = ? AND e.dataset = ? AND e.id <= ?", (scope.holder, scope.dataset, upto)
        )

    def _rows(self, where: str, args: tuple[object, ...]) -> list[sqlite3.Row]:
        return self._db.execute(
            "SELECT e.id, e.user, e.notebook, e.status, e.epsilon, e.delta, e.rho, e.scope,"
            f" CASE WHEN e.status IN ({', '.join('?' * len(ADMIN))}) THEN e.sql END AS sql,"
            " (SELECT group_concat(g.grp, char(31)) FROM charged_groups AS g"
            f" WHERE g.entry_id = e.id) AS groups FROM entries AS e WHERE {where} ORDER BY e.id",
            (*ADMIN, *args),
        ).fetchall()

    # Admin actions (``dpmagic budget grant|reset``, the console). A grant raises a
    # limit by an (ε, δ) amount; a reset forgets what was spent and granted before
    # it. Both are rows of the audit log, so the log alone explains every budget.

    def grant(self, scope: Scope, amount: Budget, note: str) -> None:
        """Raise ``scope``'s limit by ``amount``."""
        with self._lock, self._transaction():
            self._insert_admin(scope, amount, GRANTED, note, _text(self._clock()))

    def reset(self, scope: Scope, note: str) -> None:
        """Start ``scope``'s spending from zero (a user's: each notebook's too).

        Released answers stay replayable: they were already paid for.
        """
        with self._lock, self._transaction(durable=False):
            self._insert_admin(scope, Budget(0.0), RESET, note, _text(self._clock()))

    def limit(self, scope: Scope, base: Budget) -> Budget:
        """``base`` (the policy's limit) plus what was granted since the last reset."""
        with self._lock:
            return self._tally(scope).limit(base)

    def _insert_admin(
        self, scope: Scope, amount: Budget, status: str, note: str, when: str
    ) -> None:
        kind, holder, notebook = scope.row_columns()
        self._db.execute(
            "INSERT INTO entries (time, user, dataset, notebook, epsilon, delta, rho, sql,"
            " status, scope) VALUES (?, ?, ?, ?, ?, ?, 0, ?, ?, ?)",
            (
                when,
                holder,
                scope.dataset,
                notebook,
                amount.epsilon,
                amount.delta,
                note,
                status,
                kind,
            ),
        )

    def _transaction(self, durable: bool = True) -> _Immediate:
        return _Immediate(self._db, durable)

    def timeline(self, scope: Scope, base: Budget) -> list[tuple[str, Cost, Budget]]:
        """When ``scope``'s spending or limit (``base`` plus grants) changed, and to what,
        oldest first: every row that counts for it, counted as every tally counts
        (``_count``), read afresh from the log. The owner's console charts it."""
        tally = Tally()
        last = (tally.spent(), tally.limit(base))
        points: list[tuple[str, Cost, Budget]] = []
        with self._lock:
            (upto,) = self._db.execute("SELECT COALESCE(MAX(id), 0) FROM entries").fetchone()
            times = dict(
                self._db.execute(
                    "SELECT id, time FROM entries WHERE dataset = ? AND id <= ?",
                    (scope.dataset, upto),
                ).fetchall()
            )
            for row in self._scope_rows(scope, upto):
                _count(row, scope, tally)
                now = (tally.spent(), tally.limit(base))
                if now != last:
                    points.append((times[row["id"]], *now))
                    last = now
        return points


def _count(row: sqlite3.Row, scope: Scope, tally: Tally) -> None:
    """Count one row for ``scope``, if it counts there: a charge for each scope it was
    charged to; an admin row for its own scope, and a user's reset for each of the
    user's notebooks too (a notebook's own reset never gives back the user's budget)."""
    if row["status"] in SPENDING:
        if scope in charged_to(row, scope.dataset):
            tally.spend(row)
    elif row["status"] in ADMIN:
        target = admin_target(row, scope.dataset)
        cascade = (
            row["status"] == RESET
            and target.kind == ScopeKind.USER
            and scope.kind == ScopeKind.NOTEBOOK
            and scope.holder == target.holder
        )
        if target == scope or cascade:
            tally.admin(row)


@dataclass
class _Cursor:
    """The tallies of one dataset's scopes, all brought up to row id ``seen``."""

    seen: int = 0
    tallies: dict[Scope, Tally] = field(default_factory=dict)


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


def _text(when: datetime) -> str:
    """A time as the ledger keeps it: ISO 8601 in UTC, to the microsecond."""
    return when.isoformat(timespec="microseconds")
