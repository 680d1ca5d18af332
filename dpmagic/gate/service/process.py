"""One gate process: the HTTP/JSON API (docs/http-api.md) on a unix socket or TCP.

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

The parts: ``listen.py`` binds the address, ``exchange.py`` answers one request
(routing, the body, the padding), ``routes.py`` says what each endpoint does; this
module accepts connections, counts them per user and runs one gate process;
``workers.py`` runs several of them behind one address (``gate.workers``), where
these limits are each worker's; ``server.py`` is the command that starts either.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import gc
import logging
import resource
import signal
import socket
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import cast

from tornado import httputil, iostream
from tornado.http1connection import HTTP1ConnectionParameters, HTTP1ServerConnection
from tornado.tcpserver import TCPServer

from dpmagic.gate.engine import Engine
from dpmagic.gate.failures import Busy, GateError
from dpmagic.gate.policy import Policy
from dpmagic.gate.service.auth import (
    Authenticator,
    HubTokenAuth,
    PeerCredAuth,
    TokenAuth,
)
from dpmagic.gate.service.exchange import (
    HEADER_DEADLINE_S,
    MAX_BODY_BYTES,
    MAX_HEADER_BYTES,
    REQUEST_DEADLINE_S,
    App,
    Connection,
    Exchange,
    send_and_close,
)
from dpmagic.gate.service.listen import (
    Listener,
    ListenError,
    bind_tcp,
    bind_unix,
    private_dir,
    socket_path,
    split_listen,
)

log = logging.getLogger("dpmagic.gate")

LISTENING = "dpmagic gate listening on"
# Per user: connections open at once, and requests in the engine at once.
USER_CONNECTIONS = 32
USER_REQUESTS = 4
# TCP connections whose headers have not named a user yet, all together.
ANONYMOUS_CONNECTIONS = 256
# File descriptors kept free of connections, for the data, the ledger and the threads.
RESERVED_FILES = 256
# Threads running the engine; each request holds one while it is analysed and run.
ENGINE_THREADS = 16
USAGE_ERROR = 2
# Refused connections are logged per user at most this often, with their count.
BUSY_LOG_INTERVAL_S = 10.0


@dataclass(frozen=True)
class Caller:
    """What an authenticator may look at: the socket and the request's headers."""

    connection: socket.socket
    headers: httputil.HTTPHeaders = field(default_factory=httputil.HTTPHeaders)


class Server(TCPServer, httputil.HTTPServerConnectionDelegate):
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
        self.open: dict[HTTP1ServerConnection, Connection] = {}
        self.per_user: Counter[str] = Counter()
        # TCP connections whose headers have not named a user, oldest first.
        self.anonymous: dict[Connection, None] = {}
        self.slots: dict[str, asyncio.Semaphore] = {}
        self.in_flight: set[asyncio.Future[None]] = set()
        self.refused: Counter[str] = Counter()
        self.next_busy_log: dict[str, float] = {}
        self.shared: list[socket.socket] = []  # sockets other workers accept from too

    def accept_shared(self, sockets: list[socket.socket]) -> None:
        """Accept from sockets the gate's other workers accept from too, one connection
        each time one is ready, never a batch: tornado's ``add_sockets`` takes up to 128
        at a time, and the worker that woke first took three quarters of a burst of 300
        (16.4 s of one core against the other's 4.3). Taking one and going back to the
        loop, a worker whose interpreter is busy with analyses comes back later, so the
        connections go mostly to whichever worker has time for them."""
        for sock in sockets:
            self.loop.add_reader(sock.fileno(), self._accept_one, sock)
            self.shared.append(sock)

    def _accept_one(self, sock: socket.socket) -> None:
        try:
            connection, address = sock.accept()
        except (BlockingIOError, InterruptedError, ConnectionAbortedError):
            return  # another worker took it, or the peer left
        stream = iostream.IOStream(
            connection, max_buffer_size=self.max_buffer_size, read_chunk_size=self.read_chunk_size
        )
        self.handle_stream(stream, address)

    def stop(self) -> None:
        super().stop()
        for sock in self.shared:
            self.loop.remove_reader(sock.fileno())
        self.shared.clear()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return asyncio.get_running_loop()

    def handle_stream(self, stream: iostream.IOStream, address: object) -> None:
        conn = Connection(stream, accepted=self.loop.time())
        try:
            if self.app.auth.at_accept:
                conn.user = self.app.auth.identify(Caller(stream.socket))
            self._admit(conn)
        except GateError as exc:
            self._note_refusal(conn.user or "-", exc)
            send_and_close(stream, exc)
            return
        except OSError:  # the peer left before we could ask who it was
            stream.close()
            return
        server_conn = HTTP1ServerConnection(stream, self.params)
        self.open[server_conn] = conn
        server_conn.start_serving(self)

    def _admit(self, conn: Connection) -> None:
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

    async def identify(self, conn: Connection, headers: httputil.HTTPHeaders) -> None:
        """Name the user of an anonymous connection from its headers and move it
        from the anonymous pool to that user's count."""
        caller = Caller(conn.stream.socket, headers)
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
        # tornado hands back the connections this server started (``handle_stream``).
        return Exchange(self, self.open[cast(HTTP1ServerConnection, server_conn)], request_conn)

    def on_close(self, server_conn: object) -> None:
        conn = self.open.pop(cast(HTTP1ServerConnection, server_conn), None)
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


class RunningGate:
    """Listening sockets and the engine; ``run`` serves until asked to stop, and
    ``close`` releases the engine and the socket file."""

    def __init__(self, listener: Listener, app: App, shared: bool = False) -> None:
        self._listener = listener
        self.app = app
        self.engine = app.engine
        self.address = listener.address
        self.shared = shared  # a worker: other processes accept from the same sockets

    async def run(self, stop: asyncio.Event) -> None:
        """Serve until ``stop`` is set, then finish the requests being answered."""
        server = Server(self.app, _connection_limit())
        if self.shared:
            server.accept_shared(self._listener.sockets)
        else:
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
    auth = authenticator(policy, listen, jupyterhub)
    listener = bind(listen)
    try:
        private_dir(policy.gate.state_dir)
    except BaseException:
        listener.close()
        raise
    return gate_over(listener, policy, auth)


def authenticator(policy: Policy, listen: str, jupyterhub: bool) -> Authenticator:
    """Who a request is from: the Hub's token with ``jupyterhub``, else a bearer token
    over TCP (the policy's ``tokens_file``), else the peer's uid on a unix socket."""
    if jupyterhub:
        return HubTokenAuth()
    kind, _ = split_listen(listen)
    if kind == "tcp":
        if policy.gate.tokens_file is None:
            raise ListenError(
                f"listening on {listen} needs bearer tokens: set gate.tokens_file in the "
                "policy to a TOML file with a [users] table, or listen on a unix socket"
            )
        return TokenAuth.from_file(policy.gate.tokens_file)
    return PeerCredAuth()


def bind(listen: str) -> Listener:
    """The bound, listening sockets of ``unix:PATH`` or ``tcp:HOST:PORT``."""
    kind, where = split_listen(listen)
    return bind_unix(socket_path(where)) if kind == "unix" else bind_tcp(where)


def gate_over(
    listener: Listener, policy: Policy, auth: Authenticator, shared: bool = False
) -> RunningGate:
    """The engine over ``policy`` behind ``listener``'s sockets (closed if it fails);
    ``shared``: other worker processes accept from them too."""
    try:
        engine = Engine(policy)
    except BaseException:
        listener.close()
        raise
    if isinstance(auth, HubTokenAuth):
        auth.membership = engine.membership  # the Hub's groups join the policy's
    app = App(engine=engine, auth=auth, quantum_s=policy.gate.response_quantum_ms / 1000)
    return RunningGate(listener, app, shared)


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


def setup_logging(name: str = "dpmagic gate") -> None:
    """Our access log at INFO, each line after ``name``; libraries (tornado's,
    jupyterhub's) only warnings; the open-files limit lifted
    (``raise_open_files_limit``); and a crash in native code (DuckDB, SQLite, Arrow,
    OpenDP's library) logged with every thread's Python stack before the process dies
    (``faulthandler``), so a gate or worker that dies of a signal leaves in the log
    where each thread was, not only its exit status. The stacks name files, functions
    and lines, never a value."""
    logging.basicConfig(level=logging.WARNING, format=f"{name}: %(message)s")
    log.setLevel(logging.INFO)
    # A standard error without a file descriptor (the gate run inside another program
    # that replaced it) has nowhere a dying process could write: no report then.
    with contextlib.suppress(AttributeError, ValueError, RuntimeError):
        faulthandler.enable(file=sys.stderr, all_threads=True)
    raise_open_files_limit()


async def serve_until_signalled(gate: RunningGate, lifeline: int | None = None) -> None:
    """Serve until SIGTERM or SIGINT, or (a worker) until ``lifeline``, a pipe whose
    other end its supervisor holds, reads its end: the supervisor is gone."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if lifeline is not None:

        def gone() -> None:  # readable only at its end: once, not at every turn after
            loop.remove_reader(lifeline)
            stop.set()

        loop.add_reader(lifeline, gone)
    try:
        await gate.run(stop)
    finally:
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.remove_signal_handler(sig)
        if lifeline is not None:
            loop.remove_reader(lifeline)  # False if ``gone`` did
