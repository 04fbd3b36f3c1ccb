"""What other processes changed in a lake: its snapshots, read from the catalog database.

Every DuckLake commit is one snapshot, recorded in the catalog table
``ducklake_snapshot_changes`` with an author, a commit message and extra information that the
committing transaction may set (``ducklake_set_commit_message``). cce_duck stamps each of its
commits with the process's :attr:`ChangeFeed.token` as author and, as extra information, the
sessions the commit wrote (:meth:`ChangeFeed.stamp`). Before serving a call, a process reads the
snapshots committed since it last looked (:meth:`ChangeFeed.poll`, one indexed query, about
0.06 ms on a local catalog) and learns:

- which sessions other cce_duck processes wrote (their cached indexes and turn counters are
  dropped, so the next read of them is fresh and the next write numbers after their turns);
- whether some commit does not say what it changed (``cce sql``, maintenance, another program):
  then everything cached is dropped;
- whether snapshots it has not read were expired meanwhile (a compaction or an erasure expires
  the older snapshots, and their stamps with them): DuckLake numbers snapshots one after the
  other, so the first one it reads then is past the next number, and everything cached is
  dropped too. (A compaction by a process itself keeps the snapshots of the last
  :data:`cce_duck.compaction.EXPIRE_GRACE_S` seconds, which the processes that are serving
  have read by then.)

Its own commits are skipped: the process updated its caches when it made them.
"""

from __future__ import annotations

import json
import os
import socket
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from cce_duck.leases import CatalogLink

__all__ = ["MESSAGE", "ChangeFeed", "Changes"]

#: The commit message of cce_duck's writes (the extra information lists the sessions).
MESSAGE = "cce_duck"


@dataclass
class Changes:
    """What :meth:`ChangeFeed.poll` found since the previous poll."""

    #: Sessions other cce_duck processes wrote.
    sessions: set[str] = field(default_factory=set)
    #: A commit that does not say which sessions it changed: drop every cache.
    everything: bool = False
    #: Snapshots seen, and the newest one.
    snapshots: int = 0
    head: int = -1

    def __bool__(self) -> bool:
        return self.everything or bool(self.sessions)


class ChangeFeed:
    """The snapshots of one lake that this process has not seen yet."""

    def __init__(self, link: CatalogLink) -> None:
        self.link = link
        #: This process's author name on its commits (host, process id and a random part: a
        #: restarted process is another author).
        self.token = f"cce_duck/{socket.gethostname()}/{os.getpid()}/{uuid.uuid4().hex[:8]}"
        rows = link.run("feed_head")
        self.seen = int(rows[0][0]) if rows else -1

    def stamp(self, sessions: Iterable[str] | None, info: dict[str, Any] | None = None
              ) -> tuple[str, str, str]:
        """``(author, message, extra_info)`` for a commit that wrote ``sessions`` (``None``: it
        may have changed anything); ``info`` adds what kind of commit it is (``{"kind":
        "ack"}``: turn rows, ``"derived"``: rows derived from them; see
        :mod:`cce_duck.backlog`)."""
        extra: dict[str, Any] = {"all": True} if sessions is None else {
            "sessions": sorted(set(sessions))}
        extra.update(info or {})
        return self.token, MESSAGE, json.dumps(extra, separators=(",", ":"))

    def poll(self) -> Changes:
        """The changes other processes committed since the last poll (raises
        :class:`~cce_duck.errors.StorageError` when the catalog is unreachable; nothing is
        marked seen then)."""
        rows = self.link.run("feed_since", {"after": self.seen})
        out = Changes(head=self.seen)
        for snapshot_id, author, message, extra, _changes in rows:
            out.snapshots += 1
            if int(snapshot_id) != out.head + 1:  # a gap: snapshots expired before this
                out.everything = True             # process read them (their stamps are gone)
            out.head = max(out.head, int(snapshot_id))
            if author == self.token:
                continue
            sessions = _sessions(message, extra)
            if sessions is None:
                out.everything = True
            else:
                out.sessions.update(sessions)
        self.seen = out.head
        return out


def _sessions(message: str | None, extra: str | None) -> list[str] | None:
    """The sessions a cce_duck commit names; ``None`` for any other commit."""
    if message != MESSAGE or not extra:
        return None
    try:
        data = json.loads(extra)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("all"):
        return None
    sessions = data.get("sessions")
    if not isinstance(sessions, list) or not all(isinstance(s, str) for s in sessions):
        return None
    return sessions

