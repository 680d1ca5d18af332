"""Where the gate listens: a unix socket (identity from ``SO_PEERCRED``) or TCP (bearer
tokens), bound before the engine opens so that a second gate started by mistake on
the same address stops before it touches the state directory of the first."""

from __future__ import annotations

import logging
import os
import socket
import stat
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from tornado import netutil

log = logging.getLogger("dpmagic.gate")

# sun_path is 108 bytes including the terminating NUL.
MAX_SOCKET_PATH_BYTES = 107
LISTEN_BACKLOG = 1024


class ListenError(ValueError):
    """The listen address is malformed or cannot be used."""


@dataclass(frozen=True)
class Listener:
    """Bound, listening sockets (and the file, for a unix socket)."""

    sockets: list[socket.socket]
    address: str
    socket_path: Path | None = None
    socket_inode: int | None = None

    def close(self) -> None:
        for sock in self.sockets:
            sock.close()
        path = self.socket_path
        # Only our own socket: a gate started after us may have replaced it.
        if path is not None and path.exists() and path.stat().st_ino == self.socket_inode:
            path.unlink()


def bind_unix(path: Path) -> Listener:
    _clear_stale_socket(path)
    # Anyone local may connect: identity comes from SO_PEERCRED, not the mode.
    sock = netutil.bind_unix_socket(str(path), mode=0o666, backlog=LISTEN_BACKLOG)
    return Listener([sock], f"unix:{path}", path, path.stat().st_ino)


def bind_tcp(where: str) -> Listener:
    host, port = _host_port(where)
    sockets = netutil.bind_sockets(port, host, backlog=LISTEN_BACKLOG)
    bound_host, bound_port = sockets[0].getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in str(bound_host) else str(bound_host)
    if not _loopback(str(bound_host)):
        log.warning("tokens travel in clear text over tcp: put TLS in front of this gate")
    return Listener(sockets, f"tcp:{shown}:{bound_port}")


def hub_listen() -> str:
    """Where a Hub-managed gate listens: the ``url`` the Hub gave the service."""
    url = os.environ.get("JUPYTERHUB_SERVICE_URL")
    if not url:
        raise ListenError(
            "--jupyterhub without --listen needs JUPYTERHUB_SERVICE_URL: give the service "
            "a url in jupyterhub_config.py, or pass --listen tcp:HOST:PORT"
        )
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or not parts.port:
        raise ListenError(f"JUPYTERHUB_SERVICE_URL {url!r} is not http://HOST:PORT")
    host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
    return f"tcp:{host}:{parts.port}"


def split_listen(listen: str) -> tuple[str, str]:
    kind, _, where = listen.partition(":")
    if kind not in ("unix", "tcp") or not where:
        raise ListenError(f"listen address {listen!r} is not unix:PATH or tcp:HOST:PORT")
    return kind, where


def _host_port(where: str) -> tuple[str, int]:
    host, _, port = where.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not host or not port.isdigit() or int(port) > 65535:
        raise ListenError(f"tcp address {where!r} is not HOST:PORT (PORT 0 picks a free one)")
    return host, int(port)


def _loopback(host: str) -> bool:
    return host in ("::1", "localhost") or host.startswith("127.")


def socket_path(where: str) -> Path:
    path = Path(where).expanduser().absolute()
    if len(os.fsencode(path)) > MAX_SOCKET_PATH_BYTES:
        raise ListenError(
            f"socket path {path} is longer than {MAX_SOCKET_PATH_BYTES} bytes; choose a shorter one"
        )
    return path


def _clear_stale_socket(path: Path) -> None:
    """Remove a socket left by a gate that died; never a live gate's, nor a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise ListenError(f"{path} exists and is not a socket; refusing to replace it")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(str(path))
        except OSError:
            path.unlink()
            return
    raise ListenError(f"another gate is already listening on unix:{path}")


def private_dir(path: Path) -> None:
    """The state directory (ledger, materialised data) is the gate user's alone."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.stat().st_uid == os.getuid():
        os.chmod(path, 0o700)
