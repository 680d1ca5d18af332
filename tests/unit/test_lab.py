"""``dpmagic lab`` for real: JupyterLab with the gated kernelspec pointed at a live gate."""

from __future__ import annotations

import io
import json
import os
import socket
from pathlib import Path

import pytest

from dpmagic.commands.lab import check_port

pytest.importorskip("jupyterlab", reason="JupyterLab is the optional extra dpmagic[lab]")


def test_lab_port_in_use_fails_clearly(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dpmagic.commands.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["lab", "--port", str(port), "--no-browser"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"dpmagic: error: port {port} is in use") and err.count("\n") == 1
    check_port(port)  # free again: the check reports what it sees


def test_the_lab_serves_the_current_folder_or_the_one_named(tmp_path, monkeypatch) -> None:
    from dpmagic.commands.lab import LabError, served_folder

    monkeypatch.chdir(tmp_path)
    assert served_folder(None) == tmp_path.resolve()
    (tmp_path / "mine").mkdir()
    assert served_folder(Path("mine")) == (tmp_path / "mine").resolve()
    with pytest.raises(LabError, match="--notebook-dir nowhere: no such folder"):
        served_folder(Path("nowhere"))


def test_a_missing_notebook_dir_fails_clearly(tmp_path, capsys) -> None:
    from dpmagic.commands.cli import main

    missing = tmp_path / "nowhere"
    assert main(["lab", "--notebook-dir", str(missing), "--no-browser"]) == 2
    assert capsys.readouterr().err == f"dpmagic: error: --notebook-dir {missing}: no such folder\n"
    assert not missing.exists()


def _fake_home(tmp_path: Path, monkeypatch) -> Path:
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for variable in ("IPYTHONDIR", "JUPYTER_DATA_DIR", "XDG_DATA_HOME", "npm_config_cache"):
        monkeypatch.delenv(variable, raising=False)
    return home


def test_the_lab_keeps_its_own_files_in_its_folder_and_turns_news_off(tmp_path, monkeypatch):
    """Served: the notebooks' folder. JupyterLab's workspace, runtime files and its
    configuration are in the lab's folder; where the user has no IPython, Jupyter data
    or npm folder, those are the lab's too, so nothing is made in the home folder."""
    from dpmagic.commands.lab import ANNOUNCEMENTS, lab_command

    home = _fake_home(tmp_path, monkeypatch)
    root, workdir = tmp_path / "notebooks", tmp_path / "dpmagic-lab-x"
    root.mkdir()
    workdir.mkdir()
    cmd, env = lab_command(root, workdir, "unix:/gate.sock", port=8888, browser=False)
    assert f"--ServerApp.root_dir={root}" in cmd
    assert f"--LabApp.workspaces_dir={workdir / 'workspaces'}" in cmd
    assert env["JUPYTER_RUNTIME_DIR"] == str(workdir / "runtime")
    for variable in ("IPYTHONDIR", "JUPYTER_DATA_DIR", "npm_config_cache", "npm_config_logs_dir"):
        assert Path(env[variable]).parent == workdir, variable
    assert not any(str(home) in part for part in cmd)
    # Announcements (news and update checks) off, by JupyterLab's page configuration.
    config = Path(env["JUPYTER_CONFIG_PATH"].split(os.pathsep)[0])
    page = json.loads((config / "labconfig" / "page_config.json").read_text())
    assert page["disabledExtensions"] == {ANNOUNCEMENTS: True}
    assert list(home.iterdir()) == []


def test_the_users_own_folders_are_used_where_they_exist(tmp_path, monkeypatch) -> None:
    from dpmagic.commands.lab import lab_command

    home = _fake_home(tmp_path, monkeypatch)
    for folder in (".ipython", ".local/share/jupyter", ".npm"):
        (home / folder).mkdir(parents=True)
    _, env = lab_command(tmp_path, tmp_path / "lab", "unix:/gate.sock")
    assert not {"IPYTHONDIR", "JUPYTER_DATA_DIR", "npm_config_cache"} & env.keys()


def test_the_quickstart_is_copied_once_and_a_users_copy_is_left_alone(tmp_path) -> None:
    from dpmagic.commands.demo import NOTEBOOK, example_file
    from dpmagic.commands.lab import place_quickstart

    out = io.StringIO()
    place_quickstart(tmp_path, out)
    copied = tmp_path / NOTEBOOK
    assert copied.read_bytes() == example_file(NOTEBOOK).read_bytes()
    copied.write_text("my edits")
    place_quickstart(tmp_path, out)
    assert copied.read_text() == "my edits"
    assert "served as it is" in out.getvalue()
