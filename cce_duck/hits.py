"""Ranked hits as columns: what a retrieval returns, made into dicts only where they are read.

A context asks the ranking for hundreds of hits (eight per note it may quote) and quotes a
few dozen: building a dict of fifteen Python values for each of them cost more than ranking
them. :class:`Hits` keeps the ranking's arrays; the context builder reads the columns it needs
(:meth:`Hits.col`, :meth:`Hits.value`), while explain forms, searches and tests read the hits
as the dicts they always were (``hits[i]``, iteration).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np

__all__ = ["HIT_KEYS", "USER_HIT_KEYS", "Hit", "Hits"]

Hit = dict[str, Any]

#: The keys of a hit, in order (``score`` only when the ranking gives conversation scores).
HIT_KEYS = ("turn_no", "row", "note_id", "role", "speaker", "ts", "dense", "best_sentence",
            "bm25", "recency", "asks", "n_terms", "fused", "rank", "score")
#: A hit across a user's sessions starts with its session and its position among them.
USER_HIT_KEYS = ("session_id", "pos", *HIT_KEYS)
_NONE_BELOW_ZERO = ("note_id", "best_sentence")  # stored as -1 when there is none


class Hits(Sequence[Hit]):
    """The hits of one ranking, best first.

    ``columns`` maps each key of :data:`HIT_KEYS` (or :data:`USER_HIT_KEYS`) to a NumPy array or
    a list, one value per hit; ``note_id`` and ``best_sentence`` are -1 where there is none,
    ``ts`` is ``datetime64[us]``, ``rank`` may be left out (1, 2, ...).
    """

    __slots__ = ("_cols", "_keys", "_lists", "_n")

    def __init__(self, columns: dict[str, Any]) -> None:
        self._cols = columns
        self._keys = tuple(k for k in USER_HIT_KEYS if k in columns or k == "rank")
        self._n = len(columns["turn_no"])
        self._lists: dict[str, list[Any]] = {}

    @classmethod
    def empty(cls) -> Hits:
        """No hit."""
        return cls({"turn_no": []})

    def __len__(self) -> int:
        return self._n

    def col(self, key: str) -> list[Any]:
        """One column as Python values (made once), ``None`` where there is none."""
        out = self._lists.get(key)
        if out is None:
            if key == "rank":
                out = list(range(1, self._n + 1))
            else:
                values = self._cols[key]
                out = values.tolist() if isinstance(values, np.ndarray) else list(values)
                if key in _NONE_BELOW_ZERO:
                    out = [v if v >= 0 else None for v in out]
            self._lists[key] = out
        return out

    def raw(self, key: str) -> list[Any]:
        """One column as Python values, -1 (not ``None``) where there is none: the context
        builder's loop compares ints."""
        if key not in _NONE_BELOW_ZERO:
            return self.col(key)
        values = self._cols[key]
        return values.tolist() if isinstance(values, np.ndarray) else list(values)

    def value(self, key: str, i: int) -> Any:
        """The value of ``key`` of hit ``i`` (a Python value)."""
        if key == "rank":
            return i + 1
        lst = self._lists.get(key)
        if lst is not None:
            return lst[i]
        v = self._cols[key][i]
        if isinstance(v, np.generic):
            v = v.item()
        return None if key in _NONE_BELOW_ZERO and v < 0 else v

    @overload
    def __getitem__(self, i: int) -> Hit: ...
    @overload
    def __getitem__(self, i: slice) -> list[Hit]: ...

    def __getitem__(self, i: int | slice) -> Hit | list[Hit]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._n))]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("hit index out of range")
        return {k: self.value(k, i) for k in self._keys}

    def __iter__(self) -> Iterator[Hit]:
        cols = [self.col(k) for k in self._keys]
        keys = self._keys
        for values in zip(*cols, strict=True):
            yield dict(zip(keys, values, strict=True))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Hits | list):
            return list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Hits({len(self)} hits)"
