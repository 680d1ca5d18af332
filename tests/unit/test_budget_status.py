"""Which datasets' budgets dpmagic.budget_status asks for, with a stand-in client (the
real gate, shell and kernel request are in tests/system/test_budget_status.py)."""

from __future__ import annotations

from typing import Any

import pytest

from dpmagic.budget_status import MAX_DATASETS, MIME_TYPE, BudgetStatus, _datasets


class History:
    """A client whose ``history`` says what the gate serves and this notebook queried."""

    def __init__(self, served: list[str], queried: list[str]) -> None:
        self.served, self.queried = served, queried

    def history(self, dataset: Any, notebook: str, limit: int | None = None) -> dict:
        assert dataset is None and limit == 1
        entries = [{"dataset": name} for name in self.queried][-1:]
        return {"datasets": self.served, "notebook": notebook, "entries": entries}


@pytest.mark.parametrize(
    ("served", "queried", "chosen", "shown"),
    [
        (["a", "b"], ["a"], "b", ["b"]),  # DpSql.dataset wins
        (["a", "b"], ["a", "b"], None, ["b"]),  # else the one this notebook queried last
        (["a"], [], None, ["a"]),  # else the only one
        ([], [], None, [None]),  # the gate's default, whatever it says
        (["a", "b", "c"], [], None, ["a", "b", "c"]),  # else each
    ],
)
def test_the_datasets_shown(served, queried, chosen, shown):
    assert _datasets(History(served, queried), chosen, "n.ipynb") == (served, shown)


def test_at_most_so_many_datasets_are_asked():
    served = [f"d{i:02}" for i in range(MAX_DATASETS + 5)]
    assert _datasets(History(served, []), None, "n.ipynb")[1] == served[:MAX_DATASETS]


def test_the_status_is_typed_json_with_a_line_of_text():
    payload = {"state": "error", "kind": "unavailable", "message": "no gate", "notebook": "n"}
    bundle = BudgetStatus(payload)._repr_mimebundle_()
    assert bundle[MIME_TYPE] is payload
    assert bundle["text/plain"] == "dpmagic budget status: error (no gate)"
