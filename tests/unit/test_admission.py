"""Resources after the debit: ``admission.Admission`` (one run per user and dataset;
time counted on the run's share of the engine, ``engines/sharing.py``; memory under
load retried once, holding no one), the random per-run time limit
(``interface.drawn_timeout``), and ``max_resource_failures`` through the engine.

The old rule (a run that ran out while another overlapped it was run again with
the dataset to itself) is kept below as ``ExclusiveRetry``, the broken version the
stall test must catch."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from typing import TypeVar

import pytest
from scipy import stats

from dpmagic.gate import engine as engines
from dpmagic.gate.admission import Admission
from dpmagic.gate.engines import sharing
from dpmagic.gate.engines.deadline import within_limit
from dpmagic.gate.engines.interface import TIMEOUT_JITTER, OutOfResources, drawn_timeout
from dpmagic.gate.engines.sharing import Sharing
from dpmagic.gate.failures import Refused
from dpmagic.gate.ledger.scopes import Scope
from tests.gate_helpers import running_engine

T = TypeVar("T")


class Heavy(Exception):
    """Stands for running out of time or memory."""

    memory = False


class OutOfMemory(Heavy):
    memory = True


class Nobody:
    """An engine that cannot be interrupted (a vector that takes seconds)."""

    def interrupt(self) -> None:
        pass


def _in_thread(fn) -> tuple[threading.Thread, list]:
    out: list = []

    def run() -> None:
        try:
            out.append(fn())
        except Exception as exc:  # the test reads what happened
            out.append(exc)

    t = threading.Thread(target=run)
    t.start()
    return t, out


@dataclass
class ExclusiveRetry:
    """The rule this replaced (the broken version): a run that ran out while another
    overlapped it is run again with the dataset to itself, every new run held. It
    takes the engine's ``locks`` (a user's run lock across worker processes) and leaves
    them: the gates it stands in run one process."""

    locks: object = None
    _changed: threading.Condition = field(default_factory=threading.Condition)
    _running: list[list[bool]] = field(default_factory=list)
    _users: set[str] = field(default_factory=set)
    _alone: bool = False
    _waiting_alone: int = 0

    def run(self, user: str, query: Callable[[], T], resources: type[Exception]) -> T:
        with self._shared(user) as overlapped:
            try:
                return query()
            except resources:
                if not overlapped[0]:
                    raise
        with self._changed:
            self._waiting_alone += 1
            self._changed.wait_for(lambda: not self._running and not self._alone)
            self._waiting_alone -= 1
            self._alone = True
        try:
            return query()
        finally:
            with self._changed:
                self._alone = False
                self._changed.notify_all()

    @contextmanager
    def _shared(self, user: str) -> Iterator[list[bool]]:
        run = [False]
        with self._changed:
            self._changed.wait_for(
                lambda: user not in self._users and not self._alone and not self._waiting_alone
            )
            self._users.add(user)
            for other in self._running:
                other[0] = True
            run[0] = bool(self._running)
            self._running.append(run)
        try:
            yield run
        finally:
            with self._changed:
                self._running.remove(run)
                self._users.discard(user)
                self._changed.notify_all()


SLOW_S = 0.6  # a slow run's time to its deadline, in these tests


def _cheap_waits(admission: Admission | ExclusiveRetry) -> list[float]:
    """While user a's slow runs run out of time one after another (each after
    ``SLOW_S``, beside b's), how long each of b's cheap runs waited to start."""
    stop = threading.Event()

    def slow() -> None:
        time.sleep(SLOW_S)  # its time, then its deadline
        raise Heavy

    def heavy() -> None:
        while not stop.is_set():
            with suppress(Heavy):
                admission.run("a", slow, Heavy)

    t, _ = _in_thread(heavy)
    time.sleep(0.05)
    waits = []
    try:
        end = time.monotonic() + 3 * SLOW_S
        while time.monotonic() < end:
            asked = time.monotonic()
            started = admission.run("b", time.monotonic, Heavy)
            waits.append(started - asked)
            time.sleep(0.005)
    finally:
        stop.set()
        t.join(10)
    return waits


def test_no_user_waits_for_another_users_runs_that_run_out() -> None:
    """The issue's stall: with the old rule each of a's time-outs beside b's queries was
    run again alone, b held meanwhile (its longest wait about ``SLOW_S``); now b never
    waits for a."""
    waits = _cheap_waits(Admission())
    assert len(waits) > 50 and max(waits) < 0.05, max(waits)


@pytest.mark.search  # seconds of sleeping threads: the broken version runs with the searches
def test_the_stall_is_caught_under_the_old_rule() -> None:
    """The same measurement under the old rule (``ExclusiveRetry``) sees b wait for a."""
    broken = _cheap_waits(ExclusiveRetry())
    assert max(broken) > SLOW_S / 2, max(broken)


def test_a_time_failure_is_reported_at_once_never_retried() -> None:
    admission = Admission()
    started, release = threading.Event(), threading.Event()
    t, _ = _in_thread(lambda: admission.run("a", lambda: (started.set(), release.wait(5)), Heavy))
    started.wait(5)
    calls = []

    def runs_out() -> None:
        calls.append(admission.running)
        raise Heavy  # out of time, while a's run was beside it

    with pytest.raises(Heavy):
        admission.run("b", runs_out, Heavy)
    release.set()
    t.join(5)
    assert calls == [2]


def test_a_run_gets_its_limit_on_its_share_of_the_engine() -> None:
    """A run that needs 0.3 s of an engine it has to itself, beside another user's run
    that takes as much of the engine for as long: it gets half the engine, so it takes
    0.6 s of the wall clock, past its 0.45 s limit on the wall clock (the broken
    version, ``Solo``) but within it on its share."""

    def answered(share_out: bool) -> object:
        sharing_ = Sharing()
        mine, theirs = sharing_.join(), sharing_.join()  # two runs in the engine

        def needs() -> str:
            time.sleep(0.6)  # 0.3 s of engine at half of it
            return "answered"

        token = sharing.counted_on(mine if share_out else sharing.Solo())
        with token:
            try:
                return within_limit(needs, 0.45, Nobody(), lambda e: False)
            except OutOfResources as exc:
                return exc
            finally:
                sharing_.leave(theirs)

    assert answered(share_out=True) == "answered"
    assert isinstance(answered(share_out=False), OutOfResources)


def test_the_engine_clock_runs_at_one_over_the_runs_sharing_it() -> None:
    engine = Sharing()
    a = engine.join()
    time.sleep(0.2)
    b = engine.join()
    time.sleep(0.2)
    engine.leave(a)
    time.sleep(0.1)
    assert a.used() == pytest.approx(0.2 + 0.1, abs=0.03)  # its clock stopped as it left
    assert b.used() == pytest.approx(0.1 + 0.1, abs=0.03)
    # where b's 0.5 s of engine time will be reached, alone: 0.3 s from now
    assert b.at(0.5) - time.monotonic() == pytest.approx(0.3, abs=0.03)


def test_a_run_past_its_deadline_keeps_its_users_place_not_anothers() -> None:
    """A run abandoned at its deadline (its engine ignores the interrupt for 1 s): its
    reply's error comes at the deadline, its user's next run waits until the work
    stopped, another user's does not."""
    admission = Admission()
    stuck = threading.Event()

    def slow_engine() -> None:
        stuck.wait(1.0)

    start = time.monotonic()
    with pytest.raises(OutOfResources):
        admission.run("a", lambda: within_limit(slow_engine, 0.1, Nobody(), bool), OutOfResources)
    assert time.monotonic() - start < 0.3  # at the deadline, not when the engine stopped
    assert admission.running == 1  # its work still takes the engine
    b_started = time.monotonic()
    admission.run("b", lambda: None, OutOfResources)
    assert time.monotonic() - b_started < 0.05
    admission.run("a", lambda: None, OutOfResources)
    assert time.monotonic() - start >= 1.0  # a's next waited for its own stopped work
    assert admission.running == 0


def test_memory_under_load_is_retried_once_after_the_runs_beside_it_holding_no_one() -> None:
    admission = Admission()
    started, release = threading.Event(), threading.Event()
    t, out = _in_thread(
        lambda: admission.run("a", lambda: (started.set(), release.wait(5))[1], Heavy)
    )
    started.wait(5)
    calls = []

    def victim() -> str:
        calls.append(admission.running)
        if len(calls) == 1:
            raise OutOfMemory  # ran out of memory beside a's run
        return "answered"

    v, got = _in_thread(lambda: admission.run("b", victim, Heavy))
    time.sleep(0.1)
    assert calls == [2] and not got  # b's retry waits for a's run to leave ...
    c_started = time.monotonic()
    assert admission.run("c", lambda: "c", Heavy) == "c"  # ... holding no one
    assert time.monotonic() - c_started < 0.05
    release.set()
    t.join(5)
    v.join(5)
    assert out == [True] and got == ["answered"]
    assert calls == [2, 1]  # the retry ran once a had left


def test_a_memory_failure_alone_is_reported() -> None:
    admission = Admission()
    calls = []

    def fails() -> None:
        calls.append(1)
        raise OutOfMemory

    with pytest.raises(OutOfMemory):
        admission.run("a", fails, Heavy)
    assert calls == [1]  # not retried: nothing else ran


def test_a_user_runs_one_query_at_a_time_on_a_dataset() -> None:
    admission = Admission()
    running, most = [0], [0]
    lock = threading.Lock()

    def query() -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        time.sleep(0.05)
        with lock:
            running[0] -= 1

    threads = [_in_thread(lambda: admission.run("a", query, Heavy))[0] for _ in range(4)]
    other = _in_thread(lambda: admission.run("b", query, Heavy))[0]
    for t in [*threads, other]:
        t.join(5)
    assert most[0] == 2  # one of a's and b's, never two of a's


def test_the_time_limit_is_drawn_uniformly_over_its_last_quarter() -> None:
    """KS test against the uniform law on [0.75, 1] × limit, α = 1e-3 (a false failure
    once in 1,000 runs); a fixed limit (the broken version) is rejected."""
    limit = 30.0
    draws = [drawn_timeout(limit) for _ in range(4000)]
    assert min(draws) >= limit * (1 - TIMEOUT_JITTER) and max(draws) <= limit
    law = stats.uniform(loc=limit * (1 - TIMEOUT_JITTER), scale=limit * TIMEOUT_JITTER)
    assert stats.kstest(draws, law.cdf).pvalue > 1e-3
    assert stats.kstest([limit] * 4000, law.cdf).pvalue < 1e-3


POLICY = """
[gate]
state_dir = "state"
query_timeout_s = 0.2

[datasets.c]
sources = { t = "t.csv" }
privacy_unit = "pid"
max_partitions = 1
max_rows_per_partition = 1
user_budget = { epsilon = 1e6 }
max_resource_failures = 2

[datasets.c.tables.t.columns]
pid = { type = "int" }
x = { type = "int", lower = 0, upper = 9 }
"""


@pytest.fixture
def engine(tmp_path):
    rows = [(i, i % 10) for i in range(200)]
    with running_engine(tmp_path, POLICY, {"t": ("pid,x", rows)}) as e:
        yield e


def test_failures_are_told_alike_and_after_a_few_the_user_is_refused_free(
    engine, monkeypatch
) -> None:
    def out_of_memory(analysed, store):
        raise OutOfResources(time.monotonic() + 0.1)

    monkeypatch.setattr(engines, "execute", out_of_memory)
    ask = {"sql": "SELECT COUNT(*) FROM t", "epsilon": 0.5, "fresh": True}
    for _ in range(2):
        with pytest.raises(OutOfResources, match="ran out of the gate's time or memory"):
            engine.query("alice", ask)
    spent = engine.budget("alice", "c", None)
    with pytest.raises(Refused, match="max_resource_failures"):
        engine.query("alice", ask)
    assert engine.budget("alice", "c", None) == spent  # the refusal charged nothing
    # another user is not affected, and an owner's reset lets alice query again
    monkeypatch.undo()
    assert engine.query("bob", ask)["rows"]
    engine.ledger.reset(Scope.user("c", "alice"), "tuned to the limit")
    assert engine.query("alice", ask)["rows"]


def test_a_real_time_out_is_an_out_of_resources_reply(engine) -> None:
    store = engine.databases["c"]
    slow = "SELECT COUNT(*) FROM range(100000000) a, range(100000) b WHERE a.range % 7 = b.range"
    start = time.monotonic()
    with pytest.raises(OutOfResources) as caught:
        store.run(slow)
    took = time.monotonic() - start
    assert 0.2 * (1 - TIMEOUT_JITTER) <= took < 5
    assert caught.value.release_at <= time.monotonic()
