"""The approximate first stage of a large user's ranking: its settings, its codes, where the
exact vectors go, and how estimates are put on the exact scale (see :mod:`cce_duck.joined`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from cce_duck.config import Config
from cce_duck.folder import SPILL_DIR
from cce_duck.projection import Projection
from cce_duck.spill import SpillFile, Vectors
from cce_duck.store import Store

if TYPE_CHECKING:
    from cce_duck.index import SessionIndex
    from cce_duck.joined import JoinedIndex

__all__ = ["Approx", "Coarse", "calibrated", "codes_into", "first_stage", "new_spill",
           "sample_picks"]

#: Where the estimates go when no line puts them on the exact scale: below every exact score
#: (a dense score is within about [-1, 1]), in the order of the estimates.
_BELOW_CANDIDATES = 16.0
#: A spill file is started afresh when it holds more than twice the rows in use, plus this.
_SPILL_SLACK_ROWS = 65_536
_CODE_BATCH_ROWS = 8192  # vectors projected together when the codes are computed


@dataclass(frozen=True)
class Approx:
    """When a user's joined index ranks with the approximate first stage, and how (the
    settings of :class:`~cce_duck.Config` of those names; see :mod:`cce_duck.joined`)."""

    above_turns: int        # Config.exact_user_turns
    candidates: int         # Config.approx_candidates
    lexical: int            # Config.approx_bm25_turns
    dims: int               # Config.approx_dims
    sample: int             # Config.approx_sample
    spill_dir: Path | None  # the data folder's spill files (None: exact vectors in memory)
    encrypted: bool         # the folder is encrypted: so are its spill files

    @classmethod
    def of(cls, config: Config, store: Store) -> Approx:
        """The settings of ``config`` for ``store`` (spilling only in a writable folder)."""
        folder = store.data_dir
        spill = folder / SPILL_DIR if folder is not None and not store.read_only else None
        return cls(above_turns=config.exact_user_turns, candidates=config.approx_candidates,
                   lexical=config.approx_bm25_turns,
                   dims=config.approx_dims, sample=config.approx_sample, spill_dir=spill,
                   encrypted=store.folder_key is not None)


@dataclass
class Coarse:
    """The approximate first stage of a joined index: the projection of the user's vectors and
    the code of every message and sentence vector, in the joined index's row order."""

    projection: Projection
    mcode: np.ndarray  # (n, dims) int8
    scode: np.ndarray  # (m, dims) int8
    candidates: int
    lexical: int  # the turns with the best BM25 scores also scored exactly

    @property
    def nbytes(self) -> int:
        """Memory held."""
        p = self.projection
        return int(self.mcode.nbytes + self.scode.nbytes + p.basis.nbytes + p.scale.nbytes)


def calibrated(est: np.ndarray, rows: np.ndarray, exact: np.ndarray) -> np.ndarray:
    """Every turn's estimate on the scale of the exact scores: the least-squares line from the
    estimates of ``rows`` to their ``exact`` scores (the estimates run lower: the projection
    leaves out part of each vector). When no line fits (all estimates equal, or a slope not
    above zero), the estimates moved below every exact score instead."""
    if len(rows) > 1 and np.ptp(est[rows]) > 0:
        slope, intercept = np.polyfit(est[rows], exact, 1)
        if slope > 0:
            return np.asarray(est * slope + intercept, dtype=np.float64)
    return np.asarray(est - _BELOW_CANDIDATES, dtype=np.float64)


def first_stage(parts: list[tuple[str, SessionIndex]], starts: np.ndarray, approx: Approx,
                 previous: JoinedIndex | None) -> tuple[Vectors, Vectors, Coarse]:
    """The exact vectors (in the spill file, or memory) and the codes of a large user's
    joined index. The projection, the codes of parts unchanged since ``previous`` (the same
    user's, when its first session is this one's) and its spill file are reused."""
    idxs = [idx for _, idx in parts]
    prev = previous if (previous is not None and previous.coarse is not None and
                        previous.parts and previous.parts[0][0] == parts[0][0]) else None
    dim = idxs[0].mvec.dim
    n_vectors = int(starts[-1]) + sum(len(i.svec) for i in idxs)
    old = prev.mvec.file if prev is not None else None
    file = old if (approx.spill_dir is not None and old is not None and not old.removed
                   and old.rows <= 2 * n_vectors + _SPILL_SLACK_ROWS) else new_spill(approx, dim)
    projection = prev.coarse.projection if prev is not None and prev.coarse is not None else \
        Projection.fit(_sample(idxs, approx.sample), approx.dims)
    s_sizes = np.array([len(i.svec) for i in idxs], dtype=np.int64)
    s_starts = np.concatenate([[0], np.cumsum(s_sizes)]).astype(np.int64)
    mcode = np.empty((int(starts[-1]), projection.dims), dtype=np.int8)
    scode = np.empty((int(s_starts[-1]), projection.dims), dtype=np.int8)
    reuse = {id(idx): j for j, (_, idx) in enumerate(prev.parts)} if prev is not None else {}
    m_parts: list[Vectors] = []
    s_parts: list[Vectors] = []
    todo: list[tuple[np.ndarray, np.ndarray]] = []  # (where the codes go, the vectors)
    for j, idx in enumerate(idxs):
        a, b, sa, sb = int(starts[j]), int(starts[j + 1]), int(s_starts[j]), int(s_starts[j + 1])
        pj = reuse.get(id(idx))
        if prev is not None and prev.coarse is not None and pj is not None:
            pa_, pb = int(prev.starts[pj]), int(prev.starts[pj + 1])
            psa, psb = int(prev.s_bounds[pj]), int(prev.s_bounds[pj + 1])
            mcode[a:b] = prev.coarse.mcode[pa_:pb]
            scode[sa:sb] = prev.coarse.scode[psa:psb]
            m_mat = s_mat = None
        else:
            m_mat, s_mat = idx.mvec.all(), idx.svec.all()
            todo += [(mcode[a:b], m_mat), (scode[sa:sb], s_mat)]
        m_parts.append(_placed(idx.mvec, m_mat, file))
        s_parts.append(_placed(idx.svec, s_mat, file))
    codes_into(projection, todo)
    coarse = Coarse(projection=projection, mcode=mcode, scode=scode,
                    candidates=approx.candidates, lexical=approx.lexical)
    return _joined_vectors(m_parts, file, dim), _joined_vectors(s_parts, file, dim), coarse


def codes_into(projection: Projection, todo: list[tuple[np.ndarray, np.ndarray]]) -> None:
    """Write the codes of each ``(where, vectors)`` pair into ``where``, many small matrices
    (a session's) projected together: one product per few thousand rows."""
    batch: list[tuple[np.ndarray, np.ndarray]] = []
    rows = 0
    for pair in [*todo, None]:
        if pair is not None and len(pair[1]):
            batch.append(pair)
            rows += len(pair[1])
        if batch and (pair is None or rows >= _CODE_BATCH_ROWS):
            codes = projection.codes(np.concatenate([m for _, m in batch]))
            at = 0
            for where, mat in batch:
                where[:] = codes[at : at + len(mat)]
                at += len(mat)
            batch, rows = [], 0


def _placed(vectors: Vectors, mat: np.ndarray | None, file: SpillFile | None) -> Vectors:
    """``vectors`` in ``file`` (``None``: in memory); ``mat`` is their matrix when already read."""
    if file is None:
        return vectors if not vectors.spilled else Vectors(vectors.all() if mat is None else mat)
    if vectors.file is file:
        return vectors
    return Vectors(file=file, at=file.append(vectors.all() if mat is None else mat))


def _joined_vectors(parts: list[Vectors], file: SpillFile | None, dim: int) -> Vectors:
    """The parts' vectors one after the other (all in ``file``, or all in memory)."""
    if file is None:
        mats = [v.all() for v in parts]
        return Vectors(np.concatenate(mats) if mats else np.empty((0, dim), np.int8))
    return Vectors(file=file, at=np.concatenate([v.at for v in parts if v.at is not None]))


def new_spill(approx: Approx, dim: int) -> SpillFile | None:
    """A new spill file for a large user's vectors (``None``: they stay in memory)."""
    if approx.spill_dir is None:
        return None
    return SpillFile(approx.spill_dir, dim, encrypted=approx.encrypted)


def sample_picks(sizes: np.ndarray, size: int) -> list[tuple[int, np.ndarray]]:
    """About ``size`` rows evenly spread over blocks of ``sizes`` rows laid end to end: each
    block with rows picked and those rows (counted from the block's first)."""
    total = int(sizes.sum())
    if not total:
        return []
    picks = np.unique(np.linspace(0, total - 1, min(size, total)).astype(np.int64))
    bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    out = []
    for k in range(len(sizes)):
        lo, hi = np.searchsorted(picks, [bounds[k], bounds[k + 1]])
        if hi > lo:
            out.append((k, picks[lo:hi] - bounds[k]))
    return out


def _sample(idxs: list[SessionIndex], size: int) -> np.ndarray:
    """About ``size`` of the parts' message and sentence vectors, evenly spread (each part's
    messages, then its sentences, part after part; the same ones for the same parts): what the
    projection is fitted on."""
    blocks = [v for i in idxs for v in (i.mvec, i.svec)]
    picked = [blocks[k].take(rows) for k, rows in
              sample_picks(np.array([len(v) for v in blocks], dtype=np.int64), size)]
    return np.concatenate(picked) if picked else np.empty((0, idxs[0].mvec.dim), np.int8)
