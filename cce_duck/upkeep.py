"""Compaction of a lake by the processes that write to it, on a timer.

Live writing leaves one or more small data files per commit (30 to 60 per 1,000 messages,
docs/scale.md); every read of a table opens all of them, and the catalog keeps a row per file.
:class:`Upkeep` is a thread that, every ``compact_check_s`` seconds, counts the data files the
lake's current snapshot reads and compacts the lake (``Engine.compact``: merge, drop deleted
rows, expire older snapshots, delete the files no snapshot uses) once they are more than
``compact_files``. Several processes on one lake each run one: one process compacts at a time
and the count is taken again under the lake's commit lock, so the others find nothing to do
(:mod:`cce_duck.compaction`). Writes of every process wait for one step of the compaction at
a time (a table's merge or rewrite, then the expiry, the clean-up and the text bounds); no
process reloads its cached indexes because of it (the snapshots of the last
:data:`cce_duck.compaction.EXPIRE_GRACE_S` seconds are kept). An error (the catalog
unreachable) is logged and the next check tries again.

Each check also looks for erasures another process left unfinished (killed between the commit
that deleted the rows and the purge of the data files: :mod:`cce_duck.erasure`), and purges the
lake again when an intent is older than :data:`cce_duck.erasure.STALE_S`.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

__all__ = ["Upkeep"]

log = logging.getLogger(__name__)


class Upkeep:
    """A daemon thread that runs ``compact(above_files=max_files)`` every ``every_s`` seconds
    (until :meth:`close`)."""

    def __init__(self, compact: Callable[..., dict[str, int]], *, every_s: float,
                 max_files: int, finish: Callable[[], int] | None = None) -> None:
        self._compact = compact
        self._finish = finish
        #: Purges run for erasures other processes left unfinished.
        self.finished = 0
        self.every_s = every_s
        self.max_files = max_files
        #: Compactions done, the figures of the last one and the error of the last check.
        self.compactions = 0
        self.last: dict[str, int] | None = None
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cce-upkeep", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.check()

    def check(self) -> dict[str, int] | None:
        """Count the data files and compact when they are too many; the figures when it
        compacted, else ``None`` (errors are logged and kept in :attr:`error`). Erasures left
        unfinished are purged first."""
        try:
            if self._finish is not None and self._finish():
                self.finished += 1
                log.info("purged the lake again for an erasure another process left unfinished")
            sizes = self._compact(above_files=self.max_files)
        except Exception as exc:  # (the thread must go on: the next check tries again)
            self.error = str(exc)
            log.warning("the lake could not be compacted: %s", exc)
            return None
        self.error = None
        if not sizes["compacted"]:  # too few files (counted again under the lock when more),
            return None  # or another process is compacting the lake now
        self.compactions += 1
        self.last = sizes
        log.info("compacted the lake: %d data files (%d bytes) into %d (%d bytes)",
                 sizes["files_before"], sizes["bytes_before"], sizes["files_after"],
                 sizes["bytes_after"])
        return sizes

    def close(self) -> None:
        """Stop the thread (a compaction under way is finished first)."""
        self._stop.set()
        if self._thread is not threading.current_thread():
            self._thread.join()
