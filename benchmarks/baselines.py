"""Raw-turn baselines: what a user would do without the engine, under the same token budget.

Every baseline sees the conversation's turns as they were written (``speaker: text``) and fills
its budget with **whole turns**, rendered in conversation order under a date line per day
(``[2023-05-08]``), which is the cheapest faithful layout (a turn's date is never lost, and one
date serves every turn of that day). Sizes are counted with ``cce_duck.estimate_tokens`` on the
rendered text, the same counter the engine's context is measured with.

* ``full``: every turn, no budget (the cost to beat);
* ``recent``: the most recent turns that fit;
* ``bm25``: Okapi BM25 (``rank_bm25``, k1 = 1.5, b = 0.75) over the turns, with lower-casing,
  stop-word removal and Snowball stemming (``PyStemmer``); turns are taken best first and any
  turn that does not fit is skipped, so the budget is filled;
* ``dense``: cosine similarity between the question and each turn, with the engine's embedder;
* ``hybrid``: reciprocal-rank fusion (k = 60) of the BM25 ranking (turns with a positive score)
  and the dense ranking.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime

import numpy as np
import Stemmer
from rank_bm25 import BM25Okapi

from cce_duck import estimate_tokens

__all__ = ["BASELINES", "RRF_K", "RawTurn", "TurnIndex", "bm25_tokens", "fill", "render"]

BASELINES: tuple[str, ...] = ("full", "recent", "bm25", "dense", "hybrid")
RRF_K = 60

_WORD = re.compile(r"[a-z0-9]+(?:'[a-z]+)?")
# A common English stop-word list (the short NLTK list); stemming runs after removal.
_STOP_TEXT = """
    i me my myself we our ours ourselves you your yours yourself yourselves he him his himself
    she her hers herself it its itself they them their theirs themselves what which who whom
    this that these those am is are was were be been being have has had having do does did doing
    a an the and but if or because as until while of at by for with about against between into
    through during before after above below to from up down in out on off over under again
    further then once here there when where why how all any both each few more most other some
    such no nor not only own same so than too very s t can will just don should now d ll m o re
    ve y ain aren couldn didn doesn hadn hasn haven isn ma mightn mustn needn shan shouldn wasn
    weren won wouldn
    """
_STOP: frozenset[str] = frozenset(_STOP_TEXT.split())
_STEMMER = Stemmer.Stemmer("english")


def bm25_tokens(text: str) -> list[str]:
    """Lower-cased words without stop words, Snowball-stemmed."""
    words = [w.split("'")[0] for w in _WORD.findall(text.lower().replace("’", "'"))]
    return _STEMMER.stemWords([w for w in words if w and w not in _STOP])


@dataclass(frozen=True)
class RawTurn:
    """One turn as written, with its position in the conversation."""

    index: int
    speaker: str
    text: str
    ts: datetime

    def line(self) -> str:
        """``speaker: text``."""
        return f"{self.speaker}: {self.text}"


def _header(day: date) -> str:
    return f"[{day.isoformat()}]"


def render(turns: Sequence[RawTurn], chosen: Sequence[int]) -> str:
    """The chosen turns in conversation order, with a date line whenever the day changes."""
    out: list[str] = []
    last: date | None = None
    for i in sorted(chosen):
        t = turns[i]
        if t.ts.date() != last:
            last = t.ts.date()
            out.append(_header(last))
        out.append(t.line())
    return "\n".join(out)


def fill(turns: Sequence[RawTurn], ranked: Sequence[int], budget: int, *, contiguous: bool = False,
         costs: Sequence[int] | None = None) -> list[int]:
    """Turns taken in ``ranked`` order while they fit in ``budget`` tokens once rendered.

    A turn that does not fit is skipped and the next one tried (``contiguous=True`` stops at the
    first one instead). ``costs`` are the turns' line sizes if already counted. The rendered size
    is checked exactly at the end; turns are dropped from the end of the ranking until it fits.
    """
    chosen: list[int] = []
    days: set[date] = set()
    used = 0
    for i in ranked:
        t = turns[i]
        cost = costs[i] if costs is not None else estimate_tokens(t.line()) + 1
        if t.ts.date() not in days:
            cost += estimate_tokens(_header(t.ts.date())) + 1
        if used + cost > budget:
            if contiguous:
                break
            continue
        chosen.append(i)
        days.add(t.ts.date())
        used += cost
    while chosen and estimate_tokens(render(turns, chosen)) > budget:
        chosen.pop()
    return chosen


class TurnIndex:
    """BM25 and dense indexes over one conversation's turns, and the baselines built on them."""

    def __init__(self, turns: Sequence[RawTurn], embed: object) -> None:
        """``embed`` is an embedder with ``embed(texts, kind)`` (the engine's, for fairness)."""
        self.turns = list(turns)
        self._embed = embed
        self._bm25 = BM25Okapi([bm25_tokens(t.line()) or ["\0"] for t in self.turns])
        self._vectors = np.asarray(
            embed.embed([t.line() for t in self.turns], "passage"),  # type: ignore[attr-defined]
            dtype=np.float32,
        )
        self._costs = [estimate_tokens(t.line()) + 1 for t in self.turns]
        self.full_text = render(self.turns, range(len(self.turns)))

    def rankings(self, question: str) -> dict[str, list[int]]:
        """Turn positions best first, per ranked baseline (ties: the later turn first)."""
        n = len(self.turns)
        later_first = np.arange(n)[::-1]
        bm = np.asarray(self._bm25.get_scores(bm25_tokens(question)), dtype=np.float64)
        qv = np.asarray(self._embed.embed([question], "query"), dtype=np.float32)[0]  # type: ignore[attr-defined]
        dense = self._vectors @ qv
        bm_rank = [int(i) for i in later_first[np.argsort(-bm[::-1], kind="stable")]]
        dense_rank = [int(i) for i in later_first[np.argsort(-dense[::-1], kind="stable")]]
        fused = np.zeros(n, dtype=np.float64)
        for r, i in enumerate(dense_rank):
            fused[i] += 1.0 / (RRF_K + r + 1)
        for r, i in enumerate(bm_rank):
            if bm[i] > 0:
                fused[i] += 1.0 / (RRF_K + r + 1)
        hybrid_rank = [int(i) for i in later_first[np.argsort(-fused[::-1], kind="stable")]]
        return {"recent": list(range(n - 1, -1, -1)), "bm25": bm_rank, "dense": dense_rank,
                "hybrid": hybrid_rank}

    def contexts(self, rankings: dict[str, list[int]], budget: int) -> dict[str, str]:
        """The text each budgeted baseline sends for one question at ``budget`` tokens."""
        out = {}
        for name, ranked in rankings.items():
            chosen = fill(self.turns, ranked, budget, contiguous=name == "recent", costs=self._costs)
            out[name] = render(self.turns, chosen)
        return out
