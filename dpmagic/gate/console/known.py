"""Which users the gate knows, so that a grant to a name it does not know is asked
about before it creates a budget (``changes.py``).

A grant to a user the ledger has never seen is how a budget comes to exist, so a
misspelt name ("dna" for "ana") would quietly make a budget nobody will use, and
leave the student it was for without. The console therefore asks first, naming the
user it would create, unless the gate already knows them:

- from its tokens file (``[gate] tokens_file``): the users it serves over TCP;
- from the policy's ``[groups]``: every member of a group;
- from the ledger: everyone it has charged, refused or granted on any dataset;
- on JupyterHub, from the Hub: a user the Hub has (asked of the Hub's API with the
  console's own service token, ``hub.hub_knows``; it needs ``read:users:name``).

Names only: the tokens themselves are read to list their users and dropped.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable

from dpmagic.gate.ledger.store import Ledger
from dpmagic.gate.policy import Policy
from dpmagic.gate.service.auth import TokenFileError, load_tokens

# How many known names a refusal suggests for a name it does not know.
SUGGESTIONS = 3


def listed_users(policy: Policy, ledger: Ledger | None) -> dict[str, str]:
    """Each user the gate can list, with where it knows them from (the first of: its
    tokens file, a group, the ledger)."""
    found: dict[str, str] = {}
    if policy.gate.tokens_file is not None:
        try:
            for user in load_tokens(policy.gate.tokens_file):
                found.setdefault(user, "its tokens file")
        except (TokenFileError, OSError):
            pass  # the gate refuses such a file too; its users are then asked about
    for group, members in sorted(policy.groups.items()):
        for user in sorted(members):
            found.setdefault(user, f"group {group}")
    if ledger is not None:
        for name in sorted(policy.datasets):
            for user, _ in ledger.notebooks(name):
                found.setdefault(user, "the ledger")
    return found


def known_where(
    policy: Policy,
    ledger: Ledger | None,
    user: str,
    hub: Callable[[str], bool] | None = None,
) -> str | None:
    """Where the gate knows ``user`` from, or None if it does not."""
    where = listed_users(policy, ledger).get(user)
    if where is None and hub is not None and hub(user):
        where = "the Hub"
    return where


def sources(policy: Policy, hub: Callable[[str], bool] | None = None) -> list[str]:
    """Where the gate looks for a user, as a confirmation names them."""
    found = ["its tokens file"] if policy.gate.tokens_file is not None else []
    found += ["the policy's groups"] if policy.groups else []
    return [*found, "the ledger", *(["the Hub"] if hub is not None else [])]


def near(policy: Policy, ledger: Ledger | None, user: str) -> list[str]:
    """The known users whose names are closest to ``user`` (a slip's likely target)."""
    names = list(listed_users(policy, ledger))
    return difflib.get_close_matches(user, names, n=SUGGESTIONS, cutoff=0.5)
