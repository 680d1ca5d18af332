"""The golden fixtures (``tests/golden/``): for each case, the plan summary and the
generated SQL are what ``expected/NAME.txt`` holds, byte for byte. A deliberate
change regenerates them (``python -m tests.golden.run --update``) and the diff
is reviewed as data."""

from __future__ import annotations

import difflib

import pytest

from tests.golden.run import Case, cases, render


@pytest.mark.parametrize("case", cases(), ids=lambda c: c.name)
def test_the_plan_and_sql_are_the_golden_ones(case: Case):
    assert case.expected.exists(), "no fixture: run python -m tests.golden.run --update"
    expected = case.expected.read_text()
    got = render(case)
    if got != expected:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True), got.splitlines(keepends=True),
                "expected", "got", n=1,
            )
        )  # fmt: skip
        pytest.fail(f"{case.name} changed (python -m tests.golden.run --update if meant):\n{diff}")


def test_every_case_has_a_fixture_and_no_fixture_is_orphaned():
    names = {c.name for c in cases()}
    assert len(names) == len(cases()), "two cases share a name"
    files = {p.stem for p in (cases()[0].expected.parent).glob("*.txt")}
    assert files == names
