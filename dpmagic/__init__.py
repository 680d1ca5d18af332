"""dpmagic: differentially private SQL cells for Jupyter.

``%load_ext dpmagic`` registers the ``%%dpsql`` magics; the trusted gate lives
in :mod:`dpmagic.gate` and is never imported by the kernel.
"""

from dpmagic.client.errors import (
    AuthError,
    BudgetExhausted,
    DPError,
    GateBusy,
    GateUnavailable,
    QueryRefused,
)

__all__ = [
    "AuthError",
    "BudgetExhausted",
    "DPError",
    "GateBusy",
    "GateUnavailable",
    "QueryRefused",
    "load_ipython_extension",
]
__version__ = "0.1.0"


def load_ipython_extension(ipython) -> None:
    from dpmagic.magics.dpsql import register

    register(ipython)
