"""Reads of a lake's change feed shared by the reads that wait for one (a group commit for reads).

A read on a lake with a PostgreSQL catalog must see every commit acknowledged before it arrived,
in any process: before it answers, it reads the change feed (:meth:`Coordinator.refresh
<cce_duck.coordinator.Coordinator.refresh>`, one query to the catalog). A server's contexts
are built on its event loop from memory (:meth:`Engine.context_in_memory
<cce_duck.engine.Engine.context_in_memory>`), which must not wait for the catalog: a context
asks :meth:`Refresher.after_now` for a future and awaits it. One thread reads the feed for every
read waiting at that moment, so that concurrent reads share one query instead of queueing for
one each. A read is answered only by a poll that *began after it asked*: a poll already under
way may have begun before a commit the caller saw acknowledged, so the caller waits for the
next one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from cce_duck.errors import StorageError

__all__ = ["Refresher"]


class Refresher:
    """Runs ``refresh`` on a thread of its own for the callers of :meth:`after_now`, one run for
    all callers that asked before it began."""

    def __init__(self, refresh: Callable[[], Any]) -> None:
        self._refresh = refresh
        self._cv = threading.Condition()
        self._waiting: list[Future[None]] = []
        self._thread: threading.Thread | None = None
        self._closed = False
        #: Runs of ``refresh`` so far, and the futures they answered (for the statistics).
        self.runs = 0
        self.answered = 0

    def after_now(self) -> Future[None]:
        """A future that is done once a run of ``refresh`` that began after this call has ended
        (with its exception, if it raised one; a closed refresher fails it with
        :class:`~cce_duck.errors.StorageError`)."""
        done: Future[None] = Future()
        with self._cv:
            if self._closed:
                done.set_exception(StorageError("the store is closed"))
                return done
            self._waiting.append(done)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="cce-refresher",
                                                daemon=True)
                self._thread.start()
            self._cv.notify()
        return done

    def _run(self) -> None:
        while True:
            with self._cv:
                while not self._waiting and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                batch, self._waiting = self._waiting, []  # (each asked before this run began)
            # a caller that gave up (a client gone: its awaiting task cancelled the future) is
            # left out; the others can no longer be cancelled, so answering them cannot fail
            batch = [done for done in batch if done.set_running_or_notify_cancel()]
            try:
                self._refresh()
            except BaseException as exc:  # (handed to the callers, who raise it)
                for done in batch:
                    done.set_exception(exc)
            else:
                for done in batch:
                    done.set_result(None)
            self.runs += 1
            self.answered += len(batch)

    def close(self) -> None:
        """Stop the thread (after a run under way); callers still waiting get
        :class:`~cce_duck.errors.StorageError`."""
        with self._cv:
            self._closed = True
            left, self._waiting = self._waiting, []
            self._cv.notify_all()
            thread = self._thread
        for done in left:
            done.set_exception(StorageError("the store is closed"))
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=10)
