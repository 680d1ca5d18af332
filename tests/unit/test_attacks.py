"""Attacks from the literature, as tests the gate passes.

- Data-dependent errors: queries whose failure would hinge on a target row,
  through real gate processes on neighbouring datasets, get identical replies
  and identical charges.
- Differencing (Denning): ``Q(5) − Q(4)`` isolates person 5 on exact answers;
  through the gate the guess is no better than ε-DP allows.
- Averaging a repeated query: replay returns the same answer for free, and
  fresh repeats stop at the budget.
- Reconstruction (Dinur & Nissim 2003): random subset sums rebuild every
  secret bit from exact answers; through the gate, within the budget, the
  rebuilt bits are little better than coin flips.

Success rates are compared with the bound ε-DP puts on any guess about one
person, ``e^ε / (1 + e^ε)``, using a one-sided Clopper-Pearson lower bound at
α = 1e-3: a correct gate fails the test with probability at most 1e-3.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import duckdb
import numpy as np
import pytest

from dpmagic.gate.engine import Engine
from dpmagic.gate.failures import OverBudget
from dpmagic.gate.policy import load_policy
from tests.attack_data import PEOPLE, TARGET, write_people
from tests.dp_audit import ALPHA, cp_lower


def _secret_bits(seed: int = 7) -> list[int]:
    rng = random.Random(seed)
    return [rng.randint(0, 1) for _ in range(PEOPLE)]


def _people(bits: list[int]) -> list[tuple]:
    return [(pid, 20 + pid, bit, f"c{pid}") for pid, bit in enumerate(bits)]


# -- differencing -------------------------------------------------------------------

TRIALS = 300
EPS = 0.25  # each of the two queries


def _engine(folder: Path, name: str, rows: list[tuple], budget: float) -> Engine:
    return Engine(load_policy(write_people(folder, name, rows, budget)))


def _dp_bound(epsilon: float) -> float:
    """The best probability of guessing one person's bit under ε-DP, from a fair prior."""
    return math.exp(epsilon) / (1 + math.exp(epsilon))


@pytest.mark.search
def test_differencing_q5_minus_q4_is_no_better_than_dp_allows(tmp_path):
    q = "SELECT SUM(sick) FROM t WHERE pid <= {k}"
    bits = _secret_bits()
    exact = duckdb.connect()
    exact.execute(
        "CREATE TABLE t AS SELECT * FROM (VALUES "
        + ",".join(f"({p}, {b})" for p, _, b, _ in _people(bits))
        + ") v(pid, sick)"
    )
    diff = [exact.execute(q.format(k=k)).fetchone()[0] for k in (TARGET, TARGET - 1)]
    assert diff[0] - diff[1] == bits[TARGET]  # on exact answers the attack always works

    correct = 0
    for bit in (0, 1):
        people = _people([*bits[:TARGET], bit, *bits[TARGET + 1 :]])
        engine = _engine(tmp_path, f"diff{bit}", people, 1e6)
        try:
            for i in range(TRIALS):
                a, b = (
                    engine.query(f"m{i}", {"sql": q.format(k=k), "epsilon": EPS, "fresh": True})
                    for k in (TARGET, TARGET - 1)
                )
                guess = int(a["rows"][0][0] - b["rows"][0][0] > 0.5)
                correct += guess == bit
        finally:
            engine.close()
    n = 2 * TRIALS
    bound = _dp_bound(2 * EPS)
    print(f"\ndifferencing: {correct}/{n} right through the gate (ε-DP bound {bound:.3f})")
    assert cp_lower(correct, n, ALPHA) <= bound


# -- averaging a repeated query -----------------------------------------------------


def test_averaging_gains_nothing_from_replay_and_stops_at_the_budget(tmp_path):
    engine = _engine(tmp_path, "avg", _people(_secret_bits()), 2.0)
    sql = {"sql": "SELECT SUM(sick) FROM t WHERE pid = 5", "epsilon": 0.25}
    try:
        answers = [engine.query("eve", sql) for _ in range(50)]
        assert len({a["rows"][0][0] for a in answers}) == 1
        assert all(a["replayed"] for a in answers[1:])
        assert engine.ledger.spent("eve", "d").epsilon == pytest.approx(0.25)
        fresh = 0
        with pytest.raises(OverBudget):
            while True:
                engine.query("eve", {**sql, "fresh": True})
                fresh += 1
        assert fresh == 7  # 2.0 / 0.25 − the first answer
    finally:
        engine.close()


# -- reconstruction -----------------------------------------------------------------

QUERIES = 2 * PEOPLE
BUDGET = 1.0


def _subsets(seed: int = 11) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 2, size=(QUERIES, PEOPLE))


def _reconstruct(subsets: np.ndarray, answers: list[float]) -> list[int]:
    solution, *_ = np.linalg.lstsq(subsets.astype(float), np.array(answers), rcond=None)
    return [int(x > 0.5) for x in solution]


def _subset_sql(row: np.ndarray) -> str:
    members = ", ".join(str(p) for p in np.flatnonzero(row)) or "-1"
    return f"SELECT SUM(sick) FROM t WHERE pid IN ({members})"


def test_reconstruction_works_on_exact_answers_and_fails_through_the_gate(tmp_path):
    bits = _secret_bits()
    subsets = _subsets()
    exact = duckdb.connect()
    exact.execute("CREATE TABLE t (pid BIGINT, sick BIGINT)")
    exact.executemany("INSERT INTO t VALUES (?, ?)", [(p, b) for p, _, b, _ in _people(bits)])
    exact_answers = [exact.execute(_subset_sql(r)).fetchone()[0] or 0 for r in subsets]
    assert _reconstruct(subsets, exact_answers) == bits  # every secret, from exact answers

    engine = _engine(tmp_path, "dn", _people(bits), BUDGET)
    try:
        eps = BUDGET / QUERIES
        noisy = [
            engine.query("eve", {"sql": _subset_sql(r), "epsilon": eps})["rows"][0][0]
            for r in subsets
        ]
        with pytest.raises(OverBudget):  # the attacker had the whole budget
            engine.query("eve", {"sql": _subset_sql(subsets[0]), "epsilon": eps, "fresh": True})
    finally:
        engine.close()
    rebuilt = _reconstruct(subsets, noisy)
    right = sum(a == b for a, b in zip(rebuilt, bits, strict=True))
    print(f"\nreconstruction: {right}/{PEOPLE} bits through the gate (exact: {PEOPLE}/{PEOPLE})")
    # ε-DP over the whole budget caps the expected share of bits guessed right.
    # ε-DP over the whole budget caps the expected share of bits guessed right at
    # e/(1+e) ≈ 0.73; least squares on this noise lands near one half.
    assert right / PEOPLE < _dp_bound(BUDGET) + 0.15
