"""The overview of a conversation under a budget: which topics (of a session) or which sessions
(of a user) are listed, and with how much of each.

A session's overview lists its topics; a user's lists their sessions in time order, each under a
header line (dates, session, status, size) followed by its cold-tier summary (a closed session
wholly inside the asked window) or its topics (the topics inside the window otherwise), and the
first user message of the turns no topic holds yet (an open session's latest). The rows
come from the macro ``cce_user_overview``; this module only decides what fits.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cce_duck.text import estimate_tokens
from cce_duck.topics import clip

__all__ = ["LINE_MAX_TOKENS", "SessionBlock", "fit_sessions", "session_blocks", "spread"]

#: The longest line of a session's summary or topic list, in tokens.
LINE_MAX_TOKENS = 48


def spread(costs: Sequence[int], room: int) -> list[int]:
    """Indexes of an evenly spread subset of items in order when their ``costs`` exceed
    ``room`` (every index when they fit)."""
    if sum(costs) <= room:
        return list(range(len(costs)))
    keep: list[int] = []
    step = max(1.0, sum(costs) / max(room, 1))
    i = 0.0
    while int(i) < len(costs):
        keep.append(int(i))
        i += step
    return keep


@dataclass
class SessionBlock:
    """One session of a user's overview: its header line and the lines that may follow it."""

    session_id: str
    header: str
    lines: list[str]
    first_ts: Any
    last_ts: Any
    summary: str | None
    topics: list[str]
    kept: int = field(default=0)  # how many of ``lines`` fit

    def text(self) -> str:
        """The header and the lines that fit."""
        return "\n".join([self.header, *self.lines[:self.kept]])


def _span(first: Any, last: Any) -> str:
    a, z = f"{first:%Y-%m-%d}", f"{last:%Y-%m-%d}"
    return a if a == z else f"{a} → {z}"


def _turns(n: int) -> str:
    return f"{n} turn" if n == 1 else f"{n} turns"


def session_blocks(rows: list[dict[str, Any]], chats: dict[str, int] | None = None
                   ) -> list[SessionBlock]:
    """The blocks of the rows of ``cce_user_overview`` (in their order). With ``chats`` (each
    session's place among the user's, as quotes name them: ``chat 3``) the header names the
    place, not the id (which may cost 20 tokens); without, the session id (for people)."""
    out = []
    for r in rows:
        state = "closed" if r["status"] == "closed" else "open"
        sid = str(r["session_id"])
        who = f"chat {chats[sid]}" if chats is not None and sid in chats else f"session {sid}"
        header = (f"[{_span(r['first_ts'], r['last_ts'])} · {who} · "
                  f"{state} · {_turns(int(r['turns']))}]")
        topics = []
        for t in r["topics"]:
            first = str(t["summary"]).splitlines()[0] if t["summary"] else ""
            topics.append(f"- {t['label']}: {first}" if first else f"- {t['label']}")
        if r["summary"] and r["whole"]:
            lines = [ln for ln in str(r["summary"]).splitlines() if ln.strip()]
        else:
            lines = topics
        if r["opening"] and not (r["summary"] and r["whole"]):
            lines.append(f"- not summarised yet ({_turns(int(r['unsummarised']))}), from: "
                         f"{r['opening']}")
        out.append(SessionBlock(
            str(r["session_id"]), header, [clip(ln, LINE_MAX_TOKENS) for ln in lines],
            r["first_ts"], r["last_ts"], r["summary"], [str(t["label"]) for t in r["topics"]]))
    return out


def fit_sessions(blocks: list[SessionBlock], room: int) -> tuple[list[SessionBlock], int]:
    """The blocks that fit ``room`` tokens (each block costs its lines' estimates plus one per
    line), and their cost. Every header first (an evenly spread subset in time order when they
    do not all fit), then one more line of each listed session in turn, oldest first, while
    lines fit: many sessions get a line each before any gets its fifth."""
    heads = [estimate_tokens(b.header) + 1 for b in blocks]
    listed = [blocks[i] for i in spread(heads, room)]
    used = sum(estimate_tokens(b.header) + 1 for b in listed)
    if used > room:  # a single header larger than the room
        return [], 0
    for b in listed:
        b.kept = 0
    depth, growing = 0, list(listed)
    while growing:
        still = []
        for b in growing:
            if depth >= len(b.lines):
                continue
            cost = estimate_tokens(b.lines[depth]) + 1
            if used + cost <= room:
                used += cost
                b.kept = depth + 1
                still.append(b)
        growing, depth = still, depth + 1
    return listed, used
