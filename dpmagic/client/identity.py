"""Which notebook a kernel runs: a sub-budget key the user reads in footers and errors.

It is what the kernel claims, never an identity (the gate knows the user;
the notebook only splits the user's budget). It should still read well and
stay the same across runs of the same notebook:

- in a Jupyter server, the notebook's path relative to the server's root
  (``course/hw1.ipynb``): the server gives the kernel the absolute path in
  ``JPY_SESSION_NAME``, and its root in the runtime file
  ``jpserver-<pid>.json`` of the server that started the kernel (our parent);
- under ``jupyter execute`` / nbclient, nbconvert or papermill, which give the
  kernel no name, the input ``.ipynb`` file on the parent process's command line,
  as it was given (not the value of ``--output``);
- in VS Code, the notebook file it names in ``__vsc_ipynb_file__``;
- elsewhere (plain IPython, a console), ``ipython:`` and the folder it runs in.

A renamed or moved notebook is a new notebook to the gate: see docs/user-guide.md,
"Which notebook is charged".
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def notebook_name(user_ns: dict[str, Any]) -> str:
    """This kernel's notebook, as short as it can be while staying the same across runs."""
    session = os.environ.get("JPY_SESSION_NAME") or str(user_ns.get("__session__") or "")
    if session:
        return _relative_to_server_root(session)
    executed = _notebook_on_parent_command_line()
    if executed:
        return executed
    vscode = user_ns.get("__vsc_ipynb_file__")
    if isinstance(vscode, str) and vscode:
        return _short(Path(vscode))
    return f"ipython:{_short(Path.cwd())}"


def _relative_to_server_root(path: str) -> str:
    if not os.path.isabs(path):
        return path
    root = _server_root(os.getppid())
    if root is not None:
        try:
            relative = Path(path).resolve().relative_to(Path(root).resolve())
        except ValueError:
            pass
        else:
            return relative.as_posix()
    return _short(Path(path))


def _server_root(pid: int) -> str | None:
    """The root folder of the Jupyter server with process id ``pid``, from its runtime file."""
    try:
        from jupyter_core.paths import jupyter_runtime_dir
    except ImportError:
        return None
    runtime = Path(jupyter_runtime_dir())
    for name in (f"jpserver-{pid}.json", f"nbserver-{pid}.json"):
        try:
            info = json.loads((runtime / name).read_text())
        except (OSError, ValueError):
            continue
        root = info.get("root_dir") or info.get("notebook_dir")
        if isinstance(root, str) and root:
            return root
    return None


def _notebook_on_parent_command_line() -> str | None:
    """``hw1.ipynb`` when ``jupyter execute hw1.ipynb`` (or nbconvert, papermill) started
    this kernel: the parent's input notebook (Linux's ``/proc`` only)."""
    try:
        raw = Path(f"/proc/{os.getppid()}/cmdline").read_bytes()
    except OSError:
        return None
    return input_notebook(raw.decode(errors="replace").split("\0"))


# Options whose value names where a tool writes, not what it runs: ``jupyter execute
# --output out.ipynb in.ipynb``, ``jupyter nbconvert --execute in.ipynb --output
# out.ipynb``, their traitlets forms (``--NbClientApp.output_base``), an output folder.
OUTPUT_OPTIONS = ("output", "output_base", "output-dir", "output_dir", "build_directory")


def input_notebook(args: list[str]) -> str | None:
    """The first ``.ipynb`` argument that is neither an option (``--output=out.ipynb``)
    nor the value of an output option given apart (``--output out.ipynb``): the
    notebook ``jupyter execute``, nbconvert or papermill (``in.ipynb out.ipynb``) runs."""
    previous = ""
    for arg in args:
        option = previous.startswith("-") and "=" not in previous
        writes = option and previous.lstrip("-").lower().endswith(OUTPUT_OPTIONS)
        if arg.endswith(".ipynb") and not arg.startswith("-") and not writes:
            return arg
        previous = arg
    return None


def _short(path: Path) -> str:
    """``~/…`` under the home folder; the path itself elsewhere."""
    try:
        return "~/" + path.relative_to(Path.home()).as_posix()
    except ValueError:
        return path.as_posix()
