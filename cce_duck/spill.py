"""Where the int8 vectors of a large user's index are kept: in memory, or in a spill file.

A user's joined index above :attr:`cce_duck.Config.exact_user_turns` ranks with compact codes
in memory (:mod:`cce_duck.projection`) and reads the exact int8 vectors of a few thousand
candidates per question; those vectors then need not be in the process's heap. In a writable
data folder they are appended to a file of ``vectors.tmp/`` (:data:`cce_duck.folder.SPILL_DIR`)
and read back by row, through a memory map whose pages are handed back after every read: they
stay in the operating system's page cache (evictable, shared, not this process's resident
memory). Without a writable folder (in memory, a lake, read-only) they stay in memory.

A spill file lives as long as the process uses it: it is removed when the last index holding
it is dropped, by :meth:`cce_duck.Engine.close`, by every erasure
(:func:`cce_duck.erasure.erase`: forgetting, deleting a session or a user) and at the next
writable open after a crash (:func:`cce_duck.folder.clean_leftovers`). In an encrypted folder
it is encrypted with AES-256 in counter mode under a key drawn for the file and kept only in
memory: what the file holds is unreadable once the process ends.

:class:`Vectors` is what an index holds: the rows in memory, or their row numbers in a spill
file; both give the same int8 values.
"""

from __future__ import annotations

import mmap
import os
import secrets
import shutil
import threading
import weakref
from pathlib import Path

import numpy as np

__all__ = ["SpillFile", "Vectors", "appended", "held_bytes", "remove_spill_files"]

_AES_BLOCK = 16


class _Keystream:
    """AES-256 in counter mode, computed for any rows at once: the counter of byte ``i`` of the
    file is ``i // 16`` after a random 64-bit prefix, encrypted in ECB (each block distinct)."""

    def __init__(self, dim: int) -> None:
        self._key = secrets.token_bytes(32)
        self._prefix = np.frombuffer(secrets.token_bytes(8), dtype=np.uint64)[0]
        self._blocks = -(-dim // _AES_BLOCK)
        self._dim = dim

    def of_rows(self, rows: np.ndarray) -> np.ndarray:
        """``(len(rows), dim)`` int8 keystream of the file rows ``rows``."""
        # (imported here: only an encrypted folder's spill file uses it, see cipher._aesgcm)
        from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

        n = len(rows)
        ctr = np.empty((n, self._blocks, 2), dtype=np.uint64)
        ctr[:, :, 0] = self._prefix
        first = rows.astype(np.uint64) * np.uint64(self._blocks)
        ctr[:, :, 1] = first[:, None] + np.arange(self._blocks, dtype=np.uint64)[None, :]
        out = bytearray(n * self._blocks * _AES_BLOCK + _AES_BLOCK)
        enc = Cipher(algorithms.AES(self._key), modes.ECB()).encryptor()
        enc.update_into(ctr.reshape(-1).view(np.uint8).data, out)
        stream = np.frombuffer(out, dtype=np.int8, count=n * self._blocks * _AES_BLOCK)
        return stream.reshape(n, self._blocks * _AES_BLOCK)[:, : self._dim]


def _close(fd: int, path: Path) -> None:
    """Close and remove a spill file (its finaliser: the last index holding it was dropped)."""
    try:
        os.close(fd)
    finally:
        path.unlink(missing_ok=True)


class SpillFile:
    """An append-only file of int8 vectors of ``dim`` bytes in ``folder``, read by row number.

    Safe to share between threads: appends take a lock; reads gather rows through a read-only
    memory map (mapped again when rows were appended past it) and hand the pages back to the
    system afterwards, so reading leaves nothing resident in this process.
    """

    def __init__(self, folder: Path, dim: int, *, encrypted: bool) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / f"{os.getpid()}-{secrets.token_hex(8)}.bin"
        self.dim = dim
        self.rows = 0
        self.encrypted = encrypted
        self._stream = _Keystream(dim) if encrypted else None
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        self._lock = threading.Lock()
        self._map: tuple[mmap.mmap, np.ndarray] | None = None
        self._finalizer = weakref.finalize(self, _close, self._fd, self.path)

    def append(self, mat: np.ndarray) -> np.ndarray:
        """Write the rows of the ``(k, dim)`` int8 matrix ``mat`` at the end; their row numbers
        (int32)."""
        data = np.ascontiguousarray(mat, dtype=np.int8).reshape(-1, self.dim)
        with self._lock:
            first = self.rows
            if first + len(data) >= 2**31:
                raise OverflowError("a spill file holds fewer than 2**31 vectors")
            rows = np.arange(first, first + len(data), dtype=np.int32)
            if self._stream is not None and len(data):
                data = data ^ self._stream.of_rows(rows)
            view = data.reshape(-1).view(np.uint8).data
            done = 0
            while done < len(view):
                done += os.pwrite(self._fd, view[done:], first * self.dim + done)
            self.rows += len(data)
        return rows

    def read(self, rows: np.ndarray) -> np.ndarray:
        """The ``(len(rows), dim)`` int8 vectors at ``rows`` (a copy)."""
        rows = np.asarray(rows, dtype=np.int64)
        if not len(rows):
            return np.empty((0, self.dim), dtype=np.int8)
        mm, view = self._mapping(int(rows.max()) + 1)
        out: np.ndarray = np.asarray(view[rows])
        if hasattr(mm, "madvise"):  # the pages stay in the page cache, not in this process
            mm.madvise(mmap.MADV_DONTNEED)
        if self._stream is not None:
            np.bitwise_xor(out, self._stream.of_rows(rows), out=out)
        return out

    def _mapping(self, need: int) -> tuple[mmap.mmap, np.ndarray]:
        with self._lock:
            if self._map is None or len(self._map[1]) < need:
                if need > self.rows:
                    raise IndexError(f"row {need - 1} of a spill file of {self.rows} rows")
                mm = mmap.mmap(self._fd, self.rows * self.dim, prot=mmap.PROT_READ)
                self._map = (mm, np.frombuffer(mm, dtype=np.int8).reshape(-1, self.dim))
            return self._map

    def remove(self) -> None:
        """Remove the file from its folder (threads reading it still can: it stays open)."""
        self.path.unlink(missing_ok=True)

    def close(self) -> None:
        """Close and remove the file now."""
        self._finalizer()

    @property
    def removed(self) -> bool:
        """Whether the file is no longer in its folder."""
        return not self.path.exists()


def remove_spill_files(folder: Path) -> list[str]:
    """Remove every spill file of ``folder`` (a data folder's ``vectors.tmp/``) and the folder;
    the names removed. Files still open in this process stay readable to it."""
    if not folder.is_dir():
        return []
    names = sorted(p.name for p in folder.iterdir())
    shutil.rmtree(folder, ignore_errors=True)
    return names


_room_lock = threading.Lock()
_room_used: dict[int, int] = {}  # id of a buffer made by appended -> rows used (while it lives)


def appended(a: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``a`` with ``rows`` after it (a session's vectors as a write extends them).

    The result is a view of a buffer with room to spare: when ``a`` is the longest view of its
    buffer, the rows go into that room and nothing is copied (the rows ``a`` shows never
    change, so whoever still reads ``a`` is not affected); otherwise (another extension of the
    same rows took the room first, or ``a`` is not such a view) a new buffer is made, half as
    large again. Copying a session's vectors on every message cost more than the rest of the
    extension."""
    n, m = len(a), len(rows)
    base = a.base
    if isinstance(base, np.ndarray) and a.flags.c_contiguous and base.flags.c_contiguous and (
            a.ctypes.data == base.ctypes.data):
        with _room_lock:
            if _room_used.get(id(base)) == n and len(base) >= n + m:
                base[n : n + m] = rows
                _room_used[id(base)] = n + m
                return base[: n + m]
    buf = np.empty((n + m + max(64, (n + m) // 2), *a.shape[1:]), dtype=a.dtype)
    buf[:n] = a
    buf[n : n + m] = rows
    with _room_lock:
        _room_used[id(buf)] = n + m
    weakref.finalize(buf, _room_used.pop, id(buf), None)
    return buf[: n + m]


def appended_columns(cols: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``cols`` (a ``(dim, n)`` matrix of columns) with the columns of ``rows.T`` after it, the
    way :func:`appended` grows rows: a view of a buffer with room to spare, written in place
    when ``cols`` is the widest view of it."""
    n, m = cols.shape[1], len(rows)
    base = cols.base
    if isinstance(base, np.ndarray) and base.ndim == 2 and base.flags.c_contiguous and (
            cols.ctypes.data == base.ctypes.data) and cols.strides == base.strides:
        with _room_lock:
            if _room_used.get(id(base)) == n and base.shape[1] >= n + m:
                base[:, n : n + m] = rows.T
                _room_used[id(base)] = n + m
                return base[:, : n + m]
    buf = np.empty((cols.shape[0], n + m + max(64, (n + m) // 2)), dtype=cols.dtype)
    buf[:, :n] = cols
    buf[:, n : n + m] = rows.T
    with _room_lock:
        _room_used[id(buf)] = n + m
    weakref.finalize(buf, _room_used.pop, id(buf), None)
    return buf[:, : n + m]


def held_bytes(a: np.ndarray) -> int:
    """Bytes of ``a``, or of the whole buffer it is a growing view of (:func:`appended`)."""
    base = a.base
    return int(base.nbytes) if isinstance(base, np.ndarray) and id(base) in _room_used else int(
        a.nbytes)


class Vectors:
    """int8 vectors of an index: an ``(n, dim)`` matrix in memory, or ``n`` rows of a
    :class:`SpillFile` (``at``: their row numbers). Never changed once made (the copy of an
    in-memory matrix by columns, :meth:`columns`, is made when first asked for)."""

    __slots__ = ("at", "cols", "dim", "file", "mat")

    def __init__(self, mat: np.ndarray | None = None, *, file: SpillFile | None = None,
                 at: np.ndarray | None = None, dim: int | None = None) -> None:
        self.mat = mat
        self.cols: np.ndarray | None = None
        self.file = file
        self.at = at if file is not None else None
        if mat is not None and file is None:
            self.dim = int(mat.shape[1])
        elif file is not None and at is not None and mat is None:
            self.dim = file.dim if dim is None else dim
        else:
            raise ValueError("Vectors hold a matrix, or rows (at) of a spill file")

    @classmethod
    def empty(cls, dim: int) -> Vectors:
        """No vector."""
        return cls(np.empty((0, dim), dtype=np.int8))

    def __len__(self) -> int:
        return len(self.mat) if self.mat is not None else len(self._rows()[1])

    @property
    def spilled(self) -> bool:
        """Whether the vectors are in a spill file."""
        return self.file is not None

    @property
    def nbytes(self) -> int:
        """Memory held (row numbers only, when spilled; the whole buffer of vectors grown in
        place), the copy by columns aside (:attr:`columns_nbytes`)."""
        return held_bytes(self.mat) if self.mat is not None else int(self._rows()[1].nbytes)

    @property
    def columns_nbytes(self) -> int:
        """Memory held by the copy by columns (0 until it is made)."""
        cols = self.cols
        if cols is None:
            return 0
        base = cols.base
        return int(base.nbytes) if isinstance(base, np.ndarray) else int(cols.nbytes)

    def columns(self) -> np.ndarray | None:
        """The vectors as a ``(dim, n)`` int8 matrix, each dimension's values side by side
        (``None`` when spilled): made on first use and grown with :meth:`append`. A hashed
        question has a few dozen non-zero dimensions; reading them by rows reads the whole
        matrix, by columns a tenth of it."""
        if self.mat is None:
            return None
        cols = self.cols
        if cols is None:
            cols = self.cols = appended_columns(np.empty((self.dim, 0), dtype=self.mat.dtype),
                                                self.mat)
        return cols

    def all(self) -> np.ndarray:
        """Every vector, as an ``(n, dim)`` int8 matrix (read from the file when spilled)."""
        if self.mat is not None:
            return self.mat
        file, at = self._rows()
        return file.read(at)

    def take(self, rows: np.ndarray) -> np.ndarray:
        """The vectors at positions ``rows`` (a copy)."""
        if self.mat is not None:
            return np.asarray(self.mat[rows])
        file, at = self._rows()
        return file.read(at[rows])

    def slice(self, a: int, b: int) -> Vectors:
        """Rows ``a..b`` (a view: nothing copied)."""
        if self.mat is not None:
            return Vectors(self.mat[a:b])
        file, at = self._rows()
        return Vectors(file=file, at=at[a:b])

    def append(self, mat: np.ndarray) -> Vectors:
        """These vectors followed by the rows of ``mat`` (written to the file when spilled; in
        memory grown in place when there is room: :func:`appended`)."""
        if self.mat is not None:
            rows = mat.reshape(-1, self.dim)
            grown = Vectors(appended(self.mat, rows))
            if self.cols is not None:
                grown.cols = appended_columns(self.cols, rows)
            return grown
        file, at = self._rows()
        return Vectors(file=file, at=np.concatenate([at, file.append(mat)]))

    def _rows(self) -> tuple[SpillFile, np.ndarray]:
        if self.file is None or self.at is None:
            raise RuntimeError("these vectors are in memory")
        return self.file, self.at

    def same_as(self, other: Vectors) -> bool:
        """Whether both name the same rows of the same matrix or file (a view of it counts)."""
        if self.mat is not None and other.mat is not None:
            return np.shares_memory(self.mat, other.mat)
        return self.file is other.file and self.file is not None
