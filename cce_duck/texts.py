"""The texts of a session index's turns, held as read: one Arrow string array, not a Python
string per turn (a user of 100,000 messages: 13 MB of text instead of 19 MB of objects).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from operator import index
from typing import Any, SupportsIndex, overload

import pyarrow as pa

__all__ = ["Texts"]

_OBJECT_BYTES = 50  # a Python string's header, for the texts appended after a load


class Texts(Sequence[str | None]):
    """A sequence of turn texts (``None``: not kept): an Arrow array, then the texts appended
    since it was read (a tuple). Never changed once made; :meth:`appended` gives a new one."""

    __slots__ = ("_arr", "_more")

    def __init__(self, arr: pa.Array | pa.ChunkedArray | None = None,
                 more: tuple[str | None, ...] = ()) -> None:
        if isinstance(arr, pa.ChunkedArray):
            arr = arr.chunk(0) if arr.num_chunks == 1 else arr.combine_chunks()
        self._arr: pa.Array = pa.array([], pa.string()) if arr is None else arr
        self._more = more

    def __len__(self) -> int:
        return len(self._arr) + len(self._more)

    @overload
    def __getitem__(self, i: SupportsIndex) -> str | None: ...

    @overload
    def __getitem__(self, i: slice) -> list[str | None]: ...

    def __getitem__(self, at: SupportsIndex | slice) -> str | list[str | None] | None:
        if isinstance(at, slice):
            return [self[j] for j in range(*at.indices(len(self)))]
        i = index(at)
        n = len(self._arr)
        if i < 0:
            i += len(self)
        if 0 <= i < n:
            value: str | None = self._arr[i].as_py()
            return value
        return self._more[i - n]

    def __iter__(self) -> Iterator[str | None]:
        yield from self._arr.to_pylist()
        yield from self._more

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Texts | list | tuple):
            return list(self) == list(other)
        return NotImplemented

    __hash__: Any = None

    def __repr__(self) -> str:
        return f"Texts({len(self)} texts)"

    def appended(self, texts: Iterable[str | None]) -> Texts:
        """These texts followed by ``texts``."""
        return Texts(self._arr, self._more + tuple(texts))

    @property
    def nbytes(self) -> int:
        """Memory held (the Arrow buffers, and the appended strings)."""
        return int(self._arr.nbytes) + sum(len(t) + _OBJECT_BYTES for t in self._more if t)
