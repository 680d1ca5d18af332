"""A public dataset nobody here wrote, through a real gate process over its socket:
statsmodels' ``modechoice`` travel survey (210 travellers, four travel options each,
exactly one chosen), split as an owner would load it (``travellers`` one row per
person, ``options`` four rows per person linked to it), and asked the shapes that
broke honesty before: a count filtered to each traveller's chosen option under
``--max-rows 1``, the same across a join under ``--max-groups 1 --max-rows 1``, and a
clipped average per mode. Truth comes from pandas on the same data.

Each cell's 95% interval must hold the truth in at least 50 of ``RUNS`` = 60 answers
(if the intervals cover at their stated 95%, fewer than 50 has probability 2e-4 per
cell, binomial); a cell whose interval misses the truth must never be one the gate
calls sound (unflagged) while missing it by more than its own width; and no count is
flagged as noise-dominated where its truth is at least 30 and its noise a few units.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

statsmodels = pytest.importorskip("statsmodels.datasets.modechoice")

from dpmagic.client.http_gate import Gate  # noqa: E402
from tests.conftest import GateProcess  # noqa: E402

RUNS = 60
POLICY = """
[gate]
state_dir = "state"
response_quantum_ms = 0

[datasets.travel]
sources = { travellers = "travellers.csv", options = "options.csv" }
privacy_unit = "individual"
max_partitions = 4
max_rows_per_partition = 4
user_budget = { epsilon = 1e6 }
notebook_budget = { epsilon = 1e6 }

[datasets.travel.tables.travellers]
max_rows_per_unit = 1
[datasets.travel.tables.travellers.columns]
individual = { type = "int" }
chosen = { type = "int", public_values = [1, 2, 3, 4] }
hinc = { type = "float", lower = 0, upper = 100 }

[datasets.travel.tables.options]
links = { individual = "travellers.individual" }
[datasets.travel.tables.options.columns]
individual = { type = "int" }
mode = { type = "int", public_values = [1, 2, 3, 4] }
choice = { type = "int", public_values = [0, 1] }
invt = { type = "float", lower = 0, upper = 1500, not_null = true }
"""


@pytest.fixture(scope="module")
def data() -> dict:
    frame = statsmodels.load_pandas().data.astype(int)
    chosen = frame[frame["choice"] == 1][["individual", "mode"]].rename(columns={"mode": "chosen"})
    hinc = frame.groupby("individual")["hinc"].first().reset_index()
    travellers = chosen.merge(hinc, on="individual")
    options = frame[["individual", "mode", "choice", "invt"]]
    return {"travellers": travellers, "options": options}


@pytest.fixture(scope="module")
def gate(data, tmp_path_factory) -> Iterator[GateProcess]:
    folder = tmp_path_factory.mktemp("travel")
    for name, frame in data.items():
        frame.to_csv(folder / f"{name}.csv", index=False)
    (folder / "policy.toml").write_text(POLICY)
    short = Path(tmp_path_factory.mktemp("s", numbered=True))
    process = GateProcess(folder / "policy.toml", f"unix:{short / 'g.sock'}")
    process.start()
    try:
        yield process
    finally:
        process.stop()


def _answers(gate: GateProcess, sql: str, column: str, **asked) -> list[tuple]:
    """(group, value, lower, upper, flagged) of every cell of ``RUNS`` fresh answers."""
    client = Gate(gate.address)
    cells = []
    for i in range(RUNS):
        result = client.query(sql, epsilon=1.0, fresh=True, notebook=f"{column}{i}", **asked)
        frame = result.interval(column)
        flags = result.noise_dominates(column)
        for row, lo, hi, flag in zip(
            result.rows, frame["lower"], frame["upper"], flags, strict=True
        ):
            group = row[0] if len(row) > 1 else None
            cells.append((group, row[-1], lo, hi, flag))
    return cells


def _honest(cells: list[tuple], truth: dict) -> None:
    held: dict = {}
    for group, value, lo, hi, flag in cells:
        true = truth[group]
        held[group] = held.get(group, 0) + (lo <= true <= hi)
        if not flag:  # a cell called sound never misses by more than its own width
            assert lo - (hi - lo) <= true <= hi + (hi - lo), (group, value, lo, hi, true)
    assert all(n >= 50 for n in held.values()), held


def test_a_filtered_count_under_one_row_per_person(gate, data) -> None:
    options = data["options"]
    cells = _answers(
        gate, "SELECT COUNT(*) AS n FROM options WHERE choice = 1", "n", max_rows_per_partition=1
    )
    _honest(cells, {None: int((options["choice"] == 1).sum())})
    assert not any(flag for *_, flag in cells)


def test_a_filtered_join_grouped_by_the_chosen_mode(gate, data) -> None:
    sql = (
        "SELECT t.chosen, COUNT(*) AS n FROM travellers t JOIN options o "
        "ON o.individual = t.individual WHERE o.choice = 1 GROUP BY t.chosen"
    )
    truth = data["travellers"].groupby("chosen").size().to_dict()
    cells = _answers(gate, sql, "n", max_partitions=1, max_rows_per_partition=1)
    _honest(cells, truth)
    assert not any(flag for *_, flag in cells)


def test_an_average_per_mode_shares_its_count_and_holds_the_truth(gate, data) -> None:
    """``invt`` is declared ``not_null``: the average divides by the query's count."""
    options = data["options"]
    sql = "SELECT mode, COUNT(*) AS n, AVG(invt) AS a FROM options GROUP BY mode"
    truth = options.groupby("mode")["invt"].mean().to_dict()
    cells = _answers(gate, sql, "a")
    _honest(cells, truth)
    plan = Gate(gate.address).query(sql, epsilon=1.0, dry_run=True)
    counts = [p for p in plan.reply["plan"] if p.get("kind") == "count"]
    assert [p["aggregate"] for p in counts] == ["COUNT(*)"]
