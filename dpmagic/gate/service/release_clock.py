"""Held replies woken at their release time, to the operating system's timer precision.

Reply padding holds each ``/v1/query`` reply to the next multiple of
``response_quantum_ms`` after its request arrived, so that the reply's time does
not depend on how long the query ran. An ``asyncio.sleep`` until that moment
does not quite do it: the event loop's selector takes its timeout in whole
milliseconds, rounded up, so a reply wakes late by the part of a millisecond
that the wait began with, and the wait begins when the query ends. The reply's
time then still carried the query's running time modulo 1 ms (measured: 0.4 ms
late for a wait of a whole number of milliseconds, 1.1 ms for one a quarter past;
the system test of padding saw a 1 ms difference between two datasets).

One thread waits instead, on a condition variable whose timeout has the
precision of the kernel's timers, for the earliest release due, and hands each
reply back to its event loop through ``call_soon_threadsafe``, whose wake-up (a
byte on the loop's self-pipe) takes the same time whenever it comes.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
import threading
import time


class ReleaseClock:
    """Release times of held replies, watched by one daemon thread started on first use."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._due: list[tuple[float, int, asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._order = itertools.count()
        self._thread: threading.Thread | None = None

    def until(self, when: float) -> asyncio.Future[None]:
        """A future of the running loop, done at ``time.monotonic()`` ``when``."""
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        with self._changed:
            heapq.heappush(self._due, (when, next(self._order), loop, done))
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="dpmagic-release", daemon=True
                )
                self._thread.start()
            self._changed.notify()
        return done

    def _run(self) -> None:
        with self._changed:
            while True:
                now = time.monotonic()
                while self._due and self._due[0][0] <= now:
                    _, _, loop, done = heapq.heappop(self._due)
                    # A loop that has closed has nobody waiting any more.
                    with contextlib.suppress(RuntimeError):
                        loop.call_soon_threadsafe(_finish, done)
                self._changed.wait(self._due[0][0] - now if self._due else None)


def _finish(done: asyncio.Future[None]) -> None:
    if not done.done():  # a reply whose client left was cancelled meanwhile
        done.set_result(None)
