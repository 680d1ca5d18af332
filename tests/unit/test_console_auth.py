"""Who the owner's console lets in, and which changes it refuses as forged.

The console is served on loopback in this process (``tests/consoles.py``) over a
real ledger; every request is real HTTP. A refused request must show nothing of the
ledger, and a refused change must write nothing to it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlencode

import pytest

from dpmagic.gate import owner
from dpmagic.gate.console.guards import csrf_ok, same_origin
from dpmagic.gate.console.owners import AdminTokens, Owner, Way
from dpmagic.gate.console.server import Console
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
