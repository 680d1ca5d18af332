"""The gated kernel: ipykernel with the dpmagic magics already loaded.

Students and researchers pick "Python 3 (dpmagic)" and write ``%%dpsql``
cells without a ``%load_ext`` line. It is an ordinary IPython kernel in every
other way; it holds no data and no gate code, only the client.

``python -m dpmagic.kernel -f CONNECTION_FILE`` starts it; :func:`install`
writes its kernelspec.
"""

from __future__ import annotations

import json
import sys
import tempfile
from importlib.resources import files
from pathlib import Path

RESOURCES = "dpmagic.kernelspec"
LOGOS = ("logo-32x32.png", "logo-64x64.png")


def kernel_json(gate: str | None = None) -> dict[str, object]:
    """The kernelspec for this Python, from the template shipped in ``kernel/``."""
    spec = json.loads(files(RESOURCES).joinpath("kernel.json").read_text())
    spec["argv"] = [sys.executable, "-m", "dpmagic.kernel", "-f", "{connection_file}"]
    if gate:
        spec["env"] = {"DPMAGIC_GATE": gate}
    return spec


def install(
    user: bool = True,
    sys_prefix: bool = False,
    prefix: str | None = None,
    name: str = "dpmagic",
    gate: str | None = None,
) -> str:
    """Install the kernelspec and return the directory it was written to.

    ``prefix`` (or ``sys_prefix``, this environment's prefix) wins over
    ``user``; ``gate`` bakes ``DPMAGIC_GATE`` into the kernel's environment.
    """
    from jupyter_client.kernelspec import KernelSpecManager

    if sys_prefix:
        prefix = sys.prefix
    with tempfile.TemporaryDirectory() as tmp:
        source = write_spec(Path(tmp) / name, gate)
        return KernelSpecManager().install_kernel_spec(
            str(source), kernel_name=name, user=user and prefix is None, prefix=prefix
        )


def write_spec(folder: Path, gate: str | None = None) -> Path:
    """The kernelspec's files (``kernel.json`` and the logos) written to ``folder``, made
    if missing, as Jupyter finds them in ``…/share/jupyter/kernels/NAME``; returns it.
    Unlike ``install`` it asks nothing of Jupyter's paths (which would create an IPython
    folder in the home folder)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "kernel.json").write_text(json.dumps(kernel_json(gate), indent=2) + "\n")
    for logo in LOGOS:
        (folder / logo).write_bytes(files(RESOURCES).joinpath(logo).read_bytes())
    return folder


AUTOLOAD_BEGIN = "# >>> dpmagic autoload >>>"
AUTOLOAD_END = "# <<< dpmagic autoload <<<"
KERNEL_CONFIG = "ipython_kernel_config.py"


def install_autoload(
    sys_prefix: bool = False, prefix: str | None = None, gate: str | None = None
) -> Path:
    """Make every IPython kernel of this environment (or user) load dpmagic.

    Graders run notebooks under a plain ``python3`` kernel, which reads
    ``ipython_kernel_config.py`` from ``PREFIX/etc/ipython`` (``--sys-prefix``
    or ``--prefix``) or from the user's IPython profile. Our lines sit between
    markers, so installing again replaces them and leaves the rest alone.
    """
    if sys_prefix:
        prefix = sys.prefix
    if prefix is not None:
        folder = Path(prefix) / "etc" / "ipython"
    else:
        from IPython.paths import get_ipython_dir

        folder = Path(get_ipython_dir()) / "profile_default"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / KERNEL_CONFIG
    block = [AUTOLOAD_BEGIN, 'c.InteractiveShellApp.extensions.append("dpmagic")']
    if gate:
        block.append(f"c.DpSql.gate = {gate!r}")
    block.append(AUTOLOAD_END)
    kept = _without_block(path.read_text() if path.exists() else "")
    if kept and not kept.endswith("\n"):
        kept += "\n"
    path.write_text(kept + "\n".join(block) + "\n")
    return path


def _without_block(text: str) -> str:
    lines = text.splitlines(keepends=True)
    if AUTOLOAD_BEGIN + "\n" not in lines:
        return text
    start = lines.index(AUTOLOAD_BEGIN + "\n")
    end = lines.index(AUTOLOAD_END + "\n", start)
    return "".join(lines[:start] + lines[end + 1 :])


def main(argv: list[str] | None = None) -> None:
    """Start the kernel with the extension loaded, passing other options through.

    A notebook written for any Python kernel starts with ``%load_ext dpmagic`` (the
    quickstart does); on this kernel IPython would answer it with "The dpmagic extension
    is already loaded. To reload it, use: %reload_ext dpmagic". So the extension is not
    left marked loaded: such a cell loads it again, silently, as on a plain kernel."""
    from ipykernel.kernelapp import IPKernelApp

    args = list(sys.argv[1:] if argv is None else argv)
    app = IPKernelApp.instance()
    app.initialize([*args, "--IPKernelApp.extra_extensions=dpmagic"])
    assert app.shell is not None, "initialize() makes the kernel's shell"
    app.shell.extension_manager.loaded.discard("dpmagic")
    app.start()


if __name__ == "__main__":
    main()
