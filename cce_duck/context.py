"""The context builder: pins, recent and pending turns, then retrieved notes with quotes, under a
hard token cap (the cap is never exceeded)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from cce_duck.config import Config
from cce_duck.errors import ValidationError
from cce_duck.payload import MESSAGE_OVERHEAD, ContextPayload, VerbatimTurn
from cce_duck.store import Store
from cce_duck.text import estimate_tokens

__all__ = ["ContextRequest", "build_context", "is_overview_question"]

_OVERVIEW = re.compile(
    r"\b(what (did|have|were) we (talk|talking|discuss|discussing|chat|chatting|cover)"
    r"|what (topics|subjects)|summari[sz]e (our|the|this) (conversation|chat|discussion)"
    r"|recap|overview of (our|the|this))\b",
    re.I,
)
MEMORY_HEADER = "Memory of earlier conversation (verbatim quotes, oldest first):"
PIN_HEADER = "Pinned:"
RECENT_SHARE = 0.3
QUOTE_MAX_TOKENS = 120
QUOTES_PER_NOTE = 6


def is_overview_question(query: str) -> bool:
    """Does the question ask what the conversation was about (rather than for a fact)?"""
    return bool(_OVERVIEW.search(query))


@dataclass(frozen=True)
class ContextRequest:
    """Validated parameters of one context build."""

    session_id: str
    query: str
    max_tokens: int
    top_k: int
    since: datetime | None = None
    until: datetime | None = None
    last_turns: int | None = None

    def __post_init__(self) -> None:
        """Reject budgets and counts that cannot work."""
        for name in ("max_tokens", "top_k"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
                raise ValidationError(f"{name} must be a positive integer, got {v!r}")
        if self.last_turns is not None and (
            isinstance(self.last_turns, bool) or not isinstance(self.last_turns, int)
            or self.last_turns <= 0
        ):
            raise ValidationError(f"last_turns must be a positive integer, got {self.last_turns!r}")
        if not isinstance(self.query, str):
            raise ValidationError("query must be a string")
        if not self.query.isascii():  # lone surrogates cannot reach DuckDB: replace them
            object.__setattr__(self, "query", self.query.encode("utf-8", "replace").decode("utf-8"))
        if self.since and self.until and self.since > self.until:
            raise ValidationError("since is after until")


def _day(ts: datetime) -> str:
    return ts.strftime("%Y-%m-%d %H:%M")


def _clip(text: str, limit: int) -> str:
    if estimate_tokens(text) <= limit:
        return text
    words = text.split()
    while words and estimate_tokens(" ".join(words) + " …") > limit:
        words = words[: max(0, len(words) - max(1, len(words) // 8))]
    return " ".join(words) + " …"


class _Budget:
    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0
        self.split: dict[str, int] = {"pins": 0, "recent": 0, "pending": 0, "notes": 0,
                                      "overhead": 0}

    def take(self, part: str, cost: int, limit: int | None = None) -> bool:
        cap = self.total if limit is None else min(self.total, limit)
        if self.used + cost > cap:
            return False
        self.used += cost
        self.split[part] += cost
        return True


def build_context(store: Store, config: Config, req: ContextRequest, explain: bool = False
                  ) -> ContextPayload:
    """Assemble the context for ``req`` (see the module docstring for the order)."""
    sid = req.session_id
    budget = _Budget(req.max_tokens)
    since = req.since.isoformat() if req.since else None
    until = req.until.isoformat() if req.until else None
    next_turn = int(store.q("session_row", {"sid": sid}).fetchone()[2])
    first = next_turn - req.last_turns if req.last_turns else None

    # The memory block is one system message: its overhead is paid once, when it is used.
    memory_overhead = MESSAGE_OVERHEAD + estimate_tokens(MEMORY_HEADER) + 1

    # 1. pins (at most a quarter of the budget)
    pins: list[str] = []
    pin_rows = store.q("pin_texts", {"sid": sid}).fetchall()
    if pin_rows and budget.take("overhead", memory_overhead + estimate_tokens(PIN_HEADER) + 1):
        for _, text in pin_rows:
            line = f"- {text}"
            if budget.take("pins", estimate_tokens(line) + 1, limit=req.max_tokens // 4 +
                           budget.split["overhead"]):
                pins.append(line)

    # 2. recent and pending turns, newest first, within their share
    verbatim: list[VerbatimTurn] = []
    rows = store.q("verbatim_candidates", {"sid": sid, "hot": config.hot_tier_max_turns,
                                           "since": since, "until": until, "first": first}).fetchall()
    share = budget.used + int(req.max_tokens * RECENT_SHARE)
    header_paid = False
    for turn_no, role, speaker, content, ts, tokens, state in rows:
        vt = VerbatimTurn(turn_no, role, speaker, content, ts, state)
        cost = max(int(tokens) + MESSAGE_OVERHEAD, estimate_tokens(vt.line()) + 1)
        extra = 0 if header_paid else 8  # "Recent conversation (YYYY-MM-DD):"
        if not budget.take("recent" if state == "hot" else "pending", cost + extra, limit=share):
            break
        budget.split["overhead"] += extra
        budget.split["recent" if state == "hot" else "pending"] -= extra
        header_paid = True
        verbatim.append(vt)
    verbatim.reverse()
    first_verbatim = verbatim[0].turn_no if verbatim else None

    # 3. notes: retrieved quotes grouped by topic, or the overview
    overview = is_overview_question(req.query)
    memory_paid = bool(pins)
    chosen: list[dict[str, Any]] = []
    dropped: list[dict[str, Any]] = []
    hits: list[dict[str, Any]] = []
    if overview:
        chosen, dropped, memory_paid = _overview(store, sid, budget, memory_paid, memory_overhead)
    elif req.query.strip():
        hits = store.con.execute(
            "SELECT * FROM cce_retrieve(?, ?, k := ?, since := ?, until := ?, last_turns := ?, "
            "before_turn := ?, recency_weight := ?, rrf_k := ?)",
            [sid, req.query, req.top_k * 8, since, until, req.last_turns, first_verbatim,
             config.recency_weight, config.rrf_k],
        ).to_arrow_table().to_pylist()
        chosen, dropped, memory_paid = _quotes(store, sid, req, hits, budget, memory_paid,
                                               memory_overhead)

    memory = _render_memory(pins, chosen, overview)
    payload = ContextPayload(
        session_id=sid, query=req.query, max_tokens=req.max_tokens, memory=memory,
        turns=verbatim, notes=chosen, pins=[p[2:] for p in pins],
        full_tokens=int(store.q("full_tokens", {"sid": sid}).fetchone()[0]),
    )
    # Safety net: the estimate is additive per line, but never trust it blindly.
    while payload.tokens > req.max_tokens:
        if payload.notes:
            last = max(payload.notes, key=lambda n: max(q["rank"] for q in n["quotes"]) if
                       n["quotes"] else 0)
            if last["quotes"]:
                last["quotes"].pop()
            if not last["quotes"]:
                payload.notes.remove(last)
        elif payload.pins:
            payload.pins.pop()
            pins.pop()
        elif payload.turns:
            payload.turns.pop(0)
        else:
            break
        payload.memory = _render_memory(pins, payload.notes, overview)
    if explain:
        payload.explain = {
            "budget": {"max_tokens": req.max_tokens, "used": payload.tokens, **budget.split},
            "overview": overview,
            "hits": [{k: v for k, v in h.items() if k != "ts"} for h in hits],
            "chosen": [{"note_id": n["note_id"], "quotes": [
                {k: q[k] for k in ("turn_no", "dense", "bm25", "recency", "fused", "rank")}
                for q in n["quotes"]]} for n in payload.notes],
            "dropped": dropped,
        }
    if payload.notes and not store.read_only:
        ids = [n["note_id"] for n in payload.notes if n["note_id"] is not None]
        if ids:
            store.q("bump_retrieval", {"sid": sid, "ids": _csv(ids)})
    return payload


def _csv(values: Iterable[int]) -> str:
    """Numbers as one comma-separated string (binding a list parameter costs far more)."""
    return ",".join(str(int(v)) for v in values)


def _note_header(n: dict[str, Any]) -> str:
    span = (f"turn {n['start_turn']}" if n["start_turn"] == n["end_turn"]
            else f"turns {n['start_turn']}-{n['end_turn']}")
    return f"[{_day(n['start_ts'])} · {span} · {n['label']}]"


def _quote_text(row: dict[str, Any], best_sentence: int | None) -> str:
    content = row["content"]
    if content is None:
        return str(row["micro"] or "")
    sentences = row["sentences"] or []
    if best_sentence is not None and sentences and row["tokens"] > QUOTE_MAX_TOKENS // 2:
        by_no = {s["sent_no"]: s for s in sentences}
        s = by_no.get(best_sentence)
        if s is not None:
            text = content[s["start_char"]:s["end_char"]]
            nxt = by_no.get(best_sentence + 1)
            if nxt is not None and estimate_tokens(text) < 16:
                text = content[s["start_char"]:nxt["end_char"]]
            return _clip(text, QUOTE_MAX_TOKENS)
    return _clip(content, QUOTE_MAX_TOKENS)


def _quotes(store: Store, sid: str, req: ContextRequest, hits: list[dict[str, Any]],
            budget: _Budget, memory_paid: bool, memory_overhead: int
            ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], bool]:
    if not hits:
        return [], [], memory_paid
    turn_rows = {r["turn_no"]: r for r in store.q(
        "quote_rows", {"sid": sid, "turns": _csv(h["turn_no"] for h in hits)}).to_arrow_table().to_pylist()}
    note_ids = sorted({h["note_id"] for h in hits if h["note_id"] is not None})
    headers = {r["note_id"]: r for r in store.q(
        "note_headers", {"sid": sid, "ids": _csv(note_ids)}).to_arrow_table().to_pylist()
    } if note_ids else {}  # '' would not cast to BIGINT[]
    groups: dict[Any, dict[str, Any]] = {}
    dropped: list[dict[str, Any]] = []
    for h in hits:
        row = turn_rows.get(h["turn_no"])
        if row is None:
            continue
        key = h["note_id"] if h["note_id"] is not None else f"turn-{h['turn_no']}"
        who = h["speaker"] or h["role"]
        line = f"{who}: {_quote_text(row, h['best_sentence'])}"
        cost = estimate_tokens(line) + 1
        group = groups.get(key)
        if group is None:
            if len(groups) >= req.top_k:
                dropped.append({"turn_no": h["turn_no"], "note_id": h["note_id"],
                                "reason": "top_k", "fused": h["fused"]})
                continue
            if h["note_id"] is not None:
                hdr = headers[h["note_id"]]
            else:
                hdr = {"note_id": None, "label": "not yet summarised", "start_turn": h["turn_no"],
                       "end_turn": h["turn_no"], "start_ts": h["ts"], "end_ts": h["ts"]}
            group = {**hdr, "quotes": []}
            cost += estimate_tokens(_note_header(group)) + 1
        elif len(group["quotes"]) >= QUOTES_PER_NOTE:
            dropped.append({"turn_no": h["turn_no"], "note_id": h["note_id"],
                            "reason": "quotes_per_note", "fused": h["fused"]})
            continue
        extra = 0 if memory_paid else memory_overhead
        if not budget.take("notes", cost + extra):
            dropped.append({"turn_no": h["turn_no"], "note_id": h["note_id"], "reason": "budget",
                            "fused": h["fused"]})
            continue
        if extra:
            budget.split["notes"] -= extra
            budget.split["overhead"] += extra
            memory_paid = True
        groups[key] = group
        group["quotes"].append({**{k: h[k] for k in ("turn_no", "dense", "bm25", "recency",
                                                      "fused", "rank")},
                                "speaker": who, "text": line.split(": ", 1)[1], "line": line})
    chosen = sorted(groups.values(), key=lambda g: g["start_turn"])
    for g in chosen:
        g["quotes"].sort(key=lambda q: q["turn_no"])
    return chosen, dropped, memory_paid


def _overview(store: Store, sid: str, budget: _Budget, memory_paid: bool, memory_overhead: int
              ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], bool]:
    notes = store.con.execute("SELECT * FROM cce_overview(?)", [sid]).to_arrow_table().to_pylist()
    if not notes:
        return [], [], memory_paid
    lines = [f"{_note_header(n)} {n['summary'].splitlines()[0] if n['summary'] else ''}"
             for n in notes]
    costs = [estimate_tokens(ln) + 1 for ln in lines]
    extra = 0 if memory_paid else memory_overhead
    room = budget.total - budget.used - extra
    keep = list(range(len(notes)))
    if sum(costs) > room:  # too many topics: keep an evenly spread subset, in order
        keep = []
        step = max(1.0, sum(costs) / max(room, 1))
        i = 0.0
        while int(i) < len(notes):
            keep.append(int(i))
            i += step
    chosen, dropped = [], []
    for i, n in enumerate(notes):
        if i in keep and budget.take("notes", costs[i] + extra):
            if extra:
                budget.split["notes"] -= extra
                budget.split["overhead"] += extra
                extra, memory_paid = 0, True
            chosen.append({**n, "quotes": [], "overview_line": lines[i]})
        else:
            dropped.append({"note_id": n["note_id"], "reason": "budget"})
    return chosen, dropped, memory_paid


def _render_memory(pins: list[str], notes: list[dict[str, Any]], overview: bool) -> str:
    if not pins and not notes:
        return ""
    out = [MEMORY_HEADER]
    if pins:
        out.append(PIN_HEADER)
        out.extend(pins)
    for n in notes:
        if overview:
            out.append(n["overview_line"])
            continue
        out.append(_note_header(n))
        out.extend(q["line"] for q in n["quotes"])
    return "\n".join(out)
