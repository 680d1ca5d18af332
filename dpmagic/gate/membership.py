"""Which groups a user belongs to: the policy's ``[groups]``, joined on a JupyterHub
by the groups the Hub reports for the user's token.

Groups decide two things: which group budgets a query is charged against
(``ledger/scopes.applicable``), and, where the owner shares releases within
groups, whose answers a user may be served and which of their groups serving one
charges (those it did not count against yet: ``Ledger.serve_shared``). A charge
records the groups of its moment, so a user who later leaves a group leaves their
past spending counted in it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping

from dpmagic.gate.policy import Policy


class Membership:
    """The declared groups, and the ones an identity provider (the Hub) last reported
    for each user; a user's groups are the union of both."""

    def __init__(self, declared: Mapping[str, frozenset[str]]) -> None:
        self._declared: dict[str, set[str]] = {}
        for group, members in declared.items():
            for user in members:
                self._declared.setdefault(user, set()).add(group)
        self._reported: dict[str, frozenset[str]] = {}
        self._lock = threading.Lock()

    def report(self, user: str, groups: Iterable[str]) -> None:
        """What the Hub said of ``user`` just now, replacing what it said before."""
        with self._lock:
            self._reported[user] = frozenset(groups)

    def of(self, user: str) -> frozenset[str]:
        with self._lock:
            reported = self._reported.get(user, frozenset())
        return frozenset(self._declared.get(user, ())) | reported


def declared_groups(policy: Policy, user: str) -> frozenset[str]:
    """``user``'s groups in the policy's ``[groups]`` (offline, where no Hub reports)."""
    return Membership(policy.groups).of(user)
