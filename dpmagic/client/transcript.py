"""Answering from a transcript instead of a gate: autograding without network.

``dpmagic transcript export`` writes what a user was released in a notebook.
Pointed at that file (``DPMAGIC_TRANSCRIPT=path`` or ``%dpconnect
transcript:path``), the magics answer each query with its stored answer,
exactly as the gate would replay it, and refuse any query that is not in the
file: a replay can never produce an answer that was not released.

This runs in the untrusted kernel: it reads a file of already-released
answers and imports nothing from ``dpmagic.gate``. Whether the file is
genuine is checked where the signing key is, with ``dpmagic transcript verify``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec
from msgspec.structs import replace

from dpmagic.client.asking import Asking
from dpmagic.client.errors import DPError, QueryRefused
from dpmagic.display.cells import ALPHA
from dpmagic.display.result import DPResult
from dpmagic.protocol import (
    FREE,
    Accuracy,
    Ask,
    Asked,
    Budgets,
    Cost,
    QueryReply,
    default_delta,
    reply_of,
)

FORMAT = "dpmagic-transcript/1"
SCHEME = "transcript:"


class TranscriptGate(Asking):
    """A stand-in for :class:`dpmagic.client.http_gate.Gate` that only replays a transcript."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.address = SCHEME + str(path)
        try:
            document = json.loads(self.path.read_text())
        except OSError as exc:
            raise DPError(f"cannot read the transcript {path}: {exc.strerror}") from None
        except ValueError:
            raise DPError(f"the transcript {path} is not JSON") from None
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            raise DPError(f"{path} is not a {FORMAT} file")
        self.notebook: str = document["notebook"]
        self.default_dataset: str | None = document.get("default_dataset")
        self.datasets: dict[str, dict[str, Any]] = document["datasets"]
        self._answers = {_key(a["request"]): a["reply"] for a in document["answers"]}
        self._history: list[dict[str, Any]] = document.get("history", [])

    def __repr__(self) -> str:
        return f"TranscriptGate({str(self.path)!r})"

    def _answer(self, ask: Ask) -> DPResult:
        """The stored answer to this exact request, marked replayed; ``fresh``
        cannot spend anything here, so it replays too. A dry run of a query the
        transcript does not hold says that its plan is not available offline
        instead of failing."""
        name = self._dataset(ask.dataset)
        facts = self.datasets[name]
        default = facts["query_default"]
        epsilon = ask.epsilon if ask.epsilon is not None else default["epsilon"]
        if ask.delta is not None:
            delta = ask.delta
        else:
            zcdp = facts.get("accountant") == "zcdp"
            notebook_delta = facts["notebook_budget"]["delta"]
            delta = default_delta(default.get("delta", 0.0), zcdp, notebook_delta)
        asked = Asked(
            sql=ask.sql,
            params=ask.params or {},
            epsilon=float(epsilon),
            delta=float(delta),
            accuracy=None if ask.accuracy is None else float(ask.accuracy),
            alpha=None if ask.accuracy is None else float(ask.alpha or ALPHA),
            bounding_report=None if ask.bounding_report is None else float(ask.bounding_report),
            max_partitions=ask.max_partitions,
            max_rows_per_partition=ask.max_rows_per_partition,
            clip=None if ask.clip is None else float(ask.clip),
        )
        stored = self._answers.get(_key({**asked.json(), "dataset": name}))
        budget = msgspec.convert(self.datasets[name]["budget"], Budgets)
        if stored is None and ask.dry_run:
            cost = Cost(epsilon=float(epsilon), delta=float(delta))
            offline = QueryReply(dataset=name, dry_run=True, offline=True, cost=cost, budget=budget)
            return DPResult(offline)
        if stored is None:
            raise QueryRefused(
                f"this query is not in the transcript {self.path.name}: "
                "only answers released to the notebook's author can be replayed"
            )
        reply = replace(reply_of(stored, migrate=True), budget=budget)
        if ask.dry_run:
            accuracy = Accuracy(alpha=ALPHA, columns=[])
            reply = replace(reply, rows=[], accuracy=accuracy, dry_run=True)
        else:
            reply = replace(reply, replayed=True, cost=FREE)
        return DPResult(reply)

    def budget(
        self,
        dataset: str | None = None,
        notebook: str | None = None,
        *,
        preview: bool = False,
        accuracy: float | None = None,
        rows: int | None = None,
    ) -> dict[str, Any]:
        """The budget as it stood when the transcript was exported. Never a preview:
        only the gate can plan one, and there is none to ask offline."""
        name = self._dataset(dataset)
        return {"dataset": name, **self.datasets[name]["budget"]}

    def history(
        self, dataset: str | None = None, notebook: str | None = None, limit: int | None = None
    ) -> dict[str, Any]:
        """The notebook's queries as they stood when the transcript was exported."""
        names = [self._dataset(dataset)] if dataset else sorted(self.datasets)
        entries = [e for e in self._history if e.get("dataset") in names]
        if limit is not None:
            entries = entries[-limit:]
        return {"datasets": names, "notebook": self.notebook, "entries": entries}

    def abort(self) -> None:
        """Nothing is ever in flight: answers come from the file."""

    def schema(self, dataset: str | None = None) -> dict[str, Any]:
        """The public schema the gate served, kept in the transcript."""
        info = dict(self.datasets[self._dataset(dataset)])
        info.pop("budget", None)
        return info

    def health(self) -> bool:
        return True

    def _dataset(self, name: str | None) -> str:
        name = name or self.default_dataset
        if name is None:
            raise DPError(f"name a dataset; the transcript has {sorted(self.datasets)}")
        if name not in self.datasets:
            raise QueryRefused(f"the transcript has no answers about dataset {name!r}")
        return name


def _key(request: dict[str, Any]) -> str:
    """Requests are matched exactly; only the SQL's surrounding blank space is ignored."""
    return json.dumps({**request, "sql": str(request["sql"]).strip()}, sort_keys=True)
