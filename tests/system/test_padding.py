"""Padding only where private data was touched, on a real gate process over its unix
socket (docs/security.md, "Which replies are padded").

D and D' are test_timing's neighbours: D' is D without one unit, the target, whose
5,000 rows of folded text make a fresh run of ``SQL`` about 70 ms slower over D. One gate
serves both, as the datasets ``with`` (D) and ``sans`` (D'; a name as long, so that
the replies are as long): two gate processes differ in their replies' times by up
to a tenth of a millisecond whatever their data (two gates over the same D
were told apart at p = 2e-5 in one of four runs of 40 replies each), which the
statistical test below would see; within one process only the data differs. The
quantum is 1.5 s, far above any reply here, so padded and unpadded replies cannot
be confused:

- a fresh run is padded (its reply leaves within its first quantum, never sooner);
  a replay, a dry run, a mock run and refusals before the run are answered at once
  (each under a quarter of the quantum);
- a replay's time does not follow the data: after one fresh run on each dataset,
  the same query replayed over D and over D', in an order drawn afresh each round,
  gives reply times that a two-sample Kolmogorov-Smirnov test does not tell apart
  at α = 1e-3 (if the replays' times are identically distributed, it rejects with
  probability at most 1e-3). The same test, same sample sizes and α, rejects for
  a deliberately broken gate started by this test (production code unchanged),
  whose replay reads the private data again without marking the read, so the test
  can see what it rules out;
- a request queued behind its user's padded runs (four at once, the server's
  ``USER_REQUESTS``) starts when a padded reply leaves, not when its run ended.
"""

from __future__ import annotations

import contextlib
import random
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb
import pytest
from scipy.stats import ks_2samp

from dpmagic.client.errors import BudgetExhausted, DPError, QueryRefused
from dpmagic.client.http_gate import Gate
from dpmagic.gate.service.process import USER_REQUESTS
from tests.conftest import GateProcess

ALPHA = 1e-3
QUANTUM_S = 1.5
# "At once": a quarter of the quantum. Replays and dry runs take a few milliseconds
# on a quiet machine; the bound leaves room for a loaded one.
AT_ONCE_S = QUANTUM_S / 4
REPLAYS = 60
DATASETS = ("with", "sans")  # D, with the target; D', without it
TARGET_ROWS = 5000
TARGET_CHARS = 1200
# Folding 2-byte characters is the dearest text work per character (docs/security.md,
# "Operator prices"): priced under every row cap here, slow over many rows.
SQL = "SELECT COUNT(*) FROM t WHERE LOWER(s) = 'x'"

GATE = """
[gate]
state_dir = "state-{variant}"
response_quantum_ms = {quantum_ms}
"""
DATASET = """
[datasets.{name}]
database = "{name}.duckdb"
privacy_unit = "pid"
# The target's heavy rows are kept at load and their work allowed, as in test_timing.
max_rows_per_partition = 5000
max_unit_work = 1000000000
user_budget = {{ epsilon = 1000.0 }}
notebook_budget = {{ epsilon = 1000.0 }}

[datasets.{name}.tables.t.columns]
pid = {{ type = "int" }}
s = {{ type = "str", max_length = 1200 }}
"""

# A deliberately broken gate, for this test only: every replay runs the query on the
# private data again (as a replay that re-checked its stored answer against the data
# might) without marking the read, so the server answers it at once.
REPLAY_THAT_READS = """
import sys

from dpmagic.gate.engine import Engine
from dpmagic.gate.service import server
from dpmagic.gate.sql.pipeline import execute

answered = Engine._query


def replay_that_reads(self, user, request, reads):
    reply = answered(self, user, request, reads)
    if reply.envelope.replayed:
        dataset = self._dataset(request.dataset)
        analysis = self.analysis(user, dataset, request)
        execute(analysis.analysed, self.databases[dataset.name])
    return reply


Engine._query = replay_that_reads
sys.exit(server.main(sys.argv[1:]))
"""


class _ReplayThatReads(GateProcess):
    """``GateProcess`` running ``REPLAY_THAT_READS`` instead of the gate's module."""

    def start(self) -> None:
        command = [sys.executable, "-c", REPLAY_THAT_READS]
        self.proc = subprocess.Popen(
            [*command, "--policy", str(self.policy), "--listen", self.listen],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        line = self._first_line()
        if "listening on " not in line:
            self.stop()
            raise RuntimeError(f"the broken gate did not start: {line!r}")
        self.address = line.split("listening on ", 1)[1].strip()


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("padding")
    for name in DATASETS:
        con = duckdb.connect(str(folder / f"{name}.duckdb"))
        con.execute("CREATE TABLE t AS SELECT range AS pid, 'ab' AS s FROM range(2000)")
        if name == "with":  # one unit, the target, with as much text as the policy keeps
            con.execute(
                f"INSERT INTO t SELECT 999999, repeat('é', {TARGET_CHARS}) "
                f"FROM range({TARGET_ROWS})"
            )
        con.close()
    return folder


@pytest.fixture
def padded_gate(data: Path, short_dir: Path, request) -> Iterator[GateProcess]:
    """A gate serving D and D', padded to ``QUANTUM_S``, with a ledger of its own; the
    broken variant when the test asks for ``"broken"``."""
    variant = getattr(request, "param", "gate")
    kind = _ReplayThatReads if variant == "broken" else GateProcess
    policy = data / f"{request.node.name}.toml".replace("[", "-").replace("]", "")
    text = GATE.format(variant=policy.stem, quantum_ms=int(QUANTUM_S * 1000))
    policy.write_text(text + "".join(DATASET.format(name=name) for name in DATASETS))
    process = kind(policy, f"unix:{short_dir / 'padding.sock'}")
    process.start()
    try:
        yield process
    finally:
        process.stop()


def _timed(ask: Callable[[], object]) -> float:
    """Seconds from request to reply (or to the refusal)."""
    start = time.perf_counter()
    with contextlib.suppress(DPError):
        ask()
    return time.perf_counter() - start


def _ms(times: list[float]) -> str:
    return f"median {statistics.median(times) * 1000:.1f} ms, max {max(times) * 1000:.1f} ms"


def test_only_a_run_on_the_private_data_is_padded(padded_gate):
    gate = Gate(padded_gate.address)
    fresh = _timed(lambda: gate.query(SQL, epsilon=0.1, dataset="with"))
    assert QUANTUM_S <= fresh < 2 * QUANTUM_S, fresh  # the run, padded
    at_once = {
        "replay": lambda: gate.query(SQL, epsilon=0.1, dataset="with"),
        "dry run": lambda: gate.query(SQL, epsilon=0.1, dataset="with", dry_run=True),
        "mock run": lambda: gate.query(SQL, dataset="with", mock=True, mock_rows=50),
        "refused before the debit": lambda: gate.query("SELECT s FROM t", dataset="with"),
        "over budget": lambda: gate.query(SQL, epsilon=5000.0, dataset="with"),
        "budget": lambda: gate.budget("with"),
    }
    times = {kind: _timed(ask) for kind, ask in at_once.items()}
    shown = ", ".join(f"{kind} {t * 1000:.1f} ms" for kind, t in times.items())
    print(f"\nfresh {fresh * 1000:.0f} ms; {shown}")
    for kind, elapsed in times.items():
        assert elapsed < AT_ONCE_S, (kind, elapsed)
    # What each was: a replay of the run, refusals that charged nothing.
    assert gate.query(SQL, epsilon=0.1, dataset="with").reply["replayed"] is True
    with pytest.raises(QueryRefused):
        gate.query("SELECT s FROM t", dataset="with")
    with pytest.raises(BudgetExhausted):
        gate.query(SQL, epsilon=5000.0, dataset="with")
    assert gate.budget("with")["user"]["spent"]["epsilon"] == pytest.approx(0.1)
    again = _timed(lambda: gate.query(SQL, epsilon=0.1, dataset="with", fresh=True))
    assert QUANTUM_S <= again < 2 * QUANTUM_S, again  # --fresh runs again: padded


def _replay_times(address: str) -> dict[str, list[float]]:
    """One fresh run on each dataset (padded), one replay to warm up, then ``REPLAYS``
    replays of each, in an order drawn afresh each round (a fixed seed), so that
    neither a drift in the machine's load nor what came just before favours one."""
    gate = Gate(address)
    for name in DATASETS:
        assert gate.query(SQL, epsilon=0.1, dataset=name, fresh=True).reply["replayed"] is False
        assert gate.query(SQL, epsilon=0.1, dataset=name).reply["replayed"] is True
    times: dict[str, list[float]] = {name: [] for name in DATASETS}
    order, draw = list(DATASETS), random.Random(30)
    for _ in range(REPLAYS):
        draw.shuffle(order)
        for name in order:
            times[name].append(_timed(lambda n=name: gate.query(SQL, epsilon=0.1, dataset=n)))
    return times


def _verdict(times: dict[str, list[float]]) -> float:
    """The two-sample KS test's p-value: D's replay times against D''s."""
    test = ks_2samp(times["with"], times["sans"])
    print(f"\nreplays over D: {_ms(times['with'])}; over D': {_ms(times['sans'])}; "
          f"KS p = {test.pvalue:.3g}")  # fmt: skip
    return float(test.pvalue)


def test_a_replays_time_does_not_follow_the_data(padded_gate):
    times = _replay_times(padded_gate.address)
    p = _verdict(times)
    for t in times["with"] + times["sans"]:
        assert t < AT_ONCE_S, t  # answered at once, not padded
    assert p > ALPHA, times


@pytest.mark.parametrize("padded_gate", ["broken"], indirect=True)
def test_the_same_test_sees_a_replay_that_reads_the_data(padded_gate):
    p = _verdict(_replay_times(padded_gate.address))
    assert p < ALPHA


def test_a_request_queued_behind_padded_runs_starts_when_their_replies_leave(padded_gate):
    """Four fresh runs of one user hold the user's four places in the engine; a replay
    sent after them waits for a place. Their runs end within milliseconds, their
    replies leave a quantum after they were sent: the replay comes no sooner. Were a
    place let go when its run ended, the replay's time would say how long the run
    took, which the padding hides."""
    address = padded_gate.address

    def fresh(epsilon: float) -> None:
        Gate(address).query(SQL, epsilon=epsilon, dataset="sans", fresh=True)

    Gate(address).query(SQL, epsilon=0.1, dataset="sans")  # what is asked below replays it
    start = time.perf_counter()
    runs = [threading.Thread(target=fresh, args=(0.2 + i,)) for i in range(USER_REQUESTS)]
    for run in runs:
        run.start()
    time.sleep(0.6)  # all four accepted, run, and waiting for their quantum
    replay = Gate(address).query(SQL, epsilon=0.1, dataset="sans")
    replayed_after = time.perf_counter() - start
    for run in runs:
        run.join()
    print(f"\nthe replay after {replayed_after * 1000:.0f} ms")
    assert replay.reply["replayed"] is True
    assert QUANTUM_S - 0.01 <= replayed_after < 2 * QUANTUM_S, replayed_after
