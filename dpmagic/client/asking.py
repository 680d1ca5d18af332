"""``query(...)``, the one signature a notebook asks with, for the gate's client and
the transcript's stand-in alike.

Both ``http_gate.Gate`` and ``transcript.TranscriptGate`` take the same keyword
arguments and differ only in where the answer comes from, so the arguments are
spelled once, here, and become the wire's `protocol.Ask`; each subclass answers
it (``_answer``). A mock run never leaves the kernel: it is answered here from the
public schema either subclass gives.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from dpmagic.client.mock import mock_query
from dpmagic.display.result import DPResult
from dpmagic.protocol import Ask


class Asking(ABC):
    """What answers a notebook's query: a gate, or a transcript of one."""

    def query(
        self,
        sql: str,
        *,
        epsilon: float | None = None,
        delta: float | None = None,
        dataset: str | None = None,
        notebook: str | None = None,
        dry_run: bool = False,
        fresh: bool = False,
        params: dict[str, Any] | None = None,
        accuracy: float | None = None,
        alpha: float | None = None,
        mock: bool = False,
        mock_rows: int | None = None,
        bounding_report: float | None = None,
        max_partitions: int | None = None,
        max_rows_per_partition: int | None = None,
        clip: float | None = None,
    ) -> DPResult:
        """Run ``sql`` through the gate; the reply's cost is already charged.

        ``accuracy=A`` (with ``alpha``, default 0.05) asks instead of an ε for the
        least cost at which every noisy cell's (1 - alpha) interval is ±A.
        ``bounding_report=S`` spends the share ``S`` of the query's ε on a noisy
        count of the rows the contribution bounds left out (``DPResult.envelope.bounding``).
        ``max_partitions`` and ``max_rows_per_partition`` tighten the policy's
        contribution bounds for this query (never loosen them): less noise at the same ε,
        more of each unit's rows left out. ``clip=S`` spends the share ``S`` of the ε
        choosing the bounds of the summed values privately, the rest answering within
        them (``DPResult.reply["clip"]`` says which).
        ``mock=True`` instead answers on fake tables drawn from the public schema,
        in this process (``mock_rows`` privacy units, default 1000): only the
        schema is fetched, the query never reaches the gate, nothing is charged.
        """
        if mock:
            return mock_query(sql, self.schema(dataset), params, mock_rows)
        ask = Ask(
            sql=sql, epsilon=epsilon, delta=delta, dataset=dataset, notebook=notebook,
            dry_run=dry_run, fresh=fresh, params=params, accuracy=accuracy, alpha=alpha,
            bounding_report=bounding_report, max_partitions=max_partitions,
            max_rows_per_partition=max_rows_per_partition, clip=clip,
        )  # fmt: skip
        return self._answer(ask)

    @abstractmethod
    def schema(self, dataset: str | None = None) -> dict[str, Any]:
        """The dataset's public schema (a mock run draws its tables from it)."""

    @abstractmethod
    def _answer(self, ask: Ask) -> DPResult:
        """The answer to ``ask``: from the gate, or from what a transcript holds."""
