"""The gate's one timeout thread (``engines/watchdog.py``): a query past its deadline is
interrupted, again and again until it is let go (an interrupt that lands before
DuckDB starts is lost); a query let go is never interrupted after; one that ends in
time never at all; each query keeps its own deadline."""

from __future__ import annotations

import threading
import time

import duckdb
import pytest

from dpmagic.gate.engines.watchdog import RETRY_S, Watchdog


class Target:
    def __init__(self) -> None:
        self.calls: list[float] = []
        self.lock = threading.Lock()

    def interrupt(self) -> None:
        with self.lock:
            self.calls.append(time.monotonic())


def test_a_query_past_its_deadline_is_interrupted_until_let_go():
    dog, target = Watchdog(), Target()
    start = time.monotonic()
    key = dog.watch(target, 0.05)
    time.sleep(0.05 + 20 * RETRY_S)
    dog.release(key)
    count = len(target.calls)
    # The first interrupt comes at the deadline, then one every RETRY_S (a loaded
    # machine may stretch the gaps, never shorten them).
    assert target.calls[0] - start >= 0.05
    assert 3 <= count <= 22
    time.sleep(5 * RETRY_S)
    assert len(target.calls) == count  # nothing after release() returned


def test_a_query_that_ends_in_time_is_never_interrupted():
    dog, target = Watchdog(), Target()
    with dog.watching(target, 0.2):
        time.sleep(0.05)
    time.sleep(0.3)
    assert target.calls == []


def test_each_query_keeps_its_own_deadline():
    dog = Watchdog()
    slow, quick, late = Target(), Target(), Target()
    start = time.monotonic()
    a = dog.watch(slow, 0.3)
    b = dog.watch(quick, 0.05)
    c = dog.watch(late, 10.0)
    # Waited for rather than slept through: on a loaded machine a sleep of 0.15 s can
    # last past the slow one's deadline, though each still fires at its own.
    waited = time.monotonic() + 10.0
    while not (quick.calls and slow.calls) and time.monotonic() < waited:
        time.sleep(0.01)
    assert quick.calls[0] - start >= 0.05 and slow.calls[0] - start >= 0.3
    assert quick.calls[0] < slow.calls[0] and not late.calls
    for key in (a, b, c):
        dog.release(key)
    assert late.calls == []


def test_a_real_duckdb_query_is_stopped_near_its_deadline():
    con = duckdb.connect()
    dog = Watchdog()
    start = time.monotonic()
    with pytest.raises(duckdb.InterruptException), dog.watching(con, 0.3):
        con.execute(
            "SELECT COUNT(*) FROM range(100000000) a, range(100000) b WHERE a.range % 7 = b.range"
        ).fetchall()
    assert 0.3 <= time.monotonic() - start < 5
    assert con.execute("SELECT 42").fetchone() == (42,)  # the connection still answers


def test_only_one_thread_watches_however_many_queries():
    dog = Watchdog()
    before = threading.active_count()
    keys = [dog.watch(Target(), 10.0) for _ in range(50)]
    assert threading.active_count() == before + 1
    for key in keys:
        dog.release(key)


def test_a_nearer_deadline_wakes_the_sleeping_thread():
    """The thread sleeps towards the nearest deadline it knows; a query with a nearer
    one, watched while it sleeps, must still be stopped in time."""
    dog, far, near = Watchdog(), Target(), Target()
    a = dog.watch(far, 30.0)
    time.sleep(0.1)  # the thread now sleeps towards the 30 s deadline
    start = time.monotonic()
    b = dog.watch(near, 0.05)
    time.sleep(0.5)
    dog.release(a)
    dog.release(b)
    assert near.calls and 0.05 <= near.calls[0] - start < 0.4
    assert far.calls == []
