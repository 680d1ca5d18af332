"""The kernel's way to the gate: the HTTP client (``http_gate``), the one signature
every query is asked with (``asking``), its offline stand-ins (``mock`` on the public
schema, ``transcript`` replaying a signed transcript), the errors a reply becomes, and
what the kernel tells the gate about itself (``identity``, ``settings``).

Above the display (an answer comes back as a ``display.result.DPResult``) and the
shared wire; it never imports the magics, the commands or the gate.
"""

from dpmagic.client.http_gate import Gate

__all__ = ["Gate"]  # ``from dpmagic.client import Gate``, as before the layers
