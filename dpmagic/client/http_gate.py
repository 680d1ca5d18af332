"""The kernel's only way to the data: HTTP requests to the gate.

This module runs in the untrusted kernel, so it imports nothing from
``dpmagic.gate``. It speaks the HTTP API of docs/http-api.md over a unix socket
(``unix:/path``; the gate learns who we are from the socket's peer
credentials) or over TCP (``http://host:port`` with a bearer token). A query's
answer comes as an Arrow stream (``dpmagic/wire.py``), read into the result's
columns without a Python object per cell; everything else, errors included, as JSON.

A query is sent exactly once. Retrying a request whose reply was lost could
charge the budget twice, so a lost reply is reported, never retried.
"""

from __future__ import annotations

import contextlib
import gc
import http.client
import json
import os
import socket
import threading
from collections.abc import Iterator
from typing import Any
from urllib.parse import urlencode, urlsplit

import msgspec

from dpmagic import wire
from dpmagic.client.asking import Asking
from dpmagic.client.errors import ERROR_KINDS, BudgetExhausted, DPError, GateUnavailable
from dpmagic.client.transcript import SCHEME, TranscriptGate
from dpmagic.display.result import DPResult
from dpmagic.protocol import Ask, ErrorReply, QueryReply, reply_of

ENV_GATE = "DPMAGIC_GATE"
ENV_TOKEN = "DPMAGIC_TOKEN"
ENV_TRANSCRIPT = "DPMAGIC_TRANSCRIPT"
# Set by JupyterHub in every single-user server, and so in its kernels: a Hub
# gate (`dpmagic serve --jupyterhub`) resolves it to the user through the Hub.
ENV_HUB_TOKEN = "JUPYTERHUB_API_TOKEN"
DEFAULT_TIMEOUT = 120.0
# A query's answer: Arrow's stream preferred, JSON accepted (an older gate sends it).
ANSWER_ACCEPT = f"{wire.ARROW}, {wire.JSON};q=0.5"
HOW_TO_SET = (
    f"start a gate (`dpmagic serve --policy …`) and point the notebook at it with "
    f"`%dpconnect unix:/path/to/gate.sock` or the {ENV_GATE} environment variable"
)


def connect(
    address: str | None = None, token: str | None = None, timeout: float = DEFAULT_TIMEOUT
) -> Gate | TranscriptGate:
    """A gate client, or a transcript replayer for ``transcript:PATH``.

    Without an address, ``$DPMAGIC_TRANSCRIPT`` (an autograder's offline
    replay) wins over ``$DPMAGIC_GATE``.
    """
    if not address and os.environ.get(ENV_TRANSCRIPT):
        address = SCHEME + os.environ[ENV_TRANSCRIPT]
    if address and address.startswith(SCHEME):
        return TranscriptGate(address.removeprefix(SCHEME))
    return Gate(address, token, timeout=timeout)


class _UnixConnection(http.client.HTTPConnection):
    """``http.client`` over a unix socket: the gate's default transport."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


class Gate(Asking):
    """A client for one gate address.

    ``address`` defaults to ``$DPMAGIC_GATE`` and ``token`` to
    ``$DPMAGIC_TOKEN``, else, over TCP, ``$JUPYTERHUB_API_TOKEN``. Each
    request opens its own connection: requests are rare and slow next to a
    connect, and a fresh connection never resends a request on a stale
    keep-alive socket.

    ``Gate()`` without an address under ``$DPMAGIC_TRANSCRIPT`` is the
    transcript's replayer (a :class:`TranscriptGate`), as the magics are: a
    graded notebook's Python cells replay from the same file.
    """

    def __new__(cls, address: str | None = None, *args: Any, **kwargs: Any) -> Any:
        if address is None and cls is Gate and os.environ.get(ENV_TRANSCRIPT):
            return TranscriptGate(os.environ[ENV_TRANSCRIPT])
        return super().__new__(cls)

    def __init__(
        self,
        address: str | None = None,
        token: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
    ) -> None:
        address = address or os.environ.get(ENV_GATE) or ""
        if not address:
            raise GateUnavailable(f"no gate address is set: {HOW_TO_SET}")
        self.address = address
        self._target = _parse_address(address)
        if token is None:
            token = os.environ.get(ENV_TOKEN) or None
        if token is None and self._target[0] == "tcp":
            # Only over TCP: a unix-socket gate knows us by our uid instead.
            token = os.environ.get(ENV_HUB_TOKEN)
        self.token = token or None
        self.timeout = timeout
        self._lock = threading.Lock()
        self._in_flight: set[http.client.HTTPConnection] = set()
        self._aborted: set[http.client.HTTPConnection] = set()

    def __repr__(self) -> str:
        return f"Gate({self.address!r})"

    def _answer(self, ask: Ask) -> DPResult:
        reply = self._request("POST", "/v1/query", ask.body(), accept=ANSWER_ACCEPT)
        with collector_paused():
            if isinstance(reply, tuple):
                envelope, cells = reply
                return DPResult(_query_reply(envelope), cells=cells)
            return DPResult(_query_reply(reply))

    def budget(
        self,
        dataset: str | None = None,
        notebook: str | None = None,
        *,
        preview: bool = False,
        accuracy: float | None = None,
        rows: int | None = None,
    ) -> dict[str, Any]:
        """What the user and the notebook have spent and have left:
        ``{"dataset", "user": {"spent", "limit", "remaining"}, "notebook": {…}}``.

        With ``preview`` (implied by ``accuracy`` or ``rows``), also ``"preview"``: per
        kind of query (a count, the mean of each bounded column), its cost and how many
        more the budget allows at the default ε and, with ``accuracy``, at ±``accuracy``
        (a mean's over ``rows`` rows; docs/http-api.md)."""
        asked = preview or accuracy is not None or rows is not None
        path = _path(
            "/v1/budget",
            dataset=dataset,
            notebook=notebook,
            preview="true" if asked else None,
            accuracy=None if accuracy is None else repr(float(accuracy)),
            rows=None if rows is None else str(rows),
        )
        return self._request("GET", path)

    def history(
        self, dataset: str | None = None, notebook: str | None = None, limit: int | None = None
    ) -> dict[str, Any]:
        """This user's queries in ``notebook``, oldest first (all datasets unless one is named):
        ``{"datasets", "notebook", "entries": [{"time", "dataset", "sql", "cost", "status",
        "replayed"}]}``."""
        path = _path(
            "/v1/history",
            dataset=dataset,
            notebook=notebook,
            limit=None if limit is None else str(limit),
        )
        return self._request("GET", path)

    def schema(self, dataset: str | None = None) -> dict[str, Any]:
        """The public schema and policy facts: everything a user may know."""
        return self._request("GET", _path("/v1/schema", dataset=dataset))

    def health(self) -> bool:
        """Whether a gate answers at the address; other failures still raise."""
        try:
            return self._request("GET", "/v1/health").get("ok") is True
        except GateUnavailable:
            return False

    def abort(self) -> None:
        """Stop waiting for every reply in flight (from another thread).

        The gate is not told and does not need to be: a query it has charged
        stays charged and is finished and stored, so asking again replays it.
        """
        with self._lock:
            connections = list(self._in_flight)
            # A request still connecting sees this mark and is never sent.
            self._aborted.update(connections)
        for conn in connections:
            if conn.sock is not None:
                # shutdown, not close: it wakes a thread blocked reading the socket.
                with contextlib.suppress(OSError):
                    conn.sock.shutdown(socket.SHUT_RDWR)

    def _connection(self) -> http.client.HTTPConnection:
        kind, where = self._target
        if kind == "unix":
            return _UnixConnection(where, self.timeout)
        host, _, port = where.rpartition(":")
        return http.client.HTTPConnection(host.strip("[]"), int(port), timeout=self.timeout)

    def _request(self, method: str, path: str, body: object = None, accept: str = wire.JSON) -> Any:
        """The reply's JSON object, or for an Arrow reply its envelope and its cells."""
        headers = {"Accept": accept}
        payload = None
        if body is not None:
            payload = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        conn = self._connection()
        with self._lock:
            self._in_flight.add(conn)
        try:
            try:
                conn.connect()
            except OSError as exc:
                raise GateUnavailable(
                    f"no gate answers at {self.address} ({_reason(exc)}): {HOW_TO_SET}"
                ) from None
            with self._lock:
                if conn in self._aborted:
                    raise DPError("stopped before the request was sent; nothing was charged")
            try:
                conn.request(method, path, body=payload, headers=headers)
                response = conn.getresponse()
                status, raw = response.status, response.read()
                kind = (response.getheader("Content-Type") or "").split(";")[0].strip()
            except (OSError, http.client.HTTPException) as exc:
                # The request may have reached the gate and been charged.
                raise DPError(
                    f"the gate at {self.address} did not reply ({_reason(exc)}); "
                    "a query may have been charged — re-running it replays the stored answer"
                ) from None
        finally:
            with self._lock:
                self._in_flight.discard(conn)
                self._aborted.discard(conn)
            conn.close()
        if status == 200 and kind == wire.ARROW:
            try:
                return wire.read(raw)
            except (ValueError, OSError):  # pyarrow's errors derive from these
                raise DPError("the gate's reply was not a readable Arrow stream") from None
        return _decode(status, raw)


def _parse_address(address: str) -> tuple[str, str]:
    """``unix:/path`` → ("unix", path); ``http://h:p`` or ``tcp:h:p`` → ("tcp", "h:p")."""
    if address.startswith("unix:"):
        path = address.removeprefix("unix:")
        if path.startswith("//"):
            path = path[2:]
        if not path:
            raise GateUnavailable(f"gate address {address!r} names no socket path")
        return "unix", path
    if address.startswith("tcp:"):
        address = "http://" + address.removeprefix("tcp:")
    parts = urlsplit(address)
    if parts.scheme == "http" and parts.hostname and parts.port:
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        return "tcp", f"{host}:{parts.port}"
    raise GateUnavailable(
        f"gate address {address!r} is not `unix:/path/to/gate.sock` or `http://host:port`"
    )


def _path(base: str, **query: str | None) -> str:
    present = {k: v for k, v in query.items() if v is not None}
    return f"{base}?{urlencode(present)}" if present else base


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No cyclic garbage collection while a reply is decoded: a reply of 100,000 cells
    is a few hundred thousand new lists, and the collections they set off took three
    quarters of its decoding (1M rows, 100,000 groups: ``json.loads`` 223 → 75 ms,
    the ``DPResult`` 70 → 6 ms). The collector is turned back on only if it was on,
    so a caller that keeps it off keeps it off."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


def _decode(status: int, raw: bytes) -> dict[str, Any]:
    """The reply's JSON object, or the error it reports raised as its class."""
    try:
        with collector_paused():
            reply = json.loads(raw)
    except ValueError:
        reply = None
    if status >= 400:
        try:
            error = msgspec.convert(reply, ErrorReply).error
        except msgspec.ValidationError:  # not the gate's (a proxy's page): its status only
            raise DPError(f"the gate replied with HTTP {status}") from None
        message = " ".join(error.message.split())
        failure = ERROR_KINDS.get(error.kind, DPError)(message, kind=error.kind)
        if isinstance(failure, BudgetExhausted) and error.budget is not None:
            failure.budget = error.budget
        raise failure
    if not isinstance(reply, dict):
        raise DPError("the gate's reply was not a JSON object")
    return reply


def _query_reply(data: dict[str, Any]) -> QueryReply:
    """A query's reply read into the wire's struct; one that is not (a gate of another
    make, a proxy's page) is told as such rather than shown half read."""
    try:
        return reply_of(data)
    except msgspec.ValidationError as exc:
        raise DPError(f"the gate's reply is not a query's reply: {exc}") from None


def _reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError | socket.timeout):
        return "timed out"
    return getattr(exc, "strerror", None) or type(exc).__name__
