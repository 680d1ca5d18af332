"""A simulated course under one dataset-wide budget: how many questions it answers
with and without shared releases, on the gate's real engine over real DuckDB.

    python benchmarks/course.py                       # 300 students, 10 sections
    python benchmarks/course.py --students 60 --json  # smaller; what the test runs

Each student is in one of ``--sections`` sections (``[groups]``). Every student runs
the same homework notebook (``HOMEWORK``: eight questions at ε = 0.1 each), then two
exploratory questions of their own, drawn from a pool shared by the class (so some
coincide), then re-runs the homework twice, as students do. Students take turns in
a random (seeded) order, one step each, as a class working through an evening.

The policy: each student ε = 1.5; the dataset ε = ``--dataset-epsilon`` (default 20,
renewing monthly), the number the owner can promise the data's subjects; sharing
``none``, ``group`` (within a section) or ``everyone``. For each setting it prints
the questions answered (fresh, replayed from the student's own release, served
from another student's), refused by which budget, and the dataset's ε spent.
Not a test (tests/system/test_course.py runs it small and checks what must hold).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time
from collections import Counter
from pathlib import Path

HOMEWORK = [
    "SELECT COUNT(*) AS n FROM visits",
    "SELECT AVG(age) AS mean_age FROM visits",
    "SELECT state, COUNT(*) AS n FROM visits GROUP BY state",
    "SELECT diagnosis, AVG(cost) AS mean_cost FROM visits GROUP BY diagnosis",
    "SELECT COUNT(*) AS n FROM visits WHERE age >= 65",
    "SELECT SUM(cost) AS total FROM visits WHERE diagnosis = 'flu'",
    "SELECT state, AVG(cost) AS mean_cost FROM visits GROUP BY state",
    "SELECT COUNT(*) AS n FROM visits WHERE cost > 500",
]
EPSILON = 0.1
PERSONS = 5_000
STATES = ["CA", "NY", "TX", "WA", "MA"]
DIAGNOSES = ["flu", "cold", "asthma", "diabetes"]
SETTINGS = ("none", "group", "everyone")


def pool() -> list[str]:
    """The exploratory questions a class draws from: 40, some far likelier."""
    return [f"SELECT COUNT(*) AS n FROM visits WHERE age >= {a}" for a in range(20, 80, 3)] + [
        f"SELECT AVG(cost) AS m FROM visits WHERE age < {a}" for a in range(25, 85, 3)
    ]


def write_course(folder: Path, students: int, sections: int, budget: float, share: str) -> Path:
    rng = random.Random(7)
    rows = [
        f"{p},{rng.randint(18, 90)},{rng.choice(STATES)},{rng.choice(DIAGNOSES)},"
        f"{rng.randint(50, 2000)}"
        for p in range(PERSONS)
    ]
    (folder / "visits.csv").write_text("pid,age,state,diagnosis,cost\n" + "\n".join(rows) + "\n")
    groups = "\n".join(
        f"sec{s} = [" + ", ".join(f'"s{i}"' for i in range(s, students, sections)) + "]"
        for s in range(sections)
    )
    states = ", ".join(f'"{s}"' for s in STATES)
    diagnoses = ", ".join(f'"{d}"' for d in DIAGNOSES)
    policy = folder / "policy.toml"
    policy.write_text(f"""
[gate]
state_dir = "state"
response_quantum_ms = 0

[groups]
{groups}

[datasets.clinic]
sources = {{ visits = "visits.csv" }}
privacy_unit = "pid"
user_budget = {{ epsilon = 1.5 }}
dataset_budget = {{ epsilon = {budget}, renew = "month" }}
share_releases = "{share}"

[datasets.clinic.tables.visits.columns]
pid = {{ type = "int" }}
age = {{ type = "int", lower = 0, upper = 100 }}
state = {{ type = "str", public_values = [{states}] }}
diagnosis = {{ type = "str", public_values = [{diagnoses}] }}
cost = {{ type = "float", lower = 0, upper = 2000 }}
""")
    return policy


def plan(students: int) -> list[tuple[str, str]]:
    """Every (student, question) asked, in the class's order."""
    rng = random.Random(11)
    choices = pool()
    weights = [1.0 / (1 + i) for i in range(len(choices))]  # a few questions are popular
    work = {
        f"s{i}": [*HOMEWORK, *rng.choices(choices, weights, k=2), *HOMEWORK, *HOMEWORK]
        for i in range(students)
    }
    order: list[tuple[str, str]] = []
    while work:
        for student in rng.sample(sorted(work), len(work)):
            order.append((student, work[student].pop(0)))
            if not work[student]:
                del work[student]
    return order


def simulate(students: int, sections: int, budget: float, share: str) -> dict[str, object]:
    from dpmagic.gate.engine import Engine
    from dpmagic.gate.failures import OverBudget
    from dpmagic.gate.ledger.scopes import Scope
    from dpmagic.gate.policy import load_policy

    outcome: Counter[str] = Counter()
    answers: dict[tuple[str, str], list] = {}
    with tempfile.TemporaryDirectory() as work:
        engine = Engine(load_policy(write_course(Path(work), students, sections, budget, share)))
        start = time.perf_counter()
        try:
            for student, sql in plan(students):
                body = {"sql": sql, "epsilon": EPSILON, "notebook": "homework.ipynb"}
                try:
                    reply = engine.query(student, body)
                except OverBudget as refused:
                    named = None if refused.budget is None else refused.budget.budget
                    outcome[f"refused ({named})"] += 1
                    continue
                kind = (
                    "shared" if reply.get("shared") else
                    "replayed" if reply["replayed"] else "fresh"
                )  # fmt: skip
                outcome[kind] += 1
                section = f"sec{int(student[1:]) % sections}"
                answers.setdefault((section, sql), []).append(reply["rows"])
            seconds = time.perf_counter() - start
            whole = engine.policy.dataset("clinic").dataset_budget
            [(spent_cost, _limit)] = engine.ledger.standing([(Scope.whole("clinic"), whole)])
            spent = spent_cost.epsilon
        finally:
            engine.close()
    asked = sum(outcome.values())
    answered = outcome["fresh"] + outcome["replayed"] + outcome["shared"]
    # Within a section under group sharing, every answer to one question is the same.
    agreeing = sum(1 for rows in answers.values() if all(r == rows[0] for r in rows))
    return {
        "share": share,
        "students": students,
        "asked": asked,
        "answered": answered,
        **dict(sorted(outcome.items())),
        "dataset_epsilon_spent": round(spent, 9),
        "dataset_epsilon": budget,
        "questions_in_sections": len(answers),
        "questions_answered_alike_in_section": agreeing,
        "seconds": round(seconds, 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--students", type=int, default=300)
    parser.add_argument("--sections", type=int, default=10)
    parser.add_argument("--dataset-epsilon", type=float, default=20.0)
    parser.add_argument("--share", choices=SETTINGS, action="append", help="default: all three")
    parser.add_argument("--json", action="store_true", help="one JSON object per setting")
    args = parser.parse_args(argv)
    results = [
        simulate(args.students, args.sections, args.dataset_epsilon, share)
        for share in (args.share or SETTINGS)
    ]
    if args.json:
        print(json.dumps(results))
        return 0
    print(f"load average {os.getloadavg()[0]:.2f}; {args.students} students in "
          f"{args.sections} sections, dataset ε = {args.dataset_epsilon}, each question ε = "
          f"{EPSILON}, each student ε = 1.5\n")  # fmt: skip
    keys = sorted({k for r in results for k in r} - {"share", "students"})
    print("| " + " | ".join(["share_releases", *keys]) + " |")
    print("|" + "---|" * (len(keys) + 1))
    for r in results:
        print("| " + " | ".join(str(r.get(k, 0)) for k in ["share", *keys]) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
