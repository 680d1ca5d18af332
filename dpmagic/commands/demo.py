"""``dpmagic demo``: the whole system on the bundled example, end to end.

Everything runs as it would for a real user: the clinic data is generated into
a scratch folder, a gate is started as a *separate process* on a unix socket,
and the quickstart notebook is executed by a real ``python3`` kernel (through
nbclient) whose only way to the data is ``DPMAGIC_GATE``. Nothing is
simulated, so a demo that passes is evidence that the parts fit together.

The gate and the kernel are children of a :class:`~dpmagic.commands.supervisor.Supervisor`:
whatever ends the demo (a failing cell, Ctrl-C, ``kill``, a closed terminal),
they stop and the scratch folder with its copy of the data is removed.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from importlib import resources
from pathlib import Path
from typing import TextIO

import msgspec
import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError
from traitlets.config import Config

from dpmagic.commands.supervisor import Stopped, Supervisor
from dpmagic.examples.clinic import generate, write_policy
from dpmagic.protocol import Budgets

GATE_START_TIMEOUT_S = 120.0
GATE_STOP_TIMEOUT_S = 15.0
CELL_TIMEOUT_S = 300
NOTEBOOK = "quickstart.ipynb"
PLOT = "%dpplot"  # the demo does not run plot cells (``_run_cells``)
# Unix socket paths are limited to about 108 bytes by the kernel.
_MAX_SOCKET_PATH = 100
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


class GateStartError(RuntimeError):
    """The gate process did not come up; the message carries its stderr."""


class GateProcess:
    """A gate running as a child process, as it would run under a service manager.

    The gate announces its address on stdout once it is ready; until then
    nothing may connect. Its stderr goes to a log file so a failure can be
    shown whole without risk of the pipe filling up while it runs.
    """

    def __init__(
        self,
        policy: Path,
        socket: Path,
        log: Path,
        spawn: Callable[..., subprocess.Popen[str]] = subprocess.Popen,
    ) -> None:
        self.policy = policy
        self._spawn = spawn
        self.socket = socket
        self.log = log
        self.address = f"unix:{socket}"
        self._proc: subprocess.Popen[str] | None = None
        self._lines: queue.Queue[str | None] = queue.Queue()

    def start(self, timeout: float = GATE_START_TIMEOUT_S) -> None:
        cmd = [
            sys.executable, "-m", "dpmagic", "serve",
            "--policy", str(self.policy), "--listen", self.address,
        ]  # fmt: skip
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        with self.log.open("w") as err:
            self._proc = self._spawn(
                cmd,
                stdout=subprocess.PIPE,
                stderr=err,
                stdin=subprocess.DEVNULL,
                text=True,
                env=env,
            )
        threading.Thread(target=self._read, daemon=True).start()
        try:
            line = self._lines.get(timeout=timeout)
            while line is not None and "listening" not in line:
                line = self._lines.get(timeout=timeout)
        except queue.Empty:
            self.stop()
            raise GateStartError(self._failure(f"did not start within {timeout:.0f}s")) from None
        if line is None:
            self.stop()
            raise GateStartError(self._failure("exited before listening"))

    def stop(self) -> int:
        """SIGTERM, then wait; a gate that hangs is killed. Returns its exit code."""
        proc = self._proc
        if proc is None:
            return 0
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(GATE_STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        return proc.returncode

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            self._lines.put(line)
        self._lines.put(None)

    def _failure(self, what: str) -> str:
        stderr = self.log.read_text(errors="replace").strip() if self.log.exists() else ""
        return f"the gate {what}" + (f"; its stderr:\n{stderr}" if stderr else "")

    def __enter__(self) -> GateProcess:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def prepare_example(workdir: Path, patients: int) -> Path:
    """Generate the clinic data and its policy in ``workdir``; returns the policy.

    The policy's relative paths (data, ``state_dir``) resolve against its own
    folder, so the gate's ledger stays inside ``workdir`` too.
    """
    generate(workdir, patients=patients)
    return write_policy(workdir)


def example_file(name: str) -> Path:
    """A file shipped in ``dpmagic.examples`` (a real path: the package is not zipped)."""
    return Path(str(resources.files("dpmagic.examples") / name))


def socket_path(workdir: Path, stack: contextlib.ExitStack) -> Path:
    """``workdir/gate.sock``, or in a short temporary folder when that path is too long."""
    return short_folder(workdir, stack) / "gate.sock"


def short_folder(workdir: Path, stack: contextlib.ExitStack) -> Path:
    """``workdir``, or a temporary folder removed with ``stack`` when unix socket
    paths under ``workdir`` could be too long."""
    if len(str(workdir)) <= _MAX_SOCKET_PATH - 20:
        return workdir
    return Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dpmagic-")))


def start_gate(
    policy: Path,
    workdir: Path,
    stack: contextlib.ExitStack,
    out: TextIO,
    supervisor: Supervisor,
) -> GateProcess | None:
    """A gate in the supervisor's group, stopped when ``stack`` closes; None
    (reported) if it won't start."""
    sock = socket_path(workdir, stack)
    gate = GateProcess(policy, sock, workdir / "gate.log", spawn=supervisor.popen)
    try:
        gate.start()
    except GateStartError as exc:
        print(f"dpmagic: error: {exc}", file=out)
        return None
    stack.callback(gate.stop)
    print(f"gate listening on {gate.address} (a separate process)", file=out)
    return gate


def run_notebook(path: Path, env: dict[str, str], out: TextIO, sockets: Path) -> bool:
    """Execute the notebook cell by cell, printing its explanations, each code
    cell and its output, noisy answers with their intervals.

    The kernel talks to us over unix sockets under ``sockets`` (IPC transport):
    no TCP port on the host for another local user to try, and no ipykernel
    warning about unencrypted TCP. The executed notebook is written back to ``path``.
    Returns False (after printing the error) if a cell fails.
    """
    nb = nbformat.read(path, as_version=4)
    config = Config()
    config.KernelManager.transport = "ipc"
    config.KernelManager.ip = str(sockets / "kernel")
    config.KernelManager.connection_file = str(sockets / "kernel.json")
    client = NotebookClient(
        nb,
        kernel_name="python3",
        timeout=CELL_TIMEOUT_S,
        resources={"metadata": {"path": str(path.parent)}},
        config=config,
    )
    with client.setup_kernel(env=env):
        try:
            ok = _run_cells(client, nb, out)
        except Stopped:
            # Stopping anyway: no polite shutdown request racing the running
            # cell (the kernel would print a traceback as its sockets close).
            client.shutdown_kernel = "immediate"
            raise
    nbformat.write(nb, path)
    return ok


def _run_cells(client: NotebookClient, nb: nbformat.NotebookNode, out: TextIO) -> bool:
    """Each cell in turn; False (with the error printed) at the first that fails."""
    code = [i for i, cell in enumerate(nb.cells) if cell.cell_type == "code"]
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "markdown":
            print(f"\n{cell.source.strip()}", file=out)
            continue
        if cell.cell_type != "code":
            continue
        if cell.source.lstrip().startswith(PLOT):
            # A terminal shows no figure, and without matplotlib (not a dependency of
            # the plain install the demo runs on) the cell would only say to install it.
            print(f"\nskipping cell {code.index(index) + 1}/{len(code)}: a plot, for a "
                  "notebook's front end (JupyterLab), not a terminal", file=out)  # fmt: skip
            print(_indent(cell.source, "  >>> "), file=out)
            continue
        print(f"\nrunning cell {code.index(index) + 1}/{len(code)} …", file=out)
        print(_indent(cell.source, "  >>> "), file=out)
        try:
            client.execute_cell(cell, index)
        except (CellExecutionError, CellTimeoutError, DeadKernelError) as exc:
            print(_indent(_ANSI.sub("", str(exc)).strip(), "  ! "), file=out)
            return False
        for text in _texts(cell.outputs):
            print(_indent(text.rstrip(), "    "), file=out)
        out.flush()
    return True


def run_demo(keep: Path | None = None, patients: int = 5000, out: TextIO = sys.stdout) -> int:
    """The ``dpmagic demo`` command; returns the exit code.

    A stop signal raises :class:`~dpmagic.commands.supervisor.Stopped` out of here after
    the kernel and the gate have stopped and the scratch folder is gone.
    """
    with Supervisor() as supervisor, contextlib.ExitStack() as stack:
        if keep is None:
            workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="dpmagic-demo-")))
        else:
            workdir = keep.resolve()
            workdir.mkdir(parents=True, exist_ok=True)
        # Registered after the folder, so it runs first: children stop before
        # the folder they work in is removed.
        stack.callback(supervisor.stop)
        print(f"generating the clinic example ({patients} patients) in {workdir}", file=out)
        policy = prepare_example(workdir, patients)
        notebook = workdir / NOTEBOOK
        shutil.copyfile(example_file(NOTEBOOK), notebook)
        gate = start_gate(policy, workdir, stack, out, supervisor)
        if gate is None:
            return 1
        env = {**os.environ, "DPMAGIC_GATE": gate.address, "JPY_SESSION_NAME": NOTEBOOK}
        sockets = short_folder(workdir, stack)
        if not run_notebook(notebook, env, out, sockets):
            print("\nthe demo failed: a cell raised an error (above)", file=out)
            return 1
        print(f"\n{_budget_line(gate.address)}", file=out)
        code = gate.stop()
        if code != 0:
            print(f"dpmagic: error: the gate exited with status {code}", file=out)
            return 1
        print("gate stopped", file=out)
        if keep is not None:
            print(f"kept the data, policy, ledger and executed notebook in {workdir}", file=out)
        return 0


def _budget_line(address: str) -> str:
    from dpmagic.client.http_gate import Gate

    budget = msgspec.convert(Gate(address).budget(notebook=NOTEBOOK), Budgets)
    parts = []
    for view, who in ((budget.notebook, "this notebook"), (budget.user, "you overall")):
        if view is not None:
            parts.append(f"{who} ε {view.remaining.epsilon:g} of {view.limit.epsilon:g}")
    return "budget left: " + "; ".join(parts)


def _texts(outputs: list) -> Iterator[str]:
    for output in outputs:
        kind = output.get("output_type")
        if kind == "stream":
            yield output.get("text", "")
        elif kind in ("execute_result", "display_data"):
            data = output.get("data", {})
            # An answer's plain text carries each noisy value's interval and flags the
            # cells where noise dominates, so a noisy -53 is read as noise.
            text = data.get("text/plain")
            if text:
                yield text
        elif kind == "error":
            # A magic's refusal or misuse (a UsageError) is its one line, as the notebook
            # shows it; any other error keeps its class's name.
            name, value = output.get("ename"), output.get("evalue")
            yield str(value) if name == "UsageError" else f"{name}: {value}"


def _indent(text: str, prefix: str) -> str:
    return "\n".join(prefix + line for line in text.splitlines())
