"""``dpmagic lab``: JupyterLab wired to a gate, for trying dpmagic by hand.

The gate runs as a separate process, exactly as in a deployment; the lab gets
the gated kernelspec in a private Jupyter data folder (nothing is installed
into the user's or the environment's Jupyter paths) and ``DPMAGIC_GATE`` in
its environment, so every kernel it starts can reach the gate and nothing
else. Without ``--policy`` the bundled clinic example is generated first and
the quickstart notebook is put in the lab's root folder.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TextIO

from dpmagic.demo import NOTEBOOK, example_file, prepare_example, start_gate
from dpmagic.gate.policy import load_policy

LAB_MISSING = "JupyterLab is not installed: pip install 'dpmagic[lab]'"
LAB_STOP_TIMEOUT_S = 15.0


class LabUnavailable(RuntimeError):
    """JupyterLab is not importable here."""


def run_lab(
    policy: Path | None = None,
    port: int | None = None,
    patients: int = 5000,
    out: TextIO = sys.stdout,
    browser: bool = True,
) -> int:
    """The ``dpmagic lab`` command: returns JupyterLab's exit code.

    Raises LabUnavailable before doing anything if JupyterLab is missing, and
    PolicyError for a bad ``--policy``.
    """
    if importlib.util.find_spec("jupyterlab") is None:
        raise LabUnavailable(LAB_MISSING)
    if policy is not None:
        policy = load_policy(policy).path
    from dpmagic.kernel import install

    with contextlib.ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dpmagic-lab-")))
        root = workdir / "notebooks"
        root.mkdir()
        if policy is None:
            print(f"generating the clinic example ({patients} patients) in {workdir}", file=out)
            policy = prepare_example(workdir / "data", patients)
            shutil.copyfile(example_file(NOTEBOOK), root / NOTEBOOK)
        gate = start_gate(policy, workdir, stack, out)
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
        }
        cmd = [sys.executable, "-m", "jupyterlab", f"--ServerApp.root_dir={root}"]
        if port is not None:
            cmd.append(f"--port={port}")
        if not browser:
            cmd.append("--no-browser")
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            # Containers often run as root; JupyterLab refuses to without this.
            print("running as root: starting JupyterLab with --allow-root", file=out)
            cmd.append("--allow-root")
        out.flush()
        lab = subprocess.Popen(cmd, env=env)
        try:
            return lab.wait()
        except KeyboardInterrupt:
            # A terminal's Ctrl-C reaches JupyterLab too, but a SIGINT sent to
            # this process alone (a script, a supervisor) does not: stop it
            # either way, or it outlives the gate it was started for.
            return _stop(lab)


def _stop(lab: subprocess.Popen[bytes]) -> int:
    """SIGTERM, then SIGKILL if JupyterLab has not exited in time."""
    lab.terminate()
    try:
        return lab.wait(LAB_STOP_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        lab.kill()
        return lab.wait()
