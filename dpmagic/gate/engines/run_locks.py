"""A user's one run on a dataset, and a question's first release, held across the
gate's worker processes.

``admission.py`` lets each user have one run at a time on each dataset, so that a
user sending the heaviest queries the policy allows holds one run's share of the
engine's memory and cores, whoever else is querying. Within one process its
condition does that; a gate of several workers (``service/workers.py``) accepts a
user's requests in any of them, so the rule is also held here, by a lock the
operating system keeps for the whole machine: one file per dataset and user in the
state directory, ``flock``-ed exclusively for as long as the run's work goes on.

Why a file lock, and one per user:

- the kernel drops a ``flock`` when the process holding it dies, so a worker that
  crashes (or is killed) mid-run never leaves a user locked out, and nothing has to
  clean a table of holders the way a lock kept in the ledger would need;
- a lock taken on a separately opened file is the caller's alone, threads of one
  process included, so it excludes the user's other requests wherever they run;
- one file per (dataset, user), named by a hash of both, never a lock shared by
  several users (a fixed set of stripes): two users whose names hashed alike would
  wait for each other, and how long one waited would say when the other ran.

The files are empty; the folder, like the state directory, is the gate user's
alone (0700, each file 0600), and a file's name says nothing of the user but to
someone who can already read the ledger beside it.

``FlightLocks`` does the same for the engine's single flight of a replay key
(``engine._Flights``): the same question asked in two workers at once waits for
the first release rather than making a second, so everyone who asks is served the
same numbers. One lock per replay key and scope the release is served in (the
asker's own; everyone's, or each group's, where the dataset shares releases): two
asks contend exactly when one's release could be served to the other. Replay keys
are many, so each file is removed by its holder before it lets go; a waiter that
then holds a removed file sees that and opens the path anew.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
from collections.abc import Callable, Iterable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

FOLDER = "runs"
FLIGHTS = "flights"


class RunLocks:
    """The run locks of one dataset, as files in ``state_dir / FOLDER``."""

    def __init__(self, state_dir: Path, dataset: str) -> None:
        self.folder = state_dir / FOLDER
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.dataset = dataset

    def path(self, user: str) -> Path:
        name = hashlib.sha256(f"{self.dataset}\0{user}".encode()).hexdigest()[:40]
        return self.folder / f"{name}.lock"

    def hold(self, user: str) -> Held:
        """Wait until no other process (or thread) runs ``user``'s query on this
        dataset, then hold the lock until ``Held.release``."""
        fd = os.open(self.path(user), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except BaseException:
            os.close(fd)
            raise
        return Held(fd)


class Held:
    """A held run lock; ``release`` may be called from any thread, once."""

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)  # closing the last descriptor of the file drops the flock


class FlightLocks:
    """The locks of first releases, as files in ``state_dir / FLIGHTS``."""

    def __init__(self, state_dir: Path) -> None:
        self.folder = state_dir / FLIGHTS
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)

    def path(self, key: str, scope: Iterable[str]) -> Path:
        name = hashlib.sha256("\0".join([key, *scope]).encode()).hexdigest()[:40]
        return self.folder / f"{name}.lock"

    @contextmanager
    def holding(
        self, key: str, scopes: Iterable[Iterable[str]], contended: Callable[[], None]
    ) -> Iterator[None]:
        """Hold the lock of ``key`` in every one of ``scopes`` (in the order of their
        files, so two holders never wait for each other in a circle); ``contended()``
        is called once, before the first wait for another holder."""
        told = [False]

        def wait() -> None:
            if not told[0]:
                told[0] = True
                contended()

        with ExitStack() as held:
            for path in sorted({self.path(key, scope) for scope in scopes}):
                held.enter_context(_removed_after(path, wait))
            yield


@contextmanager
def _removed_after(path: Path, wait: Callable[[], None]) -> Iterator[None]:
    """Hold ``path``'s ``flock`` (``wait()`` before blocking on another holder), and
    remove the file before letting go."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                wait()
                fcntl.flock(fd, fcntl.LOCK_EX)
            if _same_file(fd, path):
                break
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # its holder removed it meanwhile: the lock is the path's new file
    try:
        yield
    finally:
        try:
            path.unlink(missing_ok=True)
        finally:
            os.close(fd)


def _same_file(fd: int, path: Path) -> bool:
    try:
        return os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False
