"""Which ``Host`` a request to the console may name: the addresses it serves.

Nothing could be forged through another name today (``guards.py``: the session
cookie is the console's host's alone, and a change needs its CSRF token), but a
console that answers any ``Host`` answers a name someone else controls and has
pointed at its address (DNS rebinding): to the browser, the console's pages are then
that site's own, readable by its script. Pinned, the console leaves no such door,
whatever a later change to its cookies or pages. A request naming another host is
answered a bare 400 before anything else is read (``server.py``).

The names it answers, with the port it serves on:

- the address given with ``--host`` and each address it is bound to;
- for a loopback bind, ``localhost``, ``127.0.0.1`` and ``[::1]`` (one machine's
  names for itself: a browser there may use any of them);
- for a bind beyond loopback, the machine's own names (``socket.gethostname`` and
  its fully qualified name), and for a bind on every interface (``0.0.0.0``, ``::``)
  any IP address: a rebinding needs a name, and an address typed into a browser is
  the console's own origin;
- a public address configured for it (``public``): on JupyterHub, the Hub's public
  URL (``c.JupyterHub.public_url``, given to services as ``JUPYTERHUB_PUBLIC_URL``),
  with that URL's port, since the browser's ``Host`` is the Hub's proxy's. Where the
  Hub names none, it cannot say under which name it is reached: the console then
  answers IP addresses and loopback names on any port (the test Hub's
  ``127.0.0.1:PORT``), and a Hub reached by a name needs its ``public_url`` set.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
DEFAULT_PORTS = {"http": 80, "https": 443}


def split_host(value: str) -> tuple[str, int | None] | None:
    """A ``Host`` header's name (lowercase, IPv6 without brackets) and port (None when
    it names none); None when it is not a host at all (a path, a user, spaces)."""
    try:
        parts = urlsplit("//" + value.strip())
        name, port = parts.hostname, parts.port
    except ValueError:
        return None
    if not name or parts.username is not None or parts.path or parts.query or parts.fragment:
        return None
    if any(c.isspace() for c in value):
        return None
    return name.lower().rstrip("."), port


def is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _loopback(address: str) -> bool:
    return address in LOOPBACK_NAMES or (
        is_ip(address) and ipaddress.ip_address(address).is_loopback
    )


def _wildcard(address: str) -> bool:
    return address in ("", "0.0.0.0", "::") or (
        is_ip(address) and ipaddress.ip_address(address).is_unspecified
    )


@dataclass(frozen=True)
class Hosts:
    """The ``(name, port)`` pairs a request's ``Host`` may name. ``any_ip`` admits an
    IP address on the served port (a bind on every interface); ``any_port`` admits an
    IP address or loopback name on any port (on a Hub that names no public URL). The
    empty default admits nothing: a console nobody told its address refuses."""

    pairs: frozenset[tuple[str, int | None]] = frozenset()
    port: int | None = None
    any_ip: bool = False
    any_port: bool = False

    @classmethod
    def served(
        cls,
        given: str,
        bound: Iterable[str],
        port: int,
        public: Iterable[str] = (),
        *,
        behind_hub: bool = False,
    ) -> Hosts:
        """The hosts of a console bound to ``bound`` addresses on ``port``, asked to
        serve on ``given`` (``--host``), reachable at the ``public`` URLs too."""
        addresses = {given.strip().strip("[]").lower(), *(a.lower() for a in bound)} - {""}
        names = {a for a in addresses if not _wildcard(a)}
        if any(_loopback(a) for a in addresses):
            names |= LOOPBACK_NAMES
        if not all(_loopback(a) for a in addresses):
            names |= {n.lower() for n in (socket.gethostname(), socket.getfqdn()) if n}
        pairs: set[tuple[str, int | None]] = {(n, port) for n in names}
        for url in public:
            found = urlsplit(url if "//" in url else "//" + url)
            if found.hostname:  # a bare name without a port: the browser names none
                default = DEFAULT_PORTS.get(found.scheme)
                pairs.add((found.hostname.lower().rstrip("."), found.port or default))
        no_public = not list(public)
        return cls(
            frozenset(pairs),
            port,
            any_ip=any(_wildcard(a) for a in addresses),
            any_port=behind_hub and no_public,
        )

    def allows(self, host: str | None) -> bool:
        """Whether a request's ``Host`` header names one of these hosts. Without a port
        it names the scheme's default, which matches a public URL's (80 or 443)."""
        if not host:
            return False
        found = split_host(host)
        if found is None:
            return False
        name, port = found
        if self.any_port and (is_ip(name) or name in LOOPBACK_NAMES):
            return True
        if self.any_ip and is_ip(name) and port == self.port:
            return True
        if port is None:
            return any((name, p) in self.pairs for p in (None, *DEFAULT_PORTS.values()))
        return (name, port) in self.pairs
