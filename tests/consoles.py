"""The owner's console under test: a policy with every kind of budget, a ledger with
released answers whose values are planted to be looked for, a console served on
loopback in this process, and an HTTP client that keeps its cookie as a browser does.

Shared by tests/unit/test_console*.py and tests/system/test_console*.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlencode, urlsplit

from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

from dpmagic.gate.console.hosts import Hosts
from dpmagic.gate.console.server import COOKIE, Console, application
from dpmagic.gate.dp.accounting import Cost, PureAccountant
from dpmagic.gate.ledger.scopes import applicable
from dpmagic.gate.ledger.store import Ledger
from dpmagic.gate.owner import LEDGER_FILE
from dpmagic.gate.policy import Policy, load_policy
from dpmagic.gate.reply import Reply
from dpmagic.protocol import QueryReply
from tests.conftest import write_dataset

START_TIMEOUT_S = 60
# Budgets of every kind: the dataset's, a group's, each user's (renewing weekly).
BUDGETS = """\
user_budget = { epsilon = 5.0, renew = "week" }
dataset_budget = { epsilon = 20.0 }
group_budgets = { ta = { epsilon = 8.0 } }
"""
GROUPS = '\n[groups]\nta = ["alice", "bob"]\n'
# Numbers no page may ever show: the values of the answers released to users.
PLANTED = ("918273645", "56473.829", "7654321")
# Each query: its user, notebook, ε and SQL.
QUERIES = (
    ("alice", "hw1.ipynb", 0.5, "SELECT COUNT(*) AS n FROM t"),
    ("alice", "hw2.ipynb", 0.25, "SELECT AVG(age) AS a FROM t"),
    ("bob", "hw1.ipynb", 1.0, "SELECT sex, COUNT(*) AS n FROM t GROUP BY sex"),
    ("carol", "<b>notes</b>.ipynb", 0.125, "SELECT COUNT(*) AS n FROM t WHERE age < 3"),
)


def console_policy(folder: Path) -> Policy:
    """The tests' dataset with every kind of budget, and group ``ta`` (alice, bob)."""
    path = write_dataset(folder)
    text = path.read_text().replace("user_budget = { epsilon = 5.0 }\n", BUDGETS)
    path.write_text(text + GROUPS)
    return load_policy(path)


def seed(policy: Policy) -> None:
    """Charge ``QUERIES`` as the gate does, each released with an answer holding a
    planted value."""
    ds = policy.dataset("d")
    ledger = Ledger(policy.gate.state_dir / LEDGER_FILE, PureAccountant())
    try:
        for i, (user, notebook, epsilon, sql) in enumerate(QUERIES):
            groups = frozenset(g for g, members in policy.groups.items() if user in members)
            charge = ledger.debit(
                user=user,
                dataset="d",
                notebook=notebook,
                cost=Cost(epsilon),
                limits=applicable(ds, user, notebook, groups),
                sql=sql,
                replay_key=f"key-{i}",
                groups=groups,
            )
            planted = PLANTED[i % len(PLANTED)]
            ledger.record_release(
                charge, Reply.of(QueryReply(columns=["n"], rows=[[float(planted)], [planted]]))
            )
    finally:
        ledger.close()


@contextlib.contextmanager
def served(console: Console) -> Iterator[str]:
    """``console`` served on a free loopback port by a thread's event loop, answering
    the hosts ``serve.py`` gives such a bind; yields its base URL."""
    ready = threading.Event()
    loop = asyncio.new_event_loop()
    where: list[str] = []

    def run() -> None:
        asyncio.set_event_loop(loop)
        server = HTTPServer(application(console))
        sockets = bind_sockets(0, "127.0.0.1")
        port = sockets[0].getsockname()[1]
        console.hosts = Hosts.served("127.0.0.1", ["127.0.0.1"], port, console.public)
        server.add_sockets(sockets)
        where.append(f"http://127.0.0.1:{port}{console.base}")
        ready.set()
        loop.run_forever()
        server.stop()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    ready.wait(10)
    try:
        yield where[0]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        console.close()


@dataclass
class ConsoleProcess:
    """``dpmagic console`` run as its owner runs it; ``login`` is the URL it printed."""

    proc: subprocess.Popen[str]
    login: str

    @property
    def base(self) -> str:
        return self.login.split("login?", 1)[0]


@contextlib.contextmanager
def console_process(policy: Path, *options: str) -> Iterator[ConsoleProcess]:
    """``dpmagic console --policy P --port 0 OPTIONS`` until the test ends, then SIGTERM
    (it must exit 0)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "dpmagic", "console", "--policy", str(policy), "--port", "0",
         *options],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith(("DPMAGIC_", "JUPYTERHUB_"))},
    )  # fmt: skip
    assert proc.stdout is not None and proc.stderr is not None
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        line = ""
        while not line and time.monotonic() < deadline and proc.poll() is None:
            if select.select([proc.stdout], [], [], 0.2)[0]:
                line = proc.stdout.readline()
        found = re.search(r"open (http://\S+)", line)
        if not found:
            said = proc.stderr.read() if proc.poll() is not None else ""
            raise AssertionError(f"the console did not start: {line!r} {said}")
        yield ConsoleProcess(proc, found.group(1))
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                assert proc.wait(timeout=20) == 0
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        proc.stdout.close()
        proc.stderr.close()


@dataclass
class Answer:
    status: int
    headers: http.client.HTTPMessage
    body: str


@dataclass
class Client:
    """A browser's part in the exchange: it keeps the console's cookie, and sends the
    Origin a browser sends with a form (its own, unless told otherwise)."""

    base: str
    cookie: str | None = None
    extra: dict[str, str] = field(default_factory=dict)

    def get(self, path: str, headers: dict[str, str] | None = None) -> Answer:
        return self._send("GET", path, None, headers or {})

    def post(
        self, path: str, fields: dict[str, str], headers: dict[str, str] | None = None
    ) -> Answer:
        sent = {"Origin": self.origin, **(headers or {})}
        return self._send("POST", path, urlencode(fields), {k: v for k, v in sent.items() if v})

    @property
    def origin(self) -> str:
        parts = urlsplit(self.base)
        return f"{parts.scheme}://{parts.netloc}"

    def csrf(self, path: str = "change") -> str:
        """The CSRF token of the session's forms, read from a page as a browser has it."""
        found = re.search(r'name="_csrf" value="([^"]+)"', self.get(path).body)
        assert found, "no CSRF field on the page"
        return found.group(1)

    def _send(self, method: str, path: str, body: str | None, headers: dict[str, str]) -> Answer:
        parts = urlsplit(self.base)
        conn = http.client.HTTPConnection(parts.hostname, parts.port, timeout=30)
        sent = dict(self.extra)
        if self.cookie is not None:
            sent["Cookie"] = f"{COOKIE}={self.cookie}"
        if body is not None:
            sent["Content-Type"] = "application/x-www-form-urlencoded"
        sent.update(headers)
        try:
            conn.request(method, parts.path + path, body=body, headers=sent)
            reply = conn.getresponse()
            text = reply.read().decode()
        finally:
            conn.close()
        for header in reply.headers.get_all("Set-Cookie") or []:
            name, _, rest = header.partition("=")
            if name == COOKIE:
                value = rest.split(";", 1)[0]
                self.cookie = None if value in ("", '""') else value
        return Answer(reply.status, reply.headers, text)
