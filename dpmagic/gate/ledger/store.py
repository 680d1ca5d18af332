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

import sqlite3
import threading
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

from dpmagic.gate.dp.accounting import Accountant, Cost
from dpmagic.gate.failures import OverBudget, required
from dpmagic.gate.ledger.flush import Flusher
from dpmagic.gate.ledger.replays import (
    ReplayKey,
    Served,
    SharedRelease,
    fresh_because,
    releases_of,
)
from dpmagic.gate.ledger.schema import RECENT_FAILURES, Immediate, open_ledger
from dpmagic.gate.ledger.scopes import (
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
    charged_to,
    renewal_due,
)
from dpmagic.gate.ledger.tallies import Cursor, count
from dpmagic.gate.policy import Budget
from dpmagic.gate.reply import Reply


@dataclass(frozen=True)
class Charge:
    """A debit: its ledger row, and when that row is on the disk."""

    id: int
    durable: Future[None]


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
        self._lock = threading.Lock()
        self._cursors: dict[str, Cursor] = {}
        self._db, wal = open_ledger(self.path)
        # Where the file system cannot keep a WAL (SQLite then keeps its own journal),
        # debits commit FULL and are on the disk when they return.
        self._flusher = Flusher(self.path) if wal else None

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
        why = fresh_because(self._db, user, scope.dataset, replay_key)
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
            f"needs {need} but only {left[scope]} is left {where}{because}", scope.named()
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
        (``reply.py``), so the same query can be replayed for free; returns
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
            (failed,) = self._db.execute(
                RECENT_FAILURES, (user, dataset, since, user, dataset)
            ).fetchone()
        return int(failed)

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
            releases = releases_of(self._db, dataset, replay_key, user, mine)
            chosen: tuple[int, Served, frozenset[str]] | None = None
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
            charged = Cost(0.0)
            charged_to: tuple[Scope, ...] = ()
            standing: list[tuple[Scope, Cost, Budget, tuple[str, str] | None]] = []
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

    def fresh_because(self, user: str, dataset: str, replay_key: str) -> str | None:
        """Why a query with no release under ``replay_key`` is answered afresh, when
        the same query was released to ``user`` before under other versions of the
        data or the policy (``DATA_CHANGED``, ``POLICY_CHANGED``, ``BOTH_CHANGED``;
        ``UNVERSIONED`` for a release of a ledger from before versions); None if it
        never was."""
        with self._lock:
            return fresh_because(self._db, user, dataset, replay_key)

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
        where: list[str] = []
        args: list[object] = []
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
        cursor = self._cursors.setdefault(scope.dataset, Cursor())
        tally = cursor.tallies.get(scope)
        if tally is None:  # a scope first read here: its rows up to where the others are
            tally = cursor.tallies[scope] = Tally()
            for row in self._scope_rows(scope, cursor.seen):
                count(row, scope, tally)
        if refresh:
            self._refresh(scope.dataset)
        return tally

    def _refresh(self, dataset: str) -> None:
        """Bring every scope of ``dataset`` read before up to date with the rows written
        since, by the scopes each row counts for: one read, however many scopes a
        debit checks (``refresh=False`` for the others)."""
        cursor = self._cursors.setdefault(dataset, Cursor())
        for row in self._rows("e.dataset = ? AND e.id > ?", (dataset, cursor.seen)):
            cursor.seen = row["id"]
            if row["status"] in SPENDING:
                for target in charged_to(row, dataset):
                    if (each := cursor.tallies.get(target)) is not None:
                        each.spend(row)
            elif row["status"] in ADMIN:
                for target, each in cursor.tallies.items():
                    count(row, target, each)

    def _scope_rows(self, scope: Scope, upto: int) -> list[sqlite3.Row]:
        """The rows up to id ``upto`` that may count for ``scope`` (``tallies.count`` decides)."""
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

    def _transaction(self, durable: bool = True) -> Immediate:
        return Immediate(self._db, durable)

    def timeline(self, scope: Scope, base: Budget) -> list[tuple[str, Cost, Budget]]:
        """When ``scope``'s spending or limit (``base`` plus grants) changed, and to what,
        oldest first: every row that counts for it, counted as every tally counts
        (``tallies.count``), read afresh from the log. The owner's console charts it."""
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
                count(row, scope, tally)
                now = (tally.spent(), tally.limit(base))
                if now != last:
                    points.append((times[row["id"]], *now))
                    last = now
        return points


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
