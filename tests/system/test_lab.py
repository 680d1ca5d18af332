"""``dpmagic lab`` for real: JupyterLab with the gated kernelspec pointed at a live gate.

Through real processes (gate, kernel or CLI); the in-process tests of the same subject
are in tests/unit/test_lab.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from dpmagic.client.http_gate import Gate
from tests.stopping import STOP_SIGNALS, Command, stop_and_check

pytest.importorskip("jupyterlab", reason="JupyterLab is the optional extra dpmagic[lab]")
TOKEN = "dpmagic-lab-test-token"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(port: int, path: str) -> dict:
    url = f"http://127.0.0.1:{port}{path}?token={TOKEN}"
    with urllib.request.urlopen(url, timeout=5) as reply:
        return json.loads(reply.read())


def _fake_home(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """An empty home folder, and an environment where it is the only per-user one."""
    home = tmp_path / "home"
    home.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("IPYTHONDIR", "JUPYTER_DATA_DIR", "XDG_DATA_HOME", "npm_config_cache")
    }
    return home, {**env, "HOME": str(home)}


def _save(port: int, name: str) -> dict:
    """A notebook saved through JupyterLab's contents API, as its Save does."""
    notebook = {"cells": [], "metadata": {"saved_by": "test"}, "nbformat": 4, "nbformat_minor": 5}
    save = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/contents/{name}?token={TOKEN}",
        data=json.dumps({"type": "notebook", "content": notebook}).encode(),
        method="PUT",
    )
    urllib.request.urlopen(save, timeout=30).close()
    return notebook


def test_lab_serves_the_gated_kernel_and_the_quickstart(tmp_path: Path) -> None:
    """From the current folder, which keeps the quickstart and what the user saves;
    JupyterLab's news are off and it writes nothing in the home folder."""
    port = _free_port()
    home, env = _fake_home(tmp_path)
    here = tmp_path / "here"
    here.mkdir()
    env = {**env, "JUPYTER_TOKEN": TOKEN, "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg")}
    lab = subprocess.Popen(
        [sys.executable, "-m", "dpmagic", "lab", "--port", str(port), "--no-browser",
         "--patients", "200"],
        env=env, cwd=here, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 90
        specs = None
        while time.monotonic() < deadline and lab.poll() is None:
            try:
                specs = _get(port, "/api/kernelspecs")
                break
            except OSError:
                time.sleep(0.5)
        assert specs is not None, "JupyterLab did not come up"
        gated = specs["kernelspecs"]["dpmagic"]["spec"]
        address = gated["env"]["DPMAGIC_GATE"]
        assert gated["argv"][1:3] == ["-m", "dpmagic.kernel"]
        assert Gate(address).health()
        assert "clinic" in Gate(address).schema()["datasets"]
        names = [c["name"] for c in _get(port, "/api/contents")["content"]]
        assert "quickstart.ipynb" in names
        saved = _save(port, "my_analysis.ipynb")
        # The page JupyterLab serves has the announcements plugin (the news toast) off.
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/lab?token={TOKEN}") as page:
            html = page.read().decode()
        tag = html[html.index('id="jupyter-config-data"') :]
        config = json.loads(tag[tag.index(">") + 1 : tag.index("</script>")])
        assert "@jupyterlab/apputils-extension:announcements" in config["disabledExtensions"]
        # A workspace, as the browser saves it on every change of layout.
        workspace = urllib.request.Request(
            f"http://127.0.0.1:{port}/lab/api/workspaces/default?token={TOKEN}",
            data=json.dumps({"data": {}, "metadata": {"id": "default"}}).encode(),
            method="PUT",
        )
        urllib.request.urlopen(workspace, timeout=30).close()
    finally:
        lab.send_signal(signal.SIGINT)
        lab.wait(timeout=60)
    # The gate and JupyterLab itself go with the lab, even when the signal
    # reached `dpmagic lab` alone (no terminal sends it to the whole group).
    assert not Gate(address).health()
    with pytest.raises(OSError):
        _get(port, "/api/status")
    assert json.loads((here / "my_analysis.ipynb").read_text())["metadata"] == saved["metadata"]
    assert (here / "quickstart.ipynb").exists()
    assert sorted(p.name for p in home.rglob("*")) == []


@pytest.mark.signals
@pytest.mark.parametrize("signum", STOP_SIGNALS, ids=lambda s: s.name)
def test_lab_stops_everything_on_a_signal(tmp_path: Path, signum: int) -> None:
    """JupyterLab, a running kernel (in a session of its own) and the gate stop,
    and the lab's folder with the runtime files and sockets is removed; the
    notebook the user saved in the served folder, and the policy's data and
    ledger, stay, and nothing is left in the home folder."""
    from dpmagic.examples.clinic import generate, write_policy

    port = _free_port()
    home, env = _fake_home(tmp_path)
    data, notebooks = tmp_path / "data", tmp_path / "notebooks"
    generate(data, patients=100)
    policy = write_policy(data)
    notebooks.mkdir()
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    env = {**env, "JUPYTER_TOKEN": TOKEN, "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg")}
    args = ["lab", "--policy", str(policy), "--notebook-dir", str(notebooks), "--port",
            str(port), "--no-browser"]  # fmt: skip
    lab = Command(args, tmp_path / "lab.log", env)
    try:
        lab.wait_for(lambda: _answers(port), "JupyterLab")
        start = urllib.request.Request(
            f"http://127.0.0.1:{port}/api/kernels?token={TOKEN}",
            data=json.dumps({"name": "dpmagic"}).encode(),
            method="POST",
        )
        # Answered once the kernel's process is started.
        urllib.request.urlopen(start, timeout=120).close()
        # Over unix sockets, its connection file in the lab's folder.
        folder = lab.folder("dpmagic-lab-")
        (connection,) = folder.glob("runtime/kernel-*.json")
        assert json.loads(connection.read_text())["transport"] == "ipc"
        saved = _save(port, "my_analysis.ipynb")
        # The gate, JupyterLab and the kernel.
        stop_and_check(lab, signum, folder, min_children=3)
    finally:
        if lab.proc.poll() is None:
            lab.kill("dpmagic-lab-")
    kept = json.loads((notebooks / "my_analysis.ipynb").read_text())
    assert kept["metadata"] == saved["metadata"]
    assert sorted(p.name for p in home.rglob("*")) == []
    # Nothing removed that the lab did not make: what was there is there still.
    after = {p.relative_to(tmp_path) for p in tmp_path.rglob("*")}
    assert set(before) <= after


def _answers(port: int) -> bool:
    try:
        _get(port, "/api/status")
    except OSError:
        return False
    return True
