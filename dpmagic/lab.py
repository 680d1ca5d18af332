"""``dpmagic lab``: JupyterLab wired to a gate, for trying dpmagic by hand.

The gate runs as a separate process, exactly as in a deployment; the lab gets
the gated kernelspec in a private Jupyter data folder (nothing is installed
into the user's or the environment's Jupyter paths) and ``DPMAGIC_GATE`` in
its environment, so every kernel it starts can reach the gate and nothing
else. Without ``--policy`` the bundled clinic example is generated first and
the quickstart notebook is put in the lab's root folder.

Everything the lab starts (the gate, JupyterLab, its kernels) is a child of a
:class:`~dpmagic.supervisor.Supervisor`, and everything it makes (the data
copy, the ledger, the kernelspec, Jupyter's runtime files) is in one temporary
folder: on any exit, signals included, the children stop and the folder goes.
"""

from __future__ import annotations

import contextlib
import errno
import importlib.util
import os
import shutil
import socket
import sys
import tempfile
from pathlib import Path
from typing import TextIO

from dpmagic.demo import NOTEBOOK, example_file, prepare_example, start_gate
from dpmagic.gate.policy import load_policy
from dpmagic.supervisor import Supervisor

LAB_MISSING = "JupyterLab is not installed: pip install 'dpmagic[lab]'"


class LabError(RuntimeError):
    """The lab cannot start (JupyterLab missing, its port taken); one line why."""


def run_lab(
    policy: Path | None = None,
    port: int | None = None,
    patients: int = 5000,
    out: TextIO = sys.stdout,
    browser: bool = True,
) -> int:
    """The ``dpmagic lab`` command: returns JupyterLab's exit code.

    Raises LabError before doing anything if JupyterLab is missing or ``port``
    is taken, and PolicyError for a bad ``--policy``. A stop signal raises
    :class:`~dpmagic.supervisor.Stopped` out of here once JupyterLab, its
    kernels and the gate have stopped and the lab's folder is removed.
    """
    if importlib.util.find_spec("jupyterlab") is None:
        raise LabError(LAB_MISSING)
    if port is not None:
        check_port(port)
    if policy is not None:
        policy = load_policy(policy).path
    from dpmagic.kernel import install

    with Supervisor() as supervisor, contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dpmagic-lab-")))
        # Registered after the folder, so it runs first: children stop before
        # the folder they work in (data copy, ledger, sockets) is removed.
        stack.callback(supervisor.stop)
        root = workdir / "notebooks"
        root.mkdir()
        if policy is None:
            print(f"generating the clinic example ({patients} patients) in {workdir}", file=out)
            policy = prepare_example(workdir / "data", patients)
            shutil.copyfile(example_file(NOTEBOOK), root / NOTEBOOK)
        gate = start_gate(policy, workdir, stack, out, supervisor)
        if gate is None:
            return 1
        prefix = workdir / "jupyter"
        where = install(prefix=str(prefix), gate=gate.address)
        print(f"gated kernel installed in {where}", file=out)
        env = {
            **os.environ,
            "DPMAGIC_GATE": gate.address,
            "JUPYTER_PATH": os.pathsep.join(
                p for p in (str(prefix / "share" / "jupyter"), os.environ.get("JUPYTER_PATH")) if p
            ),
            # The server's and kernels' connection files and IPC sockets stay
            # in the lab's folder and go with it.
            "JUPYTER_RUNTIME_DIR": str(workdir / "runtime"),
        }
        cmd = [
            sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={root}",
            # Kernels over unix sockets: local only, and no ipykernel warning
            # about unencrypted TCP.
            "--KernelManager.transport=ipc",
        ]  # fmt: skip
        if port is not None:
            # Fail rather than move to another port if it is taken meanwhile.
            cmd += [f"--port={port}", "--ServerApp.port_retries=0"]
        if not browser:
            cmd.append("--no-browser")
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            # Containers often run as root; JupyterLab refuses to without this.
            print("running as root: starting JupyterLab with --allow-root", file=out)
            cmd.append("--allow-root")
        out.flush()
        lab = supervisor.popen(cmd, env=env)
        return lab.wait()


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
