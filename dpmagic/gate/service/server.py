"""The gate's HTTP/JSON API (docs/http-api.md) on a unix socket or TCP.

This is the process boundary the privacy model rests on: the kernel gets
only what these handlers write back. Hence the rules kept here, whatever
the engine does:

- every request is attributed to a user by the authenticator, never by
  anything the body claims;
- an unexpected exception is answered with a fixed text and only its type is
  logged, because its message may quote private values;
- a reply whose computation read the private data (``padding.PrivateRead``, set
  by the engine where a query's run begins) is held back to the next multiple
  of the policy's ``response_quantum_ms``, so how long the run took does not
  leak, and woken by a clock of its own, whose precision does not depend on
  when the wait began (``release_clock``); every other reply (a replay, a dry
  run, a refusal before the run, a budget) is a function of the request and of
  what the caller was already told, and leaves at once (``padding``);
- a user's place in the engine (``USER_REQUESTS``) is let go when the reply
  leaves, not when its computation ended, so a request queued behind a padded
  one starts no sooner than that padded reply is seen;
- the access log names the user, route and status, never the SQL.

And the rules that keep one user from starving the others (a local user can
open as many connections as they like and send as slowly as they like):

- one event loop (tornado) serves every connection, so a connection costs a
  socket and a buffer, not a thread; the engine, which blocks (DuckDB,
  SQLite), runs in a pool of threads beside it, never on the loop;
- the caller is identified before a byte is read where the transport allows:
  on a unix socket at accept (``SO_PEERCRED``), over TCP as soon as the
  headers are in; then each user may hold ``USER_CONNECTIONS`` connections
  and run ``USER_REQUESTS`` requests in the engine at once, and the excess is
  refused (``503 busy``) or waits its turn, while other users go on;
- TCP connections not yet identified must send their headers within
  ``HEADER_DEADLINE_S`` and share a pool of ``ANONYMOUS_CONNECTIONS``; when
  it is full, the oldest is dropped for the newcomer, so a flood of slow
  headers cannot keep an honest client (whose headers arrive at once) out;
- every request has one deadline for all of it, headers and body
  (``REQUEST_DEADLINE_S`` from accept), not one per read, so dripping a byte
  at a time does not keep a connection; a body over ``MAX_BODY_BYTES`` is
  refused from its ``Content-Length`` before it is read, and none is buffered
  beyond it.

Run it with ``dpmagic serve`` or ``python -m dpmagic.gate.service.server``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import logging
import os
import resource
import signal
import socket
import stat
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from tornado import httputil, iostream, netutil
from tornado.http1connection import HTTP1ConnectionParameters, HTTP1ServerConnection
from tornado.tcpserver import TCPServer

from dpmagic import wire
from dpmagic.gate.engine import Engine
from dpmagic.gate.engines.interface import OutOfResources
from dpmagic.gate.failures import BadRequest, Busy, Failed, GateError, Unauthorized, required
from dpmagic.gate.policy import Policy, PolicyError, load_policy
from dpmagic.gate.service.auth import (
    Authenticator,
    HubConfigError,
    HubTokenAuth,
    PeerCredAuth,
    TokenAuth,
    TokenFileError,
)
from dpmagic.gate.service.body import parse_body
from dpmagic.gate.service.padding import PrivateRead, release_time
from dpmagic.gate.service.release_clock import ReleaseClock
from dpmagic.gate.service.reply import Reply

log = logging.getLogger("dpmagic.gate")

LISTENING = "dpmagic gate listening on"
MAX_BODY_BYTES = 1 << 20
MAX_HEADER_BYTES = 16 << 10
# The whole request, headers and body, must be in this long after accept.
REQUEST_DEADLINE_S = 30.0
# The headers must be in this long after accept; until then a TCP caller is anonymous.
HEADER_DEADLINE_S = 5.0
# Per user: connections open at once, and requests in the engine at once.
USER_CONNECTIONS = 32
USER_REQUESTS = 4
# TCP connections whose headers have not named a user yet, all together.
ANONYMOUS_CONNECTIONS = 256
# File descriptors kept free of connections, for the data, the ledger and the threads.
RESERVED_FILES = 256
# Threads running the engine; each request holds one while it is analysed and run.
ENGINE_THREADS = 16
RELEASES = ReleaseClock()  # every held reply of the process, one thread
# sun_path is 108 bytes including the terminating NUL.
MAX_SOCKET_PATH_BYTES = 107
USAGE_ERROR = 2
LISTEN_BACKLOG = 1024
# Refused connections are logged per user at most this often, with their count.
BUSY_LOG_INTERVAL_S = 10.0
# Entries of /v1/history: the newest ones, by default and at most.
HISTORY_DEFAULT = 100
HISTORY_MAX = 1000
ALLOWED_METHODS = ("GET", "POST")


class ListenError(ValueError):
    """The listen address is malformed or cannot be used."""


class _HTTPError(BadRequest):
    """A ``bad_request`` with its own HTTP status (400, 404, 405, 411, 413, 501)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(frozen=True)
class App:
    """What every request needs: the engine, who is asking, and the padding quantum."""

    engine: Engine
    auth: Authenticator
    quantum_s: float


@dataclass(frozen=True)
class _Caller:
    """What an authenticator may look at: the socket and the request's headers."""

    connection: socket.socket
    headers: httputil.HTTPHeaders = field(default_factory=httputil.HTTPHeaders)


@dataclass(eq=False)
class _Connection:
    """One accepted connection: its stream, its deadline and whom it counts against
    (``None``: the anonymous TCP pool, until its headers name a user)."""

    stream: iostream.IOStream
    accepted: float
    user: str | None = None
    responding: bool = False

    @property
    def deadline(self) -> float:
        """Loop time by which the request must be in: short while anonymous."""
        limit = REQUEST_DEADLINE_S if self.user is not None else HEADER_DEADLINE_S
        return self.accepted + limit


Outcome = tuple[int, bytes, str]  # status, body, its content type


def _run(handler: Callable[[], dict[str, object] | Reply], arrow: bool = False) -> Outcome:
    """Run a route in an engine thread; its reply as (status, body, content type): an
    answer as an Arrow stream when the client asked for one (``wants_arrow``), else
    JSON, as every error is. A query that ran out of time or memory is answered no
    sooner than its run's deadline (``interface.OutOfResources``): the engine thread is
    let go, the reply waits. The body is encoded here, in the engine's thread, not on
    the event loop."""
    try:
        status, reply = 200, handler()
        if isinstance(reply, Reply):
            if arrow:
                return status, reply.arrow(), wire.ARROW
            reply = reply.json()
    except OutOfResources as exc:
        data = json.dumps(exc.as_reply()).encode()
        raise _HeldFailure(exc.status, data, exc.release_at) from None
    except GateError as exc:
        status, reply = exc.status, exc.as_reply()
    except Exception as exc:
        log.error("request failed: %s", type(exc).__name__)
        status, reply = 500, Failed().as_reply()
    return status, json.dumps(reply, default=str).encode(), wire.JSON


def wants_arrow(accept: str | None) -> bool:
    """Whether an ``Accept`` header prefers Arrow's stream to JSON: Arrow listed with a
    quality above 0 and at least JSON's (a JSON type not listed counts as 0; ``*/*``
    and no header at all mean JSON, which every client reads)."""
    quality = {}
    for item in (accept or "").split(","):
        kind, *params = (p.strip() for p in item.split(";"))
        q = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    q = float(value)
                except ValueError:
                    q = 0.0
        quality[kind.lower()] = max(q, quality.get(kind.lower(), 0.0))
    arrow = quality.get(wire.ARROW, 0.0)
    return arrow > 0 and arrow >= quality.get(wire.JSON, 0.0)


def _response(
    status: int, data: bytes, content_type: str = wire.JSON
) -> tuple[httputil.ResponseStartLine, httputil.HTTPHeaders]:
    headers = httputil.HTTPHeaders(
        {
            "Content-Type": content_type,
            "Content-Length": str(len(data)),
            "Cache-Control": "no-store",
            "Connection": "close",
        }
    )
    if status == 401:
        headers["WWW-Authenticate"] = "Bearer"
    if status == 503:
        headers["Retry-After"] = "1"
    return httputil.ResponseStartLine("HTTP/1.1", status, HTTPStatus(status).phrase), headers


def _send_and_close(stream: iostream.IOStream, error: GateError) -> None:
    """Answer ``error`` on a stream no HTTP parser owns any more, then close it."""
    data = json.dumps(error.as_reply()).encode()
    start, headers = _response(error.status, data)
    head = f"{start.version} {start.code} {start.reason}\r\n"
    head += "".join(f"{name}: {value}\r\n" for name, value in headers.get_all())
    try:
        written = stream.write(head.encode("latin1") + b"\r\n" + data)
    except iostream.StreamClosedError:
        return
    if written.done():  # the usual case: closed at once, not a loop turn later
        stream.close()
    else:
        written.add_done_callback(lambda done: (done.exception(), stream.close()))


class _Exchange(httputil.HTTPMessageDelegate):
    """One request on one connection: route, identify, read the body, answer."""

    def __init__(
        self, server: _Server, conn: _Connection, request: httputil.HTTPConnection
    ) -> None:
        self.server = server
        self.conn = conn
        self.request = request
        # The padding clock runs from the connection's accept (a connection carries one
        # request), so how soon the loop read the request is inside the pad too.
        self.arrival = conn.accepted
        self.method = "-"
        self.path = "-"
        self.query = ""
        self.route: Route | None = None
        self.refusal: GateError | None = None
        self.body = bytearray()
        self.closed = False
        self.arrow = False  # the client asked for an answer as Arrow's stream

    @property
    def user(self) -> str:
        return self.conn.user or "-"

    async def headers_received(
        self,
        start_line: httputil.RequestStartLine | httputil.ResponseStartLine,
        headers: httputil.HTTPHeaders,
    ) -> None:
        if not isinstance(start_line, httputil.RequestStartLine):  # a response's line
            raise TypeError("the gate reads requests only")
        url = urlsplit(start_line.path)
        self.method, self.path, self.query = start_line.method, url.path, url.query
        self.arrow = wants_arrow(headers.get("Accept"))
        try:
            self.route = self._route()
            if self.route.authenticated and self.conn.user is None:
                await self.server.identify(self.conn, headers)
            if self.method == "POST":
                _check_length(headers)
        except (Unauthorized, Busy, _TooLarge) as exc:
            # Decided from the headers alone: answered now, the body never read.
            self._answer_now(exc)
            return
        except _HTTPError as exc:
            self.refusal = exc  # answered once the (bounded) body is read and dropped
        except Exception as exc:  # e.g. from the Hub's client: only its type is logged
            log.error("identifying a caller failed: %s", type(exc).__name__)
            self._answer_now(Failed("the gate could not identify the caller; nothing was charged"))
            return
        remaining = self.conn.deadline - self.server.loop.time()
        self.request.set_body_timeout(max(remaining, 0.001))  # type: ignore[attr-defined]

    def _route(self) -> Route:
        if self.method not in ALLOWED_METHODS:
            raise _HTTPError(501, f"the gate does not implement {self.method}")
        route = ROUTES.get(self.path)
        if route is None:
            raise _HTTPError(404, f"no such endpoint: {self.path}")
        if route.method != self.method:
            raise _HTTPError(405, f"{self.path} takes {route.method}, not {self.method}")
        return route

    def _answer_now(self, error: GateError) -> None:
        stream = self.request.detach()  # type: ignore[attr-defined]
        _send_and_close(stream, error)
        if not isinstance(error, Busy):  # refusals for busy are logged by count
            log.info("%s %s %s %d", self.user, self.method, self.path, error.status)

    def data_received(self, chunk: bytes) -> None:
        if self.refusal is None:  # a refused request's body is read only to be dropped
            self.body.extend(chunk)

    def finish(self) -> None:
        self.conn.responding = True
        self.server.track(asyncio.ensure_future(self._respond()))

    def on_connection_close(self) -> None:
        self.closed = True

    async def _respond(self) -> None:
        try:
            status, data, kind = await self._outcome()
        except Exception as exc:  # never a traceback that might quote a value
            log.error("request failed: %s", type(exc).__name__)
            status, data, kind = 500, _FAILED, wire.JSON
        self._reply(status, data, kind)
        log.info("%s %s %s %d", self.user, self.method, self.path, status)

    async def _outcome(self) -> Outcome:
        if self.refusal is not None:
            return self.refusal.status, json.dumps(self.refusal.as_reply()).encode(), wire.JSON
        engine, user = self.server.app.engine, self.user
        route = required(self.route, "the request's route")
        body, self.body = bytes(self.body), bytearray()
        reads = PrivateRead()

        def handler() -> dict[str, object] | Reply:
            return route.run(engine, user, self.query, body, reads)

        if not route.authenticated:  # /v1/health: no user, no data
            return _run(handler)
        async with self.server.slot(user):
            status, data, kind = await self._computed(handler)
            # Still holding the user's place: a request of theirs waiting for it (a
            # replay, answered at once) must not start when this run ended, which
            # the padding hides, but when this reply leaves, which its user sees.
            if reads.began:
                await self._hold_until_quantum()
            return status, data, kind

    async def _computed(self, handler: Callable[[], dict[str, object] | Reply]) -> Outcome:
        """``handler``'s reply, computed in an engine thread. A run that ran out of
        time or memory is answered no sooner than its deadline (``_HeldFailure``)."""
        threads = self.server.engine_threads
        try:
            return await self.server.loop.run_in_executor(threads, _run, handler, self.arrow)
        except _HeldFailure as held:
            await RELEASES.until(held.release_at)
            return held.status, held.data, wire.JSON
        except Exception as exc:  # never a traceback that might quote a value
            log.error("request failed: %s", type(exc).__name__)
            return 500, _FAILED, wire.JSON

    async def _hold_until_quantum(self) -> None:
        quantum = self.server.app.quantum_s
        if quantum <= 0:
            return
        # Not asyncio.sleep: its wake-up is late by a fraction of a millisecond that
        # follows the query's running time (``release_clock``).
        await RELEASES.until(release_time(self.arrival, time.monotonic(), quantum))

    def _reply(self, status: int, data: bytes, content_type: str) -> None:
        if self.closed:  # the client went away; nothing to tell it
            return
        start, headers = _response(status, data, content_type)
        try:
            self.request.write_headers(start, headers, data)
            self.request.finish()
        except (iostream.StreamClosedError, httputil.HTTPOutputError):
            pass


_FAILED = json.dumps(Failed().as_reply()).encode()


class _HeldFailure(Exception):
    """A reply that must not leave before ``release_at`` (monotonic seconds)."""

    def __init__(self, status: int, data: bytes, release_at: float) -> None:
        super().__init__("held")
        self.status, self.data, self.release_at = status, data, release_at


class _TooLarge(_HTTPError):
    """A body refused from its headers (length missing, malformed or over the limit)."""


def _check_length(headers: httputil.HTTPHeaders) -> None:
    if "chunked" in headers.get("Transfer-Encoding", "").lower():
        raise _TooLarge(411, "send the body with a Content-Length, not chunked")
    length = headers.get("Content-Length")
    if length is None:
        raise _TooLarge(411, "a request body needs a Content-Length header")
    if not length.strip().isdigit():
        raise _TooLarge(400, "Content-Length must be a whole number")
    if int(length) > MAX_BODY_BYTES:
        raise _TooLarge(413, f"the request body is over {MAX_BODY_BYTES} bytes")


class _Server(TCPServer, httputil.HTTPServerConnectionDelegate):
    """Accepts connections, counts them per user, and hands each to tornado's HTTP/1
    parser with this gate's limits."""

    def __init__(self, app: App, max_connections: int) -> None:
        super().__init__(max_buffer_size=MAX_BODY_BYTES + MAX_HEADER_BYTES)
        self.app = app
        self.max_connections = max_connections
        self.params = HTTP1ConnectionParameters(
            no_keep_alive=True,
            header_timeout=HEADER_DEADLINE_S,
            max_header_size=MAX_HEADER_BYTES,
            max_body_size=MAX_BODY_BYTES,
            body_timeout=REQUEST_DEADLINE_S,
            decompress=False,
        )
        self.engine_threads = ThreadPoolExecutor(ENGINE_THREADS, "dpmagic-engine")
        # Identities that wait on the network (the Hub) get threads of their own.
        self.auth_threads = ThreadPoolExecutor(4, "dpmagic-auth")
        self.open: dict[HTTP1ServerConnection, _Connection] = {}
        self.per_user: Counter[str] = Counter()
        # TCP connections whose headers have not named a user, oldest first.
        self.anonymous: dict[_Connection, None] = {}
        self.slots: dict[str, asyncio.Semaphore] = {}
        self.in_flight: set[asyncio.Future[None]] = set()
        self.refused: Counter[str] = Counter()
        self.next_busy_log: dict[str, float] = {}

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    def handle_stream(self, stream: iostream.IOStream, address: object) -> None:
        conn = _Connection(stream, accepted=self.loop.time())
        try:
            if self.app.auth.at_accept:
                conn.user = self.app.auth.identify(_Caller(stream.socket))
            self._admit(conn)
        except GateError as exc:
            self._note_refusal(conn.user or "-", exc)
            _send_and_close(stream, exc)
            return
        except OSError:  # the peer left before we could ask who it was
            stream.close()
            return
        server_conn = HTTP1ServerConnection(stream, self.params)
        self.open[server_conn] = conn
        server_conn.start_serving(self)

    def _admit(self, conn: _Connection) -> None:
        if len(self.open) >= self.max_connections:
            raise Busy("the gate is at its connection limit; try again shortly")
        if conn.user is None:
            if len(self.anonymous) >= ANONYMOUS_CONNECTIONS:
                # Not the newcomer but the oldest: an honest client sends its headers
                # at once, so only one that is dripping them has been waiting long.
                oldest = next(iter(self.anonymous))
                del self.anonymous[oldest]
                oldest.stream.close()
            self.anonymous[conn] = None
        else:
            self._count_user(conn.user)

    def _count_user(self, user: str) -> None:
        if self.per_user[user] >= USER_CONNECTIONS:
            raise Busy(
                f"{user} already has {USER_CONNECTIONS} connections open to the gate; "
                "wait for their replies"
            )
        self.per_user[user] += 1

    async def identify(self, conn: _Connection, headers: httputil.HTTPHeaders) -> None:
        """Name the user of an anonymous connection from its headers and move it
        from the anonymous pool to that user's count."""
        caller = _Caller(conn.stream.socket, headers)
        auth = self.app.auth
        if auth.blocking:
            user = await self.loop.run_in_executor(self.auth_threads, auth.identify, caller)
        else:
            user = auth.identify(caller)
        try:
            self._count_user(user)
        except Busy as exc:
            self._note_refusal(user, exc)
            raise
        self.anonymous.pop(conn, None)
        conn.user = user

    def _note_refusal(self, user: str, error: GateError) -> None:
        """Log refused connections per user, at most once per interval, with their count."""
        self.refused[user] += 1
        now = time.monotonic()
        if now >= self.next_busy_log.get(user, 0.0):
            count = self.refused.pop(user)
            log.info("%s - - %d (%d connections refused)", user, error.status, count)
            self.next_busy_log[user] = now + BUSY_LOG_INTERVAL_S

    def start_request(
        self, server_conn: object, request_conn: httputil.HTTPConnection
    ) -> httputil.HTTPMessageDelegate:
        return _Exchange(self, self.open[server_conn], request_conn)  # type: ignore[index]

    def on_close(self, server_conn: object) -> None:
        conn = self.open.pop(server_conn, None)  # type: ignore[arg-type]
        if conn is None:
            return
        if conn.user is None:
            self.anonymous.pop(conn, None)
            return
        self.per_user[conn.user] -= 1
        if self.per_user[conn.user] <= 0:
            del self.per_user[conn.user]

    @contextlib.asynccontextmanager
    async def slot(self, user: str) -> AsyncIterator[None]:
        """One of the user's ``USER_REQUESTS`` places in the engine; waits for one."""
        semaphore = self.slots.setdefault(user, asyncio.Semaphore(USER_REQUESTS))
        async with semaphore:
            yield

    def track(self, task: asyncio.Future[None]) -> None:
        self.in_flight.add(task)
        task.add_done_callback(self.in_flight.discard)

    async def drain(self) -> None:
        """Stop accepting, drop requests not yet read (nothing was charged for them),
        and let those being answered finish, so their releases are recorded."""
        self.stop()
        for conn in list(self.open.values()):
            if not conn.responding:
                conn.stream.close()
        while self.in_flight:
            await asyncio.gather(*self.in_flight, return_exceptions=True)
        for conn in list(self.open.values()):
            conn.stream.close()
        self.engine_threads.shutdown(wait=True)
        self.auth_threads.shutdown(wait=True)


def _params(query: str, allowed: set[str]) -> dict[str, str]:
    """Single-valued query parameters; a typo is an error, not a silent default."""
    parsed = parse_qs(query, keep_blank_values=True)
    for name, values in parsed.items():
        if name not in allowed:
            raise _HTTPError(400, f"unknown parameter {name!r}")
        if len(values) != 1:
            raise _HTTPError(400, f"parameter {name!r} is given more than once")
    return {name: values[0] for name, values in parsed.items()}


def _query(engine: Engine, user: str, query: str, body: bytes, reads: PrivateRead) -> Reply:
    _params(query, set())
    return engine.respond(user, parse_body(body), reads)


def _budget(
    engine: Engine, user: str, query: str, body: bytes, reads: PrivateRead
) -> dict[str, object]:
    params = _params(query, {"dataset", "notebook"})
    return engine.budget(user, params.get("dataset"), params.get("notebook"))


def _history(
    engine: Engine, user: str, query: str, body: bytes, reads: PrivateRead
) -> dict[str, object]:
    params = _params(query, {"dataset", "notebook", "limit"})
    raw = params.get("limit", str(HISTORY_DEFAULT))
    if not raw.isdigit() or not 1 <= int(raw) <= HISTORY_MAX:
        raise _HTTPError(400, f"limit must be a whole number from 1 to {HISTORY_MAX}")
    return engine.history(user, params.get("dataset"), params.get("notebook"), int(raw))


def _schema(
    engine: Engine, user: str, query: str, body: bytes, reads: PrivateRead
) -> dict[str, object]:
    return engine.schema(_params(query, {"dataset"}).get("dataset"))


def _health(
    engine: Engine, user: str, query: str, body: bytes, reads: PrivateRead
) -> dict[str, object]:
    return {"ok": True}


@dataclass(frozen=True)
class Route:
    """An endpoint. ``run`` gets the engine, the caller, the URL's query string, the
    body and the request's ``PrivateRead``, which only the engine's query run marks."""

    method: str
    authenticated: bool
    run: Callable[[Engine, str, str, bytes, PrivateRead], dict[str, object] | Reply]


ROUTES: dict[str, Route] = {
    "/v1/query": Route("POST", True, _query),
    "/v1/budget": Route("GET", True, _budget),
    "/v1/schema": Route("GET", True, _schema),
    "/v1/history": Route("GET", True, _history),
    "/v1/health": Route("GET", False, _health),
}


@dataclass(frozen=True)
class _Listener:
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


class RunningGate:
    """Listening sockets and the engine; ``run`` serves until asked to stop, and
    ``close`` releases the engine and the socket file."""

    def __init__(self, listener: _Listener, app: App) -> None:
        self._listener = listener
        self.app = app
        self.engine = app.engine
        self.address = listener.address

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set, then finish the requests being answered."""
        server = _Server(self.app, _connection_limit())
        server.add_sockets(self._listener.sockets)
        await stop.wait()
        await server.drain()

    def close(self) -> None:
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
    listener = _bind_unix(_socket_path(where)) if kind == "unix" else _bind_tcp(where)
    try:
        _private_dir(policy.gate.state_dir)
        engine = Engine(policy)
    except BaseException:
        listener.close()
        raise
    app = App(engine=engine, auth=auth, quantum_s=policy.gate.response_quantum_ms / 1000)
    return RunningGate(listener, app)


def _bind_unix(path: Path) -> _Listener:
    _clear_stale_socket(path)
    # Anyone local may connect: identity comes from SO_PEERCRED, not the mode.
    sock = netutil.bind_unix_socket(str(path), mode=0o666, backlog=LISTEN_BACKLOG)
    return _Listener([sock], f"unix:{path}", path, path.stat().st_ino)


def _bind_tcp(where: str) -> _Listener:
    host, port = _host_port(where)
    sockets = netutil.bind_sockets(port, host, backlog=LISTEN_BACKLOG)
    bound_host, bound_port = sockets[0].getsockname()[:2]
    shown = f"[{bound_host}]" if ":" in str(bound_host) else str(bound_host)
    if not _loopback(str(bound_host)):
        log.warning("tokens travel in clear text over tcp: put TLS in front of this gate")
    return _Listener(sockets, f"tcp:{shown}:{bound_port}")


def _connection_limit() -> int:
    """Connections the gate keeps open at most: what the open-files limit allows."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return 1 << 16
    return max(USER_CONNECTIONS, soft - RESERVED_FILES)


def raise_open_files_limit() -> None:
    """Lift the soft open-files limit to the hard one, so a thousand connections fit
    (the soft limit is often 1024, counting the gate's own files)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == hard:
        return
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


# CPython collects its youngest generation every 700 container allocations. A reply of
# 100,000 cells builds a few hundred thousand lists and tuples, almost none of them in
# a cycle, and the collections they set off took a third of such a query's time in
# the gate (1M rows, 100,000 groups: 750 → 550 ms) and a sixth of a 1,000-cell one's
# (5.9 → 4.8 ms). Cyclic garbage now waits for this many allocations instead.
GC_YOUNG = 100_000


def tune_collector() -> None:
    """Collect cyclic garbage rarely, and never walk what the gate built at start: the
    objects alive once the engine is open (the policy, the engine, imported modules)
    are frozen into a generation that no collection scans. Reference counting frees
    everything else as before; only objects in cycles wait for a collection."""
    gc.collect()
    gc.freeze()
    _, *older = gc.get_threshold()
    gc.set_threshold(GC_YOUNG, *older)


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
    # Our access log at INFO; libraries (tornado's, jupyterhub's) only warnings.
    logging.basicConfig(level=logging.WARNING, format="dpmagic gate: %(message)s")
    log.setLevel(logging.INFO)
    raise_open_files_limit()
    try:
        if jupyterhub and listen is None:
            listen = hub_listen()
        gate = open_gate(policy, listen or policy.gate.listen, jupyterhub=jupyterhub)
    except (ListenError, TokenFileError, HubConfigError, PolicyError, OSError) as exc:
        print(f"dpmagic: error: {exc}", file=sys.stderr)
        return USAGE_ERROR
    tune_collector()
    print(f"{LISTENING} {gate.address}", flush=True)
    try:
        asyncio.run(_serve_until_signalled(gate))
    finally:
        # After the last reply: the engine (and its ledger) closes last.
        gate.close()
    return 0


async def _serve_until_signalled(gate: RunningGate) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await gate.run(stop)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)


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
        prog="python -m dpmagic.gate.service.server", description="Run the dpmagic gate."
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
