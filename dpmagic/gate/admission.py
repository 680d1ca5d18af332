"""Who runs on a dataset's engine, and when: no user can make another's query fail.

A dataset's engine has one memory limit (DuckDB's ``memory_limit`` is per
database, with no per-query limit; a Spark session's executors likewise), and
its cores are shared. Two rules keep one user's load from failing or slowing
another's queries:

1. **One running query per user and dataset.** A user's further queries wait
   for their own earlier one (the server already lets a user have at most four
   requests in the engine), so a user running the heaviest queries the policy
   allows holds at most one query's share of memory and cores, whoever else is
   querying. A notebook runs its cells one at a time anyway.
2. **A failure under load is retried alone.** A query that runs out of time or
   memory while another query ran on the same dataset at any moment of its run
   is run again with the dataset to itself (every other query waits, new ones
   too). Only what fails alone is reported, and charged as a failure.

Why the outcome still depends only on the query and its own data. The exact
result of a query is a function of its SQL, the data and the seed, not of what
else ran; a retry computes the same rows. What is released is therefore the
same whether or not a retry happened, and a failure is only ever reported for
a run that had the engine to itself, whose running out of time or memory is a
function of the query and the data alone (and of the per-query time limit
drawn at random, ``interface.drawn_timeout``). A retry is visible only in time,
and the reply's time is padded; that it happened says that the query and
another user's overlapped and one of them was heavy, which its own user can see
from their own queries' times anyway, and which by ``sql/work.py`` one unit
moves by at most its bounded work. The query stays charged once: the debit
came before the first run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")


@dataclass
class _Run:
    overlapped: bool = False


@dataclass
class Admission:
    """The running queries of one dataset (see the module's docstring)."""

    _changed: threading.Condition = field(default_factory=threading.Condition)
    _running: list[_Run] = field(default_factory=list)
    _users: set[str] = field(default_factory=set)
    _alone: bool = False  # a retry holds the dataset
    _waiting_alone: int = 0

    def run(self, user: str, query: Callable[[], T], resources: type[Exception]) -> T:
        """``query()`` as the user's one running query on the dataset; if it raises
        ``resources`` (out of time or memory) after another query overlapped it, once
        more with the dataset to itself."""
        with self._shared(user) as run:
            try:
                return query()
            except resources:
                if not run.overlapped:
                    raise
        with self._exclusive():
            return query()

    @contextmanager
    def _shared(self, user: str) -> Iterator[_Run]:
        run = _Run()
        with self._changed:
            self._changed.wait_for(
                lambda: user not in self._users and not self._alone and not self._waiting_alone
            )
            self._users.add(user)
            for other in self._running:
                other.overlapped = True
            run.overlapped = bool(self._running)
            self._running.append(run)
        try:
            yield run
        finally:
            with self._changed:
                self._running.remove(run)
                self._users.discard(user)
                self._changed.notify_all()

    @contextmanager
    def _exclusive(self) -> Iterator[None]:
        with self._changed:
            self._waiting_alone += 1
            self._changed.wait_for(lambda: not self._running and not self._alone)
            self._waiting_alone -= 1
            self._alone = True
        try:
            yield
        finally:
            with self._changed:
                self._alone = False
                self._changed.notify_all()

    @property
    def running(self) -> int:
        with self._changed:
            return len(self._running)
