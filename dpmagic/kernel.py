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
        source = Path(tmp) / name
        source.mkdir()
        (source / "kernel.json").write_text(json.dumps(kernel_json(gate), indent=2) + "\n")
        for logo in LOGOS:
            (source / logo).write_bytes(files(RESOURCES).joinpath(logo).read_bytes())
        return KernelSpecManager().install_kernel_spec(
            str(source), kernel_name=name, user=user and prefix is None, prefix=prefix
        )


def main(argv: list[str] | None = None) -> None:
    """Start the kernel with the extension loaded, passing other options through."""
    from ipykernel.kernelapp import IPKernelApp

    args = list(sys.argv[1:] if argv is None else argv)
    IPKernelApp.launch_instance(argv=[*args, "--IPKernelApp.extra_extensions=dpmagic"])


if __name__ == "__main__":
    main()
