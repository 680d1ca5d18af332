"""Child processes that never outlive the command that started them.

``dpmagic lab`` and ``dpmagic demo`` start a gate, JupyterLab and kernels, and
put a copy of the example's private data in a temporary folder. Whichever way
the command ends (normal exit, an exception, Ctrl-C, ``kill``, a closed
terminal), the children must stop and the folder must go: a gate left running
under PID 1 keeps serving the data, and a forgotten folder keeps a copy of it.

How: the children are started in one process group of their own, so one
``killpg`` reaches them all, and so a terminal's Ctrl-C reaches this command
alone (JupyterLab would otherwise stop to ask "Shutdown this Jupyter server?").
SIGTERM, SIGHUP and SIGINT are turned into a :class:`Stopped` exception, which
unwinds the command like ``KeyboardInterrupt`` does: every ``with`` block on
the way out runs, so children are stopped (SIGTERM, then SIGKILL after a grace
period) before their temporary folder is removed. Kernels live in sessions of
their own (``jupyter_client`` starts them so); they are found as descendants
(psutil) before anything is signalled, and stopped the same way if their
parent did not shut them down. Only SIGKILL of this command cannot be handled.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from types import FrameType
from typing import Any

import psutil

STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
GRACE_S = 10.0


class Stopped(BaseException):
    """A stop signal arrived. A BaseException, like KeyboardInterrupt, so that
    ``except Exception`` in library code (asyncio, nbclient) does not swallow it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Supervisor:
    """Owns the children's process group and the stop signals while entered.

    ``stop()`` is idempotent and, once begun, further stop signals are ignored:
    the cleanup is bounded by its own timeouts, and a second Ctrl-C must not
    interrupt the removal of the data copy half-way.
    """

    def __init__(self, grace: float = GRACE_S) -> None:
        self.grace = grace
        self.pgid: int | None = None
        self._stopping = False
        self._holding = 0
        self._pending: int | None = None
        self._previous: dict[int, Any] = {}
        self._children: list[subprocess.Popen[Any]] = []

    def __enter__(self) -> Supervisor:
        for signum in STOP_SIGNALS:
            self._previous[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.stop()
        finally:
            for signum, previous in self._previous.items():
                signal.signal(signum, previous)

    def popen(self, cmd: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start a child in the children's group; stdin is never the terminal's
        (a background group reading it would be stopped by SIGTTIN)."""
        kwargs.setdefault("stdin", subprocess.DEVNULL)
        with self._deferred():
            proc = subprocess.Popen(cmd, process_group=self.pgid or 0, **kwargs)
            if self.pgid is None:
                self.pgid = proc.pid
            self._children.append(proc)
        return proc

    def stop(self) -> None:
        """SIGTERM to the group and every descendant's own shutdown, then SIGKILL
        to whatever is left after the grace period; every child reaped.

        Our own children are waited for through their Popen, so their exit
        status stays readable; other descendants through psutil.
        """
        if self._stopping:
            return
        self._stopping = True
        if self.pgid is None:
            return
        ours = {child.pid for child in self._children}
        others = [p for p in psutil.Process().children(recursive=True) if p.pid not in ours]
        self._signal_group(signal.SIGTERM)
        deadline = time.monotonic() + self.grace
        for child in self._children:
            with contextlib.suppress(subprocess.TimeoutExpired):
                child.wait(max(0.0, deadline - time.monotonic()))
        _, alive = psutil.wait_procs(others, timeout=max(0.0, deadline - time.monotonic()))
        # Outside the group (kernels) and not shut down by their parent.
        for proc in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.terminate()
        _, alive = psutil.wait_procs(alive, timeout=self.grace / 2)
        self._signal_group(signal.SIGKILL)
        for proc in alive:
            with contextlib.suppress(psutil.NoSuchProcess):
                proc.kill()
        for child in self._children:
            child.wait()
        psutil.wait_procs(alive, timeout=self.grace / 2)

    def _signal_group(self, signum: int) -> None:
        """Signal the children's group, only while one of them runs: a group
        id whose members are all gone could be taken by someone else's."""
        if self.pgid is None or all(child.poll() is not None for child in self._children):
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, signum)

    @contextlib.contextmanager
    def _deferred(self) -> Iterator[None]:
        """A signal arriving while a child is being started waits until it is
        recorded, so no child can escape the group's stop."""
        self._holding += 1
        try:
            yield
        finally:
            self._holding -= 1
        if self._pending is not None and not self._holding and not self._stopping:
            signum, self._pending = self._pending, None
            raise Stopped(signum)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self._stopping:
            return
        if self._holding:
            self._pending = signum
            return
        raise Stopped(signum)


def exit_by_signal(signum: int) -> None:
    """End this process by ``signum`` with its default action, after cleanup, so
    a shell or supervisor sees how it ended (e.g. a Ctrl-C stops a loop)."""
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
