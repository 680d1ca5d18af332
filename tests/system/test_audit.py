"""The privacy audit (``pytest -m audit``): empirical ε lower bounds for the whole
gate path, and proof that the same audit catches deliberately broken variants.

Each sample is one real request: ``Engine.query`` parses, plans, charges a
real SQLite ledger, rewrites, runs the generated SQL on a real locked DuckDB
file, noises with OpenDP and releases, exactly as the server would; a smaller
number go through a real gate process over its unix socket, and must agree
with the in-process ones. D holds the *worst-case* unit for every query
below (two rows at the upper bound in each of two groups, the most the
contribution bounds keep); D' is D without it. The median has a pair of its
own (Q, Q'), where that unit moves the median. Every query claims ε = 1.

Each sample is charged to an auditor account of its own, so the ledger
never grows long for one user and the audit stays within its time budget.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import duckdb
import pytest
from scipy.stats import ks_2samp

from dpmagic.client.http_gate import Gate
from dpmagic.gate.dp.mechanisms import calibrate
from dpmagic.gate.engine import Engine
from dpmagic.gate.policy import Dataset, load_policy
from dpmagic.gate.request import QueryRequest
from dpmagic.gate.sql.plan_types import Plan
from tests.conftest import GateProcess
from tests.dp_audit import ALPHA, AuditResult, epsilon_lower_bound

pytestmark = pytest.mark.audit

EPSILON = 1.0
SAMPLES = 600  # per dataset and case for the gate as it is
BROKEN_SAMPLES = 1400  # enough for each broken variant to show by a clear margin
QUANTILE_SAMPLES = 400  # the exponential mechanism over 1,001 candidates is slower to sample
SOCKET_SAMPLES = 250
PEOPLE = 60
VALUE, UPPER = 50.0, 100.0
WORST = 1000  # the worst-case unit's pid
ROWS, GROUPS = 2, 2  # max_rows_per_partition, max_partitions

POLICY = f"""
[gate]
state_dir = "state"
response_quantum_ms = 0  # padding off: the audit samples many replies

[datasets.d]
database = "d.duckdb"
privacy_unit = "pid"
max_partitions = {GROUPS}
max_rows_per_partition = {ROWS}
user_budget = {{ epsilon = 1e9 }}
notebook_budget = {{ epsilon = 1e9 }}

[datasets.d.tables.t.columns]
pid = {{ type = "int" }}
g = {{ type = "int", public_values = [0, 1, 2] }}
x = {{ type = "float", lower = 0, upper = {UPPER} }}
"""

# What D releases without noise; D' is D less the worst unit's kept rows.
COUNT_D = PEOPLE + ROWS
SUM_D = PEOPLE * VALUE + ROWS * UPPER
CELL_D = {g: PEOPLE // 3 + (ROWS if g < GROUPS else 0) for g in range(3)}
# AVG noises the sum of distances to the middle of [0, UPPER]: D's is the worst unit's.
CENTRE = UPPER / 2
CENTRED_SUM_D = PEOPLE * (VALUE - CENTRE) + ROWS * (UPPER - CENTRE)


def _write_db(path: Path, rows: list[tuple[int, int, float]]) -> None:
    con = duckdb.connect(str(path))
    con.execute("CREATE TABLE t (pid BIGINT, g BIGINT, x DOUBLE)")
    con.executemany("INSERT INTO t VALUES (?, ?, ?)", rows)
    con.close()


WORST_ROWS = [(WORST, g, UPPER) for g in range(GROUPS) for _ in range(ROWS)]
DATABASES = {
    "d": [(i, i % 3, VALUE) for i in range(PEOPLE)] + WORST_ROWS,
    "dp": [(i, i % 3, VALUE) for i in range(PEOPLE)],
    # For the median, a dataset whose median the worst unit can move: on Q' every
    # candidate between 25 and 75 scores best; the unit's rows at 100 favour (75, 100].
    "q": [(1, 0, 25.0), (2, 0, 75.0), *WORST_ROWS[:ROWS]],
    "qp": [(1, 0, 25.0), (2, 0, 75.0)],
}


@pytest.fixture(scope="module")
def audit_dir() -> Iterator[Path]:
    """A policy serving D (``d``) and D' (``dp``). On tmpfs where there is one: the
    ledger's fsyncs would otherwise dominate the audit's time."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="dpm-audit-", dir=base) as folder:
        root = Path(folder)
        text = POLICY
        body = POLICY.split("[datasets.d]", 1)[1]
        for name, rows in DATABASES.items():
            _write_db(root / f"{name}.duckdb", rows)
            if name != "d":
                renamed = body.replace("datasets.d.", f"datasets.{name}.")
                text += f"\n[datasets.{name}]" + renamed.replace("d.duckdb", f"{name}.duckdb")
        (root / "policy.toml").write_text(text)
        yield root


class HalvedSensitivity(Engine):
    """Broken on purpose: every measurement's noise is calibrated to half its sensitivity."""

    def analyse(self, dataset: Dataset, request: QueryRequest) -> Plan:
        p = super().analyse(dataset, request)
        return dataclasses.replace(
            p,
            measurements=tuple(
                dataclasses.replace(
                    m,
                    noise=calibrate(m.noise.sensitivity // 2, m.cost.epsilon, m.noise.granularity),
                )
                for m in p.measurements
            ),
        )


class AvgChargedOnce(Engine):
    """Broken on purpose: AVG's sum and count each spend the whole ε of the query."""

    def analyse(self, dataset: Dataset, request: QueryRequest) -> Plan:
        p = super().analyse(dataset, request)
        return dataclasses.replace(
            p,
            measurements=tuple(
                dataclasses.replace(
                    m,
                    cost=p.unit_cost,
                    noise=calibrate(m.noise.sensitivity, p.unit_cost.epsilon, m.noise.granularity),
                )
                for m in p.measurements
            ),
        )


@pytest.fixture(scope="module")
def engines(audit_dir: Path) -> Iterator[dict[str, Engine]]:
    policy = load_policy(audit_dir / "policy.toml")
    built = {
        "correct": Engine(policy),
        "halved": HalvedSensitivity(policy),
        "avg_once": AvgChargedOnce(policy),
    }
    yield built
    for e in built.values():
        e.close()


def sample(engine: Engine, dataset: str, sql: str, n: int) -> list[list[list[object]]]:
    """``n`` released row sets, each from a fresh, charged request."""
    out = []
    for i in range(n):
        reply = engine.query(
            f"auditor-{dataset}-{i}",
            {"sql": sql, "dataset": dataset, "epsilon": EPSILON, "fresh": True},
        )
        assert reply["cost"]["epsilon"] == EPSILON and not reply["replayed"]
        out.append(reply["rows"])
    return out


def audit(
    engine: Engine,
    sql: str,
    event: Callable[[object], bool],
    pair: tuple[str, str] = ("d", "dp"),
    n: int = SAMPLES,
) -> AuditResult:
    d, d_prime = pair
    return epsilon_lower_bound(sample(engine, d, sql, n), sample(engine, d_prime, sql, n), event)


def _cells(rows: list[list[object]]) -> dict[object, object]:
    return {row[0]: row[1] for row in rows}


# Each case: the query, and the event fixed in advance from D's exact answer: a tail
# at or above it, where the likelihood ratio of the noise is largest.
CASES: dict[str, tuple[str, Callable[[object], bool]]] = {
    "count": ("SELECT COUNT(*) FROM t", lambda rows: rows[0][0] >= COUNT_D),
    "sum": ("SELECT SUM(x) FROM t", lambda rows: rows[0][0] >= SUM_D),
    # AVG is a noisy centred sum S and a noisy count N, released as CENTRE + S/N;
    # naming the count too releases it (the same measurement), and S is then
    # (AVG - CENTRE)·N, so the audit sees everything AVG spends.
    "avg": (
        "SELECT AVG(x) AS a, COUNT(x) AS c FROM t",
        lambda rows: (
            (rows[0][0] - CENTRE) * max(rows[0][1], 1) >= CENTRED_SUM_D - 1e-6
            and rows[0][1] >= COUNT_D
        ),
    ),
    "histogram": (
        "SELECT g, COUNT(*) AS n FROM t GROUP BY g",
        lambda rows: all(_cells(rows)[g] >= CELL_D[g] for g in range(GROUPS)),
    ),
    # A histogram of per-person values: persons by their rows. The worst unit is the one
    # person with GROUPS × ROWS rows (the load cap), in the last key on D, absent on D'.
    "per_person": (
        "SELECT n, COUNT(*) AS persons FROM (SELECT pid, COUNT(*) AS n FROM t GROUP BY pid) "
        "AS p GROUP BY n",
        lambda rows: _cells(rows)[GROUPS * ROWS] >= 1,
    ),
}


def _report(record_property, name: str, result: AuditResult) -> None:
    record_property(name, str(result))
    print(f"\naudit {name}: {result} (claimed ε = {EPSILON}, α = {ALPHA})")


@pytest.mark.parametrize("case", list(CASES))
def test_empirical_epsilon_stays_below_the_claim(engines, case, record_property):
    sql, event = CASES[case]
    result = audit(engines["correct"], sql, event)
    _report(record_property, case, result)
    assert result.epsilon_lower_bound < EPSILON, str(result)


def test_quantile_empirical_epsilon_stays_below_the_claim(engines, record_property):
    result = audit(
        engines["correct"],
        "SELECT MEDIAN(x) FROM t",
        lambda rows: rows[0][0] > 75,
        pair=("q", "qp"),
        n=QUANTILE_SAMPLES,
    )
    _report(record_property, "median", result)
    assert result.epsilon_lower_bound < EPSILON, str(result)


@pytest.mark.parametrize(
    ("case", "broken"),
    [
        ("count", "halved"),
        ("sum", "halved"),
        ("histogram", "halved"),
        ("per_person", "halved"),
        ("avg", "avg_once"),
        # AVG's centred sum (and count) noised for half their sensitivity.
        ("avg", "halved"),
    ],
)
def test_the_audit_flags_a_broken_variant(engines, case, broken, record_property):
    sql, event = CASES[case]
    result = audit(engines[broken], sql, event, n=BROKEN_SAMPLES)
    _report(record_property, f"{case} ({broken})", result)
    assert result.epsilon_lower_bound > EPSILON, str(result)


def test_replies_through_the_socket_match_the_in_process_path(
    engines, audit_dir, short_dir, record_property
):
    """The server adds nothing the in-process audit misses: socket samples follow the
    same distribution (two-sample KS at α) and their own bound stays below the claim."""
    sql, event = CASES["count"]
    gate = GateProcess(audit_dir / "policy.toml", f"unix:{short_dir / 'audit.sock'}")
    gate.start()
    try:
        client = Gate(gate.address)
        over_socket = {
            ds: [
                client.query(sql, epsilon=EPSILON, dataset=ds, fresh=True).rows
                for _ in range(SOCKET_SAMPLES)
            ]
            for ds in ("d", "dp")
        }
    finally:
        gate.stop()
    result = epsilon_lower_bound(over_socket["d"], over_socket["dp"], event)
    _report(record_property, "count over the socket", result)
    assert result.epsilon_lower_bound < EPSILON
    in_process = sample(engines["correct"], "d", sql, SOCKET_SAMPLES)
    test = ks_2samp([r[0][0] for r in over_socket["d"]], [r[0][0] for r in in_process])
    assert test.pvalue > ALPHA, test


# A release inside a query: the count of rows above a count released first. Both values
# are released (the stage's in the reply's ``stages``), so the event reads both: the
# stage's count at D's or above, and the query's count of the worst unit's rows
# (only they lie above 62) at theirs or above.
STAGED = "SELECT COUNT(*) FROM t WHERE x > (SELECT COUNT(*) FROM t)"
STAGED_BROKEN_SAMPLES = 800  # each sample two releases; twice the claim shows by far


def _staged_sample(engine: Engine, dataset: str, n: int) -> list[tuple[float, int]]:
    out = []
    for i in range(n):
        reply = engine.query(
            f"auditor-staged-{dataset}-{i}",
            {"sql": STAGED, "dataset": dataset, "epsilon": EPSILON, "fresh": True},
        )
        ((stage,),) = [reply["stages"]]
        out.append((stage["value"], reply["rows"][0][0]))
    return out


def _staged_event(out: object) -> bool:
    value, count = out  # type: ignore[misc]
    return value >= COUNT_D and count >= ROWS


def _staged_audit(engine: Engine, n: int) -> AuditResult:
    return epsilon_lower_bound(
        _staged_sample(engine, "d", n), _staged_sample(engine, "dp", n), _staged_event
    )


def test_a_staged_release_spends_no_more_than_it_claims(engines, record_property):
    """Its two releases take half the ε each; together they stay within the claim."""
    result = _staged_audit(engines["correct"], SAMPLES)
    _report(record_property, "staged", result)
    assert result.epsilon_lower_bound < EPSILON, str(result)


def test_the_audit_flags_a_staged_release_charged_as_one(engines, monkeypatch, record_property):
    """Broken on purpose: each stage spends the whole ε asked, as if the query were one
    release; the audit sees about twice the claim."""
    from dpmagic.gate import staged_releases

    monkeypatch.setattr(staged_releases, "shares", lambda stages: 1.0)
    result = _staged_audit(engines["correct"], STAGED_BROKEN_SAMPLES)
    _report(record_property, "staged (charged as one)", result)
    assert result.epsilon_lower_bound > EPSILON, str(result)


# ``--clip`` choosing the rows each person brings: D holds CLIP_PEOPLE persons of one
# row and the worst unit with the policy's CLIP_ROWS rows; the query's first release
# chooses twice the persons' 90th percentile, 2 rows, and its count then keeps 2 of the
# worst unit's 8. The claim covers both releases: the choice's share and the count's.
CLIP_PEOPLE, CLIP_ROWS, CLIP_SHARE = 2000, 8, 0.5
CLIP_SAMPLES, CLIP_BROKEN_SAMPLES = 400, 1000
CLIP_POLICY = """
[gate]
state_dir = "state"
response_quantum_ms = 0
"""
CLIP_DATASET = f"""
[datasets.{{name}}]
database = "{{name}}.duckdb"
privacy_unit = "pid"
max_partitions = 1
max_rows_per_partition = {CLIP_ROWS}
user_budget = {{{{ epsilon = 1e9 }}}}
notebook_budget = {{{{ epsilon = 1e9 }}}}

[datasets.{{name}}.tables.t.columns]
pid = {{{{ type = "int" }}}}
g = {{{{ type = "int", public_values = [0, 1, 2] }}}}
x = {{{{ type = "float", lower = 0, upper = {UPPER} }}}}
"""


class ChosenRowsNotEnforced(Engine):
    """Broken on purpose: the rows per person ``--clip`` chose calibrate the noise, but
    the SQL keeps the policy's rows (the plan of the dataset before it was tightened,
    with the tightened plan's noise)."""

    def analyse(self, dataset: Dataset, request: QueryRequest) -> Plan:
        chosen = super().analyse(dataset, request)
        policy = self._dataset(request.dataset)
        if dataset.max_rows_per_partition == policy.max_rows_per_partition:
            return chosen
        wide = super().analyse(policy, request)
        return dataclasses.replace(
            wide,
            measurements=tuple(
                dataclasses.replace(m, noise=c.noise)
                for m, c in zip(wide.measurements, chosen.measurements, strict=True)
            ),
        )


@pytest.fixture(scope="module")
def clip_engines() -> Iterator[dict[str, Engine]]:
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else None
    with tempfile.TemporaryDirectory(prefix="dpm-audit-clip-", dir=base) as folder:
        root = Path(folder)
        people = [(i, i % 3, VALUE) for i in range(CLIP_PEOPLE)]
        _write_db(root / "c.duckdb", people + [(WORST, 0, UPPER)] * CLIP_ROWS)
        _write_db(root / "cp.duckdb", people)
        text = CLIP_POLICY + "".join(CLIP_DATASET.format(name=n) for n in ("c", "cp"))
        (root / "policy.toml").write_text(text)
        policy = load_policy(root / "policy.toml")
        built = {"correct": Engine(policy), "unenforced": ChosenRowsNotEnforced(policy)}
        yield built
        for e in built.values():
            e.close()


def _clip_sample(engine: Engine, dataset: str, n: int) -> list[list[list[object]]]:
    out = []
    for i in range(n):
        reply = engine.query(
            f"auditor-clip-{dataset}-{i}",
            {"sql": "SELECT COUNT(*) FROM t", "dataset": dataset, "epsilon": EPSILON,
             "fresh": True, "clip": CLIP_SHARE},
        )  # fmt: skip
        assert reply["clip"]["rows"]["rows"] == 2, reply["clip"]  # the choice the audit is of
        out.append(reply["rows"])
    return out


def _clip_audit(engine: Engine, n: int) -> AuditResult:
    return epsilon_lower_bound(
        _clip_sample(engine, "c", n),
        _clip_sample(engine, "cp", n),
        lambda rows: rows[0][0] >= CLIP_PEOPLE + 2,
    )


def test_rows_chosen_by_clip_spend_no_more_than_claimed(clip_engines, record_property):
    result = _clip_audit(clip_engines["correct"], CLIP_SAMPLES)
    _report(record_property, "clip rows", result)
    assert result.epsilon_lower_bound < EPSILON, str(result)


def test_the_audit_flags_clip_rows_the_sql_does_not_keep(clip_engines, record_property):
    """The worst unit's 8 rows counted under noise for 2: about 4 × the count's share."""
    result = _clip_audit(clip_engines["unenforced"], CLIP_BROKEN_SAMPLES)
    _report(record_property, "clip rows (not enforced)", result)
    assert result.epsilon_lower_bound > EPSILON, str(result)
