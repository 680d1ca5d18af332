"""A notebook cell's latency in a real kernel: ``%%dpsql`` replayed and fresh, against
JupySQL's ``%%sql`` on DuckDB, on the same data in the same run.

    python benchmarks/cell_latency.py                 # 1M rows, 20 cells of each
    python benchmarks/cell_latency.py --cells 40 --quantum 0

The data is ``benchmarks/visits.py``'s workload (``--rows``, cached in
``benchmarks/.data/``). A real gate process serves it over its unix socket with the
policy's padding (``--quantum``, by default the gate's default); one Jupyter kernel
has ``%load_ext dpmagic`` connected to it, another ``%load_ext sql`` (JupySQL, from
the ``bench`` extra) connected to the same DuckDB file, read-only, as a user would
(every row shown, as ``%%dpsql`` shows them; JupySQL's telemetry off). Each round
runs one cell of each kind in an order drawn afresh (a fixed seed): JupySQL's, a
``%%dpsql`` cell the gate has answered before (a replay, at no cost) and a
``%%dpsql --fresh`` cell (a new run on the private data, charged and padded). A
cell's latency is the frontend's: from the execute request to the kernel's reply
with its outputs sent, as ``jupyter_client`` sees it. Prints the medians (first
round discarded), the spread, the machine's load before and after, and the goals
of issue 30: a replayed cell at most JupySQL's latency, a fresh one at most one
quantum plus twice JupySQL's.

Not a test: the numbers depend on the machine and its load, printed with them.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import visits  # noqa: E402
from data import row_count  # noqa: E402
from queries import COUNT_BY_STATE  # noqa: E402

from dpmagic.gate.policy import DEFAULT_QUANTUM_MS  # noqa: E402

KINDS = ("JupySQL %%sql", "%%dpsql replayed", "%%dpsql fresh")
EPSILON = 0.01
CELL_TIMEOUT_S = 120


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=row_count, default=1_000_000, help="1M, 10M or a number")
    parser.add_argument("--cells", type=int, default=20, help="timed cells of each kind")
    parser.add_argument("--quantum", type=float, default=DEFAULT_QUANTUM_MS, help="padding, ms")
    parser.add_argument("--sql", default=COUNT_BY_STATE.sql, help="the query every cell asks")
    args = parser.parse_args(argv)
    database = visits.visits_file(args.rows)
    print(_machine(), flush=True)
    print(f"{args.rows:,} rows; {args.sql}; padding {args.quantum:g} ms; {args.cells} cells each")
    with (
        gate(database, args.quantum) as address,
        kernel(_dpsql_setup(address)) as dp,
        kernel(_jupysql_setup(database)) as js,
    ):
        cells = {
            KINDS[0]: (js, f"%%sql\n{args.sql}"),
            KINDS[1]: (dp, f"%%dpsql -e {EPSILON}\n{args.sql}"),
            KINDS[2]: (dp, f"%%dpsql -e {EPSILON} --fresh\n{args.sql}"),
        }
        times = rounds(cells, args.cells)
    print(_report(times, args.quantum))
    print(f"load average {_load()} at the end")
    return 0


def rounds(cells: dict[str, tuple[object, str]], n: int) -> dict[str, list[float]]:
    """``n`` + 1 rounds of one cell of each kind, in an order drawn each round; the first
    round (warming the kernels, the gate's analysis and the replay) is not counted."""
    times: dict[str, list[float]] = {kind: [] for kind in cells}
    order, draw = list(cells), random.Random(30)
    for i in range(n + 1):
        draw.shuffle(order)
        for kind in order:
            client, code = cells[kind]
            elapsed, text = _cell(client, code)
            if not i:  # the warm-up: the replayed cell may come before any release
                continue
            if kind == KINDS[1] and "replayed" not in text:
                raise RuntimeError(f"the replayed cell was not a replay: {text[-300:]!r}")
            times[kind].append(elapsed)
    return times


def _cell(client, code: str) -> tuple[float, str]:
    """One cell's latency (seconds) and its outputs' text; a failed cell stops the run."""
    texts: list[str] = []

    def output(msg: dict) -> None:
        data = msg["content"].get("data") or {}
        texts.append(str(data.get("text/plain", msg["content"].get("text", ""))))

    start = time.perf_counter()
    reply = client.execute_interactive(code, timeout=CELL_TIMEOUT_S, output_hook=output)
    elapsed = time.perf_counter() - start
    if reply["content"]["status"] != "ok":
        raise RuntimeError(f"cell failed: {code.splitlines()[0]}: {reply['content'].get('evalue')}")
    return elapsed, "\n".join(texts)


@contextmanager
def gate(database: Path, quantum_ms: float) -> Iterator[str]:
    """A real gate process on ``database``, padded to ``quantum_ms``; its address."""
    with tempfile.TemporaryDirectory() as work:
        policy = Path(work) / "policy.toml"
        text = visits._policy(database, Path(work))
        policy.write_text(
            text.replace("response_quantum_ms = 0", f"response_quantum_ms = {quantum_ms:g}")
        )
        address = f"unix:{Path(work) / 'gate.sock'}"
        proc, _ = visits._start(policy, address)
        try:
            yield address
        finally:
            proc.terminate()
            proc.wait(30)


@contextmanager
def kernel(setup: str) -> Iterator[object]:
    """A real IPython kernel (this interpreter's) after ``setup`` ran in it."""
    from jupyter_client.manager import start_new_kernel

    env = {**os.environ, "PLOOMBER_STATS_ENABLED": "false", "JPY_SESSION_NAME": "latency.ipynb"}
    # The kernel's own log (a warning that it listens on local TCP) is not shown.
    manager, client = start_new_kernel(kernel_name="python3", env=env, stderr=subprocess.DEVNULL)
    try:
        _cell(client, setup)
        yield client
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def _dpsql_setup(address: str) -> str:
    return f"%load_ext dpmagic\n%dpconnect {address}"


def _jupysql_setup(database: Path) -> str:
    return "\n".join(
        [
            "import duckdb",
            f"conn = duckdb.connect({str(database)!r}, read_only=True)",
            "%load_ext sql",
            "%config SqlMagic.displaylimit = None",  # every row, as %%dpsql shows
            "%sql conn",
        ]
    )


def _report(times: dict[str, list[float]], quantum_ms: float) -> str:
    median = {kind: statistics.median(t) * 1000 for kind, t in times.items()}
    lines = ["", "| cell | median | p10–p90 |", "|---|---|---|"]
    for kind, t in times.items():
        deciles = statistics.quantiles([x * 1000 for x in t], n=10)
        lines.append(f"| {kind} | {median[kind]:.1f} ms | {deciles[0]:.1f}–{deciles[-1]:.1f} ms |")
    jupysql = median[KINDS[0]]
    fresh_goal = quantum_ms + 2 * jupysql
    lines += [
        "",
        f"replayed ≤ JupySQL: {median[KINDS[1]]:.1f} ≤ {jupysql:.1f} ms: "
        + ("held" if median[KINDS[1]] <= jupysql else "NOT held"),
        f"fresh ≤ quantum + 2 × JupySQL: {median[KINDS[2]]:.1f} ≤ {fresh_goal:.1f} ms: "
        + ("held" if median[KINDS[2]] <= fresh_goal else "NOT held"),
    ]
    return "\n".join(lines)


def _machine() -> str:
    packages = ", ".join(f"{p} {version(p)}" for p in ("duckdb", "jupysql", "ipykernel"))
    return (
        f"{os.cpu_count()} cores, load average {_load()} at the start; "
        f"Python {sys.version.split()[0]}, {packages}"
    )


def _load() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg()) + " (1 / 5 / 15 min)"


if __name__ == "__main__":
    sys.exit(main())
