"""``dpmagic lab`` for real: JupyterLab with the gated kernelspec pointed at a live gate."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from dpmagic.lab import check_port

pytest.importorskip("jupyterlab", reason="JupyterLab is the optional extra dpmagic[lab]")
TOKEN = "dpmagic-lab-test-token"


def test_lab_port_in_use_fails_clearly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dpmagic.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["lab", "--port", str(port), "--no-browser"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"dpmagic: error: port {port} is in use") and err.count("\n") == 1
    check_port(port)  # free again: the check reports what it sees
