"""The history sent as it is: what that costs, and the context that is that history.

A context never costs more than the history it stands for. When the session's turns (or the
asked window of them) and the pins fit the budget, the context *is* those turns, verbatim and in
order, after the pins; otherwise the builder packs notes and quotes under the cap, which is then
below the history's size. Both sides are measured as :attr:`ContextPayload.tokens` measures a
context: the larger of its message form (each turn's estimate plus ``MESSAGE_OVERHEAD``) and its
text form (``who: text`` lines).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from cce_duck.index import SessionIndex
from cce_duck.payload import MESSAGE_OVERHEAD, ContextPayload, VerbatimTurn
from cce_duck.text import estimate_tokens
from cce_duck.window import Window

__all__ = ["PIN_HEADER", "history_tokens", "pin_block", "pin_tokens", "verbatim_context",
           "verbatim_explain", "window_rows"]

PIN_HEADER = "Pinned:"

Rows = np.ndarray | slice


def window_rows(index: SessionIndex, window: Window, next_turn: int) -> Rows:
    """Rows of the index inside ``window`` (every row, as a slice, without one)."""
    if window == Window():
        return slice(None)
    keep = np.ones(len(index.turn_no), dtype=bool)
    if window.last_turns is not None:
        keep &= index.turn_no >= next_turn - window.last_turns
    if window.since is not None:
        keep &= index.ts >= np.datetime64(window.since, "us")
    if window.until is not None:
        keep &= index.ts <= np.datetime64(window.until, "us")
    return np.flatnonzero(keep)


def history_tokens(index: SessionIndex, rows: Rows = slice(None)) -> int:
    """Tokens of sending the turns at ``rows`` as they are, measured as a context is.

    From the stored estimates, without reading the text: the message form costs each turn's
    tokens plus the overhead; the text form joins ``who: text`` lines (``who`` and ``:``, the
    text, a newline between lines: the estimate is additive over these pieces).
    """
    tokens = index.tokens[rows]
    n = len(tokens)
    if n == 0:
        return 0
    text = int(tokens.sum())
    return max(text + MESSAGE_OVERHEAD * n, text + int(index.who_tokens[rows].sum()) + 2 * n - 1)


def pin_block(pins: list[str]) -> str:
    """The pins as the memory block shows them (``Pinned:`` then ``- text`` lines)."""
    return "\n".join([PIN_HEADER, *(f"- {p}" for p in pins)]) if pins else ""


def pin_tokens(pins: list[str]) -> int:
    """Tokens of every pin sent alone, as one system message (0 without pins)."""
    return MESSAGE_OVERHEAD + estimate_tokens(pin_block(pins)) if pins else 0


def verbatim_context(index: SessionIndex, session_id: str, query: str, max_tokens: int,
                     rows: Rows, *, hot_turns: int, full_tokens: int, pins_cost: int
                     ) -> ContextPayload | None:
    """The pins, then the turns at ``rows`` as they were written; ``None`` when some turn has
    no stored text (``keep_raw_turns`` off) or the context would not fit ``max_tokens`` or the
    history's own size (the stored estimates may be older than the text)."""
    picked = np.arange(len(index.turn_no))[rows]
    if any(index.content[r] is None for r in picked):
        return None
    next_turn = int(index.key[1])
    turns = []
    for r in picked:
        tier = ("compressed" if index.note_id[r] >= 0 else
                "hot" if index.turn_no[r] >= next_turn - hot_turns else "pending")
        content = index.content[r]
        assert content is not None
        turns.append(VerbatimTurn(int(index.turn_no[r]), index.role[r], index.speaker[r], content,
                                  index.ts[r].item(), tier))
    payload = ContextPayload(
        session_id=session_id, query=query, max_tokens=max_tokens, memory=pin_block(index.pins),
        turns=turns, pins=list(index.pins), full_tokens=full_tokens, pin_tokens=pins_cost,
        verbatim=True)
    return payload if payload.tokens <= min(max_tokens, full_tokens + pins_cost) else None


def verbatim_explain(payload: ContextPayload, overview: bool) -> dict[str, Any]:
    """The explain form of a verbatim context: its budget split, nothing ranked or dropped."""
    split = {"pins": 0, "recent": 0, "pending": 0, "notes": 0, "overhead": 0}
    if payload.pins:
        split["overhead"] = MESSAGE_OVERHEAD + estimate_tokens(PIN_HEADER) + 1
        split["pins"] = sum(estimate_tokens(f"- {p}") + 1 for p in payload.pins)
    for t in payload.turns:
        split["recent" if t.state == "hot" else "pending"] += (estimate_tokens(t.content)
                                                               + MESSAGE_OVERHEAD)
    return {"budget": {"max_tokens": payload.max_tokens, "used": payload.tokens, **split},
            "overview": overview, "verbatim": True, "hits": [], "chosen": [], "dropped": []}
