"""Group commit: concurrent writes of one process share one commit.

On a lake a commit is a round of catalog statements (about 12 ms with a local PostgreSQL catalog
however few rows it carries), and a write is acknowledged only once it is committed. So each
write takes a *ticket* when its rows join the writer's buffer (:meth:`GroupCommit.issue`) and
then waits for a commit that covers the ticket (:meth:`GroupCommit.wait`): if none is running,
the waiter leads one, which stores everything buffered so far, its own rows and those of every
call that arrived meanwhile; the others wait for it, or lead the next. Under load a commit
carries the rows of all the calls that arrived during the one before.

A leader first gathers: it waits up to :data:`GATHER_S` for calls already inside the writer,
and, when recent commits carried several calls' rows (concurrent writers), up to
:data:`GATHER_MAX_S` until as many rows wait as the fullest of the last :data:`RECENT`
commits carried: the writers whose rows the previous commit carried are sending their next
ones, and one commit for all of them costs about what one commit for a few does. A lone writer
(every recent commit carried one row) never waits.

A commit that fails fails every call it covered (none of them was stored: the writer drops
their rows), and the calls that arrive after it lead a new one.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

__all__ = ["GATHER_MAX_S", "GATHER_S", "RECENT", "GroupCommit"]

#: A leader waits at most this long for calls that are about to join its commit.
GATHER_S = 0.002
#: ... and at most this long for as many rows as recent commits carried.
GATHER_MAX_S = 0.010
#: Commits whose sizes set that goal.
RECENT = 16


@dataclass
class _Failed:
    low: int   # tickets low < t <= high failed with error
    high: int
    error: BaseException


class GroupCommit:
    """Tickets and the leader/follower protocol around one writer's commits."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._issued = 0     # the newest ticket given out
        self._done = 0       # every ticket up to this one is committed or failed
        self._leading = False
        self._arriving = 0   # calls between entering the writer and taking their ticket
        self._failed: list[_Failed] = []
        self._recent: deque[int] = deque(maxlen=RECENT)  # rows the last commits carried
        #: Commits made and the tickets they carried (their ratio: rows per commit).
        self.commits = 0
        self.carried = 0

    # -- the writer's side --------------------------------------------------

    @contextmanager
    def arriving(self) -> Iterator[None]:
        """A call that may buffer rows (a leader gathering its commit waits for it a moment)."""
        with self._cond:
            self._arriving += 1
        try:
            yield
        finally:
            with self._cond:
                self._arriving -= 1
                self._cond.notify_all()

    def issue(self, count: int = 1) -> int:
        """The ticket of ``count`` rows just buffered (with the writer's buffer lock held)."""
        with self._cond:
            self._issued += count
            self._cond.notify_all()  # (a gathering leader counts the rows that wait)
            return self._issued

    def cut(self) -> int:
        """The newest ticket, read by a commit as it takes the buffer (with the writer's lock
        held): the tickets it covers."""
        with self._cond:
            return self._issued

    def finished(self, cut: int, error: BaseException | None = None) -> None:
        """The commit that took the buffer at ``cut`` succeeded (``error`` ``None``) or failed."""
        with self._cond:
            if cut > self._done:
                if error is not None:
                    self._failed.append(_Failed(self._done, cut, error))
                    del self._failed[:-64]
                else:
                    self.commits += 1
                    self.carried += cut - self._done
                    self._recent.append(cut - self._done)
                self._done = cut
            self._cond.notify_all()

    # -- the caller's side --------------------------------------------------

    def wait(self, ticket: int, commit: Callable[[], None]) -> None:
        """Return once ``ticket`` is committed; raise the error of the commit that failed it.
        ``commit`` runs one commit of everything buffered (it calls :meth:`cut` and
        :meth:`finished` itself)."""
        if ticket <= 0:
            return
        with self._cond:
            while True:
                if ticket <= self._done:
                    for f in self._failed:
                        if f.low < ticket <= f.high:
                            raise f.error
                    return
                if self._leading:
                    self._cond.wait()
                    continue
                self._leading = True
                issued = self._issued
                break
        try:
            self._gather()
            commit()
        except BaseException as exc:  # (a commit that raised before recording its end)
            self.finished(issued, exc)
            raise
        finally:
            with self._cond:
                self._leading = False
                self._cond.notify_all()
        self.wait(ticket, commit)  # covered now (or failed), unless it arrived after the cut

    def _gather(self) -> None:
        """Give calls already inside the writer a moment to buffer their rows, and concurrent
        writers the time to send their next ones (see the module docstring)."""
        start = time.monotonic()
        with self._cond:
            goal = max(self._recent, default=1)
            while True:
                now = time.monotonic()
                if self._arriving and now < start + GATHER_S:
                    self._cond.wait(start + GATHER_S - now)
                elif goal > 1 and self._issued - self._done < goal and now < start + GATHER_MAX_S:
                    self._cond.wait(start + GATHER_MAX_S - now)
                else:
                    return

    @property
    def per_commit(self) -> float:
        """Tickets per successful commit so far."""
        return self.carried / self.commits if self.commits else 0.0
