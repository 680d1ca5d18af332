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
import json
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from dpmagic.commands.cli import main
from dpmagic.commands.demo import prepare_example
from dpmagic.gate import owner
from dpmagic.gate.policy import load_policy
from tests.conftest import free_port
from tests.hubs import START_TIMEOUT_S, Hub, needs_hub, running_hub, wait_for

pytestmark = pytest.mark.hub

SERVICE = "dpmagic"
ADMIN_TOKEN = uuid.uuid4().hex
USERS = ("alice", "bob")
GROUP = "section-a"  # a Hub group, alice's
COUNT = "SELECT COUNT(*) AS visits FROM visits"

# --- what a deployment adds for dpmagic (README: "On JupyterHub") ---
SERVICES = """
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
    "read:users:groups!user",
]
c.JupyterHub.load_groups = {{"{group}": {{"users": ["alice"]}}}}
c.Spawner.environment = {{"DPMAGIC_GATE": "http://127.0.0.1:{gate_port}"}}
"""


@dataclass
class GateHub(Hub):
    """The Hub, and the gate it runs as a service."""

    gate: str
    policy: Path


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GateHub]:
    needs_hub()
    work = tmp_path_factory.mktemp("hub")
    policy = prepare_example(work / "clinic", patients=200)
    # A budget for a group the Hub declares, which the policy's [groups] does not.
    text = policy.read_text()
    policy.write_text(
        text.replace(
            "[datasets.clinic]\n",
            f"[datasets.clinic]\ngroup_budgets = {{ {GROUP} = {{ epsilon = 40.0 }} }}\n",
            1,
        )
    )
    gate_port = free_port()
    services = SERVICES.format(
        group=GROUP,
        service=SERVICE,
        gate_port=gate_port,
        python=sys.executable,
        policy=str(policy),
        admin_token=ADMIN_TOKEN,
    )
    with running_hub(work, set(USERS), services) as running:
        the_hub = GateHub(
            running.api, running.proxy, running.log, f"http://127.0.0.1:{gate_port}", policy
        )
        deadline = time.monotonic() + START_TIMEOUT_S
        wait_for(the_hub.gate + "/v1/health", deadline, "the gate service", the_hub)
        for user in USERS:
            status, _ = the_hub.request("POST", f"/users/{user}/server", ADMIN_TOKEN)
            assert status in (201, 202), (status, the_hub.tail())
        for user in USERS:
            while time.monotonic() < deadline:
                _, model = the_hub.request("GET", f"/users/{user}", ADMIN_TOKEN)
                if model.get("servers", {}).get("", {}).get("ready"):
                    break
                time.sleep(0.5)
            else:
                raise RuntimeError(f"{user}'s server did not start:\n{the_hub.tail()}")
        yield the_hub


def server_token(hub: GateHub, user: str) -> str:
    """A token to drive the user's server from outside, as their browser would."""
    status, reply = hub.request(
        "POST", f"/users/{user}/tokens", ADMIN_TOKEN,
        {"scopes": [f"access:servers!user={user}"], "note": "test"},
    )  # fmt: skip
    assert status == 201, status
    return reply["token"]


def run_in_kernel(hub: GateHub, user: str, cells: list[str]) -> list[dict]:
    """Run cells in a new kernel of the user's server; each cell's outputs and status."""
    return asyncio.run(_run_in_kernel(hub, user, server_token(hub, user), cells))


async def _run_in_kernel(hub: GateHub, user: str, token: str, cells: list[str]) -> list[dict]:
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
from dpmagic.client.http_gate import Gate
r = Gate().query({COUNT!r}, epsilon={{eps}}, notebook="hw.ipynb")
print(json.dumps({{{{"replayed": r.replayed, "spent": r.budget["user"]["spent"]["epsilon"]}}}}))
"""


def asked(outcome: dict) -> dict:
    assert outcome["status"] == "ok", outcome
    return json.loads(outcome["stdout"].strip().splitlines()[-1])


def test_each_users_kernel_is_charged_to_its_own_budget(
    hub: GateHub, capsys: pytest.CaptureFixture[str]
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


def test_a_kernel_cannot_use_another_token(hub: GateHub) -> None:
    # A token of Alice's that the Hub issued without the gate's scope (the one
    # her browser uses for her server), and a made-up one: both refused.
    alices = server_token(hub, "alice")
    probe = f"""\
from dpmagic.client.http_gate import Gate
from dpmagic.client.errors import AuthError
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


# Last: it spends alice's and bob's budgets, which the tests above count.
GROUPS = f"""\
import json
from dpmagic.client.http_gate import Gate
r = Gate().query({COUNT!r}, epsilon=0.5, notebook="groups.ipynb", fresh=True)
print(json.dumps(sorted(r.budget.get("groups", {{}}))))
"""


def test_a_users_hub_groups_are_charged_as_groups(hub: GateHub) -> None:
    """alice is in the Hub's group section-a, bob in none: the gate reads that from
    the Hub's answer for each kernel's token, and charges alice's query to the
    group's budget as well as hers."""
    [alice] = run_in_kernel(hub, "alice", [GROUPS])
    [bob] = run_in_kernel(hub, "bob", [GROUPS])
    assert alice["status"] == "ok" and bob["status"] == "ok", (alice, bob)
    assert json.loads(alice["stdout"].strip().splitlines()[-1]) == [GROUP]
    assert json.loads(bob["stdout"].strip().splitlines()[-1]) == []
    policy = load_policy(hub.policy)
    with owner.open_ledger(policy) as ledger:
        charged = ledger.history(notebook="groups.ipynb", status="released")
    assert {row["user"]: row["groups"] for row in charged} == {"alice": [GROUP], "bob": []}
