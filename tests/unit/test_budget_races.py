"""Many users racing at the edge of every budget at once, from several threads or
processes on one ledger file, each with its own handle: no budget (the dataset's, a
group's, a user's, a notebook's) is ever overspent, and the widest is spent to its
edge.

Racing threads (each its own SQLite connection, as the gate's are) run in the
default run; racing processes, which take seconds to start and import, with the
searches (``-m search``)."""

from __future__ import annotations

import math
import multiprocessing
import queue
import threading
import time
from pathlib import Path

import pytest

from dpmagic.gate.dp.accounting import Cost, PureAccountant
from dpmagic.gate.failures import OverBudget
from dpmagic.gate.ledger.scopes import Scope
from dpmagic.gate.ledger.store import Ledger
from dpmagic.gate.policy import Budget

PROCESSES = 6
USERS_PER_PROCESS = 10
STEP = 0.125  # exact in binary: a budget's edge is reached exactly, not within rounding
GROUP_CAPS = {"g0": Budget(1.5), "g1": Budget(2.0), "g2": Budget(8.0)}
USER_CAP = Budget(0.5)
NOTEBOOK_CAP = Budget(0.375)


def _groups(user: int) -> tuple[str, ...]:
    """Users in g0, g1 or g2 by their number; every fifth also in g2."""
    return tuple(sorted({f"g{user % 3}", *(("g2",) if user % 5 == 0 else ())}))


def _limits(user: int, notebook: str, dataset_cap: Budget) -> list[tuple[Scope, Budget]]:
    name = f"u{user}"
    return [
        (Scope.whole("d"), dataset_cap),
        *((Scope.group("d", g), GROUP_CAPS[g]) for g in _groups(user)),
        (Scope.user("d", name), USER_CAP),
        (Scope.of_notebook("d", name, notebook), NOTEBOOK_CAP),
    ]


def _race(path: str, first: int, cap: float, start: float, out: queue.Queue) -> None:
    """One racer (a thread or a process): its users take turns debiting until every
    one is refused."""
    ledger = Ledger(Path(path), PureAccountant())
    time.sleep(max(0.0, start - time.time()))  # every process starts together
    granted = refused = 0
    active = {first + i: 0 for i in range(USERS_PER_PROCESS)}
    while active:
        for user in list(active):
            notebook = f"nb{active[user] % 2}"
            try:
                ledger.debit(
                    user=f"u{user}",
                    dataset="d",
                    notebook=notebook,
                    cost=Cost(STEP),
                    limits=_limits(user, notebook, Budget(cap)),
                    groups=_groups(user),
                    sql="SELECT COUNT(*) FROM t",
                    replay_key=None,
                )
                granted += 1
                active[user] += 1
            except OverBudget:
                refused += 1
                if active[user] % 2 == 1 or refused > 10_000:
                    del active[user]  # both notebooks tried, or hopeless
                else:
                    active[user] += 1  # try the other notebook
    ledger.close()
    out.put((granted, refused))


def _run_threads(path: Path, dataset_cap: float) -> list[tuple[int, int]]:
    out: queue.Queue = queue.Queue()
    start = time.time() + 0.2  # after every thread has opened the ledger
    threads = [
        threading.Thread(
            target=_race, args=(str(path), p * USERS_PER_PROCESS, dataset_cap, start, out)
        )
        for p in range(PROCESSES)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
        assert not thread.is_alive()
    return [out.get_nowait() for _ in threads]


def _run_processes(path: Path, dataset_cap: float) -> list[tuple[int, int]]:
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    start = time.time() + 3.0  # after every process has imported and opened the ledger
    procs = [
        context.Process(
            target=_race, args=(str(path), p * USERS_PER_PROCESS, dataset_cap, start, out)
        )
        for p in range(PROCESSES)
    ]
    for proc in procs:
        proc.start()
    results = [out.get(timeout=120) for _ in procs]
    for proc in procs:
        proc.join(timeout=30)
        assert proc.exitcode == 0
    return results


# 4.0: the dataset's budget binds first (32 steps against the groups' 12, 16 and 64);
# 1000: it never binds, and each group's does.
# Processes take seconds to start, so they race with the searches (``-m search``).
@pytest.mark.parametrize("dataset_cap", [4.0, 1000.0])
@pytest.mark.parametrize(
    "racers",
    [_run_threads, pytest.param(_run_processes, marks=pytest.mark.search)],
    ids=["threads", "processes"],
)
def test_racing_users_never_overspend_any_of_the_four_budgets(
    tmp_path: Path, dataset_cap: float, racers
) -> None:
    path = tmp_path / "ledger.sqlite3"
    Ledger(path, PureAccountant()).close()
    results = racers(path, dataset_cap)
    granted = sum(g for g, _ in results)

    ledger = Ledger(path, PureAccountant())
    try:
        users = range(PROCESSES * USERS_PER_PROCESS)
        scopes = {
            scope: cap
            for u in users
            for nb in ("nb0", "nb1")
            for scope, cap in _limits(u, nb, Budget(dataset_cap))
        }
        standing = dict(zip(scopes, ledger.standing(list(scopes.items())), strict=True))
        for scope, (spent, limit) in standing.items():
            assert spent.epsilon <= limit.epsilon, scope
        whole = standing[Scope.whole("d")][0].epsilon
        assert whole == granted * STEP  # every charge counted once in the dataset's budget
        if dataset_cap < 8:
            assert whole == dataset_cap  # the race reached the dataset's edge
        else:  # and otherwise each group's
            for group, cap in GROUP_CAPS.items():
                assert standing[Scope.group("d", group)][0].epsilon == cap.epsilon, group
        assert math.isclose(
            sum(s.epsilon for scope, (s, _) in standing.items() if scope.kind == "user"), whole
        )
    finally:
        ledger.close()
