"""Topic segmentation and extractive summaries (micro per message, meso per topic, macro per
session). Pure functions over message vectors: no model call, no database."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np

from cce_duck.embedders.base import Matrix
from cce_duck.text import cached_terms, estimate_tokens, split_sentences, term_words

__all__ = ["TopicTurn", "clip", "label", "macro_summary", "meso_summary", "micro", "segment", "unit"]


@dataclass(frozen=True, slots=True)
class TopicTurn:
    """What segmentation and summaries need to know of a stored turn."""

    turn_no: int
    role: str
    speaker: str | None
    content: str
    ts: datetime


def unit(v: Matrix) -> Matrix:
    """``v`` scaled to length 1 (zero stays zero)."""
    n = float(np.linalg.norm(v))
    return v / n if n > 0 else v


def segment(
    turns: Sequence[TopicTurn],
    vectors: Matrix,
    *,
    threshold: float,
    min_turns: int,
    max_turns: int,
    gap_minutes: float,
) -> tuple[list[list[int]], bool]:
    """Split consecutive turns into topics.

    A new topic starts at a silence of ``gap_minutes``, when the current topic reached
    ``max_turns``, or when a turn's similarity to the topic so far (the mean of the turn and its
    successor, which smooths one-line replies) falls below ``threshold`` once the topic has
    ``min_turns``. Returns the topics as index lists and whether the last one was closed by a
    boundary (an open last topic may still grow).
    """
    if not turns:
        return [], True
    topics: list[list[int]] = [[0]]
    total = vectors[0].astype(np.float64).copy()
    for i in range(1, len(turns)):
        cur = topics[-1]
        gap = (turns[i].ts - turns[i - 1].ts).total_seconds() / 60.0
        look = vectors[i] + (vectors[i + 1] if i + 1 < len(turns) else 0)
        sim = float(np.dot(unit(look), unit(total)))
        if gap >= gap_minutes or len(cur) >= max_turns or (len(cur) >= min_turns and sim < threshold):
            topics.append([i])
            total = vectors[i].astype(np.float64).copy()
        else:
            cur.append(i)
            total += vectors[i]
    return topics, len(topics[-1]) >= max_turns


def _who(t: TopicTurn) -> str:
    return t.speaker or t.role


def clip(text: str, max_tokens: int) -> str:
    """``text`` cut to its longest word prefix that fits ``max_tokens`` with an ellipsis."""
    if estimate_tokens(text) <= max_tokens:
        return text
    words = text.split()
    lo, hi = 0, len(words)
    while lo < hi:  # longest prefix of words that fits with the ellipsis
        mid = (lo + hi + 1) // 2
        if estimate_tokens(" ".join(words[:mid]) + " …") <= max_tokens:
            lo = mid
        else:
            hi = mid - 1
    return " ".join(words[:lo]) + " …"


def micro(turn: TopicTurn, max_tokens: int = 32, *,
          sentences: Sequence[tuple[str, Sequence[str]]] | None = None) -> str:
    """One line per message: who, and its most informative sentence (clipped).

    The sentence with the most distinct content words wins (the earliest on a tie), so greetings
    and one-word acknowledgements ("Perfect.") do not stand for a message. ``sentences`` may give
    the message's ``(sentence text, terms)`` pairs when the caller has them already.
    """
    if sentences is None:
        sentences = [(s.text, cached_terms(s.text)) for s in split_sentences(turn.content)]
    best = max(sentences, key=lambda s: len(set(s[1])), default=None)
    text = best[0] if best is not None else turn.content
    return f"{_who(turn)}: {clip(text, max_tokens)}"


def meso_summary(turns: Sequence[TopicTurn], vectors: Matrix, max_tokens: int = 80) -> str:
    """The topic's most central messages (closest to its centroid), in conversation order."""
    centroid = unit(vectors.mean(axis=0))
    order = np.argsort(-(vectors @ centroid), kind="stable")
    chosen: list[int] = []
    used = 0
    for i in order[: max(1, min(3, len(turns)))]:
        line = micro(turns[int(i)])
        cost = estimate_tokens(line) + 1
        if chosen and used + cost > max_tokens:
            break
        chosen.append(int(i))
        used += cost
    return "\n".join(micro(turns[i]) for i in sorted(chosen))


def label(turns: Sequence[TopicTurn], df: dict[str, int], n_docs: int, n_terms: int = 3) -> str:
    """The topic's most distinctive terms (tf in topic x idf in session), as a short label."""
    tf: Counter[str] = Counter()
    seen: Counter[tuple[str, str]] = Counter()  # (term, word it stands for): show the commonest
    for t in turns:
        pairs = term_words(t.content)
        tf.update({term for term, _ in pairs})
        seen.update(pairs)
    if not tf:
        return "(no words)"
    scored = sorted(
        tf.items(),
        key=lambda kv: (-(kv[1] * math.log(1 + n_docs / (1 + df.get(kv[0], 0)))), kv[0]),
    )
    top = {term: ("", 0) for term, _ in scored[:n_terms]}
    for (term, word), n in seen.items():  # first seen wins a tie, as Counter.most_common
        if term in top and n > top[term][1]:
            top[term] = (word, n)
    return ", ".join(word for word, _ in top.values())


def macro_summary(labels: Sequence[str], summaries: Sequence[str], max_tokens: int = 240) -> str:
    """A closed session in a paragraph: its topics in order, with the first line of each."""
    lines: list[str] = []
    used = 0
    for lab, summ in zip(labels, summaries, strict=True):
        first = summ.split("\n", 1)[0]
        line = f"- {lab}: {first}"
        cost = estimate_tokens(line) + 1
        if used + cost > max_tokens:
            lines.append(f"- … and {len(labels) - len(lines)} more topics")
            break
        lines.append(line)
        used += cost
    return "\n".join(lines)
