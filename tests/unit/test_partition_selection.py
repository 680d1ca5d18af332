"""Private GROUP BY keys through DP partition selection.

The threshold's calibration is checked against OpenDP's own privacy map; the
noisy rule against the exact discrete Laplace tail (and OpenDP's measurement
against the same tail), with a mis-scaled variant caught; the counts it is
applied to, and every measurement over the kept keys, against brute force on
neighbouring datasets; and the whole path through the engine: refusals that
say what to change, rare keys never released, common ones always, a cost
that does not depend on the data, the dry run and the reply showing the
threshold and δ.
"""

from __future__ import annotations

import math
from dataclasses import replace

import duckdb
import opendp.prelude as dp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy import stats

from dpmagic.display.result import DPResult
from dpmagic.display.schema import SchemaView
from dpmagic.gate.dp.accounting import ApproxAccountant
from dpmagic.gate.dp.partition_selection import KeySelection, calibrate_selection
from dpmagic.gate.engines.duckdb import database
from dpmagic.gate.engines.interface import ExactResult
from dpmagic.gate.failures import Refused
from dpmagic.gate.sql.bound import bound
from dpmagic.gate.sql.check import check
from dpmagic.gate.sql.noise import exact_vectors, noise
from dpmagic.gate.sql.parse import parse
from dpmagic.gate.sql.plan import plan
from dpmagic.gate.sql.plan_types import Plan
from dpmagic.gate.sql.resolve import resolve
from dpmagic.gate.sql.rewrite import KEY_COUNT, rewrite
from tests.cities import cities_engine, city_rows
from tests.gate_helpers import dataset, load_table, neighbours, run_rewritten

dp.enable_features("contrib")

# --- calibration against OpenDP's map --------------------------------------------


def _opendp_map(scale: float, threshold: int, l0: int, linf: int) -> tuple[float, float]:
    m = dp.m.make_laplace_threshold(
        dp.map_domain(dp.atom_domain(T="i64"), dp.atom_domain(T="i64")),
        dp.l01inf_distance(dp.absolute_distance(T="i64")),
        scale=scale,
        threshold=threshold,
    )
    return m.map((l0, l0 * linf, linf))


@pytest.mark.parametrize(
    ("l0", "epsilon", "delta"), [(1, 0.5, 1e-6), (4, 0.1, 1e-6), (8, 1.0, 1e-9), (2, 3.0, 1e-3)]
)
def test_threshold_is_the_least_opendp_proves_within_the_share(l0, epsilon, delta):
    ks = calibrate_selection(l0, 1, epsilon, delta)
    eps, dlt = _opendp_map(ks.scale, ks.threshold, l0, 1)
    assert eps <= epsilon and dlt <= delta
    assert (ks.epsilon, ks.delta) == (eps, dlt)
    # One less would not do: the threshold is as low as the share allows.
    assert _opendp_map(ks.scale, ks.threshold - 1, l0, 1)[1] > delta
    assert ks.scale == pytest.approx(l0 / epsilon, rel=1e-9)


def test_no_delta_no_private_keys():
    with pytest.raises(Refused, match="δ > 0"):
        calibrate_selection(1, 1, 1.0, 0.0)


# --- the noisy rule, statistically ---------------------------------------------


def _release_probability(count: int, scale: float, threshold: int) -> float:
    """P(count + Z >= threshold) for Z discrete Laplace of ``scale``:
    P(Z = k) = tanh(1/(2·scale)) · exp(-|k|/scale)."""
    r = math.exp(-1 / scale)
    norm = (1 - r) / (1 + r)
    need = threshold - count  # Z >= need
    if need <= 0:
        return 1 - norm * r ** (-need + 1) / (1 - r)  # 1 - P(Z <= need - 1)
    return norm * r**need / (1 - r)


COUNTS = [2, 5, 8, 10, 12, 15, 18]
DRAWS = 3000


def _frequencies(ks: KeySelection) -> list[float]:
    """Release frequency of each count in COUNTS over DRAWS draws of the gate's rule."""
    hits = [0] * len(COUNTS)
    for _ in range(DRAWS // 100):
        kept = ks.keep(COUNTS * 100)  # 700 keys a call: OpenDP's sampler, not the fast one
        for i, k in enumerate(kept):
            hits[i % len(COUNTS)] += k
    return [h / DRAWS for h in hits]


def _agrees(freqs: list[float], scale: float, threshold: int) -> bool:
    """Every frequency within its binomial two-sided α = 1e-4 acceptance region around
    the exact tail; over 7 counts a correct rule fails with probability < 7e-4."""
    for count, f in zip(COUNTS, freqs, strict=True):
        p = _release_probability(count, scale, threshold)
        lo, hi = stats.binom.interval(1 - 1e-4, DRAWS, p)
        if not lo <= f * DRAWS <= hi:
            return False
    return True


def test_release_rule_matches_the_discrete_laplace_tail():
    ks = KeySelection(l0=1, linf=1, scale=3.0, threshold=10, epsilon=1 / 3, delta=0.0)
    assert _agrees(_frequencies(ks), ks.scale, ks.threshold)


def test_opendp_measurement_follows_the_same_tail():
    """OpenDP's own ``make_laplace_threshold``, with the same rule (>=) and noise."""
    m = dp.m.make_laplace_threshold(
        dp.map_domain(dp.atom_domain(T="i64"), dp.atom_domain(T="i64")),
        dp.l01inf_distance(dp.absolute_distance(T="i64")),
        scale=3.0,
        threshold=10,
    )
    hits = [0] * len(COUNTS)
    for _ in range(DRAWS // 100):
        data = {i: COUNTS[i % len(COUNTS)] for i in range(len(COUNTS) * 100)}
        for key in m(data):
            hits[key % len(COUNTS)] += 1
    assert _agrees([h / DRAWS for h in hits], 3.0, 10)


def test_a_mis_scaled_threshold_is_caught():
    """Half the scale the privacy map assumed: the same test rejects it."""
    broken = KeySelection(l0=1, linf=1, scale=1.5, threshold=10, epsilon=1 / 3, delta=0.0)
    assert not _agrees(_frequencies(broken), 3.0, 10)


# --- brute force on neighbouring datasets ----------------------------------------

COLUMNS = {
    "pid": {"type": "int"},
    "s": {"type": "str", "max_length": 64},
    "g": {"type": "int", "public_values": [0, 1]},
    "x": {"type": "int", "lower": -3, "upper": 5},
}
ORDER = ["pid", "s", "g", "x"]
QUERIES = [
    "SELECT s, COUNT(*) FROM t GROUP BY s",
    "SELECT s, g, SUM(x), AVG(x) FROM t GROUP BY s, g",
    "SELECT s, COUNT(DISTINCT pid), COUNT(DISTINCT x) FROM t WHERE x > -2 GROUP BY s",
    "SELECT s, MEDIAN(x), VAR_POP(x) FROM t GROUP BY s",
    "SELECT COALESCE(s, 'none') AS k, COUNT(x) FROM t GROUP BY k",
]
row = st.tuples(
    st.sampled_from(["a", "b", "c", None]),
    st.sampled_from([0, 1, None]),
    st.one_of(st.none(), st.integers(-6, 8)),
)
unit_rows = st.lists(row, min_size=0, max_size=5)


def _approx_plan(sql: str, ds) -> Plan:
    return plan(bound(check(resolve(parse(sql), ds))), 1.0, 1e-6, ApproxAccountant())


def _names(p: Plan) -> tuple[str, ...]:
    """Every measurement and selection, then the threshold's count (each a column of
    the two-column SQL)."""
    return (*(m.name for m in p.measurements), *(s.name for s in p.selections), KEY_COUNT)


def _by_key(p: Plan, con: duckdb.DuckDBPyConnection, seed: int) -> dict[tuple, tuple]:
    """Each kept key's exact values, measurements in their noise's units (a centred sum
    as ``noise.exact_units`` computes it), in ``_names``' order."""
    rw, exact = run_rewritten(p, con, seed)
    keys = tuple(tuple(r[: rw.keys]) for r in exact.rows)
    units, histograms = exact_vectors(p, rw, exact.rows, keys)
    values = {**units, **histograms}
    threshold = rw.keys + rw.measurements.index(KEY_COUNT)
    return {
        key: (*(values[name][j] for name in _names(p)[:-1]), r[threshold])
        for j, (key, r) in enumerate(zip(keys, exact.rows, strict=True))
    }


@pytest.mark.search
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    per_unit=st.lists(unit_rows, min_size=1, max_size=4),
    replacement=unit_rows,
    query=st.sampled_from(QUERIES),
    neighbouring=st.sampled_from(["add_remove", "substitute"]),
    user_level=st.booleans(),
    max_partitions=st.integers(1, 3),
    max_rows=st.integers(1, 3),
    seed=st.integers(0, 2**62),
)
def test_selection_counts_and_measurements_within_their_bounds(
    per_unit, replacement, query, neighbouring, user_level, max_partitions, max_rows, seed
):
    ds = dataset(
        COLUMNS,
        unit="pid" if user_level else None,
        neighbouring=neighbouring,
        max_partitions=max_partitions,
        max_rows=max_rows,
    )
    p = _approx_plan(query, ds)
    ks = p.key_selection
    assert ks is not None and p.partitions == ()
    names = list(_names(p))
    con = duckdb.connect()
    rows = [(pid, *r) for pid, rs in enumerate(per_unit, start=1) for r in rs]
    load_table(con, "t", ORDER, rows)
    base = _by_key(p, con, seed)
    for kept in neighbours(rows, len(per_unit), user_level, neighbouring, replacement):
        load_table(con, "t", ORDER, kept)
        other = _by_key(p, con, seed)
        keys = set(base) | set(other)
        # The threshold's counts: at most l0 keys move, each by at most linf.
        col = names.index(KEY_COUNT)
        moves = [abs(_at(base, k, col) - _at(other, k, col)) for k in keys]
        assert sum(1 for m in moves if m) <= ks.l0, (query, moves)
        assert max(moves, default=0) <= ks.linf, (query, moves)
        # Each measurement over whichever keys are kept: within its sensitivity.
        for m in p.measurements:
            i = names.index(m.name)
            assert sum(abs(_at(base, k, i) - _at(other, k, i)) for k in keys) <= (
                m.noise.sensitivity
            ), (query, m.label)
        for s in p.selections:
            i = names.index(s.name)
            moved = sum(_symmetric(_hist(base, k, i), _hist(other, k, i)) for k in keys)
            assert moved <= s.sensitivity, (query, s.label)


def _at(rows: dict[tuple, tuple], key: tuple, i: int) -> int:
    return int(rows[key][i] or 0) if key in rows else 0


def _hist(rows: dict[tuple, tuple], key: tuple, i: int) -> dict:
    return dict(rows[key][i] or {}) if key in rows else {}


def _symmetric(a: dict, b: dict) -> int:
    return sum(abs(a.get(k, 0) - b.get(k, 0)) for k in set(a) | set(b))


def test_a_unit_in_many_keys_reaches_only_max_partitions_of_them():
    """The worst case: one unit with a row under each of ten keys."""
    ds = dataset(COLUMNS, max_partitions=3, max_rows=2)
    p = _approx_plan("SELECT s, COUNT(*) FROM t GROUP BY s", ds)
    con = duckdb.connect()
    load_table(con, "t", ORDER, [(1, f"k{i}", 0, 1) for i in range(10)])
    counts = _by_key(p, con, seed=7)
    assert p.key_selection is not None and p.key_selection.l0 == 3
    assert len(counts) == 3  # the unit reaches three keys, once each


def test_a_self_join_cannot_multiply_a_unit_s_reach():
    """A unit with rows under five keys, joined with itself (25 rows): after the join it
    still counts once in at most ``max_partitions`` keys, and every sum within bounds."""
    ds = dataset(COLUMNS, max_partitions=2, max_rows=2)
    p = _approx_plan(
        "SELECT a.s, COUNT(*), SUM(b.x) FROM t AS a JOIN t AS b ON a.pid = b.pid GROUP BY a.s",
        ds,
    )
    rw = rewrite(p, seed=11)
    con = duckdb.connect()
    others = [(pid, "a", 0, 1) for pid in range(2, 6)]
    load_table(con, "t", ORDER, others + [(1, f"k{i}", 0, 5) for i in range(5)])
    with_unit = _by_key(p, con, seed=11)
    load_table(con, "t", ORDER, others)
    without = _by_key(p, con, seed=11)
    assert p.key_selection is not None
    names = list(rw.measurements)
    for i, name in enumerate(names):
        moved = [
            abs(_at(with_unit, k, i) - _at(without, k, i)) for k in set(with_unit) | set(without)
        ]
        if name == KEY_COUNT:
            assert sum(1 for m in moved if m) <= p.key_selection.l0 and max(moved) == 1
        else:
            assert sum(moved) <= p.measurement(name).noise.sensitivity


SEMANTIC_QUERIES = [
    "SELECT s, COUNT(*), SUM(x) FROM t GROUP BY s",
    "SELECT UPPER(s) || '-' || g AS k, COUNT(x), SUM(x) FROM t WHERE LENGTH(s) >= 1 GROUP BY k",
    "SELECT s, g, COUNT(*) FILTER (WHERE x > 0) FROM t WHERE g = 1 OR x < 0 GROUP BY s, g",
]


@pytest.mark.search
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    rows=st.lists(
        st.tuples(
            st.integers(1, 5),
            st.sampled_from(["a", "b", "c", None]),
            st.sampled_from([0, 1, None]),
            st.one_of(st.none(), st.integers(-3, 5)),  # within bounds: nothing is clamped
        ),
        max_size=12,
    ),
    query=st.sampled_from(SEMANTIC_QUERIES),
)
def test_private_key_sql_computes_what_the_query_says(rows, query):
    """With bounds wide enough to keep every row, each key's exact values are DuckDB's
    own for the analyst's query (NULL keys are never released)."""
    # Bounds loose enough to keep every row: so is the work one unit may add.
    wide = replace(dataset(COLUMNS, max_partitions=100, max_rows=100), max_unit_work=2**40)
    p = _approx_plan(query, wide)
    con = duckdb.connect()
    load_table(con, "t", ORDER, rows)
    ours = _by_key(p, con, seed=5)
    keys = len(p.keys)
    expected = {
        tuple(r[:keys]): tuple(v or 0 for v in r[keys:])
        for r in con.execute(query).fetchall()
        if None not in r[:keys]
    }
    got = {k: tuple(x or 0 for x in v[: len(p.measurements)]) for k, v in ours.items()}
    assert got == expected


# --- through the engine ----------------------------------------------------------


@pytest.fixture
def city_engine(tmp_path):
    e = cities_engine(tmp_path / "a", city_rows("Ogdenville"))
    yield e
    e.close()


@pytest.fixture(scope="module")
def refusing_city_engine(tmp_path_factory):
    """``city_engine``'s gate, one for the module's refusals and its schema: they charge
    nothing (each refusal checks it), so they need no engine of their own."""
    e = cities_engine(tmp_path_factory.mktemp("refusing"), city_rows("Ogdenville"))
    yield e
    e.close()


def test_common_keys_are_released_and_a_lone_unit_s_key_never(city_engine):
    sql = "SELECT city, COUNT(*) AS n, AVG(age) AS a FROM t GROUP BY city ORDER BY city"
    for i in range(10):
        reply = city_engine.query("alice", {"sql": sql, "notebook": "nb", "fresh": True})
        assert [r[0] for r in reply["rows"]] == ["Shelbyville", "Springfield"], i
        assert reply["cost"] == {"epsilon": 1.0, "delta": 1e-6}
        chosen = reply["accuracy"]["partition_selection"]
        assert chosen["mechanism"] == "laplace_threshold" and chosen["threshold"] > 2
        assert chosen["delta"] <= 1e-6 / 4  # its share of δ: threshold, sum, two counts
        n = reply["rows"][0][1]
        assert abs(n - 600) < 200


def test_the_cost_and_threshold_do_not_depend_on_the_data(tmp_path):
    sql = "SELECT city, COUNT(*) FROM t GROUP BY city"
    replies = []
    for name, rows in (("a", city_rows("Ogdenville")), ("b", city_rows(None)[:40])):
        e = cities_engine(tmp_path / name, rows)
        try:
            replies.append(e.query("alice", {"sql": sql, "notebook": "nb"}))
        finally:
            e.close()
    a, b = replies
    assert a["cost"] == b["cost"] and a["plan"] == b["plan"]
    assert a["accuracy"]["partition_selection"] == b["accuracy"]["partition_selection"]
    assert b["rows"] == []  # 20 persons a city: below the threshold; an empty answer, no error


def test_dry_run_shows_the_threshold_and_charges_nothing(city_engine):
    reply = city_engine.query(
        "alice", {"sql": "SELECT city, SUM(age) FROM t GROUP BY city", "dry_run": True}
    )
    step = next(s for s in reply["plan"] if s["kind"] == "partition_selection")
    assert step["mechanism"] == "laplace_threshold" and step["threshold"] > 2
    assert step["cost"]["delta"] > 0 and step["keys"][0]["public"] is False
    assert step["keys"][0]["source"] == "DP partition selection"
    assert reply["budget"]["user"]["spent"]["epsilon"] == 0
    text = repr(DPResult(reply))
    assert "city (private: kept if noisy units ≥" in text and "laplace_threshold" in text


def test_the_footer_says_how_keys_were_chosen(city_engine):
    reply = city_engine.query("alice", {"sql": "SELECT city, COUNT(*) FROM t GROUP BY city"})
    footer = DPResult(reply).footer()
    threshold = reply["accuracy"]["partition_selection"]["threshold"]
    assert f"kept where noisy units ≥ {threshold}" in footer


@pytest.mark.parametrize(
    ("accountant", "delta", "reason"),
    [
        ("pure", 0.0, "accountant is pure"),
        ("approx", 0.0, "ask with a δ > 0"),
        ("zcdp", 1e-6, "needs the approx accountant"),
    ],
)
def test_private_keys_without_a_delta_to_spend_are_refused(tmp_path, accountant, delta, reason):
    e = cities_engine(tmp_path, city_rows(None), accountant=accountant, delta=delta)
    try:
        with pytest.raises(Refused, match=reason) as info:
            e.query("alice", {"sql": "SELECT city, COUNT(*) FROM t GROUP BY city"})
        assert "declare public_values for 'city'" in str(info.value)
        assert e.budget("alice", None, "unnamed")["user"]["spent"]["epsilon"] == 0
    finally:
        e.close()


def test_accuracy_first_is_refused_with_private_keys(refusing_city_engine):
    with pytest.raises(Refused, match="ask with ε and δ"):
        refusing_city_engine.query(
            "alice", {"sql": "SELECT city, COUNT(*) FROM t GROUP BY city", "accuracy": 50}
        )


def test_grouping_by_the_unit_stays_refused(refusing_city_engine):
    with pytest.raises(Refused, match="privacy unit"):
        refusing_city_engine.query("alice", {"sql": "SELECT pid, COUNT(*) FROM t GROUP BY pid"})


def test_schema_says_which_columns_can_be_private_keys(refusing_city_engine):
    uses = {row[0]: row[4] for _, _, rows in SchemaView(refusing_city_engine.schema(None))._tables()
            for row in rows}  # fmt: skip
    assert "DP partition selection" in uses["city"]
    assert uses["pid"].startswith("privacy unit")


def test_text_functions_make_private_keys(city_engine):
    sql = (
        "SELECT LOWER(SUBSTRING(city, 1, 5)) || '…' AS c, COUNT(*) AS n FROM t "
        "WHERE LENGTH(TRIM(city)) > 3 AND UPPER(LEFT(city, 1)) = 'S' GROUP BY c ORDER BY c"
    )
    reply = city_engine.query("alice", {"sql": sql})
    assert [r[0] for r in reply["rows"]] == ["shelb…", "sprin…"]
    clamped = city_engine.query("alice", {"sql": "SELECT SUM(LEAST(LENGTH(city), 20)) FROM t"})
    assert clamped["plan"][0]["bounds"] == [0, 20]
    # Text is cut to its max_length at load (64 here), which bounds LENGTH.
    whole = city_engine.query("alice", {"sql": "SELECT SUM(LENGTH(city)) FROM t"})
    assert whole["plan"][0]["bounds"] == [0, 64]


@pytest.mark.parametrize(
    ("sql", "reason"),
    [
        ("SELECT UPPER(age) AS a, COUNT(*) FROM t GROUP BY a", "needs a text column"),
        ("SELECT SUBSTRING(city, age, 2) AS a, COUNT(*) FROM t GROUP BY a", "integer literals"),
        ("SELECT RIGHT(city, 2.5) AS a, COUNT(*) FROM t GROUP BY a", "integer literals"),
        ("SELECT COUNT(*) FROM t WHERE UPPER(city) = 5", "compares number with text"),
        ("SELECT LEFT(city, 9223372036854775807) AS a, COUNT(*) FROM t GROUP BY a", "within"),
        ("SELECT SUBSTRING(city, 4294967296, 2) AS a, COUNT(*) FROM t GROUP BY a", "within"),
        ("SELECT COUNT(*) FROM t WHERE LENGTH(city) + UPPER(city) > 1", "arithmetic needs"),
    ],
)
def test_text_functions_that_could_fail_are_refused(refusing_city_engine, sql, reason):
    with pytest.raises(Refused, match=reason):
        refusing_city_engine.query("alice", {"sql": sql})
    assert refusing_city_engine.budget("alice", None, "unnamed")["user"]["spent"]["epsilon"] == 0


def test_a_randomized_response_key_is_not_grouped_with_private_keys():
    """Debiasing a count needs every value of the column in each group, which keys
    chosen from the data cannot promise; a mean over it debiases within its key."""
    columns = {
        **COLUMNS,
        "smoker": {"type": "int", "public_values": [0, 1], "randomized_response": {"p": 0.75}},
    }
    ds = dataset(columns)
    with pytest.raises(Refused, match="only be grouped with public keys"):
        _approx_plan("SELECT s, smoker, COUNT(*) FROM t GROUP BY s, smoker", ds)
    p = _approx_plan("SELECT s, AVG(smoker) FROM t GROUP BY s", ds)
    assert p.key_selection is not None and p.debiased


def test_the_fetch_thresholds_batch_by_batch(city_engine, monkeypatch):
    """With private keys only kept keys are held: ``keep`` sees each batch as fetched."""
    monkeypatch.setattr(database, "BATCH_ROWS", 2)
    batches: list[int] = []

    def keep(rows: list[tuple]) -> list[tuple]:
        batches.append(len(rows))
        return rows[:1]

    exact = city_engine.databases["d"].run("SELECT city, COUNT(*) FROM t GROUP BY city", keep)
    assert batches == [2, 1] and len(exact.rows) == 2 and exact.thresholded


def test_the_threshold_is_drawn_once():
    """A result thresholded while fetched is not thresholded again by the noise pass
    (a second draw would be a second mechanism, uncharged); one that was not, is."""
    p = _approx_plan("SELECT s, COUNT(*) FROM t GROUP BY s", dataset(COLUMNS))
    rw = rewrite(p, seed=1)
    lone = [(f"k{i}", 1, 1) for i in range(50)]  # one unit per key: far below the threshold
    kept = noise(p, rw, ExactResult(rows=lone, thresholded=True))
    assert len(kept.partitions) == 50
    assert noise(p, rw, ExactResult(rows=lone)).partitions == ()
