"""Who runs on a dataset's engine, and when: no user holds up, or fails, another's query.

A dataset's engine has one memory limit (DuckDB's ``memory_limit`` is per
database, with no per-query limit; a Spark session's executors likewise), and
its cores are shared. The rules:

1. **One run per user and dataset.** A user's further queries wait for their own
   earlier run (the server already lets a user have at most four requests in the
   engine), and for its work to have truly stopped, not only for its reply: a run
   abandoned at its deadline (``engines/deadline.py``) keeps its place until the
   engine's interrupt lands. So a user sending the heaviest queries the policy
   allows holds at most one run's share of memory and cores, whoever else is
   querying, and cannot pile stopped-but-running work up. A notebook runs its
   cells one at a time anyway. No user ever waits for another's run.
2. **Time is counted on the run's share of the engine** (``engines/sharing.py``):
   while ``n`` runs are in the engine, a run's drawn limit
   (``interface.drawn_timeout``) runs down at ``1 / n`` of the wall clock. A run
   that runs out of time has had its limit's worth of the engine however many
   others ran beside it, so it is reported at once, and never retried. (A run
   that ran out while another overlapped it used to be run again with the dataset
   to itself, every other query held meanwhile, new ones too: a cheap query's
   157 ms maximum became 37.1 s while another user's slow queries timed out,
   issue 38.) In wall-clock time a run's deadline is at most its limit times the
   runs that shared the engine with it, at most one a user.
3. **Memory under load is retried once, holding no one.** A run that runs out of
   memory while another run was in the engine beside it (a memory limit is not
   shared out over time) is run once more after the runs that were in the engine
   when it failed have left, beside whatever started since; its user's next query
   waits, nobody else's. What fails then is reported.

Why the outcome still depends only on the query and its own data, as far as one
unit can move it. The exact result of a query is a function of its SQL, the data
and the seed, not of what else ran; a retry computes the same rows, so what is
released is the same whether or not one happened. Whether a run fails for time
depends on its own work, which one unit moves by at most its bounded work
(``sql/work.py``), and on how evenly the engine is shared: while ``n`` runs share
it evenly, a run's clock advances exactly as fast as the engine works for it, so
the others' load cancels out of it. Where the sharing is uneven (one run's
threads get more of the cores than another's) the others' load does move its
clock, but their work, like its own, moves by at most one unit's bounded work, and
which users query when is not the data. The limit itself is drawn at random for
each run over a quarter of ``query_timeout_s``, so that difference moves the
chance of failing by at most ``work time / (TIMEOUT_JITTER × limit)``, as alone.
A failure is a function of the same things whether or not others ran: it is never
reported because of another user's time, only (rule 3) of another user's memory
held through a whole retry. A run's time, and a retry, are visible only in time,
and the reply's time is padded. The query stays charged once: the debit came
before the first run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from dpmagic.gate.engines import sharing
from dpmagic.gate.engines.run_locks import Held, RunLocks
from dpmagic.gate.engines.sharing import Shared, Sharing

T = TypeVar("T")


@dataclass
class Admission:
    """The runs of one dataset (see the module's docstring)."""

    sharing: Sharing = field(default_factory=Sharing)
    # The user's lock across the gate's processes; None: this process's rule alone.
    locks: RunLocks | None = None
    _changed: threading.Condition = field(default_factory=threading.Condition)
    _users: set[str] = field(default_factory=set)  # users with a run in the engine
    _held: dict[str, Held] = field(default_factory=dict)  # their locks across processes

    def run(self, user: str, query: Callable[[], T], resources: type[Exception]) -> T:
        """``query()`` as the user's one run on the dataset, its stores' time limits
        counted on its share of the engine; if it raises ``resources`` for want of
        memory while another run was beside it, once more after those runs left."""
        with self._changed:
            self._changed.wait_for(lambda: user not in self._users)
            self._users.add(user)
        if self.locks is not None:
            try:
                self._held[user] = self.locks.hold(user)  # waits for the other workers'
            except BaseException:
                self._leave(None, user)
                raise
        share = self.sharing.join()
        left = False  # whether ``share`` left already, to be run again
        try:
            with sharing.counted_on(share):
                return query()
        except resources as exc:
            if not (getattr(exc, "memory", False) and share.overlapped):
                raise
            beside = self.sharing.others(share)
            self._leave(share, None)
            left = True
        finally:
            if not left:
                self._leave(share, user)
        try:
            self.sharing.wait_gone(beside)
            share = self.sharing.join()
        except BaseException:
            self._leave(None, user)
            raise
        try:
            with sharing.counted_on(share):
                return query()
        finally:
            self._leave(share, user)

    def _leave(self, share: Shared | None, user: str | None) -> None:
        """Let ``share`` leave the engine, and ``user`` have their next run, once the
        run's work has truly stopped (now, or when its lingering work ends)."""
        pending = [] if share is None else [w for w in share.lingering if not w.done()]
        left = [len(pending)]
        lock = threading.Lock()

        def stopped(_: object = None) -> None:
            with lock:
                left[0] -= 1
                if left[0] > 0:
                    return
            if share is not None:
                self.sharing.leave(share)
            if user is not None:
                with self._changed:
                    held = self._held.pop(user, None)
                    if held is not None:
                        held.release()
                    self._users.discard(user)
                    self._changed.notify_all()

        if not pending:
            left[0] = 1
            stopped()
            return
        for work in pending:
            work.add_done_callback(stopped)

    @property
    def running(self) -> int:
        """Runs in the engine, including those whose reply left but whose work has not
        stopped yet."""
        return self.sharing.count
