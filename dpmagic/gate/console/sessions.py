"""The browsers signed in to the console, kept in the console's memory only.

A session is a random cookie value the console maps to an owner and to that
session's CSRF token (``guards.py``). Only a hash of the cookie is kept, so the
table holds nothing a reader could present as a cookie, and a lookup's time depends
on the hash, not on how much of a guessed cookie is right. A session ends after
``LIFETIME_S``, on sign-out, or when the console stops (restarting it signs everyone
out, the login URL it prints included).

The login token printed by ``dpmagic console`` is good once: exchanged for a session
on first use, it cannot be replayed from a shell history, a proxy's log or a
browser's history.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from dpmagic.gate.console.owners import Owner

# A session lasts a working day, however active; then its owner signs in again.
LIFETIME_S = 8 * 3600.0
TOKEN_BYTES = 32


@dataclass(frozen=True)
class Session:
    """A signed-in browser: who, its CSRF token, and when it ends (``clock`` time)."""

    owner: Owner
    csrf: str
    ends: float


class Sessions:
    """Login tokens and sessions, by the hash of their secret."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._logins: set[bytes] = set()
        self._sessions: dict[bytes, Session] = {}
        self._notes: dict[bytes, str] = {}  # what a session's next page says first

    def login_token(self) -> str:
        """A new one-time login token."""
        token = secrets.token_urlsafe(TOKEN_BYTES)
        self._logins.add(_digest(token))
        return token

    def redeem(self, token: str) -> bool:
        """Whether ``token`` is an unused login token; it is used up if so."""
        offered = _digest(token)
        found = None
        for known in self._logins:
            if hmac.compare_digest(offered, known):
                found = known
        if found is None:
            return False
        self._logins.discard(found)
        return True

    def open(self, owner: Owner) -> tuple[str, Session]:
        """A new session for ``owner``: its cookie value, and the session."""
        now = self._clock()
        for key in [k for k, s in self._sessions.items() if s.ends <= now]:  # the ended
            del self._sessions[key]
            self._notes.pop(key, None)
        cookie = secrets.token_urlsafe(TOKEN_BYTES)
        session = Session(owner, secrets.token_urlsafe(TOKEN_BYTES), now + LIFETIME_S)
        self._sessions[_digest(cookie)] = session
        return cookie, session

    def find(self, cookie: str | None) -> Session | None:
        """The live session of a cookie value, if any (an ended one is forgotten)."""
        if not cookie:
            return None
        key = _digest(cookie)
        session = self._sessions.get(key)
        if session is not None and session.ends <= self._clock():
            self.close(cookie)
            return None
        return session

    def close(self, cookie: str | None) -> None:
        if cookie:
            self._sessions.pop(_digest(cookie), None)
            self._notes.pop(_digest(cookie), None)

    def note(self, cookie: str, text: str) -> None:
        """Leave ``text`` for the session's next page (what its last change did)."""
        self._notes[_digest(cookie)] = text

    def take_note(self, cookie: str | None) -> str | None:
        return self._notes.pop(_digest(cookie), None) if cookie else None


def _digest(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()
