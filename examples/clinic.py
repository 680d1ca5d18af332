"""A synthetic clinic: the bundled example dataset for demos, docs and tests.

The data is invented, but shaped like the real thing (older patients visit
more often and cost more, pregnancy only for women of child-bearing age,
children go to pediatrics) so that the example queries give answers worth
looking at. It is deterministic for a seed, byte for byte, so a demo and its
tests see the same "private" data every time. The randomness here is plain
data synthesis; the gate never uses numpy for noise.

Every value lies inside the public bounds and key lists of ``clinic.toml``;
the constants below are the single source of both.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Literal

import duckdb
import numpy as np
import pandas as pd

YEARS = (2019, 2020, 2021, 2022, 2023, 2024)
# Fewer visits in the pandemic year, as in real utilisation data.
YEAR_WEIGHTS = (1.0, 0.75, 0.9, 1.0, 1.05, 1.1)
SEXES = ("F", "M")
STATES = ("CA", "TX", "FL", "NY", "PA", "IL", "OH", "GA", "NC", "MI")
STATE_WEIGHTS = (39.0, 30.0, 22.0, 19.7, 13.0, 12.6, 11.8, 11.0, 10.8, 10.0)
INSURANCE = ("private", "medicare", "medicaid", "none")
AGE_BANDS = ("0-17", "18-34", "35-49", "50-64", "65-79", "80+")
AGE_BAND_EDGES = (0, 18, 35, 50, 65, 80, 101)
AGE_BAND_WEIGHTS = (0.17, 0.22, 0.19, 0.20, 0.15, 0.07)
MAX_AGE = 100
MAX_COST = 50_000.0
MAX_STAY = 30
MAX_VISITS = 8
# The intake survey asked "do you smoke?" by randomized response: each patient
# answered truthfully with this chance, else by a fair coin (1 yes, 0 no).
SMOKER_P = 0.75
SMOKER_VALUES = (0, 1)
DEPARTMENTS = (
    "primary care",
    "pediatrics",
    "emergency",
    "cardiology",
    "oncology",
    "obstetrics",
    "psychiatry",
    "orthopedics",
    "pulmonology",
    "endocrinology",
)

# diagnosis -> (department, median cost in dollars, chance of an inpatient stay)
DIAGNOSES: dict[str, tuple[str, float, float]] = {
    "checkup": ("primary care", 180.0, 0.0),
    "respiratory infection": ("primary care", 240.0, 0.03),
    "hypertension": ("cardiology", 320.0, 0.02),
    "heart disease": ("cardiology", 2_400.0, 0.35),
    "diabetes": ("endocrinology", 420.0, 0.05),
    "asthma": ("pulmonology", 380.0, 0.06),
    "copd": ("pulmonology", 900.0, 0.25),
    "injury": ("emergency", 1_100.0, 0.12),
    "pregnancy": ("obstetrics", 2_800.0, 0.6),
    "depression": ("psychiatry", 260.0, 0.04),
    "back pain": ("orthopedics", 450.0, 0.03),
    "cancer": ("oncology", 6_500.0, 0.45),
}
DIAGNOSIS_NAMES = tuple(DIAGNOSES)

Format = Literal["csv", "parquet"]


def age_band(age: np.ndarray) -> np.ndarray:
    """The public age band of each age, as the policy declares them."""
    index = np.searchsorted(np.asarray(AGE_BAND_EDGES[1:-1]), age, side="right")
    return np.asarray(AGE_BANDS, dtype=object)[index]


def _diagnosis_weights(age: int, sex: str) -> np.ndarray:
    """How likely each diagnosis is for a visit at this age and sex."""
    old = age >= 65
    w = {
        "checkup": 3.0 if age < 18 else 2.0,
        "respiratory infection": 3.0 if age < 18 else 1.5,
        "hypertension": 0.1 + 0.05 * max(0, age - 30),
        "heart disease": 0.02 + 0.03 * max(0, age - 45),
        "diabetes": 0.1 + 0.03 * max(0, age - 30),
        "asthma": 1.2 if age < 18 else 0.5,
        "copd": 0.01 + 0.02 * max(0, age - 50),
        "injury": 1.8 if (sex == "M" and 15 <= age < 35) else 0.9,
        "pregnancy": 1.5 if (sex == "F" and 18 <= age <= 44) else 0.0,
        "depression": 0.8 if 15 <= age < 65 else 0.3,
        "back pain": 0.3 + 0.02 * min(age, 60),
        "cancer": 0.01 + (0.6 if old else 0.01 * max(0, age - 40)),
    }
    weights = np.array([w[d] for d in DIAGNOSIS_NAMES])
    return weights / weights.sum()


def _patients(rng: np.random.Generator, n: int) -> pd.DataFrame:
    band = rng.choice(len(AGE_BANDS), size=n, p=np.asarray(AGE_BAND_WEIGHTS))
    lo = np.asarray(AGE_BAND_EDGES)[band]
    hi = np.asarray(AGE_BAND_EDGES)[band + 1]
    uniform = lo + np.floor(rng.random(n) * (hi - lo))
    # The oldest band thins out towards 100 instead of stopping flat.
    elderly = np.minimum(lo + np.floor(rng.exponential(6.0, n)), MAX_AGE)
    age = np.where(band == len(AGE_BANDS) - 1, elderly, uniform).astype(np.int64)
    sex = np.where(rng.random(n) < 0.52, "F", "M")
    states = np.asarray(STATE_WEIGHTS) / sum(STATE_WEIGHTS)
    state = np.asarray(STATES, dtype=object)[rng.choice(len(STATES), size=n, p=states)]
    u = rng.random(n)
    insurance = np.select(
        [age >= 65, age < 18],
        [
            np.where(u < 0.93, "medicare", np.where(u < 0.98, "private", "medicaid")),
            np.where(u < 0.55, "private", np.where(u < 0.95, "medicaid", "none")),
        ],
        np.where(
            u < 0.62,
            "private",
            np.where(u < 0.82, "medicaid", np.where(u < 0.9, "medicare", "none")),
        ),
    )
    return pd.DataFrame(
        {
            "patient_id": np.arange(1, n + 1, dtype=np.int64),
            "age": age,
            "sex": sex.astype(object),
            "state": state,
            "insurance": insurance.astype(object),
            "age_band": age_band(age),
        }
    )


def smoking(age: np.ndarray, sex: np.ndarray, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Each patient's true smoking status and their randomized-response answer.

    Drawn from a generator of its own, so the survey leaves every other column
    as it was; the truth is returned for tests and never written.
    """
    rng = np.random.default_rng([seed, 1])
    rate = np.select([age < 18, age >= 65], [0.02, 0.09], 0.2) * np.where(sex == "M", 1.2, 0.85)
    truth = (rng.random(len(age)) < rate).astype(np.int64)
    coin = rng.choice(np.asarray(SMOKER_VALUES), size=len(age))
    answer = np.where(rng.random(len(age)) < SMOKER_P, truth, coin)
    return truth, answer.astype(np.int64)


def _visits(rng: np.random.Generator, patients: pd.DataFrame) -> pd.DataFrame:
    rows: list[tuple] = []
    year_p = np.asarray(YEAR_WEIGHTS)
    for pid, age_now, sex, state in patients[["patient_id", "age", "sex", "state"]].itertuples(
        index=False
    ):
        mean_visits = 1.0 + age_now / 40.0
        count = int(min(MAX_VISITS, 1 + rng.poisson(mean_visits)))
        # Ages are as of 2024: nobody visits before they were born.
        first = max(YEARS[0], YEARS[-1] - int(age_now))
        years = np.asarray(YEARS[YEARS.index(first) :])
        p = year_p[len(YEARS) - len(years) :]
        for year in sorted(rng.choice(years, size=count, p=p / p.sum())):
            age = int(age_now) - (YEARS[-1] - int(year))
            diagnosis = DIAGNOSIS_NAMES[
                rng.choice(len(DIAGNOSIS_NAMES), p=_diagnosis_weights(age, sex))
            ]
            department, median, inpatient = DIAGNOSES[diagnosis]
            if age < 18 and department not in ("emergency", "oncology", "obstetrics"):
                department = "pediatrics"
            stay = (
                int(min(MAX_STAY, 1 + rng.poisson(2.0 + age / 10.0)))
                if rng.random() < inpatient
                else 0
            )
            cost = median * rng.lognormal(0.0, 0.9) * (1.0 + 0.8 * stay)
            cost = round(float(min(max(cost, 0.0), MAX_COST)), 2)
            rows.append((pid, int(year), department, diagnosis, cost, stay, age, sex, state))
    visits = pd.DataFrame(
        rows,
        columns=[
            "patient_id",
            "year",
            "department",
            "diagnosis",
            "cost",
            "stay_days",
            "age",
            "sex",
            "state",
        ],
    )
    visits.insert(7, "age_band", age_band(visits["age"].to_numpy()))
    return visits


def generate(
    out_dir: Path, patients: int = 5000, seed: int = 7, fmt: Format = "csv"
) -> dict[str, Path]:
    """Write ``patients`` and ``visits`` tables into ``out_dir``; returns table -> file."""
    if patients < 1:
        raise ValueError("patients must be at least 1")
    if fmt not in ("csv", "parquet"):
        raise ValueError("fmt must be 'csv' or 'parquet'")
    rng = np.random.default_rng(seed)
    tables = {"patients": _patients(rng, patients)}
    tables["visits"] = _visits(rng, tables["patients"])
    people = tables["patients"]
    _, people["smoker"] = smoking(people["age"].to_numpy(), people["sex"].to_numpy(), seed)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    con = duckdb.connect()
    try:
        for name, frame in tables.items():
            target = out_dir / f"{name}.{fmt}"
            con.register("frame", frame)
            options = "FORMAT csv, HEADER" if fmt == "csv" else "FORMAT parquet"
            con.execute(f"COPY (SELECT * FROM frame) TO '{_quote(target)}' ({options})")
            con.unregister("frame")
            written[name] = target
    finally:
        con.close()
    return written


def write_policy(out_dir: Path, fmt: Format = "csv") -> Path:
    """Put a copy of ``clinic.toml`` beside the generated files, its sources
    naming them in ``fmt``; its relative paths (data, ``state_dir``) then
    resolve in ``out_dir``, so the gate's ledger lives there too."""
    text = Path(__file__).with_name("clinic.toml").read_text()
    policy = Path(out_dir) / "clinic.toml"
    policy.write_text(text.replace('.csv"', f'.{fmt}"'))
    return policy


def _quote(path: Path) -> str:
    return str(path).replace("'", "''")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m dpmagic.examples.clinic",
        description="Write the synthetic clinic dataset (patients, visits) and its policy, "
        "clinic.toml, ready for dpmagic serve --policy OUT_DIR/clinic.toml.",
    )
    parser.add_argument("out_dir", type=Path, help="folder to write the files into")
    parser.add_argument("--patients", type=int, default=5000, help="number of patients")
    parser.add_argument("--seed", type=int, default=7, help="generator seed")
    parser.add_argument("--format", choices=("csv", "parquet"), default="csv", dest="fmt")
    args = parser.parse_args(argv)
    if args.patients < 1:
        parser.error("--patients must be at least 1")
    for name, path in generate(args.out_dir, args.patients, args.seed, args.fmt).items():
        print(f"{name}: {path}")
    print(f"policy: {write_policy(args.out_dir, args.fmt)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
