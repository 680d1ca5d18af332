"""The kernel's way to the gate: the HTTP client (``http_gate``), the one signature
every query is asked with (``asking``), its offline stand-ins (``mock`` on the public
schema, ``transcript`` replaying a signed transcript), the errors a reply becomes, and
what the kernel tells the gate about itself (``identity``, ``settings``).

Above the display (an answer comes back as a ``display.result.DPResult``) and the
shared wire; it never imports the magics, the commands or the gate.
"""

from typing import Any

__all__ = ["Gate"]


def __getattr__(name: str) -> Any:
    """``from dpmagic.client import Gate``, as before the layers, imported on first use:
    the package is imported by ``dpmagic`` itself (its errors), and the gate process
    imports ``dpmagic`` without the client's pandas and HTTP stack."""
    if name == "Gate":
        from dpmagic.client.http_gate import Gate

        return Gate
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
