"""The privacy budget as the gate states it, for the JupyterLab status bar.

The browser cannot reach the gate: only the kernel can, through the magics'
settings (``%config DpSql.gate``, ``%dpconnect``, ``$DPMAGIC_GATE``). The
extension therefore asks the kernel, with a silent execute request that runs
no code and evaluates one user expression::

    __import__('dpmagic.budget_status').budget_status.status()

(``silent: true, store_history: false``: no execution count, no history, no
output in the notebook; the value comes back in the ``execute_reply`` alone).
The value is a :class:`BudgetStatus`, whose MIME bundle carries the gate's
``GET /v1/budget`` replies untouched under :data:`MIME_TYPE`, as JSON. It
charges nothing, prints nothing, and stores nothing in the notebook's
namespace; in a kernel without the magics it asks no gate and says so.
"""

from __future__ import annotations

import json
from typing import Any

MIME_TYPE = "application/vnd.dpmagic.budget+json"
"""The MIME type of the status, a JSON object (see :func:`status`)."""
TIMEOUT_S = 5.0
"""How long a status waits for the gate: the kernel is held while it does."""
MAX_DATASETS = 20
"""At most this many datasets' budgets in one status (when none is chosen)."""


class BudgetStatus:
    """A status: ``payload`` is what the extension reads (``MIME_TYPE``)."""

    def __init__(self, payload: dict[str, Any]) -> None:
        self.payload = payload

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> dict[str, Any]:
        return {MIME_TYPE: self.payload, "text/plain": self._text()}

    def __repr__(self) -> str:
        return self._text()

    def _text(self) -> str:
        state = self.payload.get("state")
        if state != "ok":
            detail = self.payload.get("message") or ""
            return f"dpmagic budget status: {state}" + (f" ({detail})" if detail else "")
        return "dpmagic budget status: " + json.dumps(self.payload["budgets"])


def status(shell: Any = None) -> BudgetStatus:
    """What the gate says this notebook and its user have spent and have left.

    ``payload["state"]`` is one of:

    - ``"ok"``: ``notebook`` (the name the magics charge), ``datasets`` (all the
      gate serves) and ``budgets``, the gate's ``GET /v1/budget`` replies
      (``{"dataset", "user": {"spent", "limit", "remaining"}, "notebook": {…}}``):
      one for the dataset the magics use (``DpSql.dataset``), else for the one
      this notebook queried last, else for the gate's only one, else for each;
    - ``"error"``: the gate could not be asked; ``kind`` (as in
      :mod:`dpmagic.client.errors`: ``unavailable``, ``auth``, ``busy``, …) and ``message``;
    - ``"not_loaded"``: the dpmagic magics are not loaded in this kernel.
    """
    if shell is None:
        from IPython import get_ipython

        shell = get_ipython()
    manager = getattr(shell, "magics_manager", None)
    magics = manager.registry.get("DpSql") if manager is not None else None
    if magics is None:
        return BudgetStatus({"state": "not_loaded"})
    notebook = magics.notebook
    try:
        from dpmagic.client.http_gate import connect

        client = connect(magics.gate, magics.token, timeout=TIMEOUT_S)
        datasets, names = _datasets(client, magics.dataset, notebook)
        budgets = [client.budget(name, notebook) for name in names]
    except Exception as exc:  # every failure is a status, never a traceback
        from dpmagic.client.errors import DPError

        kind = exc.kind if isinstance(exc, DPError) else "failed"
        message = " ".join(str(exc).split()) or type(exc).__name__
        return BudgetStatus(
            {"state": "error", "kind": kind, "message": message, "notebook": notebook}
        )
    return BudgetStatus(
        {"state": "ok", "notebook": notebook, "datasets": datasets, "budgets": budgets}
    )


def _datasets(client: Any, chosen: str | None, notebook: str) -> tuple[list[str], list[Any]]:
    """All the gate's datasets, and those whose budget the status shows."""
    history = client.history(None, notebook, limit=1)
    served = [str(name) for name in history.get("datasets") or []]
    if chosen:
        return served, [chosen]
    entries = history.get("entries") or []
    if entries and entries[-1].get("dataset"):
        return served, [entries[-1]["dataset"]]
    if len(served) <= 1:
        return served, [served[0] if served else None]
    return served, served[:MAX_DATASETS]
