"""The console's rule for JupyterHub users: the Hub's admins, by a token that carries
access to the console, and nobody else (``console/hub.py``). Judged on the user
models the Hub's ``/hub/api/user`` answers, with jupyterhub's own scope check; the
whole sign-in through a real Hub is tests/system/test_hub_console.py."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

pytest.importorskip("jupyterhub", reason="the hub extra: pip install 'dpmagic[hub]'")

from jupyterhub.services.auth import HubOAuth, HubOAuthCallbackHandler
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets
from tornado.web import Application

from dpmagic.gate.console.hosts import Hosts
from dpmagic.gate.console.hub import hub_admin, hub_console, hub_knows, hub_public_urls
from dpmagic.gate.console.owners import Owner, Way
from dpmagic.gate.console.server import Refused
from tests.consoles import Client, console_policy

# Run where the hub extra is installed (.ci/run's Hub stage), not skipped in the unit run.
pytestmark = pytest.mark.hub
ACCESS = "access:services!service=dpmagic-console"


@pytest.fixture
def hub_auth() -> HubOAuth:
    return HubOAuth(
        api_token="service-token-0123456789",
        oauth_client_id="service-dpmagic-console",
        access_scopes={ACCESS},
    )


def model(name: str, admin: bool, scopes: list[str], kind: str = "user") -> dict[str, object]:
    """A user model as the Hub answers it for an OAuth token."""
    return {"kind": kind, "name": name, "admin": admin, "scopes": scopes}


def test_a_hub_admin_with_the_consoles_access_is_an_owner(hub_auth: HubOAuth) -> None:
    assert hub_admin(model("ada", True, [ACCESS, "read:users:name!user=ada"]), hub_auth) == (
        Owner("ada", Way.HUB)
    )
    assert Owner("ada", Way.HUB).by == "hub:ada"
    # Access to every service includes this one.
    assert hub_admin(model("ada", True, ["access:services"]), hub_auth).name == "ada"


@pytest.mark.parametrize(
    ("who", "why"),
    [
        (model("bob", False, [ACCESS]), "bob is not an admin of this Hub"),
        (model("bob", False, [ACCESS, "admin:users", "admin:servers"]), "not an admin"),
        (model("ada", True, ["read:users:name!user=ada"]), "has no access to the console"),
        (model("ada", True, ["access:services!service=dpmagic"]), "no access to the console"),
        (model("cron", True, [ACCESS], kind="service"), "cron is a Hub service"),
    ],
)
def test_anyone_else_is_refused(hub_auth: HubOAuth, who: dict[str, object], why: str) -> None:
    with pytest.raises(Refused, match=why) as refused:
        hub_admin(who, hub_auth)
    assert refused.value.status_code == 403


@pytest.fixture
def hub_api() -> Iterator[str]:
    """A stand-in for the Hub's REST API: user ``ada`` exists, asked with the service's
    token; anything else is 404, as the Hub answers for a user it has not."""

    class Api(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            ok = self.path == "/hub/api/users/ada" and (
                self.headers.get("Authorization") == "token service-token-0123456789"
            )
            self.send_response(200 if ok else 404)
            self.end_headers()
            self.wfile.write(b'{"name": "ada"}' if ok else b"{}")

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Api)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hub/api"
    finally:
        server.shutdown()
        server.server_close()


def test_the_hub_says_which_users_it_has(hub_api: str) -> None:
    auth = HubOAuth(api_url=hub_api, api_token="service-token-0123456789")
    assert hub_knows(auth, "ada")
    assert not hub_knows(auth, "dna")
    assert not hub_knows(auth, "ada/../ada")  # a name is one path segment
    wrong = HubOAuth(api_url=hub_api, api_token="another-token-0123456789")
    assert not hub_knows(wrong, "ada")
    gone = HubOAuth(api_url="http://127.0.0.1:9/hub/api", api_token="service-token-0123456789")
    assert not hub_knows(gone, "ada")  # no Hub: unknown, and the owner is asked


def test_the_hubs_public_url_is_a_host_the_console_answers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("JUPYTERHUB_PUBLIC_URL", "https://hub.example.edu/services/c/")
    monkeypatch.setenv("JUPYTERHUB_PUBLIC_HUB_URL", "https://hub.example.edu/hub/")
    monkeypatch.delenv("JUPYTERHUB_HOST", raising=False)
    assert hub_public_urls() == (
        "https://hub.example.edu/services/c/",
        "https://hub.example.edu/hub/",
    )


def test_the_hub_consoles_pages_and_oauth_callback_answer_only_its_hosts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a Hub that names its public URL: a page or the OAuth callback (which sets the
    Hub's cookie) asked under another host is a bare 400, and the callback's own code
    never runs; under the public URL's host a page goes on to the Hub's sign-in."""
    monkeypatch.setenv("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:8766")
    monkeypatch.setenv("JUPYTERHUB_SERVICE_PREFIX", "/services/dpmagic-console/")
    monkeypatch.setenv("JUPYTERHUB_PUBLIC_URL", "https://hub.example.edu/services/dpmagic-console/")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "service-token-0123456789")
    monkeypatch.setenv("JUPYTERHUB_CLIENT_ID", "service-dpmagic-console")
    called: list[str] = []

    async def callback(self: object) -> None:
        called.append("callback")

    monkeypatch.setattr(HubOAuthCallbackHandler, "get", callback)
    policy = console_policy(tmp_path)
    console, app, host, port = hub_console(policy, None)
    assert (host, port) == ("127.0.0.1", 8766)
    with serving(app) as bound:
        console.hosts = Hosts.served(host, [host], bound, console.public, behind_hub=True)
        base = f"http://127.0.0.1:{bound}/services/dpmagic-console/"

        def status(path: str, host: str) -> int:
            return Client(base).get(path, {"Host": host}).status

        assert status("budgets", "evil.example") == 400
        assert status("oauth_callback", "evil.example") == 400
        assert called == []
        assert status("budgets", "hub.example.edu") == 302  # to the Hub's login
        assert status("oauth_callback", "hub.example.edu") == 200
        assert called == ["callback"]
    console.close()


@contextlib.contextmanager
def serving(app: Application) -> Iterator[int]:
    """``app`` on a free loopback port in a thread's event loop; yields the port."""
    ready, loop, where = threading.Event(), asyncio.new_event_loop(), []

    def run() -> None:
        asyncio.set_event_loop(loop)
        server = HTTPServer(app)
        sockets = bind_sockets(0, "127.0.0.1")
        server.add_sockets(sockets)
        where.append(sockets[0].getsockname()[1])
        ready.set()
        loop.run_forever()
        server.stop()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        yield where[0]
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
