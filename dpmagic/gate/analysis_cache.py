"""The engine's cache of analyses: kept per user, bounded in entries and in bytes.

An analysis (the plan, its generated SQL, vetted) is a function of the query's
text, parameters, asked budget and the policy, so a repeated text (a notebook
re-run, a dashboard) need not be analysed again. Shared by all users, the cache
was an oracle: a text another user had sent recently was answered in 0.50 s
where an unseen one took 1.75 s. Each user now has entries of their own, so
whether a text is cached says only what that user sent. A user's entries are
evicted by their own (``USER_ENTRIES``, ``USER_BYTES``) and, only when the whole
cache is over ``ENTRIES`` or ``BYTES``, from whoever holds the most bytes (the
least recent user among equals): what others do can reach a user's entries only
when the gate is that busy, and then says that it is busy, never what was sent.

Bytes are estimated, not measured: ``BYTES_PER_CHAR`` times the characters of an
entry's generated SQL and canonical query (``Engine._analysed_once``).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

V = TypeVar("V")

ENTRIES = 512
"""Analyses kept for all users together."""

BYTES = 128 << 20
"""Estimated bytes kept for all users together: under a tenth of what a gate holds
at rest beside its data, whatever the texts."""

USER_ENTRIES = 128
"""Analyses kept per user: a long notebook's distinct queries."""

USER_BYTES = 32 << 20
"""Estimated bytes kept per user; an analysis larger than this is not kept (it is
analysed again, within the analysis's bounds, when it is sent again)."""

BYTES_PER_CHAR = 200
"""The estimate's factor. Measured with ``tracemalloc``, what one analysis keeps
alive (its plan's sqlglot trees above all) is 62 to 167 bytes per character of its
generated SQL plus its canonical query, over queries from a bare count to a
100-aggregate select and an inlined chain of CTEs."""


@dataclass
class _Entries(Generic[V]):
    kept: OrderedDict[Hashable, tuple[V, int]] = field(default_factory=OrderedDict)
    nbytes: int = 0


class AnalysisCache(Generic[V]):
    """Least recently used entries per user, and the users' totals bounded; thread-safe."""

    def __init__(
        self,
        entries: int = ENTRIES,
        nbytes: int = BYTES,
        user_entries: int = USER_ENTRIES,
        user_bytes: int = USER_BYTES,
    ) -> None:
        self.entries, self.nbytes = entries, nbytes
        self.user_entries, self.user_bytes = user_entries, user_bytes
        self._users: OrderedDict[str, _Entries[V]] = OrderedDict()  # least recent first
        self._count = 0
        self._bytes = 0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return self._count

    @property
    def bytes(self) -> int:
        return self._bytes

    def get(self, user: str, key: Hashable) -> V | None:
        with self._lock:
            mine = self._users.get(user)
            found = None if mine is None else mine.kept.get(key)
            if mine is None or found is None:
                return None
            mine.kept.move_to_end(key)
            self._users.move_to_end(user)
            return found[0]

    def put(self, user: str, key: Hashable, value: V, size: int) -> None:
        """Keep ``value`` (of ``size`` estimated bytes) for ``user``, unless it alone is
        over a user's share."""
        if size > min(self.user_bytes, self.nbytes):
            return
        with self._lock:
            mine = self._users.setdefault(user, _Entries())
            self._users.move_to_end(user)
            old = mine.kept.pop(key, None)
            if old is not None:
                self._forget(mine, old[1])
            mine.kept[key] = (value, size)
            mine.nbytes += size
            self._count += 1
            self._bytes += size
            while len(mine.kept) > self.user_entries or mine.nbytes > self.user_bytes:
                self._evict(user, mine)
            while self._count > self.entries or self._bytes > self.nbytes:
                # From whoever holds the most; among equals, the least recent user.
                user, most = max(self._users.items(), key=lambda u: u[1].nbytes)
                self._evict(user, most)

    def _evict(self, user: str, entries: _Entries[V]) -> None:
        _, (_, size) = entries.kept.popitem(last=False)
        self._forget(entries, size)
        if not entries.kept:
            del self._users[user]

    def _forget(self, entries: _Entries[V], size: int) -> None:
        entries.nbytes -= size
        self._count -= 1
        self._bytes -= size
