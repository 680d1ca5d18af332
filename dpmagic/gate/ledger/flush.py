"""The write-ahead log flushed to the disk off a query's path (see ``store.py``'s
docstring for which commits wait for it, and why a debit's may come after it returns)."""

from __future__ import annotations

import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path


class Flusher:
    """Flushes the write-ahead log to the disk on a thread of its own, as a FULL commit
    would have, for commits already written (NORMAL). A flush covers every commit
    written before it began: a commit's ticket is the count of commits written when it
    returned, and a flush that starts with ``written >= ticket`` covers it. Requests
    that queue behind a flush are served by the next one, not one each.

    The log's file may have been replaced since a commit: SQLite copies the log into
    the database file (a checkpoint, which flushes the database file after the copy
    under NORMAL and FULL alike) before it starts the log again or, as the last
    connection closes (another gate process's), deletes it. A commit is then on the
    disk in the database file, or in the new log; the flush syncs whichever exists,
    and the folder when a new log file was made, since its name is in the folder."""

    def __init__(self, database: Path) -> None:
        self._database = database
        self._wal = database.with_name(database.name + "-wal")
        self._lock = threading.Lock()
        self._written = 0  # commits whose write the operating system has
        self._flushed = 0  # of those, the ones known to be on the disk
        self._log_file: int | None = None  # the inode of the log last flushed
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="dpmagic-ledger-flush")

    def committed(self) -> Future[None]:
        """Call after a NORMAL commit returns: its flush, done when it is on the disk."""
        with self._lock:
            self._written += 1
            ticket = self._written
        return self._thread.submit(self._flush, ticket)

    def _flush(self, ticket: int) -> None:
        with self._lock:
            if self._flushed >= ticket:
                return
            target = self._written
        # One thread runs this, so flushes never overlap; the lock guards the counts.
        try:
            fd = os.open(self._wal, os.O_RDONLY)
        except FileNotFoundError:  # checkpointed into the database file and deleted
            fd = os.open(self._database, os.O_RDONLY)
        try:
            os.fdatasync(fd)
            inode = os.fstat(fd).st_ino
        finally:
            os.close(fd)
        if inode != self._log_file:  # a file made since the last flush: its name too
            folder = os.open(self._database.parent, os.O_RDONLY)
            try:
                os.fsync(folder)
            finally:
                os.close(folder)
            self._log_file = inode
        with self._lock:
            self._flushed = max(self._flushed, target)

    def close(self) -> None:
        self._thread.shutdown(wait=True)
