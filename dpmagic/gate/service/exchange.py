"""One request on one connection: its route, its caller, its bounded body, its answer
computed in an engine thread, and the reply held to the padding quantum when its
computation read private data (the rules are in ``process.py``'s docstring)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http import HTTPStatus
from typing import Protocol
from urllib.parse import urlsplit

from tornado import httputil, iostream

from dpmagic import wire
from dpmagic.gate.engine import Engine
from dpmagic.gate.engines.interface import OutOfResources
from dpmagic.gate.failures import Busy, Failed, GateError, Unauthorized, required
from dpmagic.gate.padding import PrivateRead, release_time
from dpmagic.gate.reply import Reply
from dpmagic.gate.service.auth import Authenticator
from dpmagic.gate.service.release_clock import ReleaseClock
from dpmagic.gate.service.routes import ROUTES, HTTPError, Route

log = logging.getLogger("dpmagic.gate")

MAX_BODY_BYTES = 1 << 20
MAX_HEADER_BYTES = 16 << 10
ALLOWED_METHODS = ("GET", "POST")
# The whole request, headers and body, must be in this long after accept.
REQUEST_DEADLINE_S = 30.0
# The headers must be in this long after accept; until then a TCP caller is anonymous.
HEADER_DEADLINE_S = 5.0
RELEASES = ReleaseClock()  # every held reply of the process, one thread


@dataclass(frozen=True)
class App:
    """What every request needs: the engine, who is asking, and the padding quantum."""

    engine: Engine
    auth: Authenticator
    quantum_s: float


@dataclass(eq=False)
class Connection:
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


class Host(Protocol):
    """What a request needs of the server that accepted it (``server.Server``): named
    here so that the server, which makes each ``Exchange``, and the exchange do not
    import each other."""

    app: App
    engine_threads: ThreadPoolExecutor

    @property
    def loop(self) -> asyncio.AbstractEventLoop: ...

    async def identify(self, conn: Connection, headers: httputil.HTTPHeaders) -> None: ...

    def slot(self, user: str) -> contextlib.AbstractAsyncContextManager[None]: ...

    def track(self, task: asyncio.Future[None]) -> None: ...


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
    quality: dict[str, float] = {}
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


def send_and_close(stream: iostream.IOStream, error: GateError) -> None:
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

        def close(done: asyncio.Future[None]) -> None:
            done.exception()  # read, so that a failed write is not logged as unread
            stream.close()

        written.add_done_callback(close)


class Exchange(httputil.HTTPMessageDelegate):
    """One request on one connection: route, identify, read the body, answer."""

    def __init__(self, server: Host, conn: Connection, request: httputil.HTTPConnection) -> None:
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
        except HTTPError as exc:
            self.refusal = exc  # answered once the (bounded) body is read and dropped
        except Exception as exc:  # e.g. from the Hub's client: only its type is logged
            log.error("identifying a caller failed: %s", type(exc).__name__)
            self._answer_now(Failed("the gate could not identify the caller; nothing was charged"))
            return
        remaining = self.conn.deadline - self.server.loop.time()
        self.request.set_body_timeout(max(remaining, 0.001))  # type: ignore[attr-defined]

    def _route(self) -> Route:
        if self.method not in ALLOWED_METHODS:
            raise HTTPError(501, f"the gate does not implement {self.method}")
        route = ROUTES.get(self.path)
        if route is None:
            raise HTTPError(404, f"no such endpoint: {self.path}")
        if route.method != self.method:
            raise HTTPError(405, f"{self.path} takes {route.method}, not {self.method}")
        return route

    def _answer_now(self, error: GateError) -> None:
        stream = self.request.detach()  # type: ignore[attr-defined]
        send_and_close(stream, error)
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


class _TooLarge(HTTPError):
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
