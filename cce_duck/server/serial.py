"""One engine shared by the adapters' threads: writes run one at a time, reads in parallel."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from starlette.concurrency import run_in_threadpool

from cce_duck.engine import Engine
from cce_duck.errors import CCEError
from cce_duck.messages import parse_messages
from cce_duck.payload import ContextPayload

__all__ = ["READERS", "Serialized"]

T = TypeVar("T")

#: Reads that run at once (``CCE_SERVER_READERS``, default: the cores, at least 2). Reads are
#: mostly Python under one interpreter lock: more of them at once only make each slower and
#: starve the event loop that answers the clients.
READERS = int(os.environ.get("CCE_SERVER_READERS", "0") or 0) or max(2, os.cpu_count() or 2)


class Serialized:
    """An engine shared by the threads of a server (REST, proxy and MCP).

    :meth:`call` runs a call that may write, one at a time (holding the store's write lock);
    :meth:`read` runs a read beside other reads and writes, on the thread's own DuckDB cursor
    (see docs/concurrency.md).
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._lock = engine.store.write_lock
        self._readers = threading.BoundedSemaphore(READERS)

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn`` while holding the write lock; the journal sync its writes need runs after
        the lock is released, shared with concurrent calls (group commit). A call counts as
        arriving while it waits for the lock, so that a lake's commit under way gathers it
        (see :meth:`cce_duck.groupcommit.GroupCommit.arriving`). (On a lake a write through
        this call takes its session's lease, and reads the change feed, inside this lock, as
        a read refreshes: one order of the write lock and the coordinator's, no deadlock.
        Messages added through :meth:`add` take the writer's locks in the writer itself.)"""
        with self.engine.deferred_sync(), self.engine.writer.group.arriving(), self._lock:
            return fn(*args, **kwargs)

    def add(self, fn: Callable[..., T], session_id: str, messages: Any, **kwargs: Any) -> T:
        """:meth:`call` of ``fn`` (``Engine.add_messages``). On a lake the messages' text is
        analysed first, and the call does not take the write lock itself: the writer takes it,
        or while an acknowledgement commit holds it, numbers and buffers the messages for the
        next commit beside it (see :meth:`cce_duck.writer.Writer.add`)."""
        if self.engine.store.lake is None:
            return self.call(fn, session_id, messages, **kwargs)
        with contextlib.suppress(CCEError):  # (raised again by the call)
            self.engine.writer.analyse(parse_messages(messages))
        with self.engine.deferred_sync(), self.engine.writer.group.arriving():
            return fn(session_id, messages, **kwargs)

    def read(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn``, one of the engine's reads made safe beside other threads (``context``,
        ``user_context``, ``search``, ``sessions``, ``users``, ``stats``, ``summary``,
        :func:`~cce_duck.adhoc.read_only_query`), without the write lock, on the thread's own
        cursor (on a lake as on a file: one lake snapshot per read). A read whose lake data
        files a compaction or an erasure deleted under it runs again inside the engine
        (:meth:`cce_duck.store.Store.read`)."""
        with self._readers:
            return fn(*args, **kwargs)

    async def context(self, session_id: str, query: str, **kwargs: Any) -> ContextPayload:
        """``Engine.context`` for a server's event loop: built right there when it can be from
        memory alone (:meth:`Engine.context_in_memory`: a few milliseconds of Python, which a
        hand-off to a thread would only make slower), else by :meth:`read` on a worker
        thread (it may read the store or wait for the write lock). On a lake shared with other
        processes the loop first awaits a read of the change feed that began after the call
        arrived, shared with the other contexts waiting then (:mod:`cce_duck.refresher`);
        while the catalog cannot be reached the call goes to the thread at once (which tries
        the catalog once and answers from the cache, saying so)."""
        engine = self.engine
        coord = engine.store.coordinator
        fresh = False
        if coord is not None and coord.stale is None and engine.may_answer_in_memory():
            await asyncio.wrap_future(coord.refreshed())
            fresh = True
        payload = engine.context_in_memory(session_id, query, fresh=fresh, **kwargs)
        if payload is not None:
            return payload
        built: ContextPayload = await run_in_threadpool(
            functools.partial(self.read, self.engine.context, session_id, query, **kwargs))
        return built
