"""Who is asking: the user a request's budget is charged to.

Identity must come from something the kernel cannot choose. On a unix socket
that is the kernel process's uid, which the operating system reports for the
connection (``SO_PEERCRED``); over TCP it is a secret bearer token issued by
the admin; or, on JupyterHub, the kernel's ``JUPYTERHUB_API_TOKEN``, which
only the Hub can resolve to a user. An authenticator is anything with
``identify``.
"""

from __future__ import annotations

import hmac
import os
import pwd
import socket
import stat
import struct
import tomllib
from pathlib import Path
from typing import Any, Protocol

from dpmagic.gate.failures import Unauthorized
from dpmagic.gate.membership import Membership

MIN_TOKEN_CHARS = 16
_CREDENTIALS = struct.Struct("3i")  # struct ucred: pid, uid, gid


class Headers(Protocol):
    def get(self, name: str, /) -> str | None: ...


class Request(Protocol):
    """The part of a request an authenticator may look at: its socket and headers."""

    @property
    def connection(self) -> socket.socket: ...

    @property
    def headers(self) -> Headers: ...


class Authenticator(Protocol):
    """``at_accept``: it needs only the socket, so the server identifies the caller
    before reading a byte (and applies the per-user caps from the start).
    ``blocking``: ``identify`` may wait on the network, so the server calls it off
    its event loop."""

    at_accept: bool
    blocking: bool

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

    at_accept = True
    blocking = False

    def identify(self, request: Request) -> str:
        return peer_user(request.connection)


class TokenAuth:
    """TCP: ``Authorization: Bearer <token>`` looked up in the tokens file."""

    at_accept = False
    blocking = False

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


class HubClient(Protocol):
    """What the gate asks of jupyterhub's ``HubAuth`` (a test hands in its own)."""

    access_scopes: set[str]

    def user_for_token(self, token: str, *, sync: bool) -> dict[str, Any] | None: ...

    def check_scopes(self, required_scopes: set[str], model: dict[str, Any]) -> set[str]: ...


class HubTokenAuth:
    """JupyterHub: the bearer token is a Hub API token, resolved by the Hub.

    Every single-user server, and so every kernel in it, holds a token the
    Hub issued to that user (``JUPYTERHUB_API_TOKEN``); the client sends it.
    The Hub says whose it is and what it may do (jupyterhub's ``HubAuth``):
    it must belong to a user, not a service, and carry this gate's access
    scope (``access:services!service=NAME``). ``JUPYTERHUB_USER`` and other
    claims the kernel makes about itself are never read.

    The Hub's answer also lists the user's Hub groups where the token may read
    them (the ``read:users:groups`` scope on the user); they are reported to
    ``membership``, where they join the policy's ``[groups]`` for group budgets
    and shared releases (docs/deployment.md, "Groups on JupyterHub").
    """

    membership: Membership | None = None

    at_accept = False
    blocking = True  # asks the Hub over HTTP
    # How long the Hub's answer for a token is reused: long enough to spare
    # the Hub a request per query, short enough that a revoked token stops
    # working soon.
    CACHE_S = 60

    def __init__(self, hub_auth: HubClient | None = None) -> None:
        from jupyterhub.services.auth import HubAuth

        self._hub: HubClient = (
            hub_auth if hub_auth is not None else HubAuth(cache_max_age=self.CACHE_S)
        )
        self.scopes: set[str] = set(self._hub.access_scopes)
        if not self.scopes:
            raise HubConfigError(
                "--jupyterhub needs the gate's service name: run it as a Hub service, or set "
                "JUPYTERHUB_SERVICE_NAME (and JUPYTERHUB_API_URL) in its environment"
            )

    def identify(self, request: Request) -> str:
        from tornado.web import HTTPError

        token = _bearer(request, "a JupyterHub API token ($JUPYTERHUB_API_TOKEN)")
        try:
            model = self._hub.user_for_token(token, sync=True)
        except HTTPError:
            raise Unauthorized("the Hub could not check the token; try again later") from None
        if not model:
            raise Unauthorized("the Hub does not know this token")
        if model.get("kind", "user") != "user":
            raise Unauthorized("this gate answers users' tokens, not services'")
        if not self._hub.check_scopes(self.scopes, model):
            raise Unauthorized(
                f"the token lacks the scope {' or '.join(sorted(self.scopes))}: "
                "add it to c.Spawner.server_token_scopes and to the users' role"
            )
        name = str(model["name"])
        if self.membership is not None:
            self.membership.report(name, [str(g) for g in model.get("groups") or ()])
        return name


class HubConfigError(ValueError):
    """The gate cannot act as a JupyterHub service; the message says what is missing."""


def _bearer(request: Request, what: str) -> str:
    """The token of an ``Authorization: Bearer`` (or Hub-style ``token``) header."""
    header = request.headers.get("Authorization")
    if header is None:
        raise Unauthorized(f"this gate needs {what} in an `Authorization: Bearer` header")
    scheme, _, token = header.strip().partition(" ")
    if scheme.lower() not in ("bearer", "token") or not token.strip():
        raise Unauthorized("the Authorization header must be `Bearer <token>`")
    return token.strip()


def load_tokens(path: Path) -> dict[str, str]:
    """The ``[users]`` table of a tokens file: user name → token.

    Like ssh with a private key, the gate refuses a tokens file that another
    user could read or change: anyone who reads it can act as every user in it.
    """
    try:
        _check_private(Path(path))
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


def _check_private(path: Path) -> None:
    """Refuse a tokens file not owned by the gate's user, or open to group or others."""
    info = path.stat()
    if info.st_uid != os.geteuid():
        raise TokenFileError(
            f"tokens file {path} belongs to uid {info.st_uid}, not to the gate's user "
            f"(uid {os.geteuid()}): `chown` it to the gate's user and `chmod 600 {path}`"
        )
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        raise TokenFileError(
            f"tokens file {path} is accessible by group or others (mode {mode:04o}); "
            f"anyone who reads it can act as its users: run `chmod 600 {path}`"
        )
