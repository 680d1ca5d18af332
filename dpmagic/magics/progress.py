"""Waiting for the gate without freezing the notebook.

A query can run for many seconds (a large table, or a gate that pads its
replies). The request runs in a worker thread while the kernel's main thread
shows how long it has waited and stays interruptible, so Kernel ▸ Interrupt
(SIGINT) reaches it at once. Interrupting only stops the *waiting*: the gate
has already charged the query and finishes it; asking again replays the
stored answer at no cost once it is released.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from html import escape
from typing import Generic, TypeVar

from dpmagic.display.render import MUTED

T = TypeVar("T")
# Fast answers (most of them, and every replay) show no progress at all.
SHOW_AFTER_S = 1.0
TICK_S = 0.25


class Interrupted(Exception):
    """The user interrupted the wait; the request may have been charged."""

    def __init__(self, waited: float) -> None:
        super().__init__(f"interrupted after {waited:.0f} s")
        self.waited = waited


class Progress:
    """What the notebook shows while it waits: elapsed time and how to stop."""

    def __init__(self, waited: float, done: bool = False) -> None:
        self.waited = waited
        self.done = done

    def text(self) -> str:
        if self.done:
            return f"the gate answered after {self.waited:.0f} s"
        return (
            f"waiting for the gate… {self.waited:.0f} s "
            "(Kernel ▸ Interrupt stops waiting; the query stays charged)"
        )

    def _repr_html_(self) -> str:
        return f'<div class="dpmagic-progress" style="{MUTED}">{escape(self.text())}</div>'

    def __repr__(self) -> str:
        return self.text()


class _Outcome(Generic[T]):
    value: T
    error: BaseException | None = None


def wait_for(
    request: Callable[[], T],
    show: Callable[[Progress], None],
    abort: Callable[[], None],
) -> T:
    """Run ``request`` in a thread; ``show`` progress while waiting, ``abort`` on interrupt.

    ``show`` is called first after ``SHOW_AFTER_S`` and then about once a
    second, and once more with ``done=True`` if it was called at all.
    Raises :class:`Interrupted` on KeyboardInterrupt, after ``abort``.
    """
    outcome: _Outcome[T] = _Outcome()

    def work() -> None:
        try:
            outcome.value = request()
        except BaseException as exc:
            outcome.error = exc

    worker = threading.Thread(target=work, name="dpmagic-request", daemon=True)
    start = time.monotonic()
    shown = -1
    worker.start()
    try:
        while worker.is_alive():
            worker.join(TICK_S)
            waited = time.monotonic() - start
            if worker.is_alive() and waited >= SHOW_AFTER_S and int(waited) > shown:
                shown = int(waited)
                show(Progress(waited))
    except KeyboardInterrupt:
        abort()
        raise Interrupted(time.monotonic() - start) from None
    if shown >= 0:
        show(Progress(time.monotonic() - start, done=True))
    if outcome.error is not None:
        raise outcome.error
    return outcome.value
