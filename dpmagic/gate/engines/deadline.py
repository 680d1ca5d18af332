"""A store's run, waited for until its deadline and not a moment longer.

An engine stops a query only where it looks for an interrupt: DuckDB between
vectors of 2,048 rows, Spark between a task's records (and not at all inside a
regular expression). A run whose rows are slow each could go on for seconds past
its deadline, and its reply with it (issue 38: a run of ``query_timeout_s = 10``
answered after 23.75 s, another after 84.2 s against 30 s), so the drawn time limit
did not bound the reply's time, and when the interrupt landed followed the rows
of one vector, that is, the data.

So the engine's work runs in a thread of its own (``RUNS``), and the store's
caller waits for it only until the run's deadline (its drawn limit on its share of
the engine, ``sharing.py``). A run not done by then is out of time: the caller
raises ``OutOfResources`` at once, its reply leaves at the next padding quantum,
and the engine is interrupted behind it, again and again until its work ends
(``watchdog.py``). Whatever the engine does after the deadline, the reply says
and shows nothing of it. The work is not forgotten either: its admission keeps
its place (``Share.linger``) until it truly ends, so the user's next query on the
dataset waits for it, and each user has at most one run in each dataset's engine,
stopped or not; and it still counts among the runs sharing the engine, so the
others' clocks run slower while it takes the engine's time.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from dpmagic.gate.engines import sharing
from dpmagic.gate.engines.interface import OutOfResources
from dpmagic.gate.engines.watchdog import Interruptible, Watchdog

T = TypeVar("T")

# Threads for the engines' work, reused: one started per query cost 0.1–0.2 ms.
# A run abandoned at its deadline keeps its thread until the engine stops it; a user
# has at most one run in each dataset's engine, so this many are never all taken but
# by that many users' runs at once (a run that finds none free waits, and fails at
# its own deadline if none frees in time).
MAX_RUNS = 256
RUNS = ThreadPoolExecutor(MAX_RUNS, "dpmagic-run")
TIMEOUTS = Watchdog()  # every store's runs past their deadlines, one thread


class _Stop:
    """Interrupts a run's engine from its deadline until its work has ended, never
    after (a connection closed after its work ended is not interrupted)."""

    def __init__(self, target: Interruptible) -> None:
        self._target = target
        self._lock = threading.Lock()
        self._key: int | None = None
        self._ended = False

    def start(self) -> None:
        with self._lock:
            if not self._ended and self._key is None:
                self._key = TIMEOUTS.watch(self._target, 0.0)

    def end(self) -> None:
        with self._lock:
            self._ended = True
            if self._key is not None:
                TIMEOUTS.release(self._key)


def within_limit(
    work: Callable[[], T],
    limit: float,
    target: Interruptible,
    ran_out: Callable[[BaseException], bool],
    close: Callable[[], None] | None = None,
) -> T:
    """``work()``'s result if it is done within ``limit`` seconds of the calling run's
    engine time (``sharing.current``); else ``OutOfResources`` at that deadline,
    ``target`` interrupted from then until ``work`` ends, and ``close`` called after
    (see the module's docstring). An exception for which ``ran_out`` holds (the
    engine's out of memory) is ``OutOfResources`` too, held to the deadline the run
    had then; any other is raised as it is."""
    share = sharing.current()
    ends = share.used() + limit
    stop = _Stop(target)

    def run() -> T:
        try:
            return work()
        finally:
            stop.end()
            if close is not None:
                close()

    future = RUNS.submit(run)
    future.add_done_callback(lambda _: share.poke())
    while not future.done():
        deadline = share.at(ends)
        if time.monotonic() >= deadline:
            if future.cancel():  # it never started: nothing to stop but its connection
                stop.end()
                if close is not None:
                    close()
                raise OutOfResources(deadline)
            stop.start()
            share.linger(future)  # type: ignore[arg-type]
            raise OutOfResources(deadline)
        share.wait(deadline, future.done)
    try:
        return future.result()
    except BaseException as exc:
        if ran_out(exc):
            raise OutOfResources(share.at(ends), memory=True) from None
        raise
