"""Single flight of shared releases, on a real engine: the same question asked while
its first release runs waits for that release; if it fails or is refused, the
waiters go on as if it had never been. The leader's run is held open by the test,
so who waits for whom is decided, not raced; the race itself, over TCP, is in
tests/system/test_sharing_across_groups.py."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from dpmagic.gate.engine import Engine
from dpmagic.gate.failures import Failed, OverBudget
from dpmagic.gate.padding import PrivateRead
from tests.gate_helpers import running_engine
from tests.small_gate import people

POLICY = """
[gate]
state_dir = "state"

[groups]
g1 = ["ann", "bob"]
g2 = ["cat"]

[datasets.d]
sources = {{ t = "t.csv" }}
privacy_unit = "pid"
user_budget = {{ epsilon = 3.0 }}
share_releases = "{share}"

[datasets.d.tables.t.columns]
pid = {{ type = "int" }}
age = {{ type = "int", lower = 0, upper = 100 }}
sex = {{ type = "int", public_values = [0, 1] }}
"""
QUESTION = {"sql": "SELECT sex, COUNT(*) AS n FROM t GROUP BY sex", "epsilon": 0.5}


def engine_for(tmp_path: Path, share: str) -> Iterator[Engine]:
    with running_engine(
        tmp_path, POLICY.format(share=share), {"t": ("pid,age,sex", people(300))}
    ) as engine:
        yield engine


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    yield from engine_for(tmp_path, "everyone")


@pytest.fixture
def grouped(tmp_path: Path) -> Iterator[Engine]:
    yield from engine_for(tmp_path, "group")


class HeldRun:
    """The engine's first run held until ``release``, then ended by ``outcome`` (None:
    it goes on and releases); every later run goes through at once. Counts runs."""

    def __init__(self, engine: Engine, outcome: Callable[[], None] | None) -> None:
        self.runs = 0
        self.started = threading.Event()
        self.opened = threading.Event()
        real = engine._charged_run

        def held(*args, **kwargs):
            self.runs += 1
            if self.runs == 1:
                self.started.set()
                assert self.opened.wait(30)
                if outcome is not None:
                    outcome()
            return real(*args, **kwargs)

        engine._charged_run = held  # type: ignore[method-assign]

    def release(self) -> None:
        self.opened.set()


def ask(pool: ThreadPoolExecutor, engine: Engine, user: str) -> tuple[Future, PrivateRead]:
    reads = PrivateRead()
    return pool.submit(engine.respond, user, dict(QUESTION), reads), reads


def released(engine: Engine) -> list[dict]:
    return engine.ledger.history(dataset="d", status="released")


def settle() -> None:
    """Long enough for the asks sent to reach the flight they wait on (or to run)."""
    time.sleep(0.5)


def test_asks_during_a_run_wait_for_its_release_and_are_served_it(engine: Engine) -> None:
    held = HeldRun(engine, None)
    with ThreadPoolExecutor(4) as pool:
        first, _ = ask(pool, engine, "ann")
        assert held.started.wait(30)
        others = [ask(pool, engine, u) for u in ("bob", "cat", "ann")]
        settle()
        assert held.runs == 1 and not released(engine)  # nobody else debited or ran
        held.release()
        leader = first.result(30).json()
        replies = [f.result(30).json() for f, _ in others]
    assert held.runs == 1 and len(released(engine)) == 1
    assert all(r["rows"] == leader["rows"] for r in replies)
    assert [r["replayed"] for r in replies] == [True, True, True]
    assert [r.get("shared") is not None for r in replies] == [True, True, False]
    # A waiter's time followed the run's: padded like it.
    assert all(reads.began for _, reads in others)


@pytest.mark.parametrize(
    "outcome",
    [
        pytest.param(lambda: (_ for _ in ()).throw(Failed()), id="failed"),
        pytest.param(lambda: (_ for _ in ()).throw(OverBudget("no budget")), id="refused"),
    ],
)
def test_a_first_release_that_fails_leaves_the_waiters_to_go_on(engine, outcome) -> None:
    """The leader's run ends without a release: one waiter runs the question (once),
    the others are served its release."""
    held = HeldRun(engine, outcome)
    with ThreadPoolExecutor(4) as pool:
        first, _ = ask(pool, engine, "ann")
        assert held.started.wait(30)
        others = [ask(pool, engine, u) for u in ("bob", "cat", "dan")]
        settle()
        held.release()
        with pytest.raises((Failed, OverBudget)):
            first.result(30)
        replies = [f.result(30).json() for f, _ in others]
    assert held.runs == 2 and len(released(engine)) == 1
    assert len({repr(r["rows"]) for r in replies}) == 1
    assert sorted(r["replayed"] for r in replies) == [False, True, True]


def test_under_group_sharing_only_those_who_could_be_served_wait(grouped: Engine) -> None:
    """cat shares no group with ann: her ask does not wait for ann's run, and is its
    own release; bob, in ann's group, waits and is served ann's."""
    held = HeldRun(grouped, None)
    with ThreadPoolExecutor(3) as pool:
        first, _ = ask(pool, grouped, "ann")
        assert held.started.wait(30)
        cats, _ = ask(pool, grouped, "cat")
        cat = cats.result(30).json()  # not held: it ran while ann's run was
        bobs, _ = ask(pool, grouped, "bob")
        settle()
        assert not bobs.done()
        held.release()
        ann, bob = first.result(30).json(), bobs.result(30).json()
    assert not cat["replayed"] and held.runs == 2
    assert bob["replayed"] and bob["rows"] == ann["rows"]
    assert bob["shared"]["cost"]["epsilon"] == pytest.approx(0.5)
    assert len(released(grouped)) == 2
