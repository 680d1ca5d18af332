"""The course simulation (benchmarks/course.py), small, on the gate's real engine: under
one dataset-wide budget, shared releases answer more of a class's questions, never
overspend the budget, and give every student of a section the same answer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "course.py"


def test_shared_releases_answer_more_of_a_course_under_one_budget() -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--students", "40", "--sections", "4",
         "--dataset-epsilon", "4", "--json"],
        capture_output=True, text=True, check=True, timeout=600,
    ).stdout  # fmt: skip
    runs = {r["share"]: r for r in json.loads(out)}
    for run in runs.values():
        assert run["asked"] == 40 * 26
        assert run["dataset_epsilon_spent"] <= run["dataset_epsilon"] + 1e-9
    none, group, everyone = runs["none"], runs["group"], runs["everyone"]
    assert none["refused (dataset)"] > 0 and none.get("shared", 0) == 0
    assert group["answered"] > 2 * none["answered"]
    assert everyone["answered"] >= group["answered"]
    # One answer per question within a section: noise cannot be averaged away there.
    assert group["questions_answered_alike_in_section"] == group["questions_in_sections"]
