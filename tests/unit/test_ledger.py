"""The budget ledger on real SQLite files: caps, refusals that write nothing,
races between threads and between processes, durability, replay, modes."""

from __future__ import annotations

import multiprocessing
import os
import sqlite3
import stat
import threading
import uuid
from concurrent.futures import Future
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dpmagic.gate.dp.accounting import Cost, PureAccountant
from dpmagic.gate.failures import OverBudget
from dpmagic.gate.ledger.flush import Flusher
from dpmagic.gate.ledger.scopes import Scope
from dpmagic.gate.ledger.store import Charge, Ledger
from dpmagic.gate.policy import Budget
from dpmagic.gate.reply import Reply
from dpmagic.protocol import QueryReply
from tests.budgets import user_limits

USER_CAP = Budget(1.0)
NOTEBOOK_CAP = Budget(0.6)


def open_ledger(path: Path) -> Ledger:
    return Ledger(path, PureAccountant())


def charge(
    ledger: Ledger,
    epsilon: float,
    *,
    notebook: str = "a.ipynb",
    user: str = "alice",
    user_cap: Budget = USER_CAP,
    notebook_cap: Budget = NOTEBOOK_CAP,
    key: str | None = None,
) -> Charge:
    return ledger.debit(
        user=user,
        dataset="d",
        notebook=notebook,
        cost=Cost(epsilon),
        limits=user_limits("d", user, notebook, user_cap, notebook_cap),
        sql=f"SELECT COUNT(*) -- {epsilon}",
        replay_key=key,
    )


@pytest.fixture
def ledger(tmp_path: Path):
    led = open_ledger(tmp_path / "state" / "ledger.sqlite3")
    yield led
    led.close()


def test_a_debit_within_budget_is_recorded(ledger: Ledger) -> None:
    debit = charge(ledger, 0.25)
    assert ledger.spent("alice", "d") == Cost(0.25)
    assert ledger.spent("alice", "d", "a.ipynb") == Cost(0.25)
    assert ledger.spent("alice", "d", "other.ipynb") == Cost(0.0)
    assert ledger.spent("bob", "d") == Cost(0.0)
    [row] = ledger.history()
    assert row["id"] == debit.id
    assert row["status"] == "charged" and row["replayed"] is False
    assert (row["user"], row["dataset"], row["notebook"]) == ("alice", "d", "a.ipynb")
    assert row["epsilon"] == 0.25 and row["delta"] == 0.0
    assert row["sql"] == "SELECT COUNT(*) -- 0.25"


def test_the_notebook_cap_refuses_and_writes_nothing(ledger: Ledger) -> None:
    charge(ledger, 0.5)
    with pytest.raises(OverBudget) as refused:
        charge(ledger, 0.2)
    assert str(refused.value) == (
        "needs ε=0.2 but only ε=0.1 is left for notebook 'a.ipynb' (ε=0.5 left for user alice)"
    )
    assert refused.value.kind == "budget"
    assert len(ledger.history()) == 1
    assert ledger.spent("alice", "d") == Cost(0.5)


def test_new_notebooks_cannot_mint_budget_beyond_the_user_cap(ledger: Ledger) -> None:
    charge(ledger, 0.6, notebook="a.ipynb")
    charge(ledger, 0.3, notebook="b.ipynb")
    with pytest.raises(OverBudget) as refused:
        charge(ledger, 0.2, notebook="c.ipynb")
    assert str(refused.value) == "needs ε=0.2 but only ε=0.1 is left for user alice on dataset 'd'"
    assert ledger.spent("alice", "d", "c.ipynb") == Cost(0.0)
    charge(ledger, 0.1, notebook="c.ipynb")
    assert ledger.spent("alice", "d").epsilon == pytest.approx(1.0)
    # Users do not share a budget.
    charge(ledger, 0.6, user="bob")


def test_exactly_ten_debits_of_a_tenth_fit_one(ledger: Ledger) -> None:
    for _ in range(10):
        charge(ledger, 0.1, notebook_cap=USER_CAP)
    with pytest.raises(OverBudget):
        charge(ledger, 0.1, notebook_cap=USER_CAP)
    assert len(ledger.history()) == 10


def test_a_failure_stays_charged(ledger: Ledger) -> None:
    debit = charge(ledger, 0.4, key="k")
    ledger.record_failure(debit)
    assert ledger.spent("alice", "d", "a.ipynb") == Cost(0.4)
    assert ledger.history()[0]["status"] == "failed"
    assert ledger.find_release("alice", "d", "k") is None


def test_a_refusal_is_kept_with_its_reason_and_counted_by_no_budget(ledger: Ledger) -> None:
    """A query refused before its debit: in the owner's history with why, at no cost, in
    no tally, timeline or failure count, and not in the user's own history."""
    charge(ledger, 0.5)
    with pytest.raises(OverBudget) as refused:
        charge(ledger, 0.2)
    ledger.record_refusal(
        user="alice", dataset="d", notebook="a.ipynb", sql="SELECT COUNT(*) -- 0.2",
        reason=refused.value.message,
    )  # fmt: skip
    row, first = ledger.history()
    assert (row["status"], row["epsilon"], row["sql"]) == ("refused", 0.0, "SELECT COUNT(*) -- 0.2")
    assert row["reason"] == str(refused.value) and first["reason"] is None
    assert [r["status"] for r in ledger.history(refusals=False)] == ["charged"]
    assert ledger.spent("alice", "d", "a.ipynb") == Cost(0.5)
    assert ledger.recent_failures("alice", "d", 3600) == 0
    points = ledger.timeline(Scope.user("d", "alice"), USER_CAP)
    assert [p[1] for p in points] == [Cost(0.5)]
    assert [r["status"] for r in ledger.history(status="refused")] == ["refused"]


def test_replay_lookup_and_audit(ledger: Ledger) -> None:
    first = charge(ledger, 0.1, key="k1")
    ledger.record_release(first, Reply.of(QueryReply(rows=[[1]], dataset="first")))
    second = charge(ledger, 0.1, key="k1", notebook="b.ipynb")
    ledger.record_release(second, Reply.of(QueryReply(rows=[[2]], dataset="second")))
    found = ledger.find_release("alice", "d", "k1").json()
    assert (found["rows"], found["dataset"]) == ([[2]], "second")
    assert ledger.find_release("alice", "d", "k2") is None
    assert ledger.find_release("bob", "d", "k1") is None
    assert ledger.find_release("alice", "other", "k1") is None

    ledger.record_replay(
        user="alice", dataset="d", notebook="c.ipynb", sql="again", replay_key="k1"
    )
    assert ledger.spent("alice", "d").epsilon == pytest.approx(0.2)
    assert ledger.spent("alice", "d", "c.ipynb") == Cost(0.0)
    newest = ledger.history()[0]
    assert newest["replayed"] is True and newest["status"] == "replayed"
    assert newest["sql"] == "again" and newest["epsilon"] == 0.0
    assert [r["status"] for r in ledger.history()] == ["replayed", "released", "released"]
    assert [r["notebook"] for r in ledger.history(notebook="b.ipynb")] == ["b.ipynb"]
    assert len(ledger.history(user="alice", dataset="d", limit=2)) == 2
    assert ledger.history(user="bob") == []


def test_charges_survive_reopening(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    first = open_ledger(path)
    released = charge(first, 0.3, key="k")
    first.record_release(released, Reply.of(QueryReply(rows=[[7]])))
    charge(first, 0.2, notebook="b.ipynb")
    first.close()

    again = open_ledger(path)
    try:
        assert again.spent("alice", "d").epsilon == pytest.approx(0.5)
        assert again.find_release("alice", "d", "k").json()["rows"] == [[7]]
        with pytest.raises(OverBudget):
            charge(again, 0.6)
    finally:
        again.close()


def test_files_are_private(tmp_path: Path) -> None:
    path = tmp_path / "state" / "ledger.sqlite3"
    led = open_ledger(path)
    try:
        charge(led, 0.1)
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        sidecars = [path.with_name(path.name + s) for s in ("-wal", "-shm")]
        assert all(p.exists() for p in sidecars)  # WAL mode is on
        assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in sidecars)
    finally:
        led.close()


def _race(ledger: Ledger, barrier, attempts: int) -> int:
    """Debit 0.1 ``attempts`` times after everyone is ready; count successes."""
    barrier.wait()
    wins = 0
    for _ in range(attempts):
        try:
            charge(ledger, 0.1, notebook_cap=USER_CAP)
            wins += 1
        except OverBudget:
            pass
    return wins


def test_racing_threads_never_overspend(ledger: Ledger) -> None:
    threads, attempts = 12, 3
    barrier = threading.Barrier(threads)
    wins: list[int] = []
    workers = [
        threading.Thread(target=lambda: wins.append(_race(ledger, barrier, attempts)))
        for _ in range(threads)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert sum(wins) == 10
    assert ledger.spent("alice", "d").epsilon <= USER_CAP.epsilon + 1e-9
    assert len(ledger.history()) == 10


def _process_worker(path: str, barrier, results, attempts: int) -> None:
    led = open_ledger(Path(path))
    try:
        results.put(_race(led, barrier, attempts))
    finally:
        led.close()


@pytest.mark.search  # eight spawned processes; the racing threads above stay in the default run
def test_racing_processes_never_overspend(tmp_path: Path) -> None:
    path = tmp_path / "ledger.sqlite3"
    open_ledger(path).close()  # create the file and schema once, before the race
    processes, attempts = 8, 3
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(processes)
    results = ctx.Queue()
    workers = [
        ctx.Process(target=_process_worker, args=(str(path), barrier, results, attempts))
        for _ in range(processes)
    ]
    for w in workers:
        w.start()
    wins = [results.get(timeout=120) for _ in workers]
    for w in workers:
        w.join(timeout=60)
        assert w.exitcode == 0
    assert sum(wins) == 10

    led = open_ledger(path)
    try:
        assert led.spent("alice", "d").epsilon <= USER_CAP.epsilon + 1e-9
        assert len(led.history()) == 10
    finally:
        led.close()


_NOTEBOOKS = ["a.ipynb", "b.ipynb", "c.ipynb"]
_ACTIONS = st.lists(
    st.tuples(
        st.sampled_from(["debit", "grant", "reset", "refuse"]),
        st.sampled_from([None, *_NOTEBOOKS]),  # None: the whole user (a debit: a.ipynb)
        st.sampled_from([0, 1]),  # which of two handles on the file (two processes)
        st.sampled_from([0.125, 0.25, 0.5]),
        st.sampled_from([None, *_NOTEBOOKS]),  # the scope read after it (None: none)
    ),
    max_size=25,
)


def _scope(notebook: str | None) -> Scope:
    """Alice's budget on ``d`` (None), or one of her notebooks'."""
    return (
        Scope.user("d", "alice") if notebook is None else Scope.of_notebook("d", "alice", notebook)
    )


def _tallies_agree(tmp_path: Path, actions) -> None:
    """Whatever mix of debits, grants, resets and refusals two handles on one ledger
    write, and
    whenever each scope is first read, each handle's incremental standing of the user
    and of a notebook equals the one a handle opened afresh computes from the whole
    log (spending, and limits with grants)."""
    path = tmp_path / f"{uuid.uuid4().hex}.sqlite3"
    handles = [open_ledger(path), open_ledger(path)]
    big = Budget(100.0)

    def check(notebook: str) -> None:
        fresh = open_ledger(path)
        try:
            expected = fresh.standing(user_limits("d", "alice", notebook, big, big))
        finally:
            fresh.close()
        for led in handles:
            assert led.standing(user_limits("d", "alice", notebook, big, big)) == expected

    try:
        for action, notebook, which, amount, probe in actions:
            led = handles[which]
            if action == "debit":
                nb = notebook or "a.ipynb"
                charge(led, amount, notebook=nb, user_cap=big, notebook_cap=big)
            elif action == "grant":
                led.grant(_scope(notebook), Budget(amount), "")
            elif action == "refuse":
                led.record_refusal(user="alice", dataset="d", notebook=notebook or "a.ipynb",
                                   sql="SELECT 1", reason="over budget")  # fmt: skip
            else:
                led.reset(_scope(notebook), "")
            if probe is not None:
                check(probe)
        for nb in _NOTEBOOKS:
            check(nb)
    finally:
        for led in handles:
            led.close()


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(actions=_ACTIONS)
def test_running_tallies_agree_with_a_fresh_reading(tmp_path: Path, actions) -> None:
    """A few examples in the default run; the search below tries 80."""
    _tallies_agree(tmp_path, actions)


@pytest.mark.search
@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(actions=_ACTIONS)
def test_running_tallies_agree_with_a_fresh_reading_searched(tmp_path: Path, actions) -> None:
    _tallies_agree(tmp_path, actions)


# -- the debit's flush to the disk, off the query's path ------------------------------


class _HeldFlushes:
    """``os.fdatasync`` held until ``go`` is set; records, for each flush of the log,
    how many charges another connection could read when it began."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.go = threading.Event()
        self.seen: list[int] = []
        self._real = os.fdatasync

    def __call__(self, fd: int) -> None:
        assert os.readlink(f"/proc/self/fd/{fd}") == f"{self.path}-wal"
        reader = sqlite3.connect(self.path)
        try:
            self.seen.append(reader.execute("SELECT COUNT(*) FROM entries").fetchone()[0])
        finally:
            reader.close()
        assert self.go.wait(10)
        self._real(fd)


def _waits_for_the_flush(ledger: Ledger, held: _HeldFlushes) -> bool:
    """Whether recording a charge's release waits for its flush to the disk."""
    debit = charge(ledger, 0.1, key="k")
    recorded = threading.Event()
    worker = threading.Thread(
        target=lambda: (ledger.record_release(debit, Reply.of(QueryReply(rows=[]))), recorded.set())
    )
    worker.start()
    waited = not recorded.wait(0.3)
    held.go.set()
    worker.join(10)
    return waited and recorded.is_set() and debit.durable.done()


@pytest.fixture
def held(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> _HeldFlushes:
    flushes = _HeldFlushes(tmp_path / "state" / "ledger.sqlite3")
    monkeypatch.setattr(os, "fdatasync", flushes)
    return flushes


def test_a_debit_is_readable_at_once_and_released_only_once_flushed(
    ledger: Ledger, held: _HeldFlushes
) -> None:
    debit = charge(ledger, 0.1)
    # Written: every process reads it (and a crash of the gate keeps it) while the
    # flush is still held.
    reader = sqlite3.connect(held.path)
    assert reader.execute("SELECT id FROM entries").fetchall() == [(debit.id,)]
    reader.close()
    assert not debit.durable.done()
    held.go.set()
    debit.durable.result(10)
    assert held.seen == [1]  # the flush began after the commit


def test_release_and_failure_wait_for_the_flush_and_a_broken_ledger_is_caught(
    tmp_path: Path, held: _HeldFlushes
) -> None:
    class Broken(Ledger):  # hands out charges as if already on the disk
        def _durable(self):
            super()._durable()
            return _done()

    for kind, expected in ((Ledger, True), (Broken, False)):
        held.go.clear()
        led = kind(held.path, PureAccountant())
        try:
            assert _waits_for_the_flush(led, held) is expected, kind.__name__
        finally:
            led.close()
    held.go.clear()
    led = Ledger(held.path, PureAccountant())
    try:
        debit = charge(led, 0.1)
        failed = threading.Thread(target=led.record_failure, args=(debit,))
        failed.start()
        failed.join(0.3)
        assert failed.is_alive()
        held.go.set()
        failed.join(10)
        assert led.history()[0]["status"] == "failed"
    finally:
        led.close()


def _done() -> Future[None]:
    done: Future[None] = Future()
    done.set_result(None)
    return done


def test_debits_queued_behind_a_flush_share_the_next_one(
    ledger: Ledger, held: _HeldFlushes
) -> None:
    first = charge(ledger, 0.1)
    while not held.seen:  # the first flush has begun and is held
        threading.Event().wait(0.01)
    rest = [charge(ledger, 0.1) for _ in range(5)]
    held.go.set()
    for debit in (first, *rest):
        debit.durable.result(10)
    # One flush for the first debit, one for the five written while it was held.
    assert held.seen == [1, 6]


def test_without_a_write_ahead_log_a_debit_is_flushed_in_its_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A file system that cannot keep a WAL: SQLite keeps its rollback journal.
    connect = sqlite3.connect

    class NoWal(sqlite3.Connection):
        def execute(self, sql: str, *args):
            if sql == "PRAGMA journal_mode = WAL":
                sql = "PRAGMA journal_mode = DELETE"
            return super().execute(sql, *args)

    monkeypatch.setattr(sqlite3, "connect", lambda *a, **k: connect(*a, **k, factory=NoWal))
    flushes: list[int] = []
    monkeypatch.setattr(os, "fdatasync", flushes.append)
    led = open_ledger(tmp_path / "state" / "ledger.sqlite3")
    try:
        assert led._db.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
        debit = charge(led, 0.1)
        assert debit.durable.done() and flushes == []  # SQLite flushed in the commit
        led.record_release(debit, Reply.of(QueryReply(rows=[])))
        assert led.history()[0]["status"] == "released"
    finally:
        led.close()


def test_a_log_checkpointed_away_is_flushed_in_the_database_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When the last other connection has copied the log into the database file and
    deleted it, the commit is in the database file: that file is flushed, and the
    folder, since the file flushed is not the one flushed before."""
    synced: list[str] = []
    monkeypatch.setattr(
        os, "fdatasync", lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}"))
    )
    monkeypatch.setattr(os, "fsync", lambda fd: synced.append(os.readlink(f"/proc/self/fd/{fd}")))
    database = tmp_path / "ledger.sqlite3"
    database.write_bytes(b"")
    flusher = Flusher(database)
    try:
        flusher.committed().result(10)
    finally:
        flusher.close()
    assert synced == [str(database), str(tmp_path)]


def _steps(ledger: Ledger, work) -> int:
    """SQLite virtual-machine steps ``work`` takes on ``ledger``: a count of the rows
    and index entries it visits, where a timing would be a benchmark's noise."""
    steps = 0

    def step() -> int:
        nonlocal steps
        steps += 1
        return 0

    ledger._db.set_progress_handler(step, 1)
    try:
        work()
    finally:
        ledger._db.set_progress_handler(None, 1)
    return steps


def _a_query(ledger: Ledger, i: int) -> None:
    """The ledger's part of one fresh query: the failure count, the debit, the stored
    reply, the replay lookup and the budget view."""
    ledger.recent_failures("alice", "d", 3600)
    debit = charge(ledger, 0.001, user_cap=Budget(1e6), notebook_cap=Budget(1e6), key=f"k{i}")
    ledger.record_release(debit, Reply.of(QueryReply(rows=[[i]])))
    ledger.find_release("alice", "d", f"k{i}")
    ledger.standing(user_limits("d", "alice", "a.ipynb", Budget(1e6), Budget(1e6)))


def test_a_querys_ledger_work_does_not_grow_with_the_users_history(tmp_path: Path) -> None:
    """Each query asks the ledger the same questions; the rows and index entries they
    visit must not grow with what the user asked before (a failure count that read
    every earlier row took 0.76 ms after 1,000 queries). Counted in SQLite's steps,
    after 20 and after 400 earlier queries, some of them failed and one reset."""
    work = {}
    for history in (20, 400):
        led = open_ledger(tmp_path / str(history) / "ledger.sqlite3")
        for i in range(history):
            debit = charge(led, 0.001, user_cap=Budget(1e6), notebook_cap=Budget(1e6))
            if i % 5 == 0:
                led.record_failure(debit)
            else:
                led.record_release(debit, Reply.of(QueryReply(rows=[[i]])))
        led.reset(Scope.user("d", "alice"), "a new term")
        _a_query(led, -1)  # the running tallies are read once, then kept
        work[history] = _steps(led, lambda led=led, i=history: _a_query(led, i))
        led.close()
    assert work[400] <= work[20] * 1.1, work
