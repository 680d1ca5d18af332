"""The supervisor of lab's and demo's children, with real processes: a stop
signal unwinds the command, and nothing it started survives."""

from __future__ import annotations

import os
import signal
import time

import pytest

from dpmagic.commands.supervisor import Stopped, Supervisor


def test_a_signal_while_a_child_starts_waits_until_it_is_recorded() -> None:
    reached = False
    with pytest.raises(Stopped), Supervisor() as supervisor, supervisor._deferred():
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.2)  # delivered by now, and held
        reached = True
    assert reached
