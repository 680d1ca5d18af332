"""What the ledger keys a release by, so that it is replayed only over the data and
the policy it was computed from, and what it tells when a query is answered afresh
though it was released before; a release served to another user (``SharedRelease``).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
from dataclasses import dataclass

from dpmagic.gate.dp.accounting import Cost
from dpmagic.gate.ledger.scopes import RELEASED, REPLAYED, Scope
from dpmagic.gate.reply import Reply

# Why a query was answered afresh though the same query was released to the user before.
DATA_CHANGED = "the dataset changed since your earlier answer"
POLICY_CHANGED = "the policy changed since your earlier answer"
BOTH_CHANGED = "the dataset and the policy changed since your earlier answer"
UNVERSIONED = (
    "your earlier answer was released by an older gate, which kept no dataset version "
    "to tell whether the data or the policy changed since"
)


class ReplayKey(str):
    """A replay key: the text the ledger matches releases on, a hash of its parts.

    ``query``: the query's own key (its canonical SQL, parameters, cost, mechanisms:
    what the whole replay key was before versions joined it, so the releases of an
    older ledger are found by it); ``data`` and ``policy``: the versions of the data
    and of the policy facts it is answered over (``engines/versions.Versions``)."""

    query: str
    data: str
    policy: str

    def __new__(cls, query: str, data: str, policy: str) -> ReplayKey:
        text = json.dumps({"query": query, "data": data, "policy": policy}, sort_keys=True)
        key = super().__new__(cls, hashlib.sha256(text.encode()).hexdigest())
        key.query, key.data, key.policy = query, data, policy
        return key


@dataclass(frozen=True)
class SharedRelease:
    """An answer released to another user, served to the asker (``share_releases``):
    its ledger row, when and at what cost it was released; and what serving it
    charged the asker (``charged``, zero when the release already counted against
    every budget they are under) and where (``charged_to``)."""

    entry_id: int
    time: str
    cost: Cost
    reply: Reply
    charged: Cost
    charged_to: tuple[Scope, ...]


@dataclass
class Served:
    """One release of a replay key, and what of one asker's it counts against so far
    (``releases_of``): which of their groups, and which users of the two that
    matter (its own, and the asker if they were charged for it)."""

    id: int
    time: str
    cost: Cost
    groups: set[str]
    users: set[str]


def releases_of(
    db: sqlite3.Connection, dataset: str, replay_key: str, user: str, mine: frozenset[str]
) -> list[Served]:
    """Every release of ``replay_key`` on ``dataset``, first first, with what of the
    asker's it counts against: which of their groups ``mine`` (charged when it was
    released, or when served to a member who had not learned it), and whether
    ``user`` (its own user, or one charged when served it: a zero-cost replay row,
    a user's own replay or one served free by an older gate, counts nowhere).

    Read by three indexed lookups, never the stored replies: the key's releases
    (a few), the user's own rows of the key, and the asker's groups' charges among
    the key's rows; none reads a group's or the dataset's whole history, and
    nothing is decided per row in Python."""
    rows = db.execute(
        "SELECT id, time, user, epsilon, delta, rho FROM entries"
        " WHERE dataset = ? AND replay_key = ? AND status = ? ORDER BY id",
        (dataset, replay_key, RELEASED),
    ).fetchall()
    if not rows:
        return []
    paid = {
        source
        for (source,) in db.execute(
            "SELECT DISTINCT source FROM entries INDEXED BY entries_replay WHERE user = ?"
            " AND dataset = ? AND replay_key = ? AND status = ? AND source IS NOT NULL"
            " AND (epsilon > 0 OR delta > 0 OR rho > 0)",
            (user, dataset, replay_key, REPLAYED),
        )
    }
    counted: dict[int, set[str]] = {}
    if mine:
        marks = ", ".join("?" * len(mine))
        for release, group in db.execute(
            # The key's rows first (CROSS JOIN keeps that order), each looked up in
            # charged_groups by its id: the other way round would read every
            # charge of the asker's groups, a history that only grows.
            "SELECT DISTINCT COALESCE(e.source, e.id), g.grp FROM entries AS e"
            " CROSS JOIN charged_groups AS g ON g.entry_id = e.id WHERE g.dataset = ?"
            f" AND g.grp IN ({marks}) AND e.dataset = ? AND e.replay_key = ?"
            " AND e.status IN (?, ?)",
            (dataset, *sorted(mine), dataset, replay_key, RELEASED, REPLAYED),
        ):
            counted.setdefault(release, set()).add(group)
    return [
        Served(
            row["id"],
            row["time"],
            Cost(row["epsilon"], row["delta"], row["rho"]),
            counted.get(row["id"], set()),
            {row["user"]} | ({user} if row["id"] in paid else set()),
        )
        for row in rows
    ]


def fresh_because(
    db: sqlite3.Connection, user: str, dataset: str, replay_key: str | None
) -> str | None:
    """Why a query with no release under ``replay_key`` is answered afresh, when the same
    query was released to ``user`` before under other versions of the data or the policy
    (``DATA_CHANGED``, ``POLICY_CHANGED``, ``BOTH_CHANGED``; ``UNVERSIONED`` for a
    release of a ledger from before versions); None if it never was."""
    if not isinstance(replay_key, ReplayKey):
        return None
    row = db.execute(
        "SELECT k.data, k.policy FROM replay_keys AS k JOIN entries AS e"
        " ON e.replay_key = k.replay_key WHERE k.query_key = ? AND e.user = ?"
        " AND e.dataset = ? AND e.status = ? ORDER BY e.id DESC LIMIT 1",
        (replay_key.query, user, dataset, RELEASED),
    ).fetchone()
    if row is None:
        older = db.execute(
            "SELECT 1 FROM entries WHERE user = ? AND dataset = ? AND replay_key = ?"
            " AND status = ? LIMIT 1",
            (user, dataset, replay_key.query, RELEASED),
        ).fetchone()
        return None if older is None else UNVERSIONED
    data, policy = row["data"] != replay_key.data, row["policy"] != replay_key.policy
    if data and policy:
        return BOTH_CHANGED
    if data:
        return DATA_CHANGED
    return POLICY_CHANGED if policy else None
