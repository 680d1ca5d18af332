"""Replays without analysis (``replay_hints.py``): a text released before is served
from the ledger by its hint, without parsing, planning or vetting it again; across
users only where the dataset shares releases and the ledger serves the release to
the asker. On a real engine, the analyses counted at ``Engine._analysed_once``.

The defence under test is the hint's scope: a reply that comes sooner for a hint
says only what the reply says. A hint kept in one scope for everyone (the broken
version) speeds up a user the release is not shared with, whose reply then tells,
by its time, that someone else asked that text; the scope test catches it.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from dpmagic.gate import engine as engine_module
from dpmagic.gate import replay_hints
from dpmagic.gate.analysis_cache import AnalysisCache
from dpmagic.gate.engine import Engine
from tests.gate_helpers import running_engine
from tests.small_gate import people
from tests.unit.test_sharing_flights import POLICY  # ann and bob in g1, cat in g2

QUESTION = {"sql": "SELECT sex, COUNT(*) AS n FROM t GROUP BY sex", "epsilon": 0.5}


class Counted:
    """An engine whose analyses are counted; its analysis cache emptied at will, as a
    restart or eviction would leave it (the hints are what must skip the analysis)."""

    def __init__(self, engine: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
        self.engine = engine
        self.analyses = 0
        real = engine._analysed_once

        def counting(*args, **kwargs):
            self.analyses += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(engine, "_analysed_once", counting)

    def ask(self, user: str, **more: object) -> dict:
        self.engine._analyses = AnalysisCache()
        return self.engine.query(user, {**QUESTION, **more})


def counted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, share: str) -> Iterator[Counted]:
    text = POLICY.format(share=share)
    with running_engine(tmp_path, text, {"t": ("pid,age,sex", people(300))}) as engine:
        yield Counted(engine, monkeypatch)


@pytest.fixture
def alone(tmp_path, monkeypatch) -> Iterator[Counted]:
    yield from counted(tmp_path, monkeypatch, "none")


@pytest.fixture
def grouped(tmp_path, monkeypatch) -> Iterator[Counted]:
    yield from counted(tmp_path, monkeypatch, "group")


def test_a_replay_is_served_without_its_analysis(alone):
    first = alone.ask("ann")
    assert alone.analyses == 1
    again = alone.ask("ann", sql=QUESTION["sql"])
    assert again["replayed"] is True and again["rows"] == first["rows"]
    assert again["cost"]["epsilon"] == 0.0
    assert alone.analyses == 1  # the hint found the release: nothing analysed
    assert alone.engine.budget("ann", None, "")["user"]["spent"]["epsilon"] == 0.5


def test_what_a_hint_does_not_cover_is_analysed(alone):
    alone.ask("ann")
    alone.ask("ann", dry_run=True)  # a dry run is always analysed: its plan is the reply
    alone.ask("ann", fresh=True)  # asked afresh: a new release, analysed and charged
    alone.ask("ann", epsilon=0.25)  # another budget is another question
    alone.ask("ann", sql=QUESTION["sql"] + " ")  # another text, as the cache keys them
    assert alone.analyses == 5


def test_a_dry_run_or_a_refusal_leaves_no_hint(alone):
    alone.ask("ann", dry_run=True)
    alone.ask("ann")
    assert alone.analyses == 2  # the dry run's analysis made no hint for the release


def test_without_sharing_nobody_else_is_sped_up(alone):
    alone.ask("ann")
    assert alone.ask("bob")["replayed"] is False  # bob's own release, analysed
    assert alone.analyses == 2


def test_a_shared_release_is_served_without_analysis_to_whom_it_is_shared_with(grouped):
    released = grouped.ask("ann")
    shared = grouped.ask("bob")  # ann's group
    assert shared["shared"]["scope"] == "group" and shared["rows"] == released["rows"]
    assert grouped.analyses == 1
    assert grouped.ask("bob")["replayed"] is True  # bob's own now, free
    assert grouped.analyses == 1


def test_a_user_outside_the_group_is_analysed_as_if_nobody_asked(grouped):
    grouped.ask("ann")
    assert grouped.ask("cat")["replayed"] is False  # g2: released afresh, charged
    assert grouped.analyses == 2


def test_hints_in_one_scope_for_everyone_are_caught(grouped, monkeypatch):
    """Broken on purpose: every hint in one scope. cat (g2) is sped up by ann's (g1)
    hint: the ledger does not serve it, but the lookup happened, and the hint was
    consulted for a user the release is not shared with."""
    consulted: list[str] = []
    real_replayed = grouped.engine._replayed

    def replayed(user, *args, **kwargs):
        consulted.append(user)
        return real_replayed(user, *args, **kwargs)

    monkeypatch.setattr(grouped.engine, "_replayed", replayed)
    monkeypatch.setattr(engine_module, "_hint_scopes", lambda user, dataset, groups: [("all",)])
    grouped.ask("ann")
    consulted.clear()
    grouped.ask("cat")
    # cat's ask consulted the ledger for ann's key before any analysis: with the real
    # scopes it is consulted once, after cat's own analysis (the normal path).
    assert consulted == ["cat", "cat"]


def test_the_real_scopes_consult_the_ledger_once_for_an_outsider(grouped, monkeypatch):
    consulted: list[str] = []
    real_replayed = grouped.engine._replayed

    def replayed(user, *args, **kwargs):
        consulted.append(user)
        return real_replayed(user, *args, **kwargs)

    monkeypatch.setattr(grouped.engine, "_replayed", replayed)
    grouped.ask("ann")
    consulted.clear()
    grouped.ask("cat")
    assert consulted == ["cat"]


def test_hints_are_bounded_and_the_least_recent_goes_first():
    hints = replay_hints.ReplayHints(limit=2)
    scope = replay_hints.own("d", "ann")
    for text in ("a", "b", "c"):
        hints.remember([scope], text, engine_module.ReplayKey(text, "data", "policy"))
    assert hints.find([scope], "a") is None
    assert hints.find([scope], "c") == engine_module.ReplayKey("c", "data", "policy")
