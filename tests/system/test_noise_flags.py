"""What a user sees flagged, per aggregate kind, on a real gate over a socket.

For each kind (COUNT, SUM, AVG, VARIANCE/STDDEV, MEDIAN and MIN/MAX, arithmetic,
HAVING) a clearly noisy case (a handful of rows, or a small ε) and a clearly
accurate one (all 200 people of ``tests/conftest.py``'s dataset at a larger ε) go
through the client; the flag is read as the user reads it: ``DPResult``'s verdicts
and the words in its text view. A gate-side change that breaks one fails here.

A noisy case is asked ``TRIES`` times and must be flagged in all but one: the rule
flags a count of true value 0 unless its noise exceeds twice its 95% half-width,
which happens once in 800 answers (0.5 · 20⁻²). The accurate cases' ε were chosen
from 40 to 100 answers each in an engine in process: the widest interval seen was at
most a third of the width that flags (a grouped AVG at ε 0.3 came within reach of
it, 3 flags in 80 cells, so it is asked at ε 1).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from dpmagic.client.http_gate import Gate
from dpmagic.display.render import format_value

TRIES = 5
FEW = "WHERE age < 23"  # ages run 20..79: 10 of the 200 people


def _flags(gate, sql: str, column: str, epsilon: float, notebook: str) -> list[bool | None]:
    result = Gate(gate.address).query(sql, epsilon=epsilon, notebook=notebook, fresh=True)
    return result.noise_dominates(column)


def _noisy(gate, sql: str, column: str, epsilon: float) -> None:
    """Flagged (or "may dominate") in at least ``TRIES - 1`` of ``TRIES`` answers."""
    flagged = 0
    for i in range(TRIES):
        flags = _flags(gate, sql, column, epsilon, f"noisy-{i}")
        flagged += all(f is not False for f in flags)
    assert flagged >= TRIES - 1, (sql, flagged)


def _accurate(gate, sql: str, column: str, epsilon: float, notebook: str = "accurate") -> None:
    assert _flags(gate, sql, column, epsilon, notebook) == [False] * (
        2 if "GROUP BY" in sql else 1
    ), sql


def test_counts_sums_and_their_arithmetic(gate):
    _noisy(gate, f"SELECT COUNT(*) AS n FROM t {FEW}", "n", 0.02)
    _accurate(gate, "SELECT COUNT(*) AS n FROM t", "n", 0.2)
    _noisy(gate, f"SELECT SUM(age) AS s FROM t {FEW}", "s", 0.02)
    _accurate(gate, "SELECT SUM(age) AS s FROM t", "s", 0.3)
    # a ratio of two noisy aggregates, and a difference that is 0 give or take its noise
    _accurate(gate, "SELECT SUM(age) / COUNT(*) AS r FROM t", "r", 1.0)
    _noisy(gate, "SELECT AVG(age) - 49.5 AS d FROM t", "d", 0.02)
    # HAVING keeps both groups of 100 people; their counts are facts
    _accurate(gate, "SELECT sex, COUNT(*) AS n FROM t GROUP BY sex HAVING COUNT(*) > 20", "n", 0.2)


def test_averages_variances_and_standard_deviations(gate):
    """The issue's AVG of a handful of rows: a value anywhere in its bounds is flagged."""
    _noisy(gate, f"SELECT AVG(age) AS a FROM t {FEW}", "a", 0.05)
    _accurate(gate, "SELECT AVG(age) AS a FROM t", "a", 0.3)
    _accurate(gate, "SELECT sex, AVG(age) AS a FROM t GROUP BY sex", "a", 1.0)
    _noisy(gate, f"SELECT STDDEV(age) AS sd FROM t {FEW}", "sd", 0.05)
    # Judged on the interval its count's lower end allows (``judged_wider``): at ε 0.5
    # that flagged 11 of 400 answers in process, at ε 1 none of 400 (a notebook of its
    # own: the other two took 1.3 of the notebook budget's 2).
    _accurate(gate, "SELECT VAR_POP(age) AS v FROM t", "v", 1.0, "accurate-variance")
    result = Gate(gate.address).query(f"SELECT AVG(age) AS a FROM t {FEW}", epsilon=0.01)
    assert "(noise dominates)" in repr(result) and "noise dominates 1 cell" in result.footer()


def test_quantiles_are_judged_from_the_count_of_their_argument(gate):
    _noisy(gate, f"SELECT COUNT(age) AS n, MEDIAN(age) AS m FROM t {FEW}", "m", 0.1)
    # At ε = 1 its interval's ends, with less of the ε, cannot fit in 200 values and
    # fall back to the declared [0, 100]: flagged by its range, however narrow its band
    # (200 of 200 draws; at ε = 2, below, none).
    sql = "SELECT COUNT(age) AS n, MEDIAN(age) AS m FROM t"
    assert _flags(gate, sql, "m", 1.0, "edges") == [True]
    _accurate(gate, "SELECT COUNT(age) AS n, MIN(age) AS lo FROM t", "lo", 0.8)
    # without a count of the same values the gate adds one, and judges by it
    _noisy(gate, f"SELECT MEDIAN(age) AS m FROM t {FEW}", "m", 0.1)
    result = Gate(gate.address).query("SELECT MEDIAN(age) AS m FROM t", epsilon=2)
    assert [s["aggregate"] for s in result.plan if s.get("kind") == "count"] == ["COUNT(age)"]
    assert result.noise_dominates("m") == [False]
    # its accuracy reads in the column's units, and in the group's percentiles: 200
    # ages over 20..79, each end's level about 0.24 from the median's and its radius
    # 39 ranks (0.2 of the group): narrower than the declared [0, 100] unless both
    # ends strayed past their radius (below 1 in 3,600)
    (value,) = result.df["m"].tolist()
    (low, high), *_ = result.interval("m")[["lower", "upper"]].values.tolist()
    assert 0 <= low <= value <= high <= 100 and high - low < 100
    assert f"[{format_value(low)}, {format_value(high)}]" in repr(result)
    (a, b), *_ = result.percentiles("m")[["lower", "upper"]].values.tolist()
    assert 0.3 < a < 0.5 < b < 0.7


def test_the_dry_run_warns_before_anything_is_spent(gate):
    result = Gate(gate.address).query(
        "SELECT sex, AVG(age) AS a, MEDIAN(age) AS m FROM t GROUP BY sex", epsilon=0.5, dry_run=True
    )
    assert result.budget["user"]["spent"]["epsilon"] == 0.0
    text = repr(result)
    assert "a = AVG(age)" in text and "for a group of 100 rows" in text
    footer = result.footer()
    # AVG(age)'s count is a count of the median's values too: both judged
    assert "noise may dominate: a in groups under" in footer and "m in groups under" in footer
    alone = Gate(gate.address).query(
        "SELECT sex, MEDIAN(age) AS m FROM t GROUP BY sex", epsilon=0.5, dry_run=True
    )
    assert "m in groups under" in alone.footer()  # judged by the count the gate adds


def _misleading_cells():
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "misleading_cells.py"
    spec = importlib.util.spec_from_file_location("misleading_cells", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


RUNS = 100


def test_no_cell_of_a_real_dataset_is_misleading():
    """benchmarks/misleading_cells.py at ``RUNS`` runs of each query (16,700 cells) on
    statsmodels' ``fair`` survey: no cell the noise clearly dominates is unflagged, no
    clearly sound cell is flagged. The margins are the benchmark's (1.5× past the
    rule's threshold, a fifth of it). The truth's noise is measured from the runs
    themselves, so they must be many: at 20 runs, 4 of 14 found a cell judged against a
    95th percentile of 20 errors; at 100 runs (20 s at load 1-3) the flagged-but-sound
    count was 0 in 14 of 14, after the margin became a fifth (at a quarter, a ratio whose
    noise is 0.37 of its value and whose Bonferroni interval is 1.23 times that noise
    was judged sound in 1 of 3)."""
    pytest.importorskip("statsmodels")
    bench = _misleading_cells()
    tallies = bench.run(runs=RUNS)
    total = bench.Tally()
    for tally in tallies.values():
        total.add(tally)
    # Every query releases a fixed set of cells but the HAVING, whose 6 empty groups of
    # 12 pass `COUNT(*) > 20` when their noise (discrete Laplace, scale 2) reaches 21:
    # e**-10.5 / (1 + e**-0.5) = 1.7e-5 each time, 0.01 in the 600 chances of a run
    # (seen once in a loop of 20 runs). Three or more is below 2e-7; its smallest kept
    # group (48 rows) falling to 20 is below 1e-4 a run.
    having = tallies["HAVING over a noisy count"].cells
    assert RUNS * 6 <= having <= RUNS * 6 + 2
    assert total.cells - having == RUNS * 161
    # An interval can come out narrower than its noise's usual spread by luck (the
    # 41-row average or standard deviation, about once in 1,100 answers): the gate
    # judges averages and variances by their plan's error too, bare or with a constant
    # added. In 12 runs of this test (200,400 cells) no clearly dominated cell was left
    # unflagged; a 13th found a 41-row AVG(age) - 30 unflagged, before that widening
    # reached averages under arithmetic (then 300 runs, 50,100 cells: 0 and 0).
    assert total.unflagged_dominated == 0, total.examples
    assert total.flagged_sound == 0, total.examples
    # the intervals miss at about their 5% (1,900 of 33,400 at 200 runs)
    assert total.missed < 0.1 * total.cells
    # a quantile's interval in units holds its true quantile (95%; none missed in
    # 200 runs, 6,000 quantile cells): 1% of all cells is 3,000 times that
    assert total.units_missed < 0.01 * total.cells


def test_quantiles_of_one_column_come_out_in_order(gate):
    """A handful of rows at a small ε: each quantile's draw is near random, and before
    the gate sorted them every one of 40 such rows (20 answers) had a quantile out of
    order (the issue's q25 87 > median 74 > q75 49). Now every row is in order, each
    value within the interval shown beside it."""
    sql = (
        "SELECT sex, MIN(age) AS lo, QUANTILE_CONT(age, 0.25) AS q25, MEDIAN(age) AS m, "
        f"QUANTILE_CONT(age, 0.75) AS q75, MAX(age) AS hi FROM t {FEW} GROUP BY sex"
    )
    names = ["lo", "q25", "m", "q75", "hi"]
    for i in range(TRIES):
        result = Gate(gate.address).query(sql, epsilon=0.1, notebook=f"order-{i}", fresh=True)
        for row in result.df[names].values.tolist():
            assert row == sorted(row), row
        for name in names:
            frame = result.interval(name)
            values = result.df[name]
            assert ((frame["lower"] <= values) & (values <= frame["upper"])).all(), name


def test_a_flag_and_the_interval_it_was_judged_on_agree_on_screen(gate):
    """Every flagged average is flagged by the interval the user reads beside it: the
    one shown covers half the range [0, 100], or the words beside the flag give the
    wider one it was judged on, which does (the issue's ``33.06 [19.77, 43.49] noise
    dominates`` showed neither). Groups of 100 people at ε = 0.2: their intervals
    come out narrower than half the range, but their count's interval reaches far
    below 100 rows (in 20 answers, 38 of 40 cells were flagged, 37 of them on a wider
    interval than shown): at least one of ``TRIES`` answers' 10 cells must be one.
    Before the gate sent the wider interval, the words beside the flag did not give
    it and this test fails."""
    sql = "SELECT sex, AVG(age) AS a FROM t GROUP BY sex"
    widened = 0
    for i in range(TRIES):
        result = Gate(gate.address).query(sql, epsilon=0.2, notebook=f"agree-{i}", fresh=True)
        lines = repr(result).splitlines()[1:3]
        frame = result.interval("a")
        for line, flag, lo, hi in zip(
            lines, result.noise_dominates("a"), frame["lower"], frame["upper"], strict=True
        ):
            if not flag or hi - lo >= 50:
                continue
            judged = line.split("judged on [", 1)[1].split("]", 1)[0]
            a, b = (float(x) for x in judged.split(", "))
            assert b - a >= 50 and a <= lo and hi <= b, line
            widened += 1
    assert widened, "no answer flagged on a wider interval than the one shown"
