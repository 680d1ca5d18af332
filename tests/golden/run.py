"""Golden fixtures for the analysis and the SQL it generates (sqlglot-style).

Each case in ``cases.sql`` (a policy from ``policies/``, an ε and a query) is run
through the gate's passes, with a fixed seed, to the plan summary the dry run
shows and the SQL the gate generates;
``expected/NAME.txt`` holds both, reviewed as data. ``tests/unit/test_golden.py``
compares; after a deliberate change,

    python -m tests.golden.run --update

rewrites the files, and the diff is what the change did.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
from pathlib import Path

from dpmagic.gate.dp.accounting import make_accountant
from dpmagic.gate.policy import load_policy
from dpmagic.gate.sql.pipeline import Asked, analyse
from dpmagic.gate.sql.plan_types import Plan
from dpmagic.gate.sql.rewrite import rewrite
from dpmagic.gate.sql.summary import summary as plan_summary
from tests.gate_helpers import sized

HERE = Path(__file__).resolve().parent
SEED = 20261124  # the per-start seed of the window bounding, fixed here
_HEADER = re.compile(r"-- (\w+): (\w+) ([0-9.e-]+)$")


@dataclass(frozen=True)
class Case:
    name: str
    policy: str
    epsilon: float
    sql: str

    @property
    def expected(self) -> Path:
        return HERE / "expected" / f"{self.name}.txt"


def cases() -> list[Case]:
    out, header = [], None
    for line in (HERE / "cases.sql").read_text().splitlines():
        match = _HEADER.match(line)
        if match:
            header = match.groups()
        elif line.strip() and not line.startswith("--") and header is not None:
            name, policy, epsilon = header
            out.append(Case(name, policy, float(epsilon), line.strip()))
            header = None
    return out


def render(case: Case) -> str:
    """The plan summary and the generated SQL, as the fixture file holds them."""
    the_plan = plan_of(case)
    summary = json.dumps([s.json() for s in plan_summary(the_plan)], indent=1, sort_keys=True)
    sql = rewrite(the_plan, SEED).sql
    return f"-- query\n{case.sql}\n-- plan\n{summary}\n-- sql\n{sql}\n"


def plan_of(case: Case) -> Plan:
    """The case's plan, from its policy, ε and (under δ-accountants) δ = budget / 100."""
    dataset = sized(load_policy(HERE / "policies" / f"{case.policy}.toml").dataset(None))
    accountant = make_accountant(dataset.accountant)
    delta = dataset.user_budget.delta / 100 if dataset.user_budget.delta else 0.0
    return analyse(Asked(case.sql, {}, case.epsilon, delta), dataset, accountant)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--update", action="store_true", help="rewrite every expected file")
    args = parser.parse_args()
    changed = 0
    for case in cases():
        text = render(case)
        old = case.expected.read_text() if case.expected.exists() else None
        if text != old:
            changed += 1
            print(f"{'updated' if args.update else 'differs'}: {case.name}")
            if args.update:
                case.expected.write_text(text)
    print(f"{changed} of {len(cases())} cases {'updated' if args.update else 'differ'}")


if __name__ == "__main__":
    main()
