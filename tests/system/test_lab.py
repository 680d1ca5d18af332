"""``dpmagic lab`` for real: JupyterLab with the gated kernelspec pointed at a live gate.

Through real processes (gate, kernel or CLI); the in-process tests of the same subject,
and the helpers used here, are in tests/unit/test_lab.py."""

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

from dpmagic.client import Gate
from tests.stopping import STOP_SIGNALS, Command, stop_and_check
from tests.unit.test_lab import TOKEN

pytest.importorskip("jupyterlab", reason="JupyterLab is the optional extra dpmagic[lab]")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(port: int, path: str) -> dict:
    url = f"http://127.0.0.1:{port}{path}?token={TOKEN}"
    with urllib.request.urlopen(url, timeout=5) as reply:
        return json.loads(reply.read())


def test_lab_serves_the_gated_kernel_and_the_quickstart(tmp_path: Path) -> None:
    port = _free_port()
    env = {**os.environ, "JUPYTER_TOKEN": TOKEN, "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg")}
    lab = subprocess.Popen(
        [sys.executable, "-m", "dpmagic", "lab", "--port", str(port), "--no-browser",
         "--patients", "200"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
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
    finally:
        lab.send_signal(signal.SIGINT)
        lab.wait(timeout=60)
    # The gate and JupyterLab itself go with the lab, even when the signal
    # reached `dpmagic lab` alone (no terminal sends it to the whole group).
    assert not Gate(address).health()
    with pytest.raises(OSError):
        _get(port, "/api/status")


@pytest.mark.signals
@pytest.mark.parametrize("signum", STOP_SIGNALS, ids=lambda s: s.name)
def test_lab_stops_everything_on_a_signal(tmp_path: Path, signum: int) -> None:
    """JupyterLab, a running kernel (in a session of its own) and the gate stop,
    and the folder with the data copy, ledger and runtime files is removed."""
    port = _free_port()
    env = {"JUPYTER_TOKEN": TOKEN, "JUPYTER_CONFIG_DIR": str(tmp_path / "cfg")}
    args = ["lab", "--port", str(port), "--no-browser", "--patients", "100"]
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
        # The gate, JupyterLab and the kernel.
        stop_and_check(lab, signum, folder, min_children=3)
    finally:
        if lab.proc.poll() is None:
            lab.kill("dpmagic-lab-")


def _answers(port: int) -> bool:
    try:
        _get(port, "/api/status")
    except OSError:
        return False
    return True
