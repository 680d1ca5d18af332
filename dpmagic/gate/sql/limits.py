"""Bounds on the analysis itself: how large the query may grow, and how long it may take.

The analysis (``pipeline.analyse`` and ``pipeline.generate``) runs before the
debit, so whatever it costs the gate, it costs the caller nothing; unbounded, it
is a denial of service. ``resolve`` inlines CTEs and derived tables, and a chain
of CTEs each of which reads the one before twice (``c1 AS (SELECT pid, s || s AS
s FROM c0)``, ``c2 AS (… FROM c1)``, …) doubles the inlined query at each level:
12 levels (673 characters of text) became 20,484 nodes, 78,000 characters of
generated SQL and 0.95 s of analysis, each level doubling the time (14 levels:
4.4 s); 30 levels would have taken days and more memory than the machine has.
Three bounds, each a refusal (free, like every refusal before the debit):

- ``MAX_EXPANDED_NODES``: the nodes ``resolve`` builds while it inlines, counted
  *before* each copy is made (``Expansion``), so a query is refused as soon as
  its inlined form would pass the cap, never after building it (30 levels: 0.03 s);
- ``MAX_GENERATED_CHARS``: the SQL the rewrite renders, checked before DuckDB
  parses it (``pipeline.generate``);
- ``ANALYSIS_SECONDS``: a deadline on the analysis's CPU time (``deadline``),
  full passes of the garbage collector left out.

Why a cooperative deadline is enough. The deadline is checked between passes and,
while ``resolve`` expands, every ``CHECK_EVERY`` nodes; it cannot stop a pass in
the middle. It bounds the analysis because every pass's work between two checks is
bounded by the caps: ``parse`` by the text's ``MAX_SQL_CHARS``; ``resolve`` by
``MAX_EXPANDED_NODES`` (and it checks inside); ``check``, ``bound``, ``plan`` and
``rewrite`` work on the resolved tree, at most ``MAX_EXPANDED_NODES`` nodes, and on
at most one part per aggregate of the text; ``vet`` on at most
``MAX_GENERATED_CHARS`` characters. Measured here (2 shared cores): a tree at the
node cap takes 0.9 s through every pass, the longest 0.6 s (``rewrite``), and DuckDB
vets 100,000 characters in 0.3 s; so an analysis ends within ``ANALYSIS_SECONDS``
plus one such pass. The longest single pass the caps allow is the ``rewrite`` of a
text of hundreds of aggregates near the text cap (700 quantiles in 17,000
characters: 3.4 s, its 685,000 characters of SQL then refused before DuckDB reads
them, where DuckDB would have taken seconds more). Each analysis runs in the
server's engine threads, never on its event loop, and the clock is the analysing
thread's own CPU time: other users' load cannot bring a query's deadline closer,
and one query cannot hold the CPU for longer than the bound.

The clock leaves out the garbage collector's full passes (generation 2). Python
runs one in whichever thread's allocation happens to trigger it, and it walks the
whole heap: every user's cached analyses, the policy, the libraries. Its length
is the process's, not the query's, and a fuzzing run through 2,900 queries saw
one land inside an analysis of 8 ms and take it past 2 s (passes of 0.2 to 0.7 s
are common on a heap of half a million objects). A refusal must follow from the
query and the policy, never from what else the process holds. The younger
generations' passes stay on the clock: their work is the objects the analysis
itself just made. Nor can a query hide its own work in full passes: Python runs
one only once the objects that outlived the younger passes have grown by a
quarter since the last, so an analysis bounded in size triggers a few at most.
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from sqlglot import exp

from dpmagic.gate.failures import Refused

MAX_EXPANDED_NODES = 20_000
"""Nodes ``resolve`` may build while inlining CTEs and subqueries into one SELECT: its
copies of the text's expressions and of every definition a column reference
inlines, semi-joins included (a chain of CTEs builds about three times the nodes
of the tree it ends with). The largest over the repository's query corpora (the
golden cases, ``../shared/corpus``, every query the engine and pass tests send,
and 440 from the fuzzer's grammar, ``tests/sql_grammar.py``) is 127, and 99 for a
query with a CTE or a subquery; the cap is 157 times that. Texts without CTEs stay
under it up to ``MAX_SQL_CHARS`` but for the densest (19,000 characters of
column sums build 18,600; a 19,000-character ``IN`` list 4,000). It also keeps the
later passes short, which the cooperative deadline relies on: a tree of 20,000
nodes takes 0.9 s through all of them here."""

MAX_GENERATED_CHARS = 100_000
"""Characters of SQL the rewrite may generate for one query (its main query, and its
bounding report's), checked before DuckDB parses it in ``vet``. The largest over
the corpora is 3,228; the cap is 31 times that. A tree at ``MAX_EXPANDED_NODES``
generates about 80,000; 100 medians generate 96,000, 100 averages with 100
variances 112,000 (refused). DuckDB's time to vet grows faster than the text: 0.3 s
for 96,000 characters of medians, 2.0 s for 194,000 and 5.1 s for 390,000."""

ANALYSIS_SECONDS = 2.0
"""CPU seconds the analysis of one query may take, every pass up to and including
``vet``. Over the corpora's 2,000 analyses through an engine (wall time, which is
at least the CPU time), the median is 2 ms, the 99th percentile 19 ms and the
longest 0.25 s: the deadline is eight times the longest."""

CHECK_EVERY = 1_024
"""Nodes ``Expansion`` counts between two looks at the clock."""


class AnalysisLimit(Refused):
    """A refusal for the analysis's size or time, not for what the query asks: a pass
    that tries one reading after another (``resolve``'s EXISTS) must let it through
    rather than try the next reading."""


class _Collector(threading.local):
    """This thread's CPU seconds inside the collector's full passes, summed since the
    thread began (``gc.callbacks`` run in the thread that triggered the pass)."""

    seconds = 0.0
    started: float | None = None


_collector = _Collector()


def _on_collection(phase: str, info: dict[str, int]) -> None:
    if info["generation"] != 2:
        return
    if phase == "start":
        _collector.started = time.thread_time()
    elif _collector.started is not None:
        _collector.seconds += time.thread_time() - _collector.started
        _collector.started = None


gc.callbacks.append(_on_collection)


def analysis_clock() -> float:
    """This thread's CPU time less its time in the collector's full passes."""
    return time.thread_time() - _collector.seconds


@dataclass(frozen=True)
class _Deadline:
    thread: int  # the thread whose clock (``analysis_clock``) it is on
    end: float


_deadline: ContextVar[_Deadline | None] = ContextVar("dpmagic_analysis_deadline", default=None)


@contextmanager
def deadline() -> Iterator[None]:
    """The analysis deadline, ``ANALYSIS_SECONDS`` of this thread's ``analysis_clock`` from now,
    for the block; a block inside another keeps the outer one (the engine's covers
    ``analyse`` and ``generate`` together)."""
    held = _deadline.get()
    if held is not None and held.thread == threading.get_ident():
        yield
        return
    token = _deadline.set(_Deadline(threading.get_ident(), analysis_clock() + ANALYSIS_SECONDS))
    try:
        yield
    finally:
        _deadline.reset(token)


def check_deadline() -> None:
    """Refuse if the analysis under way has passed its deadline."""
    held = _deadline.get()
    if held is None or held.thread != threading.get_ident():
        return
    if analysis_clock() > held.end:
        raise AnalysisLimit(
            f"the analysis of this query took more than {ANALYSIS_SECONDS:g} s; simplify "
            "it (fewer CTE levels, subqueries or aggregates). Nothing was charged"
        )


def check_generated(sql: str) -> None:
    """Refuse generated SQL over ``MAX_GENERATED_CHARS``, before anything parses it."""
    if len(sql) > MAX_GENERATED_CHARS:
        raise AnalysisLimit(
            f"the SQL generated for this query is longer than {MAX_GENERATED_CHARS:,} "
            "characters (each aggregate adds its own, and each use of a CTE's or a "
            "subquery's column repeats its definition); simplify it"
        )


class Expansion:
    """The nodes one ``resolve`` has built, charged before each copy is made.

    ``add`` is called with the size of what is about to be copied; it refuses as soon
    as the total would pass ``MAX_EXPANDED_NODES``, so no copy larger than the cap is
    ever made and the work of inlining is at most the cap (plus one definition, itself
    under it). Sizes of definitions are remembered, so each is counted once however
    often it is read.
    """

    def __init__(self) -> None:
        self.nodes = 0
        self._next_check = CHECK_EVERY
        self._sizes: dict[int, tuple[exp.Expression, int]] = {}

    def add(self, nodes: int) -> None:
        self.nodes += nodes
        if self.nodes > MAX_EXPANDED_NODES:
            raise AnalysisLimit(
                f"the query expands to more than {MAX_EXPANDED_NODES:,} nodes once its CTEs "
                "and subqueries are inlined (each use of a CTE's or a subquery's column "
                "copies the expression that defines it); simplify it"
            )
        if self.nodes >= self._next_check:
            self._next_check = self.nodes + CHECK_EVERY
            check_deadline()

    def size(self, node: exp.Expression) -> int:
        """The nodes in ``node``, counted once per definition (kept alive with its id)."""
        found = self._sizes.get(id(node))
        if found is not None:
            return found[1]
        n = nodes(node)
        self._sizes[id(node)] = (node, n)
        return n

    def remember(self, node: exp.Expression, size: int) -> None:
        """``node``, just built, has ``size`` nodes."""
        self._sizes[id(node)] = (node, size)


def nodes(node: exp.Expression | None) -> int:
    return 0 if node is None else sum(1 for _ in node.walk())
