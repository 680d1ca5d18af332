"""How long the gate takes to answer cheap requests, and how much that varies:
what the default ``response_quantum_ms`` must cover.

    python benchmarks/reply_jitter.py                 # 1,000 requests of each kind
    python benchmarks/reply_jitter.py --requests 200  # a quick look

Starts a real gate (padding off) on a unix socket over a small generated table
and times, from the client, request after request of the kinds whose cost does
not depend on the data's size: a fresh COUNT, a fresh AVG grouped by public
values, a replayed query, a refused one and a malformed body. Prints each
kind's distribution (p50, p99, p99.9, max) and all of them together, with the
machine's load. With padding on, a reply leaves at the first multiple of the
quantum past its request, so a quantum above the overall p99.9 makes the
reply time of these requests one constant: their own jitter says nothing.

Not a test: the figures depend on the machine and on what else runs on it.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from dpmagic.client.errors import DPError
from dpmagic.client.http_gate import Gate

PEOPLE = 10_000
POLICY = """\
[gate]
state_dir = "state"
response_quantum_ms = 0

[datasets.d]
sources = { t = "t.csv" }
privacy_unit = "pid"
max_partitions = 1
max_rows_per_partition = 1
user_budget = { epsilon = 1e12 }
notebook_budget = { epsilon = 1e12 }
query_default = { epsilon = 0.01 }

[datasets.d.tables.t.columns]
pid = { type = "int" }
age = { type = "int", lower = 0, upper = 100 }
sex = { type = "int", public_values = [0, 1] }
"""


def _kinds(gate: Gate, address: str) -> dict[str, Callable[[], object]]:
    def malformed() -> None:
        conn = http.client.HTTPConnection("gate")
        conn.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        conn.sock.connect(address.removeprefix("unix:"))
        conn.request("POST", "/v1/query", body=b'{"sql": 1e400}')
        conn.getresponse().read()
        conn.close()

    def refused() -> None:
        with contextlib.suppress(DPError):
            gate.query("SELECT age FROM t")

    return {
        "fresh COUNT": lambda: gate.query("SELECT COUNT(*) FROM t", fresh=True),
        "fresh AVG by sex": lambda: gate.query(
            "SELECT sex, AVG(age) FROM t GROUP BY sex", fresh=True
        ),
        "replayed COUNT": lambda: gate.query("SELECT COUNT(*) AS n FROM t"),
        "refused": refused,
        "malformed body": malformed,
    }


def _summary(times: list[float]) -> str:
    cuts = statistics.quantiles(times, n=1000, method="inclusive")
    ms = [cuts[499] * 1e3, cuts[989] * 1e3, cuts[998] * 1e3, max(times) * 1e3]
    return "p50 {:6.1f}  p99 {:6.1f}  p99.9 {:6.1f}  max {:6.1f} ms".format(*ms)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=1000, help="of each kind (default 1000)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dpm-jitter-") as tmp:
        folder = Path(tmp)
        rows = [f"{pid},{pid * 7 % 90},{pid % 2}" for pid in range(PEOPLE)]
        (folder / "t.csv").write_text("pid,age,sex\n" + "\n".join(rows) + "\n")
        (folder / "policy.toml").write_text(POLICY)
        listen = f"unix:{folder / 'gate.sock'}"
        command = [sys.executable, "-m", "dpmagic.gate.service.server", "--policy", "policy.toml"]
        gate_process = subprocess.Popen(
            [*command, "--listen", listen],
            cwd=folder,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        try:
            line = gate_process.stdout.readline()  # type: ignore[union-attr]
            address = line.rsplit(" ", 1)[-1].strip()
            gate = Gate(address)
            kinds = _kinds(gate, address)
            for run in kinds.values():  # warm up: caches, threads, the stored answer
                for _ in range(20):
                    run()
            times: dict[str, list[float]] = {name: [] for name in kinds}
            order = [name for name in kinds for _ in range(args.requests)]
            random.Random(0).shuffle(order)
            for name in order:
                start = time.perf_counter()
                kinds[name]()
                times[name].append(time.perf_counter() - start)
        finally:
            gate_process.terminate()
            gate_process.wait(timeout=30)
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    print(
        f"reply times over a unix socket, padding off; load average {load}, {os.cpu_count()} cores"
    )
    for name, t in times.items():
        print(f"  {name:18} {_summary(t)}")
    everything = [x for t in times.values() for x in t]
    print(f"  {'all':18} {_summary(everything)}")
    print(json.dumps({"load": os.getloadavg()[0], "max_ms": max(everything) * 1e3}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
