"""Who the owner's console lets in, and which changes it refuses as forged.

The console is served on loopback in this process (``tests/consoles.py``) over a
real ledger; every request is real HTTP. A refused request must show nothing of the
ledger, and a refused change must write nothing to it.
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode, urlsplit

import pytest

from dpmagic.gate import owner
from dpmagic.gate.console import server as console_server
from dpmagic.gate.console.guards import csrf_ok, same_origin
from dpmagic.gate.console.hosts import Hosts
from dpmagic.gate.console.owners import AdminTokens, Owner, Way
from dpmagic.gate.console.server import COOKIE, Console
from dpmagic.gate.console.sessions import LIFETIME_S, Sessions
from dpmagic.gate.policy import Policy
from dpmagic.gate.service.auth import TokenFileError
from tests.consoles import Client, console_policy, seed, served

ADMIN_TOKEN = "ops-admin-token-0123456789abcdef"
GRANT = {"dataset": "d", "budget": "user", "holder": "alice", "epsilon": "0.5",
         "reason": "lab 3 retake"}  # fmt: skip


@pytest.fixture
def policy(tmp_path: Path) -> Policy:
    found = console_policy(tmp_path)
    seed(found)
    return found


@pytest.fixture
def console(policy: Policy, tmp_path: Path) -> Console:
    tokens = tmp_path / "admins.toml"
    tokens.write_text(f'[users]\nops = "{ADMIN_TOKEN}"\n')
    tokens.chmod(0o600)
    return Console(policy, "/", AdminTokens.from_file(tokens), Owner(owner.operator(), Way.UNIX))


@pytest.fixture
def base(console: Console) -> Iterator[str]:
    with served(console) as url:
        yield url


def signed_in(console: Console, base: str) -> Client:
    """A client signed in by the printed login URL."""
    client = Client(base)
    reply = client.get(f"login?token={console.sessions.login_token()}")
    assert reply.status == 303 and client.cookie is not None
    return client


def log_size(policy: Policy) -> int:
    with owner.open_ledger(policy) as ledger:
        assert ledger is not None
        return len(ledger.history())


PAGES = ("", "budgets", "log", "renewals", "change", "budgets?budget=user&holder=alice")


@pytest.mark.parametrize("path", PAGES)
def test_without_signing_in_every_page_is_refused_and_shows_nothing(base: str, path: str) -> None:
    for client in (Client(base), Client(base, cookie="made-up-session-cookie")):
        reply = client.get(path)
        assert reply.status == 403
        assert "sign in" in reply.body.lower()
        for secret in ("alice", "hw1.ipynb", "SELECT", "COUNT", "ε"):
            assert secret not in reply.body


def test_the_login_url_signs_one_browser_in_once(console: Console, base: str) -> None:
    token = console.sessions.login_token()
    first = Client(base)
    reply = first.get(f"login?token={token}")
    assert reply.status == 303 and reply.headers["Location"] == "/"
    cookie = next(h for h in reply.headers.get_all("Set-Cookie") if h.startswith("dpmagic-"))
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/" in cookie
    assert first.get("").status == 200
    assert f"signed in as {owner.operator()}" in first.get("").body

    again = Client(base)
    assert again.get(f"login?token={token}").status == 403  # used up
    assert again.cookie is None and again.get("budgets").status == 403
    assert again.post("login", {"token": token}).status == 403


def test_a_wrong_login_token_signs_nobody_in(console: Console, base: str) -> None:
    console.sessions.login_token()
    client = Client(base)
    assert client.get("login?token=not-the-token").status == 403
    assert client.post("login", {"token": "not-the-token"}).status == 403
    assert client.cookie is None


def test_an_admin_token_signs_in_as_a_bearer_or_by_the_form(base: str, policy: Policy) -> None:
    script = Client(base, extra={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    reply = script.get("budgets")
    assert reply.status == 200 and "signed in as token:ops" in reply.body
    assert 'name="_csrf"' not in reply.body  # no session, no cookie to forge with
    wrong = Client(base, extra={"Authorization": "Bearer not-an-admin-token-0123456789"})
    assert wrong.get("budgets").status == 403

    browser = Client(base)
    assert browser.post("login", {"token": ADMIN_TOKEN}).status == 303
    reply = browser.post("grant", {**GRANT, "_csrf": browser.csrf()})
    assert reply.status == 303
    with owner.open_ledger(policy) as ledger:
        assert ledger is not None
        assert ledger.history(limit=1)[0]["sql"] == "budget grant by token:ops: lab 3 retake"


def test_a_script_with_an_admin_token_changes_a_budget(base: str, policy: Policy) -> None:
    script = Client(base, extra={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    before = log_size(policy)
    assert script.post("grant", GRANT, {"Origin": "http://evil.example"}).status == 403
    assert log_size(policy) == before
    reply = script.post("grant", GRANT, {"Origin": ""})  # as curl sends it: no origin
    assert reply.status == 200
    assert reply.body == "granted ε=0.5 to the budget of user alice on dataset 'd'\n"
    with owner.open_ledger(policy) as ledger:
        assert ledger is not None
        assert ledger.history(limit=1)[0]["sql"] == "budget grant by token:ops: lab 3 retake"


def test_an_admin_tokens_file_others_can_read_is_refused(tmp_path: Path) -> None:
    tokens = tmp_path / "admins.toml"
    tokens.write_text(f'[users]\nops = "{ADMIN_TOKEN}"\n')
    tokens.chmod(0o644)
    with pytest.raises(TokenFileError, match="accessible by group or others"):
        AdminTokens.from_file(tokens)


def test_admin_tokens_match_exactly() -> None:
    admins = AdminTokens({"ops": ADMIN_TOKEN})
    assert admins.owner(ADMIN_TOKEN) == Owner("ops", Way.TOKEN)
    assert admins.owner(ADMIN_TOKEN[:-1]) is None
    assert admins.owner(ADMIN_TOKEN + "x") is None
    assert admins.owner("") is None


FORGED = [
    pytest.param({}, {}, id="no CSRF token"),
    pytest.param({"_csrf": "guessed-csrf-token"}, {}, id="a wrong CSRF token"),
    pytest.param(None, {"Origin": "http://evil.example"}, id="another site's origin"),
    pytest.param(None, {"Origin": "null"}, id="an opaque origin"),
    pytest.param(None, {"Origin": "", "Referer": "http://evil.example/x"}, id="another referer"),
    pytest.param(None, {"Origin": ""}, id="no origin at all"),
]


@pytest.mark.parametrize(("fields", "headers"), FORGED)
def test_a_forged_change_is_refused_and_writes_nothing(
    console: Console,
    base: str,
    policy: Policy,
    fields: dict[str, str] | None,
    headers: dict[str, str],
) -> None:
    client = signed_in(console, base)
    token = client.csrf()
    before = log_size(policy)
    for action in ("grant", "reset"):
        sent = {**GRANT, **(fields if fields is not None else {"_csrf": token})}
        reply = client.post(action, sent, headers)
        assert reply.status == 403, reply.body
    assert client.post("logout", {} if fields is None else fields, headers).status == 403
    assert log_size(policy) == before
    # The same session's own form, from its own page, is accepted.
    assert client.post("grant", {**GRANT, "_csrf": token}).status == 303
    assert log_size(policy) == before + 1


def test_another_sessions_csrf_token_is_refused(console: Console, base: str) -> None:
    mine, theirs = signed_in(console, base), signed_in(console, base)
    assert mine.post("grant", {**GRANT, "_csrf": theirs.csrf()}).status == 403


def test_a_get_never_changes_anything(console: Console, base: str, policy: Policy) -> None:
    client = signed_in(console, base)
    before = log_size(policy)
    for path in ("grant", "reset", "logout"):
        query = urlencode({**GRANT, "_csrf": client.csrf()})
        assert client.get(f"{path}?{query}").status == 404
    assert log_size(policy) == before
    assert client.get("").status == 200  # still signed in


def test_signing_out_ends_the_session(console: Console, base: str) -> None:
    client = signed_in(console, base)
    cookie = client.cookie
    assert client.post("logout", {"_csrf": client.csrf("")}).status == 303
    assert client.cookie is None
    assert Client(base, cookie=cookie).get("").status == 403


def test_pages_forbid_scripts_and_framing(console: Console, base: str) -> None:
    reply = signed_in(console, base).get("budgets")
    policy = reply.headers["Content-Security-Policy"]
    assert "default-src 'none'" in policy and "frame-ancestors 'none'" in policy
    assert "script-src" not in policy  # none allowed: default-src 'none'
    assert reply.headers["X-Frame-Options"] == "DENY"
    assert "<script" not in reply.body


def test_a_session_ends_after_its_lifetime() -> None:
    now = [1000.0]
    sessions = Sessions(clock=lambda: now[0])
    cookie, session = sessions.open(Owner("root", Way.UNIX))
    assert sessions.find(cookie) == session
    now[0] += LIFETIME_S - 1
    assert sessions.find(cookie) == session
    now[0] += 2
    assert sessions.find(cookie) is None
    assert sessions.find("") is None and sessions.find(None) is None


def test_login_tokens_are_good_once_and_only_as_issued() -> None:
    sessions = Sessions()
    token = sessions.login_token()
    assert not sessions.redeem(token[:-1])
    assert sessions.redeem(token)
    assert not sessions.redeem(token)


@pytest.mark.parametrize(
    ("origin", "referer", "allowed"),
    [
        ("http://127.0.0.1:8766", None, True),
        ("http://127.0.0.1:9999", None, False),
        ("http://evil.example", "http://127.0.0.1:8766/change", False),  # Origin decides
        (None, "http://127.0.0.1:8766/change", True),
        (None, "http://127.0.0.1:8766.evil.example/", False),
        ("null", None, False),
        (None, None, False),
    ],
)
def test_same_origin(origin: str | None, referer: str | None, allowed: bool) -> None:
    assert same_origin(origin, referer, "127.0.0.1:8766") is allowed


def test_csrf_tokens_compare_whole() -> None:
    sessions = Sessions()
    _, session = sessions.open(Owner("root", Way.UNIX))
    assert csrf_ok(session, session.csrf)
    assert not csrf_ok(session, session.csrf[:-1])
    assert not csrf_ok(session, "")
    assert not csrf_ok(None, session.csrf)


def _served_to(client: Client, host: str | None) -> tuple[int, str]:
    """A signed-in browser's GET of the budgets page naming ``host`` (None: no Host
    header at all), over a raw socket so the header is exactly that."""
    parts = urlsplit(client.base)
    lines = [f"GET {parts.path}budgets HTTP/1.1", f"Cookie: {COOKIE}={client.cookie}"]
    if host is not None:
        lines.append(f"Host: {host}")
    with socket.create_connection((parts.hostname, parts.port), timeout=10) as conn:
        conn.sendall(("\r\n".join([*lines, "Connection: close", "", ""])).encode())
        answer = b""
        while chunk := conn.recv(65536):
            answer += chunk
    head, _, body = answer.decode().partition("\r\n\r\n")
    return int(head.split()[1]), body


def test_the_console_answers_only_the_hosts_it_serves(
    console: Console, base: str, policy: Policy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A name pointed at the console's address (DNS rebinding) gets a bare 400, even
    from a signed-in browser, its page's Origin agreeing with the Host it names; the
    console's own names for a loopback bind are served. Without the check (the broken
    version) the foreign name is served the page."""
    client = signed_in(console, base)
    port = urlsplit(base).port
    for host in (f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}", f"LOCALHOST:{port}"):
        assert _served_to(client, host)[0] == 200, host
    wrong = [f"evil.example:{port}", "evil.example", f"127.0.0.1:{port + 1}", "127.0.0.1",
             f"10.0.0.1:{port}", f"localhost.evil.example:{port}", ""]  # fmt: skip
    for host in wrong:
        status, body = _served_to(client, host)
        assert (status, body) == (400, "400 Bad Request\n"), host
    # Not a host at all, or none: tornado itself answers 400 before the console.
    assert _served_to(client, f"a@127.0.0.1:{port}")[0] == 400
    assert _served_to(client, None)[0] == 400
    # A change sent to a rebound name, with its page's own origin: nothing written.
    before = log_size(policy)
    evil = {"Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}"}
    reply = client.post("grant", {**GRANT, "_csrf": client.csrf()}, evil)
    assert reply.status == 400 and "alice" not in reply.body
    assert Client(base).post("login", {"token": ADMIN_TOKEN}, evil).status == 400
    assert log_size(policy) == before

    monkeypatch.setattr(console_server, "check_host", lambda handler, hosts: None)
    assert _served_to(client, f"evil.example:{port}")[0] == 200  # what the check stops


@pytest.mark.parametrize(
    ("given", "bound", "public", "hub", "allowed", "refused"),
    [
        pytest.param("127.0.0.1", ["127.0.0.1"], [], False,
                     ["127.0.0.1:8766", "localhost:8766", "[::1]:8766"],
                     ["127.0.0.1:80", "127.0.0.1", "10.1.2.3:8766", "example.org:8766"],
                     id="loopback"),
        pytest.param("10.1.2.3", ["10.1.2.3"], [], False,
                     ["10.1.2.3:8766", f"{socket.gethostname()}:8766"],
                     ["10.1.2.4:8766", "10.1.2.3:8767", "example.org:8766"],
                     id="one address"),
        pytest.param("0.0.0.0", ["0.0.0.0"], [], False,
                     ["10.1.2.3:8766", "[2001:db8::1]:8766", f"{socket.getfqdn()}:8766"],
                     ["10.1.2.3:8767", "10.1.2.3", "example.org:8766"],
                     id="every interface"),
        pytest.param("127.0.0.1", ["127.0.0.1"], ["https://console.example.edu"], False,
                     ["console.example.edu", "console.example.edu:443", "127.0.0.1:8766"],
                     ["console.example.edu:8766", "console.example.edu:80", "example.edu"],
                     id="a public url"),
        pytest.param("127.0.0.1", ["127.0.0.1"], ["https://hub.example.edu:8443/"], True,
                     ["hub.example.edu:8443", "127.0.0.1:8766"],
                     ["hub.example.edu", "127.0.0.1:8000", "10.1.2.3:8000", "evil.example:8443"],
                     id="a hub with its public url"),
        pytest.param("127.0.0.1", ["127.0.0.1"], [], True,
                     ["127.0.0.1:8000", "localhost:8000", "10.1.2.3:8000", "127.0.0.1:8766"],
                     ["hub.example.edu", "hub.example.edu:8000", "evil.example:8766"],
                     id="a hub that names no public url"),
    ],
)  # fmt: skip
def test_the_hosts_of_each_way_of_serving(
    given: str,
    bound: list[str],
    public: list[str],
    hub: bool,
    allowed: list[str],
    refused: list[str],
) -> None:
    hosts = Hosts.served(given, bound, 8766, public, behind_hub=hub)
    assert [h for h in allowed if not hosts.allows(h)] == []
    assert [h for h in refused if hosts.allows(h)] == []


def test_a_console_nobody_told_its_address_answers_nobody() -> None:
    assert not Hosts().allows("127.0.0.1:8766") and not Hosts().allows("localhost")


def test_a_script_confirms_a_reset_and_a_new_user_by_naming_them(base: str, policy: Policy) -> None:
    """A bearer token's reset, or grant to a user the gate does not know, is told in
    one line what confirms it (409, nothing written); sent again with it, it is made."""
    script = Client(base, extra={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    before = log_size(policy)
    reset = {**GRANT, "epsilon": ""}
    reply = script.post("reset", reset, {"Origin": ""})
    assert (reply.status, reply.body) == (409, (
        "not reset: send it again with confirm=reset to confirm "
        "(reset the budget of user alice on dataset 'd')\n"
    ))  # fmt: skip
    reply = script.post("grant", {**GRANT, "holder": "mallory"}, {"Origin": ""})
    assert reply.status == 409 and reply.body.startswith(
        "not granted (no user 'mallory' is known to this gate): send it again with create=mallory"
    )
    assert log_size(policy) == before
    assert script.post("reset", {**reset, "confirm": "reset"}, {"Origin": ""}).status == 200
    reply = script.post(
        "grant", {**GRANT, "holder": "mallory", "create": "mallory"}, {"Origin": ""}
    )
    assert reply.status == 200
    assert log_size(policy) == before + 2
