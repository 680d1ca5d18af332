"""The gate's HTTP/JSON API (DESIGN.md §6) on a unix socket or TCP.

This is the process boundary the privacy model rests on: the kernel gets
only what these handlers write back. Hence the rules kept here, whatever
the engine does:

- every request is attributed to a user by the authenticator, never by
  anything the body claims;
- an unexpected exception is answered with a fixed text and only its type is
  logged, because its message may quote private values;
- replies to ``/v1/query`` are held back to the next multiple of the policy's
  ``response_quantum_ms``, so how long a query took does not leak;
- the access log names the user, route and status, never the SQL.

Run it with ``dpmagic serve`` or ``python -m dpmagic.gate.server``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import socket
import socketserver
import stat
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from dpmagic.gate.auth import (
    Authenticator,
    HubConfigError,
    HubTokenAuth,
    PeerCredAuth,
    TokenAuth,
    TokenFileError,
)
from dpmagic.gate.engine import Engine
from dpmagic.gate.errors import BadRequest, Failed, GateError
from dpmagic.gate.policy import Policy, PolicyError, load_policy

log = logging.getLogger("dpmagic.gate")

LISTENING = "dpmagic gate listening on"
MAX_BODY_BYTES = 1 << 20
# A client that stops sending mid-request must not hold a thread (and the
# clean shutdown, which waits for request threads) for ever.
CONNECTION_TIMEOUT_S = 60.0
# sun_path is 108 bytes including the terminating NUL.
MAX_SOCKET_PATH_BYTES = 107
USAGE_ERROR = 2
LISTEN_BACKLOG = 128
# Request threads kept at most; each serves one connection at a time.
MAX_REQUEST_THREADS = 512
# Entries of /v1/history: the newest ones, by default and at most.
HISTORY_DEFAULT = 100
HISTORY_MAX = 1000


class ListenError(ValueError):
    """The listen address is malformed or cannot be used."""


class _HTTPError(BadRequest):
    """A ``bad_request`` with its own HTTP status (400, 404, 405, 411, 413)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class App:
    """What every request handler needs: the engine and who is asking."""

    engine: Engine
    auth: Authenticator
    quantum_s: float


class GateHandler(BaseHTTPRequestHandler):
    """One request: route, authenticate, answer JSON, then close."""

    server_version = "dpmagic-gate"
    sys_version = ""
    timeout = CONNECTION_TIMEOUT_S

    def __init__(self, app: App, *args: object) -> None:
        self.app = app
        self.arrival = time.monotonic()
        self.body_read = False
        super().__init__(*args)  # type: ignore[arg-type]

    def parse_request(self) -> bool:
        # The request line has just arrived: the padding clock starts here.
        self.arrival = time.monotonic()
        self.body_read = False
        return super().parse_request()

    def do_GET(self) -> None:
        self._dispatch("GET")

    def do_POST(self) -> None:
        self._dispatch("POST")

    def _dispatch(self, method: str) -> None:
        url = urlsplit(self.path)
        user = "-"
        try:
            route = ROUTES.get(url.path)
            if route is None:
                raise _HTTPError(404, f"no such endpoint: {url.path}")
            if route.method != method:
                raise _HTTPError(405, f"{url.path} takes {route.method}, not {method}")
            if route.authenticated:
                user = self.app.auth.identify(self)
            status, reply = 200, route.run(self, user, url.query)
        except GateError as exc:
            status, reply = exc.status, exc.as_reply()
        except Exception as exc:
            log.error("%s %s failed: %s", method, url.path, type(exc).__name__)
            status, reply = 500, Failed().as_reply()
        if method == "POST" and not self.body_read:
            self._discard_body()
        if url.path == "/v1/query":
            self._hold_until_quantum()
        self._reply(status, reply)
        log.info("%s %s %s %d", user, method, url.path, status)

    def _discard_body(self) -> None:
        """Read a body the request was refused before reading: a client still
        sending it when the reply and the close came would see a broken pipe
        instead of the reply."""
        self.body_read = True
        length = self.headers.get("Content-Length", "")
        if not length.isdigit() or int(length) > MAX_BODY_BYTES:
            self.close_connection = True
            return
        try:
            self.rfile.read(int(length))
        except OSError:
            self.close_connection = True

    def _hold_until_quantum(self) -> None:
        quantum = self.app.quantum_s
        if quantum <= 0:
            return
        elapsed = time.monotonic() - self.arrival
        release_at = self.arrival + quantum * max(1, math.ceil(elapsed / quantum))
        while (wait := release_at - time.monotonic()) > 0:
            time.sleep(wait)

    def _reply(self, status: int, body: dict[str, object]) -> None:
        data = json.dumps(body, default=str).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Cache-Control", "no-store")
            if status == 401:
                self.send_header("WWW-Authenticate", "Bearer")
            self.end_headers()
            self.wfile.write(data)
        except OSError:  # the client went away; nothing to tell it
            self.close_connection = True

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """Malformed HTTP (bad request line, unknown method) answered as JSON."""
        self.close_connection = True
        text = message or HTTPStatus(code).phrase
        self._reply(code, {"error": {"kind": "bad_request", "message": text}})

    def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
        """Silenced: the default line quotes the request; `_dispatch` logs its own."""

    def log_message(self, format: str, *args: object) -> None:
        """Silenced for the same reason as `log_request`."""

    def read_json(self) -> object:
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            raise _HTTPError(411, "send the body with a Content-Length, not chunked")
        length = self.headers.get("Content-Length")
        if length is None:
            raise _HTTPError(411, "a request body needs a Content-Length header")
        try:
            size = int(length)
        except ValueError:
            raise _HTTPError(400, "Content-Length must be a number") from None
        if size < 0:
            raise _HTTPError(400, "Content-Length must not be negative")
        if size > MAX_BODY_BYTES:
            self.close_connection = True
            raise _HTTPError(413, f"the request body is over {MAX_BODY_BYTES} bytes")
        self.body_read = True
        try:
            raw = self.rfile.read(size)
        except OSError:
            self.close_connection = True
            raise _HTTPError(400, "the request body did not arrive") from None
        if len(raw) != size:
            raise _HTTPError(400, "the request body is shorter than its Content-Length")
        try:
            return json.loads(raw)
        except (UnicodeDecodeError, ValueError):
            raise _HTTPError(400, "the request body is not valid JSON") from None


def _params(query: str, allowed: set[str]) -> dict[str, str]:
    """Single-valued query parameters; a typo is an error, not a silent default."""
    parsed = parse_qs(query, keep_blank_values=True)
    for name, values in parsed.items():
        if name not in allowed:
            raise _HTTPError(400, f"unknown parameter {name!r}")
        if len(values) != 1:
            raise _HTTPError(400, f"parameter {name!r} is given more than once")
    return {name: values[0] for name, values in parsed.items()}


def _query(handler: GateHandler, user: str, query: str) -> dict[str, object]:
    _params(query, set())
    return handler.app.engine.query(user, handler.read_json())


def _budget(handler: GateHandler, user: str, query: str) -> dict[str, object]:
    params = _params(query, {"dataset", "notebook"})
    return handler.app.engine.budget(user, params.get("dataset"), params.get("notebook"))


def _history(handler: GateHandler, user: str, query: str) -> dict[str, object]:
    params = _params(query, {"dataset", "notebook", "limit"})
    raw = params.get("limit", str(HISTORY_DEFAULT))
    if not raw.isdigit() or not 1 <= int(raw) <= HISTORY_MAX:
        raise _HTTPError(400, f"limit must be a whole number from 1 to {HISTORY_MAX}")
    return handler.app.engine.history(user, params.get("dataset"), params.get("notebook"), int(raw))


def _schema(handler: GateHandler, user: str, query: str) -> dict[str, object]:
    return handler.app.engine.schema(_params(query, {"dataset"}).get("dataset"))


def _health(handler: GateHandler, user: str, query: str) -> dict[str, object]:
    return {"ok": True}


@dataclass(frozen=True)
class Route:
    method: str
    authenticated: bool
    run: Callable[[GateHandler, str, str], dict[str, object]]


ROUTES: dict[str, Route] = {
    "/v1/query": Route("POST", True, _query),
    "/v1/budget": Route("GET", True, _budget),
    "/v1/schema": Route("GET", True, _schema),
    "/v1/history": Route("GET", True, _history),
    "/v1/health": Route("GET", False, _health),
}


class _Pooled(socketserver.ThreadingMixIn):
    """A thread per connection, as ``ThreadingMixIn``, but kept for the next one.

    A request on a fresh thread took ~1.3 ms longer: the first calls into DuckDB,
    OpenDP's sampler and pandas on a thread pay for its set-up. Threads are added
    whenever none is idle (up to ``MAX_REQUEST_THREADS``), so a slow query or a
    slow client never holds up the others. Joined at close: a query in flight at
    shutdown finishes and records its release before the ledger closes.
    """

    _pool: ThreadPoolExecutor | None = None

    def process_request(self, request: object, client_address: object) -> None:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(MAX_REQUEST_THREADS, "dpmagic-request")
        self._pool.submit(self.process_request_thread, request, client_address)

    def server_close(self) -> None:
        super().server_close()  # closes the socket (no thread of its own to join)
        if self._pool is not None:
            self._pool.shutdown(wait=True)


class _UnixServer(_Pooled, socketserver.UnixStreamServer):
    # socketserver's backlog of 5 turns a sixth simultaneous connect away (EAGAIN).
    request_queue_size = LISTEN_BACKLOG


class _TCPServer(_Pooled, socketserver.TCPServer):
    request_queue_size = LISTEN_BACKLOG
    allow_reuse_address = True


class _TCP6Server(_TCPServer):
    address_family = socket.AF_INET6


@dataclass(frozen=True)
class _Listener:
    """A bound, listening socket (and its file, for a unix socket)."""

    server: socketserver.BaseServer
    address: str
    socket_path: Path | None = None
    socket_inode: int | None = None

    def close(self) -> None:
        self.server.server_close()
        path = self.socket_path
        # Only our own socket: a gate started after us may have replaced it.
        if path is not None and path.exists() and path.stat().st_ino == self.socket_inode:
            path.unlink()


class RunningGate:
    """A listening server and its engine; ``close`` releases both and the socket file."""

    def __init__(self, listener: _Listener, engine: Engine) -> None:
        self._listener = listener
        self.engine = engine
        self.address = listener.address

    def serve_forever(self) -> None:
        self._listener.server.serve_forever()

    def shutdown(self) -> None:
        """Stop the serving loop; call from a thread other than the one serving."""
        self._listener.server.shutdown()

    def close(self) -> None:
        # Request threads are joined first, so the engine closes after the last reply.
        self._listener.close()
        self.engine.close()


def open_gate(policy: Policy, listen: str, jupyterhub: bool = False) -> RunningGate:
    """Bind the listening socket, then build the engine; nothing is served yet.

    Binding comes first so that a second gate started by mistake on the same
    address stops before it touches the state directory the first one uses.
    With ``jupyterhub``, every request is identified by the Hub from its token.
    """
    kind, where = _split_listen(listen)
    auth: Authenticator = PeerCredAuth()
    if jupyterhub:
        auth = HubTokenAuth()
    elif kind == "tcp":
        if policy.gate.tokens_file is None:
            raise ListenError(
                f"listening on {listen} needs bearer tokens: set gate.tokens_file in the "
                "policy to a TOML file with a [users] table, or listen on a unix socket"
            )
        auth = TokenAuth.from_file(policy.gate.tokens_file)

    def handler(*args: object) -> GateHandler:
        # `app` is bound below, before the first request is served.
        return GateHandler(app, *args)

    listener = (
        _bind_unix(_socket_path(where), handler) if kind == "unix" else _bind_tcp(where, handler)
    )
    try:
        _private_dir(policy.gate.state_dir)
        engine = Engine(policy)
    except BaseException:
        listener.close()
        raise
    app = App(engine=engine, auth=auth, quantum_s=policy.gate.response_quantum_ms / 1000)
    return RunningGate(listener, engine)


def _bind_unix(path: Path, handler: Callable[..., GateHandler]) -> _Listener:
    _clear_stale_socket(path)
    server = _UnixServer(str(path), handler)
    # Anyone local may connect: identity comes from SO_PEERCRED, not the mode.
    os.chmod(path, 0o666)
    return _Listener(server, f"unix:{path}", path, path.stat().st_ino)


def _bind_tcp(where: str, handler: Callable[..., GateHandler]) -> _Listener:
    host, port = _host_port(where)
    server_class = _TCP6Server if ":" in host else _TCPServer
    server = server_class((host, port), handler)
    bound_host, bound_port = server.server_address[:2]
    shown = f"[{bound_host}]" if ":" in str(bound_host) else str(bound_host)
    if not _loopback(str(bound_host)):
        log.warning("tokens travel in clear text over tcp: put TLS in front of this gate")
    return _Listener(server, f"tcp:{shown}:{bound_port}")


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


def serve(policy: Policy, listen: str | None = None, jupyterhub: bool = False) -> int:
    """Serve until SIGTERM or SIGINT, then finish requests in flight and exit 0.

    Prints exactly one line, ``dpmagic gate listening on ADDRESS``, once the
    socket accepts connections, so a supervisor can wait for it.
    """
    # Our access log at INFO; libraries (jupyterhub's, under --jupyterhub) only warnings.
    logging.basicConfig(level=logging.WARNING, format="dpmagic gate: %(message)s")
    log.setLevel(logging.INFO)
    try:
        if jupyterhub and listen is None:
            listen = hub_listen()
        gate = open_gate(policy, listen or policy.gate.listen, jupyterhub=jupyterhub)
    except (ListenError, TokenFileError, HubConfigError, PolicyError, OSError) as exc:
        print(f"dpmagic: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    print(f"{LISTENING} {gate.address}", flush=True)

    def stop(signum: int, frame: object) -> None:
        # shutdown() waits for the serving loop, which runs in this very
        # thread: ask for it from another one.
        threading.Thread(target=gate.shutdown, daemon=True).start()

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        gate.serve_forever()
    finally:
        gate.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0


def _split_listen(listen: str) -> tuple[str, str]:
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


def _socket_path(where: str) -> Path:
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


def _private_dir(path: Path) -> None:
    """The state directory (ledger, materialised data) is the gate user's alone."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.stat().st_uid == os.getuid():
        os.chmod(path, 0o700)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dpmagic.gate.server", description="Run the dpmagic gate."
    )
    parser.add_argument("--policy", type=Path, required=True, help="the policy TOML file")
    parser.add_argument("--listen", help="unix:PATH or tcp:HOST:PORT (default: gate.listen)")
    parser.add_argument(
        "--jupyterhub", action="store_true", help="run as a JupyterHub service (Hub API tokens)"
    )
    args = parser.parse_args(argv)
    try:
        policy = load_policy(args.policy)
    except PolicyError as exc:
        print(f"dpmagic: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    return serve(policy, args.listen, jupyterhub=args.jupyterhub)


if __name__ == "__main__":
    sys.exit(main())
