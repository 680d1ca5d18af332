"""Who may use the console, and how the audit log names them.

Owners only, three ways: the gate's Unix user (who started ``dpmagic console`` and
was printed its one-time login URL), a holder of an admin token from the file the
owner gave (``--admin-token-file``), or a JupyterHub admin (``hub.py``). Each way
names its owner differently in the audit log, so a change says how its author got in:
``alice`` (the Unix user, as ``dpmagic budget grant`` writes it), ``token:ops``,
``hub:ada``.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from dpmagic.gate.service.auth import load_tokens


class Way(StrEnum):
    """How an owner signed in."""

    UNIX = "unix"
    TOKEN = "token"
    HUB = "hub"


@dataclass(frozen=True)
class Owner:
    """Someone the console admits: a name and the way they proved it."""

    name: str
    way: Way

    @property
    def by(self) -> str:
        """The author of a change in the audit log (``budget grant by <by>: …``)."""
        return self.name if self.way == Way.UNIX else f"{self.way.value}:{self.name}"


class AdminTokens:
    """The console's admin tokens: a file of the gate's tokens file's form (``[users]``,
    a name and a long random token each), refused unless it is the console's user's
    and ``0600``, as the gate refuses its own (``service/auth.load_tokens``)."""

    def __init__(self, tokens: dict[str, str]) -> None:
        self._tokens = [(name, token.encode()) for name, token in tokens.items()]

    @classmethod
    def from_file(cls, path: Path) -> AdminTokens:
        return cls(load_tokens(path))

    def owner(self, offered: str) -> Owner | None:
        """The admin whose token ``offered`` is, if any. Every token is compared, in
        constant time, so how long it takes says nothing of how close a guess came."""
        given = offered.strip().encode()
        found = None
        for name, token in self._tokens:
            if hmac.compare_digest(given, token):
                found = name
        return None if found is None else Owner(found, Way.TOKEN)


def bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header, if it is one."""
    if header is None:
        return None
    scheme, _, token = header.strip().partition(" ")
    return (token.strip() or None) if scheme.lower() == "bearer" else None
