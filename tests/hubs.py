"""A real JupyterHub on loopback for the hub suites (``pytest -m hub``): ``jupyterhub``
from PyPI, ``configurable-http-proxy`` from npm (in ``.hub/``), a dummy authenticator
and a local-process spawner, with the services and roles a test adds to its config.

Shared by tests/system/test_hub.py (the gate as a Hub service) and
tests/system/test_hub_console.py (the owner's console as one)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import free_port

ROOT = Path(__file__).resolve().parents[1]
PROXY = ROOT / ".hub" / "node_modules" / ".bin" / "configurable-http-proxy"
START_TIMEOUT_S = 120

# What every test Hub is; a test appends its services and roles.
BASE_CONFIG = """\
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
"""


@dataclass
class Hub:
    """A running Hub: its REST API, its proxy (what a browser reaches) and its log."""

    api: str
    proxy: str
    log: Path

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

    def tail(self) -> str:
        return self.log.read_text()[-4000:]


def wait_for(url: str, deadline: float, what: str, hub: Hub, *, served: bool = False) -> None:
    """Until ``url`` answers at all (an HTTP error is an answer), or with ``served``
    until it answers 200 (through the proxy: once the Hub has added its route)."""
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except urllib.error.HTTPError:
            if not served:
                return  # it answers
            time.sleep(0.5)
        except OSError:
            time.sleep(0.5)
    raise RuntimeError(f"{what} did not start; the Hub's log:\n{hub.tail()}")


def needs_hub() -> None:
    """Skip where the Hub cannot run: without the hub extra or the proxy."""
    pytest.importorskip("jupyterhub", reason="needs pip install -e '.[hub]'")
    if not PROXY.exists():
        pytest.skip("needs npm install --prefix .hub configurable-http-proxy")


@contextlib.contextmanager
def running_hub(work: Path, users: set[str], services: str) -> Iterator[Hub]:
    """A Hub in ``work`` with ``users`` and the config lines ``services`` (its services,
    roles and the rest a test needs), until the ``with`` ends; then it and everything it
    started are stopped."""
    needs_hub()
    ports = {name: free_port() for name in ("proxy_port", "hub_port", "chp_port")}
    bin_dir = Path(sys.executable).parent
    config = work / "jupyterhub_config.py"
    config.write_text(
        BASE_CONFIG.format(
            **ports,
            chp=str(PROXY),
            work=work,
            users=users,
            singleuser=str(bin_dir / "jupyterhub-singleuser"),
        )
        + services
    )
    log = work / "hub.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DPMAGIC_", "JUPYTERHUB_"))}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [str(bin_dir / "jupyterhub"), "-f", str(config)],
            cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
    hub = Hub(
        api=f"http://127.0.0.1:{ports['hub_port']}/hub/api",
        proxy=f"http://127.0.0.1:{ports['proxy_port']}",
        log=log,
    )
    try:
        wait_for(hub.api + "/", time.monotonic() + START_TIMEOUT_S, "the Hub", hub)
        yield hub
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
