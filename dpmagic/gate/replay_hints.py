"""Replays without analysis: the replay key a text was released under, remembered by
the text, so that asking a released text again is served from the ledger without
parsing, planning and vetting it anew (issue 42: a course's notebooks re-run cell
by cell, and a class asking the same cell of a dataset that shares releases).

A hint maps a request's text key (everything the analysis is a function of:
``engine.text_key``, the per-user cache's key) to the replay key of its release.
Hints live as long as the engine, whose policy and versions of the data
(``engines/versions.py``) are read at its start and fixed for its life, so the key
a hint gives is the key an analysis would compute. The ledger, not the hint, decides
what is served (``Engine._replayed``): a hint the ledger does not honour falls back
to the analysis.

Whom a hint may speed up is whom the ledger would serve the release to: the user it
was released to, under their own scope; and where the dataset shares releases,
everyone (``Sharing.EVERYONE``) or the members of each group it counted against
(``Sharing.GROUP``). A hint is made only when a release is stored or replayed, never
by a dry run, a refusal or an analysis alone. So a reply that comes sooner for a
hint tells its asker only what the reply itself says: that the answer was released
before, to them or, shared, to someone they share with. Within a user's scope nothing
is shared between users; across users, only where the answer itself is.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterable

from dpmagic.gate.ledger.replays import ReplayKey
from dpmagic.gate.policy.values import Sharing

MAX_HINTS = 50_000
"""Hints kept, the least recently used dropped first: a few hundred bytes each (a
query's text key is a hash), 15 MB at most. A dropped hint costs one analysis."""

Scope = tuple[str, ...]


def own(dataset: str, user: str) -> Scope:
    return ("user", dataset, user)


def sharing_scopes(dataset: str, sharing: Sharing, groups: Iterable[str]) -> list[Scope]:
    """The scopes a release to a user in ``groups`` is shared in, or a user in
    ``groups`` is served shared releases from."""
    if sharing == Sharing.EVERYONE:
        return [("everyone", dataset)]
    if sharing == Sharing.GROUP:
        return [("group", dataset, g) for g in sorted(groups)]
    return []


class ReplayHints:
    """The hints of one engine, shared by its request threads."""

    def __init__(self, limit: int = MAX_HINTS) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        self._hints: OrderedDict[tuple[Scope, Hashable], ReplayKey] = OrderedDict()

    def remember(self, scopes: Iterable[Scope], text: Hashable, key: ReplayKey) -> None:
        with self._lock:
            for scope in scopes:
                self._hints[(scope, text)] = key
                self._hints.move_to_end((scope, text))
            while len(self._hints) > self._limit:
                self._hints.popitem(last=False)

    def find(self, scopes: Iterable[Scope], text: Hashable) -> ReplayKey | None:
        """The replay key for ``text`` in the first of ``scopes`` that holds one."""
        with self._lock:
            for scope in scopes:
                key = self._hints.get((scope, text))
                if key is not None:
                    self._hints.move_to_end((scope, text))
                    return key
        return None
