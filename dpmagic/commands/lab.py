"""``dpmagic lab``: JupyterLab wired to a gate, for trying dpmagic by hand.

The gate runs as a separate process, exactly as in a deployment; the lab gets
the gated kernelspec in a private Jupyter data folder (nothing is installed
into the user's or the environment's Jupyter paths) and ``DPMAGIC_GATE`` in
its environment, so every kernel it starts can reach the gate and nothing
else. Without ``--policy`` the bundled clinic example is generated first and
the quickstart notebook is put in the served folder, unless one is there.

Notebooks are the user's: JupyterLab serves the current folder (or
``--notebook-dir``), which the lab never removes anything from. Everything the
lab starts (the gate, JupyterLab, its kernels) is a child of a
:class:`~dpmagic.commands.supervisor.Supervisor`, and everything it makes for itself (the
data copy, the ledger, the kernelspec, Jupyter's runtime files, JupyterLab's
workspace) is in one temporary folder: on any exit, signals included, the
children stop and that folder goes. Nothing is written in the home folder that
was not there: where the user has no IPython folder or Jupyter data folder yet,
what the kernels and the server would put there (history, the notebook trust
database) goes in the temporary folder too.
"""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import json
import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path
from typing import TextIO

from dpmagic.commands.demo import NOTEBOOK, example_file, prepare_example, start_gate
from dpmagic.commands.supervisor import Supervisor
from dpmagic.gate.policy import load_policy
from dpmagic.kernel import write_spec

LAB_MISSING = "JupyterLab is not installed: pip install 'dpmagic[lab]'"


class LabError(RuntimeError):
    """The lab cannot start (JupyterLab missing, its port taken); one line why."""


def run_lab(
    policy: Path | None = None,
    port: int | None = None,
    patients: int = 5000,
    out: TextIO = sys.stdout,
    browser: bool = True,
    notebook_dir: Path | None = None,
) -> int:
    """The ``dpmagic lab`` command: returns JupyterLab's exit code.

    Raises LabError before doing anything if JupyterLab is missing, ``notebook_dir``
    is not a folder or ``port`` is taken, and PolicyError for a bad ``--policy``. A
    stop signal raises :class:`~dpmagic.commands.supervisor.Stopped` out of here once
    JupyterLab, its kernels and the gate have stopped and the lab's own folder is
    removed; the served folder keeps every notebook.
    """
    if importlib.util.find_spec("jupyterlab") is None:
        raise LabError(LAB_MISSING)
    root = served_folder(notebook_dir)
    if port is not None:
        check_port(port)
    if policy is not None:
        policy = load_policy(policy).path

    with Supervisor() as supervisor, contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dpmagic-lab-")))
        # Registered after the folder, so it runs first: children stop before
        # the folder they work in (data copy, ledger, sockets) is removed.
        stack.callback(supervisor.stop)
        if policy is None:
            print(f"generating the clinic example ({patients} patients) in {workdir}", file=out)
            policy = prepare_example(workdir / "data", patients)
            place_quickstart(root, out)
        else:
            print(f"the lab's own files (sockets, runtime, workspace) in {workdir}", file=out)
        gate = start_gate(policy, workdir, stack, out, supervisor)
        if gate is None:
            return 1
        spec = write_spec(kernel_folder(workdir), gate.address)
        print(f"gated kernel installed in {spec}", file=out)
        print(f"notebooks in {root} (they stay there when the lab stops)", file=out)
        cmd, env = lab_command(root, workdir, gate.address, port, browser)
        if "--allow-root" in cmd:
            print("running as root: starting JupyterLab with --allow-root", file=out)
        out.flush()
        lab = supervisor.popen(cmd, env=env)
        return lab.wait()


# The JupyterLab plugin that asks to fetch Jupyter's news and checks for updates
# over the internet: off in a lab serving private data.
ANNOUNCEMENTS = "@jupyterlab/apputils-extension:announcements"


def served_folder(notebook_dir: Path | None) -> Path:
    """The folder JupyterLab serves: ``notebook_dir``, or the current folder."""
    root = Path.cwd() if notebook_dir is None else notebook_dir.expanduser()
    if not root.is_dir():
        raise LabError(f"--notebook-dir {notebook_dir}: no such folder")
    return root.resolve()


def place_quickstart(root: Path, out: TextIO) -> None:
    """The example's quickstart notebook copied into ``root``, unless a file of that
    name is there (then it is served as it is): the copy is the user's to keep."""
    target = root / NOTEBOOK
    if target.exists():
        print(f"{target} is there already: served as it is", file=out)
        return
    shutil.copyfile(example_file(NOTEBOOK), target)
    print(f"copied the quickstart notebook to {target}", file=out)


def kernel_folder(workdir: Path) -> Path:
    """Where the gated kernelspec goes: a Jupyter data folder of the lab's own."""
    return workdir / "jupyter" / "share" / "jupyter" / "kernels" / "dpmagic"


def lab_command(
    root: Path,
    workdir: Path,
    gate: str,
    port: int | None = None,
    browser: bool = True,
) -> tuple[list[str], dict[str, str]]:
    """JupyterLab's command line and environment: serving ``root``, with its own
    files (runtime, workspaces, its configuration) under ``workdir``; writes that
    configuration (announcements off)."""
    from jupyter_core.paths import jupyter_data_dir

    environ = os.environ
    config = workdir / "config"
    (config / "labconfig").mkdir(parents=True, exist_ok=True)
    (config / "labconfig" / "page_config.json").write_text(
        json.dumps({"disabledExtensions": {ANNOUNCEMENTS: True}}, indent=2) + "\n"
    )
    env = {
        **environ,
        "DPMAGIC_GATE": gate,
        "JUPYTER_PATH": _paths(kernel_folder(workdir).parents[1], environ.get("JUPYTER_PATH")),
        # After the user's own configuration folder, before the environment's.
        "JUPYTER_CONFIG_PATH": _paths(config, environ.get("JUPYTER_CONFIG_PATH")),
        # The server's and kernels' connection files and IPC sockets stay
        # in the lab's folder and go with it.
        "JUPYTER_RUNTIME_DIR": str(workdir / "runtime"),
        # jupyter_lsp asks npm for its prefix at start, and npm writes a log of it.
        "npm_config_logs_dir": str(workdir / "npm-logs"),
    }
    # Per-user folders the user has not got yet would be made in the home folder
    # (by the server, the kernels, npm): the lab's own instead. Where they exist, they
    # are used as by any JupyterLab (the user's kernels, profile, trust database).
    for variable, theirs, ours in (
        ("IPYTHONDIR", Path.home() / ".ipython", "ipython"),
        ("JUPYTER_DATA_DIR", Path(jupyter_data_dir()), "jupyter-data"),
        ("npm_config_cache", Path.home() / ".npm", "npm"),
    ):
        if not environ.get(variable) and not theirs.exists():
            env[variable] = str(workdir / ours)
    cmd = [
        sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={root}",
        # Kernels over unix sockets: local only, and no ipykernel warning
        # about unencrypted TCP.
        "--KernelManager.transport=ipc",
        # The layout of open tabs, saved as it changes: the lab's, not ~/.jupyter's.
        f"--LabApp.workspaces_dir={workdir / 'workspaces'}",
    ]  # fmt: skip
    if port is not None:
        # Fail rather than move to another port if it is taken meanwhile.
        cmd += [f"--port={port}", "--ServerApp.port_retries=0"]
    if not browser:
        cmd.append("--no-browser")
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        # Containers often run as root; JupyterLab refuses to without this.
        cmd.append("--allow-root")
    return cmd, env


def _paths(first: Path, rest: str | None) -> str:
    return os.pathsep.join(p for p in (str(first), rest) if p)


def check_port(port: int) -> None:
    """LabError if something already listens on ``port``: JupyterLab would
    otherwise move to another port and the URL the user expects would be dead."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise LabError(
                    f"port {port} is in use by another program: "
                    "choose another --port, or leave it out to let JupyterLab pick a free one"
                ) from None
            raise LabError(f"cannot use port {port}: {exc.strerror}") from None
