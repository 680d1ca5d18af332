"""A user's one run per dataset across the gate's worker processes
(``engines/run_locks.py`` under ``admission.Admission``): real processes, each with an
admission of its own over one state directory, as the workers of a gate are; and the
locks of first releases (``FlightLocks``), whose files are removed as they are let go.

The broken version the overlap test catches is the admission of a single process
(``Admission()`` without locks): each process lets the same user run at once."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import signal
import stat
import threading
import time
from pathlib import Path

import pytest

from dpmagic.gate.admission import Admission
from dpmagic.gate.engines.interface import OutOfResources
from dpmagic.gate.engines.run_locks import FLIGHTS, FOLDER, FlightLocks, RunLocks

RUN_S = 0.4  # each run's length: long beside a process's start and a lock's hand-over


def _run(state: str, locked: bool, user: str, start: float, out: multiprocessing.Queue) -> None:
    """One worker: its own admission, one run of ``user``'s, its (start, end) reported."""
    admission = Admission(locks=RunLocks(Path(state), "d") if locked else None)
    time.sleep(max(0.0, start - time.time()))

    def work() -> tuple[float, float]:
        began = time.time()
        time.sleep(RUN_S)
        return began, time.time()

    out.put((user, admission.run(user, work, OutOfResources)))


def _runs(state: Path, locked: bool, users: list[str]) -> list[tuple[str, tuple[float, float]]]:
    """One process per entry of ``users``, all asked to start at the same moment."""
    context = multiprocessing.get_context("fork")
    out: multiprocessing.Queue = context.Queue()
    start = time.time() + 1.0  # after every process has started
    procs = [
        context.Process(target=_run, args=(str(state), locked, user, start, out)) for user in users
    ]
    for proc in procs:
        proc.start()
    results = [out.get(timeout=60) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
    return results


def _overlap(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def _any_overlap(runs: list[tuple[str, tuple[float, float]]]) -> bool:
    spans = [span for _, span in runs]
    return any(_overlap(a, b) for i, a in enumerate(spans) for b in spans[i + 1 :])


def test_one_users_runs_in_two_processes_never_overlap(tmp_path: Path) -> None:
    runs = _runs(tmp_path, True, ["alice", "alice", "alice"])
    assert not _any_overlap(runs), runs


def test_the_rule_of_one_process_alone_lets_them_overlap(tmp_path: Path) -> None:
    """The broken version: each worker's own admission, no lock across processes. The
    check above would fail on it."""
    runs = _runs(tmp_path, False, ["alice", "alice"])
    assert _any_overlap(runs), runs


def test_different_users_do_not_wait_for_each_other(tmp_path: Path) -> None:
    runs = _runs(tmp_path, True, ["alice", "bob"])
    assert _any_overlap(runs), runs


def _hold_forever(state: str, ready: multiprocessing.Event) -> None:
    RunLocks(Path(state), "d").hold("alice")
    ready.set()
    time.sleep(600)


def test_a_lock_held_by_a_killed_worker_is_dropped(tmp_path: Path) -> None:
    context = multiprocessing.get_context("fork")
    ready = context.Event()
    holder = context.Process(target=_hold_forever, args=(str(tmp_path), ready))
    holder.start()
    assert ready.wait(60)
    locks = RunLocks(tmp_path, "d")
    fd = os.open(locks.path("alice"), os.O_RDWR)
    try:
        with pytest.raises(BlockingIOError):  # held by the other process
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.kill(holder.pid or 0, signal.SIGKILL)
        holder.join(timeout=30)
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the kernel let it go
    finally:
        os.close(fd)


def test_locks_are_per_user_and_dataset_and_private(tmp_path: Path) -> None:
    d, e = RunLocks(tmp_path, "d"), RunLocks(tmp_path, "e")
    names = {d.path("alice"), d.path("bob"), e.path("alice")}
    assert len(names) == 3
    assert all("alice" not in p.name and "bob" not in p.name for p in names)
    held = d.hold("alice")
    other = e.hold("alice")  # another dataset: not the same lock, so not a wait
    held.release()
    other.release()
    held.release()  # a second release does nothing
    assert stat.S_IMODE((tmp_path / FOLDER).stat().st_mode) == 0o700
    assert stat.S_IMODE(d.path("alice").stat().st_mode) == 0o600


def test_flight_locks_exclude_in_every_scope_and_leave_no_file(tmp_path: Path) -> None:
    """Threads holding one key's lock in overlapping scopes (each opens its own file,
    so each is a holder of its own, as a process is) never hold it together, even
    while each holder removes the file as it lets go; a holder that waited was told
    so once, one that did not was not; no file is left. Without the check that the
    file held is still the path's (a waiter on a removed file holding it while a
    newcomer locks the path's new one), two hold it together."""
    locks = FlightLocks(tmp_path)
    inside: list[int] = []
    overlapped: list[bool] = []
    told: list[str] = []
    scopes = [[("everyone", "d")], [("user", "d", "a"), ("everyone", "d")]]

    def fly(i: int) -> None:
        time.sleep(0.004 * i)  # arriving while others hold it, and after it was removed
        with locks.holding("key", scopes[i % 2], lambda: told.append(f"t{i}")):
            inside.append(i)
            overlapped.append(len(inside) > 1)
            time.sleep(0.01)
            inside.remove(i)

    threads = [threading.Thread(target=fly, args=(i,)) for i in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert len(overlapped) == 12 and not any(overlapped)
    assert 0 < len(told) == len(set(told)) < 12  # the first in did not wait
    assert list((tmp_path / FLIGHTS).iterdir()) == []
    told.clear()
    mine = [("user", "d", "a")]
    with (
        locks.holding("key", mine, lambda: told.append("x")),
        locks.holding("other", mine, lambda: told.append("y")),  # another key: no wait
    ):
        pass
    assert told == []
