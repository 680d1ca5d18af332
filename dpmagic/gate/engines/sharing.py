"""A run's share of its dataset's engine: the clock its time limit is counted on.

The runs on one dataset share its engine (DuckDB's threads, a Spark session's
task slots) while they overlap. A run's time limit (``interface.drawn_timeout``)
is counted on its *share* of the engine, not on the wall clock: while ``n`` runs
are in the engine, each one's clock advances at ``1 / n`` of the wall clock. A run
that runs out of time has therefore had its limit's worth of the engine, however
many other users ran beside it; it needs no retry with the engine to itself, the
retry that held every other user of the dataset for up to a whole limit (issue 38:
a cheap query's 157 ms maximum went to 37.1 s). ``admission.py`` says why what is
released, and whether a failure is reported, still depend on the query and its
own data, and on other users' load only through what one unit cannot move.

The number of runs is the number in ``Sharing`` at each moment: a run joins as it
is admitted and leaves once its work in the engine has truly stopped, which for a
run abandoned at its deadline (``deadline.py``) is when the engine's interrupt
lands, not when its reply left. In wall-clock time a run's deadline is therefore
at most its limit times the most runs that shared the engine with it (one a user,
``admission.py``).

Outside an admission (a benchmark, a test calling a store directly) a run is
``Solo``: its clock is the wall clock.
"""

from __future__ import annotations

import contextvars
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Protocol


class Share(Protocol):
    """One run's clock of engine time, as a store sees it."""

    def used(self) -> float:
        """The engine-seconds the run has had since it was admitted."""
        ...

    def at(self, used: float) -> float:
        """The monotonic time at which ``used()`` reaches ``used``, if the engine stays
        shared as it is now (a later change wakes ``wait``)."""
        ...

    def wait(self, until: float, done: Callable[[], bool]) -> None:
        """Unless ``done()``, sleep until monotonic ``until``, or until the sharing
        changes or ``poke``. ``done`` is read under the lock ``poke`` takes, so a poke
        right after it is never missed."""
        ...

    def poke(self) -> None:
        """Wake ``wait`` (the run's work ended)."""
        ...

    def linger(self, work: Future[object]) -> None:
        """The run's work goes on in the engine after its caller stopped waiting: its
        place stays taken until ``work`` is done."""
        ...


class Solo:
    """The wall clock, for a run no admission shares out."""

    def __init__(self) -> None:
        self._start = time.monotonic()
        self._changed = threading.Condition()

    def used(self) -> float:
        return time.monotonic() - self._start

    def at(self, used: float) -> float:
        return self._start + used

    def wait(self, until: float, done: Callable[[], bool]) -> None:
        with self._changed:
            if not done():
                self._changed.wait(max(0.0, until - time.monotonic()))

    def poke(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def linger(self, work: Future[object]) -> None:
        """Nobody else's place depends on it."""


class Sharing:
    """The runs in one dataset's engine, and each one's engine time so far."""

    def __init__(self) -> None:
        self.changed = threading.Condition()
        self._runs: list[Shared] = []
        self._since = time.monotonic()  # when every run's ``_used`` was last brought up

    def join(self) -> Shared:
        with self.changed:
            self._advance()
            run = Shared(self)
            for other in self._runs:
                other.overlapped = True
            run.overlapped = bool(self._runs)
            self._runs.append(run)
            self.changed.notify_all()
            return run

    def leave(self, run: Shared) -> None:
        with self.changed:
            self._advance()
            self._runs.remove(run)
            self.changed.notify_all()

    def others(self, run: Shared) -> list[Shared]:
        """The runs in the engine beside ``run`` now."""
        with self.changed:
            return [other for other in self._runs if other is not run]

    def wait_gone(self, runs: list[Shared]) -> None:
        """Wait until every one of ``runs`` has left the engine."""
        with self.changed:
            self.changed.wait_for(lambda: not any(r in self._runs for r in runs))

    @property
    def count(self) -> int:
        with self.changed:
            return len(self._runs)

    def _advance(self) -> None:
        """Bring every run's engine time up to now (under ``changed``)."""
        now = time.monotonic()
        if self._runs:
            step = (now - self._since) / len(self._runs)
            for run in self._runs:
                run._used += step
        self._since = now


class Shared:
    """An admitted run's clock: engine time at ``1 / n`` of the wall clock while ``n``
    runs share the engine (see the module's docstring)."""

    def __init__(self, sharing: Sharing) -> None:
        self._sharing = sharing
        self._used = 0.0
        self.lingering: list[Future[object]] = []
        # Whether another run was in the engine at some moment while this one was.
        self.overlapped = False

    def used(self) -> float:
        with self._sharing.changed:
            self._sharing._advance()
            return self._used

    def at(self, used: float) -> float:
        with self._sharing.changed:
            self._sharing._advance()
            sharers = max(1, len(self._sharing._runs))
            return time.monotonic() + max(0.0, used - self._used) * sharers

    def wait(self, until: float, done: Callable[[], bool]) -> None:
        with self._sharing.changed:
            if not done():
                self._sharing.changed.wait(max(0.0, until - time.monotonic()))

    def poke(self) -> None:
        with self._sharing.changed:
            self._sharing.changed.notify_all()

    def linger(self, work: Future[object]) -> None:
        with self._sharing.changed:
            self.lingering.append(work)


_current: contextvars.ContextVar[Share | None] = contextvars.ContextVar("share", default=None)


def current() -> Share:
    """The calling run's clock: its admission's share, or the wall clock (``Solo``)."""
    return _current.get() or Solo()


@contextmanager
def counted_on(share: Share) -> Iterator[None]:
    """Count the stores' runs in this block on ``share`` (``admission.py``)."""
    token = _current.set(share)
    try:
        yield
    finally:
        _current.reset(token)
