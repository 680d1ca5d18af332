"""dpmagic against raw DuckDB (and, with ``--peers``, SmartNoise SQL and OpenDP's
Polars front end): one table of
median time, ratio to DuckDB, relative error and peak memory, then the noise
sampler, the notebook round trip and the gate under many clients.

    python benchmarks/run.py --rows 1M            # develop on this
    python benchmarks/run.py --rows 10M --peers   # the tables of docs/speed.md

Not a test: timings depend on the machine. Every tool answers the same SQL on
the same rows with the same ε and the same bound on a person's rows (5). Raw
DuckDB and the gate run in turn, run by run; the peers run after them.
"""

from __future__ import annotations

import argparse
import os
import platform
import secrets
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from data import DIAGNOSES, STATES, dataset, row_count  # noqa: E402
from peers import PEERS, peer_python, tool_run  # noqa: E402
from queries import QUERIES, indexed, relative_error  # noqa: E402
from tools import THREADS  # noqa: E402
from visits import alternated  # noqa: E402

ROUND_TRIP_ROWS = 2_000  # the size of the PUMS samples the examples use
ROUND_TRIP_SQL = "SELECT state, COUNT(*) AS n FROM visits GROUP BY state"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=row_count, default=1_000_000, help="1M, 10M or a number")
    parser.add_argument("--reps", type=int, default=5, help="timed runs per query (median)")
    parser.add_argument("--epsilon", type=float, default=1.0, help="ε per query, every tool")
    parser.add_argument(
        "--peers",
        action="store_true",
        help="also SmartNoise SQL and OpenDP's Polars front end (each in a venv of its own)",
    )
    parser.add_argument("--clients", type=int, default=50, help="concurrent clients of the gate")
    parser.add_argument("--per-client", type=int, default=10, help="queries per client")
    args = parser.parse_args(argv)

    folder = dataset(args.rows)
    tools = {"duckdb": tool_run("duckdb", sys.executable, folder, args.reps, args.epsilon)}
    exact = {q.name: indexed(q, tools["duckdb"]["queries"][q.name]["answers"][0]) for q in QUERIES}
    with Gate(folder) as gate:
        tools["dpmagic"], raw_s = gate.run_queries(args.reps, args.epsilon)
    # Raw DuckDB's times are those taken in turn with the gate's; its answers and peak
    # memory come from the process of its own above.
    for name, seconds in raw_s.items():
        tools["duckdb"]["queries"][name]["seconds"] = seconds
    if args.peers:
        for peer in PEERS:
            tools[peer] = tool_run(peer, str(peer_python(peer)), folder, args.reps, args.epsilon)
    print(_header(args.rows))
    print(_table(tools, exact))
    print(_noise_speed())
    print()
    with Gate(dataset(ROUND_TRIP_ROWS)) as small:
        print(small.round_trips(30))
    # Over TCP with a token per client: each client is a user of its own, as in a class,
    # so the per-user cap on concurrent requests (4) does not refuse them.
    with Gate(dataset(ROUND_TRIP_ROWS), users=args.clients) as loaded:
        print(loaded.under_load(args.clients, args.per_client))
    return 0


@dataclass
class Gate:
    """A real gate process on a unix socket, serving one benchmark dataset."""

    folder: Path
    users: int = 0  # > 0: on TCP, with this many users, each with a token of its own
    load_s: float = 0.0  # the first start: preparing the data
    restart_s: float = 0.0  # a start on the prepared data
    prepare_peak_mb: float = 0.0  # the first start's peak memory
    proc: subprocess.Popen | None = None
    workdir: tempfile.TemporaryDirectory = field(default_factory=tempfile.TemporaryDirectory)
    tokens: list[str] = field(default_factory=list)

    def __enter__(self) -> Gate:
        work = Path(self.workdir.name)
        policy = work / "policy.toml"
        text = _policy(self.folder, work)
        self.address = f"unix:{work / 'gate.sock'}"
        if self.users:
            self.tokens = [secrets.token_hex(16) for _ in range(self.users)]
            users = "\n".join(f'user{i} = "{t}"' for i, t in enumerate(self.tokens))
            (work / "tokens.toml").write_text(f"[users]\n{users}\n")
            os.chmod(work / "tokens.toml", 0o600)
            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port = s.getsockname()[1]
            self.address = f"tcp:127.0.0.1:{port}"
            text = text.replace("[gate]\n", f'[gate]\ntokens_file = "{work / "tokens.toml"}"\n', 1)
        policy.write_text(text)
        # The first start prepares the data (ranks every unit's rows) and stops; the
        # gate measured is the second, serving from the prepared file, as a deployed
        # gate does after its first start (raw DuckDB's file is made beforehand too).
        self.load_s = self._spawn(policy)
        self.prepare_peak_mb = self.peak_mb()
        self.proc.terminate()  # type: ignore[union-attr]
        self.proc.wait(30)  # type: ignore[union-attr]
        self.restart_s = self._spawn(policy)
        return self

    def _spawn(self, policy: Path) -> float:
        """Start the gate and wait until it listens; the seconds it took."""
        start = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "dpmagic", "serve", "--policy", str(policy),
             "--listen", self.address],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if "listening" in line:
                break
        else:
            raise RuntimeError("the gate exited before listening")
        return time.perf_counter() - start

    def __exit__(self, *exc: object) -> None:
        assert self.proc is not None
        self.proc.terminate()
        self.proc.wait(30)
        self.workdir.cleanup()

    def client(self, user: int = 0):
        from dpmagic.client.http_gate import Gate as Client

        if self.tokens:
            host = self.address.removeprefix("tcp:")
            return Client(f"http://{host}", self.tokens[user], timeout=600)
        return Client(self.address, timeout=600)

    def peak_mb(self) -> float:
        assert self.proc is not None
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        line = next(x for x in status.splitlines() if x.startswith("VmHWM"))
        return int(line.split()[1]) / 1024

    def run_queries(self, reps: int, epsilon: float) -> tuple[dict, dict[str, list[float]]]:
        """The gate's times and answers per query, and raw DuckDB's times on the same
        rows, one run of each in turn (the first of each not counted), so that a change
        in the machine's load falls on both alike."""
        import duckdb

        from dpmagic.client.errors import QueryRefused

        client = self.client()
        raw = duckdb.connect(str(self.folder / "raw.duckdb"), read_only=True,
                             config={"threads": THREADS})  # fmt: skip
        out, raw_s = {}, {}
        for q in QUERIES:
            answers: list = []
            try:
                raw_s[q.name], seconds = alternated(
                    lambda q=q: raw.execute(q.sql).fetchall(),
                    lambda q=q, answers=answers: answers.append(
                        client.query(q.sql, epsilon=epsilon, fresh=True).rows
                    ),
                    reps,
                )
            except QueryRefused:
                out[q.name] = {"status": "refused (not supported yet)"}
                continue
            out[q.name] = {"status": "ok", "seconds": seconds, "answers": answers[1:]}
        raw.close()
        return {
            "peak_mb": self.peak_mb(),
            "load_s": self.load_s,
            "restart_s": self.restart_s,
            "prepare_peak_mb": self.prepare_peak_mb,
            "queries": out,
        }, raw_s

    def round_trips(self, n: int) -> str:
        """``%%dpsql`` cells executed by a real kernel, timed from request to reply."""
        from jupyter_client.manager import start_new_kernel

        km, kc = start_new_kernel(kernel_name="python3")
        try:
            setup = f"%load_ext dpmagic\n%dpconnect {self.address}"
            kc.execute_interactive(setup, timeout=60, output_hook=lambda m: None)
            cell = f"%%dpsql -e 0.01 --fresh\n{ROUND_TRIP_SQL}"
            times, errors = [], 0
            for _ in range(n + 1):
                start = time.perf_counter()
                reply = kc.execute_interactive(cell, timeout=60, output_hook=lambda m: None)
                times.append(time.perf_counter() - start)
                errors += reply["content"]["status"] != "ok"
            direct = []
            client = self.client()
            for _ in range(n + 1):
                start = time.perf_counter()
                client.query(ROUND_TRIP_SQL, epsilon=0.01, fresh=True)
                direct.append(time.perf_counter() - start)
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)
        return (
            f"%%dpsql round trip, {ROUND_TRIP_ROWS:,} rows, padding off: median "
            f"{_ms(statistics.median(times[1:]))} through a kernel ({errors} errors), "
            f"{_ms(statistics.median(direct[1:]))} from the Python client"
        )

    def under_load(self, clients: int, per_client: int) -> str:
        """``clients`` threads, each with its own connection per query, all at once."""
        errors: list[str] = []
        latencies: list[float] = []
        lock = threading.Lock()
        barrier = threading.Barrier(clients)

        def work(i: int) -> None:
            client = self.client(i if self.tokens else 0)
            barrier.wait()
            for _ in range(per_client):
                start = time.perf_counter()
                try:
                    client.query(ROUND_TRIP_SQL, epsilon=0.01, fresh=True, notebook=f"nb{i}")
                except Exception as exc:
                    with lock:
                        errors.append(type(exc).__name__)
                with lock:
                    latencies.append(time.perf_counter() - start)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(clients)]
        start = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - start
        total = clients * per_client
        latencies.sort()
        return (
            f"{clients} concurrent clients × {per_client} queries: {total / wall:.0f} queries/s, "
            f"median {_ms(statistics.median(latencies))}, p99 "
            f"{_ms(latencies[int(0.99 * (len(latencies) - 1))])}, {len(errors)} errors"
            + (f" ({', '.join(sorted(set(errors)))})" if errors else "")
            + f"; gate peak memory {self.peak_mb():.0f} MB"
        )


def _noise_speed() -> str:
    """The gate's sampler on a million cells, against OpenDP's one cell at a time."""
    import opendp.prelude as dp

    from dpmagic.gate.dp.mechanisms import calibrate

    noise = calibrate(sensitivity=5, epsilon=1.0)
    start = time.perf_counter()
    noise.sample(1_000_000)
    fast = time.perf_counter() - start
    opendp = dp.m.make_laplace(
        dp.vector_domain(dp.atom_domain(T="i64")), dp.l1_distance(T="i64"), scale=noise.scale
    )
    start = time.perf_counter()
    opendp([0] * 20_000)
    slow = (time.perf_counter() - start) * 50
    return f"noise for 1,000,000 cells: {fast:.2f} s (OpenDP's sampler: {slow:.1f} s, from 20,000)"


def _policy(folder: Path, work: Path) -> str:
    states = list(range(STATES))
    diagnoses = list(range(DIAGNOSES))
    return f"""
[gate]
state_dir = "{work / "state"}"
response_quantum_ms = 0
query_timeout_s = 600

[datasets.bench]
sources = {{ visits = "{folder / "visits.parquet"}", persons = "{folder / "persons.parquet"}" }}
privacy_unit = "pid"
max_partitions = 1
max_rows_per_partition = 5
user_budget = {{ epsilon = 1e12 }}
notebook_budget = {{ epsilon = 1e12 }}

[datasets.bench.tables.visits.columns]
pid = {{ type = "int" }}
age = {{ type = "int", lower = 0, upper = 100 }}
income = {{ type = "float", lower = 0, upper = 500000 }}
state = {{ type = "int", public_values = {states} }}
diagnosis = {{ type = "int", public_values = {diagnoses} }}

[datasets.bench.tables.persons.columns]
pid = {{ type = "int" }}
sex = {{ type = "int", public_values = [0, 1] }}
enrolled = {{ type = "int", lower = 2000, upper = 2025 }}
"""


def _table(tools: dict[str, dict], exact: dict[str, dict]) -> str:
    names = list(tools)
    head = "| query | " + " | ".join(
        "duckdb" if n == "duckdb" else f"{n} | × | error" for n in names
    )
    lines = [head + " |", "|" + "---|" * (1 + 1 + 3 * (len(names) - 1))]
    for q in QUERIES:
        base = _median(tools["duckdb"]["queries"][q.name])
        cells = [q.name, _ms(base) if base else "—"]
        for n in names[1:]:
            run = tools[n]["queries"][q.name]
            t = _median(run)
            if t is None:
                cells += [run["status"].split(":")[0], "", ""]
                continue
            errors = [relative_error(exact[q.name], indexed(q, a)) for a in run["answers"]]
            cells += [_ms(t), f"{t / base:.2f}", f"{100 * statistics.mean(errors):.3g}%"]
        lines.append("| " + " | ".join(cells) + " |")
    memory = ["peak memory", *(f"{tools[n]['peak_mb']:.0f} MB" for n in names[:1])]
    for n in names[1:]:
        memory += [f"{tools[n]['peak_mb']:.0f} MB", "", ""]
    lines.append("| " + " | ".join(memory) + " |")
    gate = tools["dpmagic"]
    return "\n".join(lines) + (
        f"\n\ndpmagic's peak memory is the serving gate's (started on the prepared data); "
        f"its first start prepared the data in {gate['load_s']:.1f} s "
        f"(peak {gate['prepare_peak_mb']:.0f} MB, within the policy's memory_limit), "
        f"a start on the prepared data took {gate['restart_s']:.1f} s"
    )


def _median(run: dict) -> float | None:
    return statistics.median(run["seconds"]) if run.get("status") == "ok" else None


def _header(rows: int) -> str:
    cpu = next(
        (x.split(":", 1)[1].strip() for x in Path("/proc/cpuinfo").read_text().splitlines()
         if x.startswith("model name")),
        platform.processor(),
    )  # fmt: skip
    versions = ", ".join(f"{p} {metadata.version(p)}" for p in ("duckdb", "opendp", "sqlglot"))
    return (
        f"{rows:,} rows; {cpu}, {os.cpu_count()} cores; Python {platform.python_version()}, "
        f"{versions}\n"
    )


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 10 else f"{seconds:.1f} s"


if __name__ == "__main__":
    sys.exit(main())
