"""Who is asking: the user a request's budget is charged to.

Identity must come from something the kernel cannot choose. On a unix socket
that is the kernel process's uid, which the operating system reports for the
connection (``SO_PEERCRED``); over TCP it is a secret bearer token issued by
the admin. An authenticator is anything with ``identify``: a JupyterHub one
(resolving the kernel's ``JUPYTERHUB_API_TOKEN`` through the Hub) can be
added next to these without touching the server.
"""

from __future__ import annotations

import hmac
import pwd
import socket
import struct
import tomllib
from email.message import Message
from pathlib import Path
from typing import Protocol

from dpmagic.gate.errors import Unauthorized

MIN_TOKEN_CHARS = 16
_CREDENTIALS = struct.Struct("3i")  # struct ucred: pid, uid, gid


class Request(Protocol):
    """The part of a request handler an authenticator may look at."""

    connection: socket.socket
    headers: Message


class Authenticator(Protocol):
    def identify(self, request: Request) -> str:
        """The user name to charge; raises ``Unauthorized`` if there is none."""


class TokenFileError(ValueError):
    """The tokens file cannot be used; the message says how to fix it."""


def peer_user(sock: socket.socket) -> str:
    """The login name of the process at the other end of a unix socket."""
    if sock.family != socket.AF_UNIX:
        raise Unauthorized("peer credentials need a unix socket connection")
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _CREDENTIALS.size)
    _pid, uid, _gid = _CREDENTIALS.unpack(raw)
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:  # a uid without a passwd entry, e.g. in a container
        return f"uid:{uid}"


class PeerCredAuth:
    """Unix sockets: the kernel's uid, as the kernel cannot forge it."""

    def identify(self, request: Request) -> str:
        return peer_user(request.connection)


class TokenAuth:
    """TCP: ``Authorization: Bearer <token>`` looked up in the tokens file."""

    def __init__(self, tokens: dict[str, str]) -> None:
        self._tokens = [(user, token.encode()) for user, token in tokens.items()]

    @classmethod
    def from_file(cls, path: Path) -> TokenAuth:
        return cls(load_tokens(path))

    def identify(self, request: Request) -> str:
        header = request.headers.get("Authorization")
        if header is None:
            raise Unauthorized("this gate needs an `Authorization: Bearer <token>` header")
        scheme, _, token = header.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthorized("the Authorization header must be `Bearer <token>`")
        offered = token.strip().encode()
        # Compare against every token so the time taken says nothing about
        # which user, if any, the token is close to.
        found = None
        for user, known in self._tokens:
            if hmac.compare_digest(offered, known):
                found = user
        if found is None:
            raise Unauthorized("the token is not valid for this gate")
        return found


def load_tokens(path: Path) -> dict[str, str]:
    """The ``[users]`` table of a tokens file: user name → token."""
    try:
        raw = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise TokenFileError(f"tokens file not found: {path}") from None
    except tomllib.TOMLDecodeError as exc:
        raise TokenFileError(f"tokens file {path}: not valid TOML: {exc}") from None
    users = raw.get("users")
    if not isinstance(users, dict) or not users:
        raise TokenFileError(
            f'tokens file {path}: declare tokens under [users], e.g. alice = "<secret>"'
        )
    seen: set[str] = set()
    for user, token in users.items():
        if not isinstance(token, str):
            raise TokenFileError(f"tokens file {path}: the token of {user!r} must be a string")
        if len(token) < MIN_TOKEN_CHARS:
            raise TokenFileError(
                f"tokens file {path}: the token of {user!r} is shorter than "
                f"{MIN_TOKEN_CHARS} characters; use a long random one"
            )
        if token in seen:
            raise TokenFileError(f"tokens file {path}: two users share the token of {user!r}")
        seen.add(token)
    return dict(users)
