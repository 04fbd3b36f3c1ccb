"""The journal: ``journal.jsonl`` in the data folder, one record a line, appended before a message
is acknowledged.

Three promises live here:

- **A failed append leaves nothing.** A short write (a full disk) is cut back to where the append
  began, so a message whose call raised is never replayed later.
- **A torn tail is cut at replay.** A line without its newline (a crash mid-append) was never
  acknowledged; it is truncated before anything new is appended, so the next record starts on a
  line of its own instead of being glued to the torn one.
- **Acknowledged means on disk** (``durability="fsync"``, the default): :meth:`Journal.sync`
  returns once an ``fdatasync`` covered the caller's records. Concurrent callers share one
  ``fdatasync`` (group commit): whoever finds none running starts one for everything written so
  far; the others wait for it. ``durability="os"`` leaves the write-back to the operating system
  (a killed process loses nothing, an OS crash or power cut may lose the last seconds).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from cce_duck.cipher import JournalCodec
from cce_duck.errors import StorageError

__all__ = ["DURABILITY", "Journal"]

#: ``fsync``: a record is on disk before its call returns; ``os``: the OS writes it back later.
DURABILITY = ("fsync", "os")



def _sync(fd: int) -> None:
    """``fdatasync`` (the data and the size, not the file's times) where the OS has it."""
    getattr(os, "fdatasync", os.fsync)(fd)


class Journal:
    """The append-only journal of one data folder (a process holds it open while it writes)."""

    def __init__(self, path: Path, codec: JournalCodec, durability: str = "fsync") -> None:
        if durability not in DURABILITY:
            raise ValueError(f"durability must be one of {DURABILITY}, got {durability!r}")
        self.path = path
        self.codec = codec
        self.durability = durability
        self._fd: int | None = None
        self._lock = threading.Lock()       # appends and resets, one at a time
        self._cond = threading.Condition()  # group commit
        self._written = 0   # bytes appended since the journal was opened (never goes back)
        self._synced = 0    # of those, bytes known to be on disk (or in the committed tables)
        self._syncing = False
        self._sync_error: OSError | None = None
        #: fdatasync calls made (what group commit saves is visible here).
        self.syncs = 0

    # -- reading ------------------------------------------------------------

    def replay(self) -> Iterator[dict[str, Any]]:
        """Every readable record in order; a torn last line is cut from the file first."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return
        end = data.rfind(b"\n") + 1
        if end < len(data):  # a line without its newline: never acknowledged
            os.truncate(self.path, end)
            data = data[:end]
        # split on "\n" only: splitlines() would also cut at U+2028, U+0085 ... inside a message
        for line in data.decode("utf-8", errors="replace").split("\n"):
            if not line:
                continue
            try:
                yield self.codec.decode(line)
            except (ValueError, KeyError, TypeError):
                continue  # a damaged line (an old version glued a record onto a torn one)

    # -- writing ------------------------------------------------------------

    def _open(self) -> int:
        if self._fd is None:
            new = not self.path.exists()
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            if new and self.durability == "fsync":  # the file's name must survive a crash too
                folder = os.open(self.path.parent, os.O_RDONLY)
                try:
                    os.fsync(folder)
                finally:
                    os.close(folder)
        return self._fd

    def append(self, records: Iterable[dict[str, Any]]) -> int:
        """Write ``records`` (all or none) and return a ticket for :meth:`sync`.

        Raises :class:`StorageError` when the disk refuses them; the file is then cut back to
        its length before the call, so none of them is replayed later.
        """
        data = "".join(self.codec.encode(r) + "\n" for r in records).encode("utf-8")
        with self._lock:
            try:
                fd = self._open()
                start = os.fstat(fd).st_size
            except OSError as exc:
                raise self._error(exc) from exc
            view = memoryview(data)
            try:
                while view:
                    view = view[os.write(fd, view):]
            except OSError as exc:
                try:
                    os.ftruncate(fd, start)  # a shrink needs no space
                except OSError as cut:
                    raise StorageError(
                        f"the journal {self.path} could not be written ({exc.strerror}) nor cut "
                        f"back ({cut.strerror}); restart the process before writing again"
                    ) from exc
                raise self._error(exc) from exc
            with self._cond:
                self._written += len(data)
                return self._written

    def _error(self, exc: OSError) -> StorageError:
        return StorageError(f"cannot write the journal of the data folder {self.path.parent}: "
                            f"{exc.strerror or exc}; nothing of this call was stored")

    def sync(self, ticket: int) -> None:
        """Return once the records up to ``ticket`` are on disk (group commit)."""
        if self.durability == "os":
            return
        with self._cond:
            while self._synced < ticket:
                if self._sync_error is not None:
                    raise StorageError(
                        f"the journal of the data folder {self.path.parent} could not be synced "
                        f"to disk ({self._sync_error.strerror}); restart the process: what it "
                        "acknowledged before is kept, this call may or may not be") from None
                if self._syncing:
                    self._cond.wait()
                    continue
                self._syncing, target, fd = True, self._written, self._fd
                self._cond.release()
                try:
                    if fd is not None:
                        _sync(fd)
                        self.syncs += 1
                except OSError as exc:
                    self._sync_error = exc
                finally:
                    self._cond.acquire()
                    self._syncing = False
                    if self._sync_error is None:
                        self._synced = max(self._synced, target)
                    self._cond.notify_all()

    def reset(self) -> None:
        """Empty the journal: everything in it is now in the committed tables."""
        with self._lock:
            if self._fd is not None:
                os.ftruncate(self._fd, 0)
            elif self.path.exists():
                os.truncate(self.path, 0)
            with self._cond:
                self._synced = self._written  # durable through the database's own commit
                self._cond.notify_all()

    def close(self) -> None:
        """Close the file (what is in it stays for the next replay)."""
        with self._lock:
            if self._fd is not None:
                fd, self._fd = self._fd, None
                os.close(fd)
