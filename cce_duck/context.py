"""The context builder: pins, recent and pending turns, then retrieved notes with quotes, under a
hard token cap (the cap is never exceeded), and never more than the history itself: a history
that fits is sent as it is (:mod:`cce_duck.history`)."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import date, datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any

import numpy as np

from cce_duck import ranking
from cce_duck.config import Config
from cce_duck.errors import NotFoundError, ValidationError
from cce_duck.history import (
    PIN_HEADER,
    history_tokens,
    pin_tokens,
    verbatim_context,
    verbatim_explain,
    window_rows,
)
from cce_duck.hits import Hits
from cce_duck.index import SessionIndex
from cce_duck.index_cache import IndexCache
from cce_duck.joined import JoinedIndex, retrieve_across
from cce_duck.overview import fit_sessions, session_blocks, spread
from cce_duck.payload import MESSAGE_OVERHEAD, ContextPayload, VerbatimTurn
from cce_duck.store import Store
from cce_duck.text import cached_terms, estimate_tokens, outside_spans, query_terms
from cce_duck.topics import clip
from cce_duck.window import Window

if TYPE_CHECKING:
    import polars as pl

__all__ = ["SEARCH_COLUMNS", "USER_SEARCH_COLUMNS", "ContextRequest", "build_context",
           "build_user_context", "is_overview_question", "rerank", "retrieve", "retrieve_user",
           "search_schema", "user_search_schema"]

_OVERVIEW = re.compile(
    r"\b(what (did|have|were) we (talk|talking|discuss|discussing|chat|chatting|cover)"
    r"|what (topics|subjects)|summari[sz]e (our|the|this) (conversation|chat|discussion)"
    r"|recap|overview of (our|the|this))\b",
    re.I,
)
MEMORY_HEADER = "Memory of earlier conversation (verbatim quotes, oldest first):"
USER_MEMORY_HEADER = "Memory of this user's conversations (verbatim quotes, oldest first):"
RECENT_SHARE = 0.3
QUOTE_MAX_TOKENS = 120
QUOTES_PER_NOTE = 6
_WORD_CHAR = re.compile(r"\w")
HITS_PER_NOTE = 8  # turns retrieved per note allowed, so a full budget has candidates to spare


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


def _index(store: Store, sid: str, cache: IndexCache | None) -> SessionIndex:
    """The retrieval index of ``sid`` keyed by its (updated_at, next_turn); a cached one that no
    write can have changed is used without asking the store. Raises :class:`NotFoundError`."""
    index = cache.current(store, sid) if cache is not None else None
    if index is None:
        def state() -> tuple[Any, ...] | None:
            row = store.q("session_state", {"sid": sid}).fetchone()
            return None if row is None else (row[1], int(row[0]))

        index = (cache or IndexCache(0)).load(store, sid, state)
        if index is None:
            raise NotFoundError(f"unknown session {sid!r}")
    return index


def build_context(store: Store, config: Config, req: ContextRequest, explain: bool = False,
                  cache: IndexCache | None = None, index: SessionIndex | None = None
                  ) -> ContextPayload:
    """Assemble the context for ``req`` (see the module docstring for the order).

    ``cache`` keeps sessions' retrieval indexes between calls (a throwaway one is used without);
    ``index``: the session's index to use (one extended with journaled rows). Raises
    :class:`NotFoundError` for an unknown session.
    """
    sid = req.session_id
    budget = _Budget(req.max_tokens)
    index = index if index is not None else _index(store, sid, cache)
    next_turn = int(index.key[1])
    first = next_turn - req.last_turns if req.last_turns else None

    # 0. the history (or its asked window) and the pins fit: send them as they are
    full, pins_cost = history_tokens(index), pin_tokens(index.pins)
    rows = window_rows(index, Window(req.since, req.until, req.last_turns), next_turn)
    if history_tokens(index, rows) + pins_cost <= req.max_tokens:
        whole = verbatim_context(index, sid, req.query, req.max_tokens, rows,
                                 hot_turns=config.hot_tier_max_turns, full_tokens=full,
                                 pins_cost=pins_cost)
        if whole is not None:
            if explain:
                whole.explain = verbatim_explain(whole, is_overview_question(req.query))
            return whole
    cap = min(req.max_tokens, full + pins_cost)

    # The memory block is one system message: its overhead is paid once, when it is used.
    memory_overhead = MESSAGE_OVERHEAD + estimate_tokens(MEMORY_HEADER) + 1

    # 1. pins (at most a quarter of the budget); 2. recent and pending turns
    overview = is_overview_question(req.query)
    pins = _pins(index.pins, req, budget, memory_overhead)
    verbatim = _recent(config, index, req, budget, overview, next_turn, first)
    first_verbatim = verbatim[0].turn_no if verbatim else None

    # 3. notes: retrieved quotes grouped by topic, or the overview
    memory_paid = bool(pins)
    chosen: list[dict[str, Any]] = []
    dropped: list[dict[str, Any]] = []
    hits = Hits.empty()
    if overview:
        chosen, dropped, memory_paid = _overview(store, sid, budget, memory_paid, memory_overhead)
    elif req.query.strip():
        qv = store.embedder.embed([req.query], "query")[0]
        hits = index.retrieve(qv, req.query, next_turn=next_turn, k=HITS_PER_NOTE * req.top_k,
                              since=req.since, until=req.until, last_turns=req.last_turns,
                              before_turn=first_verbatim, recency_weight=config.recency_weight,
                              rrf_k=config.rrf_k, conversation=True)
        chosen, dropped, memory_paid = _quotes(store, sid, req, hits, index, budget, memory_paid,
                                               memory_overhead, explain=explain)

    memory = _render_memory(pins, chosen, overview)
    payload = ContextPayload(
        session_id=sid, query=req.query, max_tokens=req.max_tokens, memory=memory,
        turns=verbatim, notes=chosen, pins=[p[2:] for p in pins],
        full_tokens=full, pin_tokens=pins_cost,
    )
    _trim(payload, pins, cap, overview)
    if explain:
        payload.explain = {
            "budget": {"max_tokens": req.max_tokens, "used": payload.tokens, **budget.split},
            "overview": overview,
            "hits": [{k: v for k, v in h.items() if k not in ("ts", "row")} for h in hits],
            "chosen": [{"note_id": n["note_id"], "quotes": [
                {k: q[k] for k in ("turn_no", "dense", "bm25", "recency", "fused", "rank")}
                for q in n["quotes"]]} for n in payload.notes],
            "dropped": dropped,
        }
    return payload


def _pins(texts: list[str], req: ContextRequest, budget: _Budget, memory_overhead: int
           ) -> list[str]:
    """The pin lines that fit at most a quarter of the budget."""
    pins: list[str] = []
    if texts and budget.take("overhead", memory_overhead + estimate_tokens(PIN_HEADER) + 1):
        for text in texts:
            line = f"- {text}"
            if budget.take("pins", estimate_tokens(line) + 1, limit=req.max_tokens // 4 +
                           budget.split["overhead"]):
                pins.append(line)
    return pins


def _recent(config: Config, index: SessionIndex, req: ContextRequest, budget: _Budget,
            overview: bool, next_turn: int, first: int | None) -> list[VerbatimTurn]:
    """Recent and pending turns, newest first, within their share, returned oldest first. An
    overview question gets the whole uncompressed tail; a fact question the latest
    `recent_turns` (the exchange being answered), while older hot and pending turns compete
    with the notes on relevance."""
    tail = len(index.uncompressed) if overview else config.recent_turns
    verbatim: list[VerbatimTurn] = []
    share = budget.used + int(req.max_tokens * RECENT_SHARE)
    header_paid = False
    for r in index.uncompressed[:tail]:
        if (first is not None and r["turn_no"] < first) or (req.since and r["ts"] < req.since) or (
                req.until and r["ts"] > req.until):
            continue
        tier = "hot" if r["turn_no"] >= next_turn - config.hot_tier_max_turns else "pending"
        vt = VerbatimTurn(r["turn_no"], r["role"], r["speaker"], r["content"], r["ts"], tier)
        cost = max(int(r["tokens"]) + MESSAGE_OVERHEAD, estimate_tokens(vt.line()) + 1)
        extra = 0 if header_paid else 8  # "Recent conversation (YYYY-MM-DD):"
        part = "recent" if tier == "hot" else "pending"
        if not budget.take(part, cost + extra, limit=share):
            break
        budget.split["overhead"] += extra
        budget.split[part] -= extra
        header_paid = True
        verbatim.append(vt)
    verbatim.reverse()
    return verbatim


def _trim(payload: ContextPayload, pins: list[str], cap: int, overview: bool,
          scoped: bool = False) -> None:
    """Safety net: the estimate is additive per line, but never trust it blindly; and a history
    whose raw text is not kept may compress to more than it was."""
    while payload.tokens > cap:
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
        payload.memory = _render_memory(pins, payload.notes, overview, scoped)


def _user_parts(store: Store, sessions: list[str], cache: IndexCache | None
                ) -> tuple[list[tuple[str, SessionIndex]], JoinedIndex | None]:
    """The indexes of a user's ``sessions`` and, when the cache joins users, their joined index
    (loaded together)."""
    if cache is not None and cache.join_users:
        return cache.user(store, sessions)
    return [(s, _index(store, s, cache)) for s in sessions], None


def build_user_context(store: Store, config: Config, req: ContextRequest,
                       sessions: list[str], *, cache: IndexCache | None = None,
                       explain: bool = False, user_pins: list[str] | None = None,
                       user_id: str | None = None) -> ContextPayload:
    """The context for ``req`` across ``sessions`` (a user's, in time order): the pins and
    recent turns of ``req.session_id`` (when it is stored; else ``user_pins``, the user's
    own pins), then quotes ranked over every
    session as one conversation (:func:`cce_duck.joined.retrieve_across`), each under the date
    and the session it was said in. An overview question ("what did we talk about?") lists
    the sessions of ``user_id`` instead, in time order with their summaries and topics
    (:mod:`cce_duck.overview`). The cap is never exceeded."""
    budget = _Budget(req.max_tokens)
    chats = {s: n for n, s in enumerate(sessions, 1)}
    parts, joined = _user_parts(store, sessions, cache)
    own = dict(parts).get(req.session_id)
    overview = is_overview_question(req.query)
    memory_overhead = MESSAGE_OVERHEAD + estimate_tokens(USER_MEMORY_HEADER) + 1
    pins = [] if own is not None else _pins(user_pins or [], req, budget, memory_overhead)
    verbatim: list[VerbatimTurn] = []
    before: dict[str, int] = {}
    if own is not None:
        next_turn = int(own.key[1])
        first = next_turn - req.last_turns if req.last_turns else None
        pins = _pins(own.pins, req, budget, memory_overhead)
        verbatim = _recent(config, own, req, budget, overview, next_turn, first)
        if verbatim:
            before[req.session_id] = verbatim[0].turn_no
    if joined is not None:  # what sending all of the user's history costs, once per join
        full = joined.memo.get("full_tokens", -1)
        if full < 0:
            full = joined.memo["full_tokens"] = sum(history_tokens(idx) for _, idx in parts)
    else:
        full = sum(history_tokens(idx) for _, idx in parts)
    pins_cost = pin_tokens(own.pins if own is not None else user_pins or [])
    hits = Hits.empty()
    chosen: list[dict[str, Any]] = []
    dropped: list[dict[str, Any]] = []
    cap = min(req.max_tokens, full + pins_cost)
    if overview:
        chosen, dropped = _user_overview(store, user_id, req, budget, cap, bool(pins),
                                         memory_overhead, chats)
    elif req.query.strip():
        qv = store.embedder.embed([req.query], "query")[0]
        hits = retrieve_across(parts, qv, req.query, k=HITS_PER_NOTE * req.top_k,
                               since=req.since, until=req.until, before=before,
                               recency_weight=config.recency_weight, rrf_k=config.rrf_k,
                               joined=joined)
        first_index = parts[0][1] if parts else None
        if first_index is not None:
            chosen, dropped, _ = _quotes(store, req.session_id, req, hits, first_index, budget,
                                         bool(pins), memory_overhead, indexes=dict(parts),
                                         chats=chats, explain=explain)
    payload = ContextPayload(
        session_id=req.session_id, query=req.query, max_tokens=req.max_tokens,
        memory=_render_memory(pins, chosen, overview, True), turns=verbatim, notes=chosen,
        pins=[p[2:] for p in pins], full_tokens=full, pin_tokens=pins_cost)
    _trim(payload, pins, cap, overview, True)
    if explain:
        quoted = Counter(n["session_id"] for n in payload.notes for _ in n["quotes"])
        per_session = Counter(hits.col("session_id")) if len(hits) else Counter[str]()
        listed = {n["session_id"] for n in payload.notes}
        payload.explain = {
            "budget": {"max_tokens": req.max_tokens, "used": payload.tokens, **budget.split},
            "overview": overview,
            "sessions": [{"session_id": s, "chat": chats[s],
                          "hits": per_session.get(s, 0),
                          "quotes": quoted.get(s, 0), "listed": s in listed} for s in sessions],
            "hits": [{k: v for k, v in h.items() if k not in ("ts", "row")} for h in hits],
            "chosen": [{"session_id": n["session_id"], "note_id": n["note_id"], "quotes": [
                {k: q[k] for k in ("turn_no", "dense", "bm25", "recency", "fused", "rank")}
                for q in n["quotes"]]} for n in payload.notes],
            "dropped": dropped,
        }
    return payload


def _user_overview(store: Store, user_id: str | None, req: ContextRequest, budget: _Budget,
                   cap: int, memory_paid: bool, memory_overhead: int, chats: dict[str, int]
                   ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A user's sessions in time order with their summaries and topics (the macro
    ``cce_user_overview`` inside the request's window), as much as fits under ``cap``."""
    rows = store.connection.execute(
        "SELECT * FROM cce_user_overview(?, since := ?, until := ?)",
        [user_id, req.since, req.until]).to_arrow_table().to_pylist()
    blocks = session_blocks(rows, chats)
    extra = 0 if memory_paid or not blocks else memory_overhead
    listed, cost = fit_sessions(blocks, min(budget.total, cap) - budget.used - extra)
    if listed and budget.take("notes", cost + extra, limit=cap):
        budget.split["notes"] -= extra
        budget.split["overhead"] += extra
    else:
        listed = []
    keep = {b.session_id for b in listed}
    chosen = [{"session_id": b.session_id, "chat": chats.get(b.session_id), "note_id": None,
               "quotes": [], "label": b.header,
               "start_ts": b.first_ts, "end_ts": b.last_ts, "summary": b.summary,
               "topics": b.topics, "overview_line": b.text()} for b in listed]
    dropped = [{"session_id": b.session_id, "reason": "budget"} for b in blocks
               if b.session_id not in keep]
    return chosen, dropped


#: Columns of a search's hits, in order (:func:`search_schema` gives their Polars types).
SEARCH_COLUMNS = ("turn_no", "note_id", "role", "speaker", "ts", "dense", "best_sentence", "bm25",
                  "recency", "fused", "rank", "content")


@lru_cache(maxsize=1)
def search_schema() -> dict[str, pl.DataType | type[pl.DataType]]:
    """The Polars schema of a search's hits (Polars is imported here, not with the module: a
    process that only adds messages and builds contexts never loads it, ~30 MB)."""
    import polars as pl

    types = (pl.Int32, pl.Int64, pl.String, pl.String, pl.Datetime("us"), pl.Float64, pl.Int64,
             pl.Float64, pl.Float64, pl.Float64, pl.Int64, pl.String)
    return dict(zip(SEARCH_COLUMNS, types, strict=True))


def retrieve(store: Store, config: Config, sid: str, query: str, *, k: int,
             cache: IndexCache | None = None, window: Window | None = None
             ) -> list[dict[str, Any]]:
    """Search hits with their text, best first (:data:`SEARCH_COLUMNS`), inside the
    optional time/turn ``window``."""
    window = window or Window()
    index = _index(store, sid, cache)
    hits = index.retrieve(store.embedder.embed([query], "query")[0], query,
                          next_turn=int(index.key[1]), k=k, since=window.since, until=window.until,
                          last_turns=window.last_turns, recency_weight=config.recency_weight,
                          rrf_k=config.rrf_k)
    if not hits:
        return []
    return [{**{c: h.get(c) for c in SEARCH_COLUMNS}, "content": index.content[h["row"]]}
            for h in hits]


#: Columns of a search across a user's sessions: the session, :data:`SEARCH_COLUMNS`, and the
#: conversation ``score`` the hits are ordered by.
USER_SEARCH_COLUMNS = ("session_id", *SEARCH_COLUMNS, "score")


@lru_cache(maxsize=1)
def user_search_schema() -> dict[str, pl.DataType | type[pl.DataType]]:
    """The Polars schema of :data:`USER_SEARCH_COLUMNS`."""
    import polars as pl

    return {"session_id": pl.String, **search_schema(), "score": pl.Float64}


def retrieve_user(store: Store, config: Config, sessions: list[str], query: str, *, k: int,
                  cache: IndexCache | None = None) -> list[dict[str, Any]]:
    """Hits across ``sessions`` (a user's, in time order) with their text, best first: the
    ranking a user context is built from (:func:`cce_duck.joined.retrieve_across`), the columns
    of :data:`USER_SEARCH_COLUMNS`."""
    parts, joined = _user_parts(store, sessions, cache)
    hits = retrieve_across(parts, store.embedder.embed([query], "query")[0], query, k=k,
                           recency_weight=config.recency_weight, rrf_k=config.rrf_k,
                           joined=joined)
    indexes = dict(parts)
    return [{**{c: h.get(c) for c in USER_SEARCH_COLUMNS},
             "content": indexes[h["session_id"]].content[h["row"]]} for h in hits]


def rerank(hits: list[dict[str, Any]], query: str, speakers: Iterable[str | None]
           ) -> list[dict[str, Any]]:
    """Hits (with ``turn_no``, ``fused``, ``asks``, ``speaker``, ``n_terms``) in conversation
    order: their ``score`` (:func:`cce_duck.ranking.conversation_scores`), ``rank`` renumbered.
    Ties: the later turn first. ``speakers`` are the session's (a question naming exactly one
    of them weighs the others' turns down)."""
    if not hits:
        return []
    named = ranking.named_speakers([t for t, _ in query_terms(query)],
                                   {sp: cached_terms(sp) for sp in set(speakers) if sp})
    turn_no = np.array([h["turn_no"] for h in hits], dtype=np.int64)
    score = ranking.conversation_scores(
        np.array([h["fused"] for h in hits], dtype=np.float64), turn_no,
        np.array([bool(h["asks"]) for h in hits], dtype=bool),
        ranking.other_speakers([h["speaker"] for h in hits], named),
        np.array([h["n_terms"] for h in hits], dtype=np.float64))
    for h, sc in zip(hits, score, strict=True):
        h["score"] = float(sc)
    out = [hits[i] for i in np.lexsort((-turn_no, -score))]
    for r, h in enumerate(out):
        h["rank"] = r + 1
    return out


@lru_cache(maxsize=8192)
def _day_header(day: date, chat: int | None = None) -> str:
    """The date line quotes of one day are shown under; across a user's sessions, with the
    session's place among them (``chat 3``: the user's third session in time order). Its id
    is in the payload's notes and the explain form, not in the tokens a model pays for: an id
    such as a UUID would cost 20 tokens or more on every date line, a place 2. (Memoised: a
    context has a dozen date lines, mostly of days other contexts showed too.)"""
    return f"[{day:%Y-%m-%d}]" if chat is None else f"[{day:%Y-%m-%d} · chat {chat}]"


DAY_HEADER_TOKENS = estimate_tokens(_day_header(date(2000, 1, 1)))  # the same for every day


@lru_cache(maxsize=8192)
def _session_day_tokens(day: date, chat: int) -> int:
    """Tokens of the date line of a session's quotes of ``day`` (memoised: a user context
    prices one for most of its hits)."""
    return estimate_tokens(_day_header(day, chat))


def _note_header(n: dict[str, Any]) -> str:
    """``[date time · topic label]``: when it was said, and what about (turn numbers stay in the
    payload's notes and the explain form, not in the tokens a model pays for)."""
    return f"[{_day(n['start_ts'])} · {n['label']}]"


def _quote_text(index: SessionIndex, row: int, best: int | None) -> tuple[str, int]:
    """The part of the turn at ``row`` worth quoting (its ``best`` sentence, and the next one
    when short) and its token estimate."""
    content = index.content[row]
    tokens = int(index.tokens[row])
    if content is None:
        text = str(index.micro[row] or "")
        return text, estimate_tokens(text)
    if best is not None and tokens > QUOTE_MAX_TOKENS:
        span = index.sentence_span(row, best)
        if span is not None:
            text = content[span[0]:span[1]]
            nxt = index.sentence_span(row, best + 1)
            if nxt is not None and estimate_tokens(text) < 16:
                text = content[span[0]:nxt[1]]
            text = clip(text, QUOTE_MAX_TOKENS)
            return text, estimate_tokens(text)
    spans = index.sentence_spans(row)
    if spans and _leaves_out_words(content, spans):
        # pleasantries ("Oh wow!", "Thanks!") have no sentence row: quote the substance only
        text = clip(" ".join(content[a:z] for a, z in spans), QUOTE_MAX_TOKENS)
        return text, estimate_tokens(text)
    if tokens <= QUOTE_MAX_TOKENS:
        return content, tokens
    text = clip(content, QUOTE_MAX_TOKENS)
    return text, estimate_tokens(text)


def _leaves_out_words(content: str, spans: list[tuple[int, int]]) -> bool:
    """Some word of ``content`` lies outside the (ordered) sentence ``spans``."""
    return any(_WORD_CHAR.search(piece) for piece in outside_spans(content, spans))


def _quotes(store: Store, sid: str, req: ContextRequest, hits: Hits, index: SessionIndex,
            budget: _Budget, memory_paid: bool, memory_overhead: int,
            indexes: dict[str, SessionIndex] | None = None, chats: dict[str, int] | None = None,
            explain: bool = True) -> tuple[list[dict[str, Any]], list[dict[str, Any]], bool]:
    """Quotes of ``hits`` grouped by note, in budget order. With ``indexes`` (hits of
    :func:`cce_duck.joined.retrieve_across`) each hit is read from its session's index and the
    quotes are shown under their session (its place in ``chats``) as well as their date.
    The hits left out are listed (with the reason) only for ``explain``; without it the walk
    ends as soon as no quote can fit any more. The hits are read column by column (no hit is
    made into a dict: most of them are only looked at)."""
    chats = chats or {}
    if not len(hits):
        return [], [], memory_paid
    groups: dict[Any, dict[str, Any]] = {}
    dropped: list[dict[str, Any]] = []
    who_tokens: dict[str, int] = {}
    days: set[Any] = set()
    scoped = indexes is not None
    total, used, spent = budget.total, budget.used, 0  # (written back to the budget below)
    top_k = req.top_k
    memo = index.quotes
    turn_nos, rows, note_ids = hits.col("turn_no"), hits.col("row"), hits.raw("note_id")
    bests, speakers, roles = hits.raw("best_sentence"), hits.col("speaker"), hits.col("role")
    session_ids: list[str] = hits.col("session_id") if scoped else []
    fused, dense, bm25, recency = (hits.col(k) for k in ("fused", "dense", "bm25", "recency"))

    def drop(i: int, reason: str) -> None:
        dropped.append({"turn_no": turn_nos[i], "note_id": note_ids[i] if note_ids[i] >= 0
                        else None, "reason": reason, "fused": fused[i]})

    for i in range(len(hits)):
        left = total - used
        if left < _LEAST_QUOTE and not explain:
            break  # every quote costs at least its speaker (1 token or more), 1 of text and 1
        sid_h = session_ids[i] if scoped else ""
        if indexes is not None:
            index = indexes[sid_h]
            memo = index.quotes
        row, best = rows[i], bests[i] if bests[i] >= 0 else None
        quoted = memo.get((row, best))
        if quoted is None:
            quoted = _quote_text(index, row, best)
            index.remember_quote((row, best), *quoted)
        if quoted[1] + 2 > left and not explain:
            continue  # (with its speaker, a token or more, it cannot fit: most hits once the
            #            budget is nearly spent, so this is checked first)
        nid = note_ids[i]
        key = (sid_h, nid, None if nid >= 0 else turn_nos[i])  # (note, or lone turn)
        group = groups.get(key)
        if group is None and len(groups) >= top_k:
            if explain:
                drop(i, "top_k")
            continue
        who = speakers[i] or roles[i]
        who_cost = who_tokens.get(who)
        if who_cost is None:
            who_cost = who_tokens[who] = estimate_tokens(f"{who}:")
        if left < who_cost + 2:  # not even a one-token quote fits
            if explain:
                drop(i, "budget")
            continue
        text, text_tokens = quoted
        cost = who_cost + text_tokens + 1  # the estimate is additive over these pieces
        if cost > left and not explain:  # (a day line or the memory block only add to it)
            continue
        ts = hits.value("ts", i)
        day = ts.date() if not scoped else (ts.date(), sid_h)
        if day not in days:  # quotes are shown under one date line per day (and session)
            cost += 1 + (DAY_HEADER_TOKENS if not scoped else _session_day_tokens(
                ts.date(), chats.get(sid_h, 0)))
        elif group is not None and len(group["quotes"]) >= QUOTES_PER_NOTE:
            if explain:
                drop(i, "quotes_per_note")
            continue
        extra = 0 if memory_paid else memory_overhead
        if cost + extra > left:
            if explain:
                drop(i, "budget")
            continue
        used += cost + extra
        spent += cost
        if extra:
            budget.split["overhead"] += extra
            memory_paid = True
        if group is None:
            if nid >= 0:
                hdr = index.notes[nid]
            else:
                hdr = {"note_id": None, "label": "not yet summarised", "start_turn": turn_nos[i],
                       "end_turn": turn_nos[i], "start_ts": ts, "end_ts": ts}
            group = groups[key] = {**hdr, "quotes": []}
            if scoped:
                group["session_id"] = sid_h
        days.add(day)
        quote = {"turn_no": turn_nos[i], "dense": dense[i], "bm25": bm25[i],
                 "recency": recency[i], "fused": fused[i], "rank": i + 1,
                 "speaker": who, "text": text, "line": f"{who}: {text}", "ts": ts}
        if scoped:
            quote.update(session_id=sid_h, pos=hits.value("pos", i), chat=chats.get(sid_h, 0))
        group["quotes"].append(quote)
    budget.used = used
    budget.split["notes"] += spent
    order = "turn_no" if not scoped else "pos"
    for g in groups.values():
        g["quotes"].sort(key=lambda q: q[order])
    chosen = sorted(groups.values(), key=lambda g: g["start_turn"] if not scoped else
                    g["quotes"][0]["pos"])
    return chosen, dropped, memory_paid


_LEAST_QUOTE = 3  # tokens of the cheapest quote line: a speaker, one token of text, a newline


def _overview(store: Store, sid: str, budget: _Budget, memory_paid: bool, memory_overhead: int
              ) -> tuple[list[dict[str, Any]], list[dict[str, Any]], bool]:
    notes = store.connection.execute("SELECT * FROM cce_overview(?)", [sid]).to_arrow_table(
        ).to_pylist()
    if not notes:
        return [], [], memory_paid
    lines = [f"{_note_header(n)} {n['summary'].splitlines()[0] if n['summary'] else ''}"
             for n in notes]
    costs = [estimate_tokens(ln) + 1 for ln in lines]
    extra = 0 if memory_paid else memory_overhead
    keep = spread(costs, budget.total - budget.used - extra)  # too many topics: a spread subset
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


def _render_memory(pins: list[str], notes: list[dict[str, Any]], overview: bool,
                   scoped: bool = False) -> str:
    if not pins and not notes:
        return ""
    out = [USER_MEMORY_HEADER if scoped else MEMORY_HEADER]
    if pins:
        out.append(PIN_HEADER)
        out.extend(pins)
    if overview:
        out.extend(n["overview_line"] for n in notes)
        return "\n".join(out)
    day: Any = None
    for q in sorted((q for n in notes for q in n["quotes"]),
                    key=lambda q: q["pos"] if scoped else q["turn_no"]):
        at = (q["ts"].date(), q.get("session_id"))
        if at != day:
            day = at
            out.append(_day_header(at[0], q.get("chat")))
        out.append(q["line"])
    return "\n".join(out)
