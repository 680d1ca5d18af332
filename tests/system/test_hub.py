"""JupyterHub end to end: a real Hub on loopback, the gate as its managed service.

The Hub (``jupyterhub`` from PyPI, ``configurable-http-proxy`` from npm, a
dummy authenticator and a local-process spawner) starts the gate with
``dpmagic serve --jupyterhub`` and a single-user server for each of two
users. Cells run in each user's kernel through the server's REST and
websocket API, as JupyterLab runs them. Set up with
``pip install -e '.[hub]'`` and ``npm install --prefix .hub configurable-http-proxy``;
run with ``python -m pytest -q -m hub``.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dpmagic.cli import main
from dpmagic.demo import prepare_example
from tests.conftest import free_port

pytestmark = pytest.mark.hub

ROOT = Path(__file__).resolve().parents[2]
PROXY = ROOT / ".hub" / "node_modules" / ".bin" / "configurable-http-proxy"
SERVICE = "dpmagic"
ADMIN_TOKEN = uuid.uuid4().hex
USERS = ("alice", "bob")
START_TIMEOUT_S = 120
COUNT = "SELECT COUNT(*) AS visits FROM visits"

CONFIG = """\
c = get_config()  # noqa
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = {proxy_port}
c.JupyterHub.hub_ip = "127.0.0.1"
c.JupyterHub.hub_port = {hub_port}
c.ConfigurableHTTPProxy.command = [{chp!r}]
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{chp_port}"
c.JupyterHub.db_url = "sqlite:///{work}/jupyterhub.sqlite"
c.JupyterHub.cookie_secret_file = "{work}/cookie_secret"
c.JupyterHub.pid_file = "{work}/jupyterhub.pid"
c.JupyterHub.authenticator_class = "dummy"
c.Authenticator.allowed_users = {users!r}
c.JupyterHub.spawner_class = "simple"
c.SimpleLocalProcessSpawner.home_dir_template = "{work}/home/{{username}}"
c.Spawner.cmd = [{singleuser!r}]
c.Spawner.args = ["--allow-root"]  # the test may run as root
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120

# --- what a deployment adds for dpmagic (README: "On JupyterHub") ---
c.JupyterHub.services = [
    {{
        "name": "{service}",
        "url": "http://127.0.0.1:{gate_port}",
        "command": [{python!r}, "-m", "dpmagic", "serve", "--jupyterhub", "--policy", {policy!r}],
    }},
    {{"name": "test-admin", "api_token": "{admin_token}"}},
]
c.JupyterHub.load_roles = [
    {{"name": "user", "scopes": ["self", "access:services!service={service}"]}},
    {{
        "name": "test-admin",
        "scopes": ["admin:users", "admin:servers", "tokens", "access:servers"],
        "services": ["test-admin"],
    }},
]
c.Spawner.server_token_scopes = [
    "users:activity!user",
    "access:servers!server",
    "access:services!service={service}",
]
c.Spawner.environment = {{"DPMAGIC_GATE": "http://127.0.0.1:{gate_port}"}}
"""


@dataclass
class Hub:
    api: str
    proxy: str
    gate: str
    policy: Path

    def request(self, method: str, path: str, token: str, body: object = None) -> tuple[int, dict]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.api + path, data=data, method=method)
        req.add_header("Authorization", f"token {token}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=30) as reply:
                raw = reply.read()
                return reply.status, json.loads(raw) if raw else {}
        except urllib.error.HTTPError as exc:
            return exc.code, {}


def _wait(url: str, deadline: float, what: str, log: Path) -> None:
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"{what} did not start; the Hub's log:\n{log.read_text()[-4000:]}")


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    pytest.importorskip("jupyterhub", reason="needs pip install -e '.[hub]'")
    if not PROXY.exists():
        pytest.skip("needs npm install --prefix .hub configurable-http-proxy")
    work = tmp_path_factory.mktemp("hub")
    policy = prepare_example(work / "clinic", patients=200)
    ports = {name: free_port() for name in ("proxy_port", "hub_port", "chp_port", "gate_port")}
    bin_dir = Path(sys.executable).parent
    config = work / "jupyterhub_config.py"
    config.write_text(
        CONFIG.format(
            **ports,
            chp=str(PROXY),
            work=work,
            users=set(USERS),
            singleuser=str(bin_dir / "jupyterhub-singleuser"),
            service=SERVICE,
            python=sys.executable,
            policy=str(policy),
            admin_token=ADMIN_TOKEN,
        )
    )
    log = work / "hub.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DPMAGIC_", "JUPYTERHUB_"))}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(bin_dir / "jupyterhub"), "-f", str(config)],
            cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    the_hub = Hub(
        api=f"http://127.0.0.1:{ports['hub_port']}/hub/api",
        proxy=f"http://127.0.0.1:{ports['proxy_port']}",
        gate=f"http://127.0.0.1:{ports['gate_port']}",
        policy=policy,
    )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        _wait(the_hub.api + "/", deadline, "the Hub", log)
        _wait(the_hub.gate + "/v1/health", deadline, "the gate service", log)
        for user in USERS:
            status, _ = the_hub.request("POST", f"/users/{user}/server", ADMIN_TOKEN)
            assert status in (201, 202), (status, log.read_text()[-4000:])
        for user in USERS:
            while time.monotonic() < deadline:
                _, model = the_hub.request("GET", f"/users/{user}", ADMIN_TOKEN)
                if model.get("servers", {}).get("", {}).get("ready"):
                    break
                time.sleep(0.5)
            else:
                raise RuntimeError(f"{user}'s server did not start:\n{log.read_text()[-4000:]}")
        yield the_hub
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        # The Hub stops its servers and services; anything left in its group goes too.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def server_token(hub: Hub, user: str) -> str:
    """A token to drive the user's server from outside, as their browser would."""
    status, reply = hub.request(
        "POST", f"/users/{user}/tokens", ADMIN_TOKEN,
        {"scopes": [f"access:servers!user={user}"], "note": "test"},
    )  # fmt: skip
    assert status == 201, status
    return reply["token"]


def run_in_kernel(hub: Hub, user: str, cells: list[str]) -> list[dict]:
    """Run cells in a new kernel of the user's server; each cell's outputs and status."""
    return asyncio.run(_run_in_kernel(hub, user, server_token(hub, user), cells))


async def _run_in_kernel(hub: Hub, user: str, token: str, cells: list[str]) -> list[dict]:
    from tornado.httpclient import AsyncHTTPClient, HTTPRequest
    from tornado.websocket import websocket_connect

    base = f"{hub.proxy}/user/{user}/api/kernels"
    headers = {"Authorization": f"token {token}"}
    client = AsyncHTTPClient()
    reply = await client.fetch(
        HTTPRequest(base, method="POST", headers=headers, body=json.dumps({"name": "python3"}))
    )
    kernel = json.loads(reply.body)["id"]
    url = f"{base}/{kernel}/channels".replace("http://", "ws://")
    ws = await websocket_connect(HTTPRequest(url, headers=headers))
    session = uuid.uuid4().hex
    results = []
    try:
        for code in cells:
            msg_id = uuid.uuid4().hex
            await ws.write_message(json.dumps({
                "header": {"msg_id": msg_id, "session": session, "username": user,
                           "msg_type": "execute_request", "version": "5.3", "date": ""},
                "parent_header": {}, "metadata": {}, "buffers": [], "channel": "shell",
                "content": {"code": code, "silent": False, "store_history": True,
                            "user_expressions": {}, "allow_stdin": False},
            }))  # fmt: skip
            outcome: dict = {"stdout": "", "error": "", "status": None, "idle": False}
            while outcome["status"] is None or not outcome["idle"]:
                raw = await asyncio.wait_for(ws.read_message(), timeout=120)
                assert raw is not None, "the kernel's websocket closed"
                msg = json.loads(raw)
                if msg["parent_header"].get("msg_id") != msg_id:
                    continue
                kind, content = msg["msg_type"], msg["content"]
                if kind == "stream":
                    outcome["stdout"] += content["text"]
                elif kind == "error":
                    outcome["error"] = f"{content['ename']}: {content['evalue']}"
                elif kind == "execute_reply":
                    outcome["status"] = content["status"]
                elif kind == "status" and content["execution_state"] == "idle":
                    outcome["idle"] = True
            results.append(outcome)
    finally:
        ws.close()
        await client.fetch(HTTPRequest(f"{base}/{kernel}", method="DELETE", headers=headers))
    return results


ASK = f"""\
import json
from dpmagic.client import Gate
r = Gate().query({COUNT!r}, epsilon={{eps}}, notebook="hw.ipynb")
print(json.dumps({{{{"replayed": r.replayed, "spent": r.budget["user"]["spent"]["epsilon"]}}}}))
"""


def asked(outcome: dict) -> dict:
    assert outcome["status"] == "ok", outcome
    return json.loads(outcome["stdout"].strip().splitlines()[-1])


def test_each_users_kernel_is_charged_to_its_own_budget(
    hub: Hub, capsys: pytest.CaptureFixture[str]
) -> None:
    alice = run_in_kernel(
        hub, "alice", ["%load_ext dpmagic", f"%%dpsql -e 0.5\n{COUNT}", ASK.format(eps=0.5)]
    )
    assert alice[1]["status"] == "ok", alice[1]
    assert asked(alice[2]) == {"replayed": True, "spent": 0.5}

    # Bob's identical query is his own: released to him and charged to him,
    # also when his kernel claims to be Alice's.
    bob = run_in_kernel(
        hub,
        "bob",
        [
            ASK.format(eps=0.5),
            "import os; os.environ['JUPYTERHUB_USER'] = 'alice'",
            ASK.format(eps=0.25),
        ],
    )
    assert asked(bob[0]) == {"replayed": False, "spent": 0.5}
    assert asked(bob[2]) == {"replayed": False, "spent": 0.75}

    # The gate's ledger knows them by their Hub names.
    assert main(["budget", "show", "--policy", str(hub.policy), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    spent = {r["user"]: r["spent_epsilon"] for r in rows if r["notebook"] == "(all notebooks)"}
    assert spent == {"alice": 0.5, "bob": 0.75}


def test_a_kernel_cannot_use_another_token(hub: Hub) -> None:
    # A token of Alice's that the Hub issued without the gate's scope (the one
    # her browser uses for her server), and a made-up one: both refused.
    alices = server_token(hub, "alice")
    probe = f"""\
from dpmagic.client import Gate
from dpmagic.errors import AuthError
for token in ({alices!r}, "not-a-token-0123456789"):
    try:
        Gate(token=token).query({COUNT!r}, epsilon=0.5, notebook="hw.ipynb")
        print("answered")
    except AuthError as refusal:
        print("refused:", refusal.message)
"""
    # Nor can Bob's own token get Alice's tokens from the Hub.
    steal = """\
import os, urllib.request, urllib.error
req = urllib.request.Request(os.environ["JUPYTERHUB_API_URL"] + "/users/alice/tokens")
req.add_header("Authorization", "token " + os.environ["JUPYTERHUB_API_TOKEN"])
try:
    urllib.request.urlopen(req)
    print("got them")
except urllib.error.HTTPError as exc:
    print("hub said", exc.code)
"""
    bob = run_in_kernel(hub, "bob", [probe, steal])
    lines = bob[0]["stdout"].splitlines()
    assert lines[0].startswith("refused: the token lacks the scope ")
    assert f"access:services!service={SERVICE}" in lines[0]
    assert lines[1] == "refused: the Hub does not know this token"
    assert bob[1]["stdout"].strip() in ("hub said 403", "hub said 404")
    status, reply = hub.request("GET", "/users/alice", ADMIN_TOKEN)
    assert status == 200 and reply["name"] == "alice"


def test_a_hub_gate_needs_its_service_name_and_url(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from dpmagic.gate.service.auth import HubConfigError, HubTokenAuth
    from tests.conftest import write_dataset

    for name in (
        "JUPYTERHUB_SERVICE_NAME",
        "JUPYTERHUB_OAUTH_ACCESS_SCOPES",
        "JUPYTERHUB_SERVICE_URL",
    ):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(HubConfigError, match="needs the gate's service name"):
        HubTokenAuth()
    policy = write_dataset(tmp_path)
    assert main(["serve", "--jupyterhub", "--policy", str(policy)]) == 2
    assert "needs JUPYTERHUB_SERVICE_URL" in capsys.readouterr().err
    monkeypatch.setenv("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:1")
    assert main(["serve", "--jupyterhub", "--policy", str(policy)]) == 2
    assert "needs the gate's service name" in capsys.readouterr().err
