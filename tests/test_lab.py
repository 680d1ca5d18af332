"""``dpmagic lab`` for real: JupyterLab with the gated kernelspec pointed at a live gate."""

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
        try:
            lab.wait(timeout=10)
        except subprocess.TimeoutExpired:
            lab.send_signal(signal.SIGINT)  # JupyterLab asks to confirm the first Ctrl-C
            lab.wait(timeout=30)
    # The gate and JupyterLab itself go with the lab, even when the signal
    # reached `dpmagic lab` alone (no terminal sends it to the whole group).
    assert not Gate(address).health()
    with pytest.raises(OSError):
        _get(port, "/api/status")
