"""The query timeout: one thread that interrupts the queries past their deadline.

A thread started and joined per query cost 0.1–0.2 ms of every query, as much as
the ledger's durable write. One watcher per gate instead keeps the deadlines of
the queries running, sleeps until the nearest, and from then on interrupts that
query every ``RETRY_S`` until it is let go: an interrupt that lands before
DuckDB starts executing would otherwise be lost.

Anything with an ``interrupt()`` method can be watched (a DuckDB connection).
``release`` returns only once no further interrupt can reach the query, so the
caller may close the connection right after. The thread is woken only when a new
deadline comes before the one it sleeps towards: with one timeout for every query,
once per timeout period, not once per query.
"""

from __future__ import annotations

import itertools
import math
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Protocol

RETRY_S = 0.01


class Interruptible(Protocol):
    def interrupt(self) -> None: ...


class Watchdog:
    """Deadlines of running queries, watched by one daemon thread started on first use."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._watched: dict[int, tuple[float, Interruptible]] = {}
        self._ids = itertools.count()
        self._thread: threading.Thread | None = None
        self._wake_at = math.inf  # when the thread will next look, unless woken

    @contextmanager
    def watching(self, target: Interruptible, seconds: float) -> Iterator[None]:
        """Interrupt ``target`` once ``seconds`` have passed, until the block ends."""
        key = self.watch(target, seconds)
        try:
            yield
        finally:
            self.release(key)

    def watch(self, target: Interruptible, seconds: float) -> int:
        with self._changed:
            key = next(self._ids)
            deadline = time.monotonic() + seconds
            self._watched[key] = (deadline, target)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="dpmagic-timeout", daemon=True
                )
                self._thread.start()
            if deadline < self._wake_at:  # queries of one timeout: the first wakes it only
                self._changed.notify()
        return key

    def release(self, key: int) -> None:
        with self._changed:
            self._watched.pop(key, None)

    def _run(self) -> None:
        with self._changed:
            while True:
                now = time.monotonic()
                waits = []
                for deadline, target in self._watched.values():
                    if deadline <= now:
                        target.interrupt()  # under the lock: never after release()
                        waits.append(RETRY_S)
                    else:
                        waits.append(deadline - now)
                wait = min(waits, default=None)
                self._wake_at = math.inf if wait is None else now + wait
                self._changed.wait(wait)
