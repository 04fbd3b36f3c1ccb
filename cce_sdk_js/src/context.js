// The context builder, ported from cce_duck/context.py: pins, recent and pending turns, then
// retrieved notes with verbatim quotes, under a hard token cap; and never more than the history
// itself: a history that fits with its pins is sent as it is (cce_duck/history.py).
import { estimateTokens, outsideSpans } from "./text.js";
import { clip } from "./topics.js";

export const MESSAGE_OVERHEAD = 4;
export const MEMORY_HEADER = "Memory of earlier conversation (verbatim quotes, oldest first):";
const PIN_HEADER = "Pinned:";
const RECENT_SHARE = 0.3;
const QUOTE_MAX_TOKENS = 120;
const QUOTES_PER_NOTE = 6;
const WORD_CHAR = /[\p{L}\p{N}_]/u;
const HITS_PER_NOTE = 8; // turns retrieved per note allowed, so a full budget has candidates to spare
const OVERVIEW = new RegExp(
  "\\b(what (did|have|were) we (talk|talking|discuss|discussing|chat|chatting|cover)"
  + "|what (topics|subjects)|summari[sz]e (our|the|this) (conversation|chat|discussion)"
  + "|recap|overview of (our|the|this))\\b", "i");

export function isOverviewQuestion(query) {
  return OVERVIEW.test(query);
}

const day = (ms) => new Date(ms).toISOString().slice(0, 16).replace("T", " ");

class Budget {
  constructor(total) {
    this.total = total;
    this.used = 0;
    this.split = { pins: 0, recent: 0, pending: 0, notes: 0, overhead: 0 };
  }

  take(part, cost, limit = null) {
    const cap = limit === null ? this.total : Math.min(this.total, limit);
    if (this.used + cost > cap) return false;
    this.used += cost;
    this.split[part] += cost;
    return true;
  }
}

const line = (t) => `${t.speaker || t.role}: ${t.content}`;

// `[date time · topic label]`: when it was said, and what about (turn numbers stay in the
// payload's notes and the explain form, not in the tokens a model pays for).
function noteHeader(n) {
  return `[${day(n.start_ts)} · ${n.label}]`;
}

const dateOf = (ms) => new Date(ms).toISOString().slice(0, 10);

/** The date line quotes of one day are shown under. */
const dayHeader = (ms) => `[${dateOf(ms)}]`;

function header(note) {
  return { note_id: note.noteId, label: note.label, summary: note.summary, start_turn: note.startTurn,
    end_turn: note.endTurn, start_ts: note.startTs, end_ts: note.endTs };
}

/** A built context: memory block (pins, notes, quotes) then the verbatim recent turns. */
export class ContextPayload {
  constructor(fields) { Object.assign(this, fields); }

  /** OpenAI-style messages: one system message with the memory, then the turns. */
  toMessages() {
    const out = this.memory ? [{ role: "system", content: this.memory }] : [];
    for (const t of this.turns) out.push(t.speaker ? { role: t.role, content: t.content, name: t.speaker } : { role: t.role, content: t.content });
    return out;
  }

  /** The whole context as one text (no "Recent conversation" line when it is the history as it is). */
  toString() {
    const parts = this.memory ? [this.memory] : [];
    if (this.turns.length) {
      const lines = this.turns.map(line).join("\n");
      parts.push(this.verbatim ? lines : `Recent conversation (${day(this.turns[0].ts).slice(0, 10)}):\n${lines}`);
    }
    return parts.join("\n");
  }

  get tokens() {
    const asMessages = this.toMessages().reduce((a, m) => a + estimateTokens(m.content) + MESSAGE_OVERHEAD, 0);
    return Math.max(asMessages, estimateTokens(this.toString()));
  }

  /** Net saving: the history and the pins minus what is sent (never negative: never more is sent). */
  get tokensSaved() {
    return this.fullTokens + this.pinTokens - this.tokens;
  }

  toJSON() {
    return { session_id: this.sessionId, query: this.query, max_tokens: this.maxTokens, memory: this.memory,
      turns: this.turns.map((t) => ({ ...t, ts: new Date(t.ts).toISOString() })),
      notes: this.notes.map((n) => ({ ...n, start_ts: new Date(n.start_ts).toISOString(), end_ts: new Date(n.end_ts).toISOString(),
        quotes: n.quotes.map((q) => (q.ts === undefined ? q : { ...q, ts: new Date(q.ts).toISOString() })) })),
      pins: this.pins, full_tokens: this.fullTokens, pin_tokens: this.pinTokens, verbatim: this.verbatim,
      tokens: this.tokens, tokens_saved: this.tokensSaved,
      messages: this.toMessages(), explain: this.explain ?? null };
  }
}

const pinBlock = (pins) => (pins.length ? [PIN_HEADER, ...pins.map((p) => `- ${p.text}`)].join("\n") : "");
const pinTokens = (pins) => (pins.length ? MESSAGE_OVERHEAD + estimateTokens(pinBlock(pins)) : 0);

/** Tokens of sending `turns` as they are, from their stored estimates: the larger of the message
 * form and the `who: text` lines (cce_duck/history.py `history_tokens`). */
function historyTokens(turns) {
  if (!turns.length) return 0;
  const text = turns.reduce((a, t) => a + t.tokens, 0);
  const who = turns.reduce((a, t) => a + estimateTokens(t.speaker || t.role), 0);
  return Math.max(text + MESSAGE_OVERHEAD * turns.length, text + who + 2 * turns.length - 1);
}

/** The pins, then `turns` as they were written; null when a turn has no text or it would not fit. */
function verbatimContext(s, req, turns, hotTurns, fullTokens, pinsCost) {
  if (turns.some((t) => t.content === null)) return null;
  const payload = new ContextPayload({
    sessionId: s.id, query: req.query, maxTokens: req.maxTokens, memory: pinBlock(s.pins),
    turns: turns.map((t) => ({ turn_no: t.turnNo, role: t.role, speaker: t.speaker, content: t.content, ts: t.ts,
      state: t.noteId !== null ? "compressed" : t.turnNo >= s.nextTurn - hotTurns ? "hot" : "pending" })),
    notes: [], pins: s.pins.map((p) => p.text), fullTokens, pinTokens: pinsCost, verbatim: true, explain: null,
  });
  return payload.tokens <= Math.min(req.maxTokens, fullTokens + pinsCost) ? payload : null;
}

export function buildContext(engine, s, req, explain) {
  const cfg = engine.config;
  const budget = new Budget(req.maxTokens);
  const first = req.lastTurns ? s.nextTurn - req.lastTurns : null;
  const memoryOverhead = MESSAGE_OVERHEAD + estimateTokens(MEMORY_HEADER) + 1;

  // 0. the history (or its asked window) and the pins fit: send them as they are
  const full = historyTokens(s.turns);
  const pinsCost = pinTokens(s.pins);
  const inWindow = s.turns.filter((t) => (first === null || t.turnNo >= first)
    && (req.since === null || t.ts >= req.since) && (req.until === null || t.ts <= req.until));
  if (historyTokens(inWindow) + pinsCost <= req.maxTokens) {
    const whole = verbatimContext(s, req, inWindow, cfg.hotTurns, full, pinsCost);
    if (whole !== null) {
      if (explain) {
        whole.explain = { budget: { max_tokens: req.maxTokens, used: whole.tokens, pins: 0, recent: 0, pending: 0,
          notes: 0, overhead: 0 }, overview: isOverviewQuestion(req.query), verbatim: true, hits: [], chosen: [], dropped: [] };
      }
      return whole;
    }
  }
  const cap = Math.min(req.maxTokens, full + pinsCost);

  // 1. pins (at most a quarter of the budget)
  const pins = [];
  if (s.pins.length && budget.take("overhead", memoryOverhead + estimateTokens(PIN_HEADER) + 1)) {
    for (const p of s.pins) {
      const ln = `- ${p.text}`;
      if (budget.take("pins", estimateTokens(ln) + 1, Math.floor(req.maxTokens / 4) + budget.split.overhead)) pins.push(ln);
    }
  }

  // 2. recent and pending turns, newest first, within their share. An overview question gets
  // the whole uncompressed tail; a fact question the latest `recentTurns` (the exchange being
  // answered), while older hot and pending turns compete with the notes on relevance.
  const overview = isOverviewQuestion(req.query);
  const uncompressed = s.turns.filter((t) => t.noteId === null && t.content !== null).reverse();
  const tail = overview ? uncompressed.length : cfg.recentTurns;
  const verbatim = [];
  const share = budget.used + Math.trunc(req.maxTokens * RECENT_SHARE);
  let headerPaid = false;
  for (const t of uncompressed.slice(0, tail)) {
    if ((first !== null && t.turnNo < first) || (req.since !== null && t.ts < req.since)
      || (req.until !== null && t.ts > req.until)) continue;
    const state = t.turnNo >= s.nextTurn - cfg.hotTurns ? "hot" : "pending";
    const vt = { turn_no: t.turnNo, role: t.role, speaker: t.speaker, content: t.content, ts: t.ts, state };
    const cost = Math.max(t.tokens + MESSAGE_OVERHEAD, estimateTokens(line(vt)) + 1);
    const extra = headerPaid ? 0 : 8;
    const part = state === "hot" ? "recent" : "pending";
    if (!budget.take(part, cost + extra, share)) break;
    budget.split.overhead += extra;
    budget.split[part] -= extra;
    headerPaid = true;
    verbatim.push(vt);
  }
  verbatim.reverse();
  const firstVerbatim = verbatim.length ? verbatim[0].turn_no : null;

  // 3. notes: retrieved quotes grouped by topic, or the overview
  let memoryPaid = pins.length > 0;
  let chosen = [];
  let dropped = [];
  let hits = [];
  if (overview) {
    ({ chosen, dropped, memoryPaid } = overviewNotes(s, budget, memoryPaid, memoryOverhead));
  } else if (req.query.trim()) {
    hits = engine.retrieve(s.id, req.query, { k: HITS_PER_NOTE * req.topK, since: req.since, until: req.until,
      lastTurns: req.lastTurns, beforeTurn: firstVerbatim, conversation: true });
    ({ chosen, dropped, memoryPaid } = quotes(s, req, hits, budget, memoryPaid, memoryOverhead));
  }

  const payload = new ContextPayload({
    sessionId: s.id, query: req.query, maxTokens: req.maxTokens, memory: renderMemory(pins, chosen, overview),
    turns: verbatim, notes: chosen, pins: pins.map((p) => p.slice(2)),
    fullTokens: full, pinTokens: pinsCost, verbatim: false, explain: null,
  });
  while (payload.tokens > cap) {  // safety net: never trust the estimate blindly
    if (payload.notes.length) {
      let last = payload.notes[0];
      let lastRank = -Infinity;
      for (const n of payload.notes) {
        const r = n.quotes.length ? Math.max(...n.quotes.map((q) => q.rank)) : 0;
        if (r > lastRank) { last = n; lastRank = r; }
      }
      if (last.quotes.length) last.quotes.pop();
      if (!last.quotes.length) payload.notes.splice(payload.notes.indexOf(last), 1);
    } else if (payload.pins.length) {
      payload.pins.pop();
      pins.pop();
    } else if (payload.turns.length) {
      payload.turns.shift();
    } else {
      break;
    }
    payload.memory = renderMemory(pins, payload.notes, overview);
  }
  if (explain) {
    payload.explain = {
      budget: { max_tokens: req.maxTokens, used: payload.tokens, ...budget.split },
      overview,
      hits: hits.map(({ ts, ...h }) => h),
      chosen: payload.notes.map((n) => ({ note_id: n.note_id, quotes: n.quotes.map((q) => ({
        turn_no: q.turn_no, dense: q.dense, bm25: q.bm25, recency: q.recency, fused: q.fused, rank: q.rank })) })),
      dropped,
    };
  }
  for (const n of payload.notes) {
    const note = s.notes.find((x) => x.noteId === n.note_id);
    if (note) note.retrievalCount += 1;
  }
  return payload;
}

/** Some word of `content` lies outside the (ordered) sentence `spans`. */
function leavesOutWords(content, spans) {
  return outsideSpans(content, spans.map((x) => [x.start, x.end])).some((p) => WORD_CHAR.test(p));
}

/** The part of a turn worth quoting (its best sentence, and the next one when short) and its
 * token estimate. */
function quoteText(turn, best) {
  const content = turn.content;
  if (best !== null && turn.tokens > QUOTE_MAX_TOKENS) {
    const s = turn.sents.find((x) => x.sentNo === best);
    if (s) {
      let text = content.slice(s.start, s.end);
      const nxt = turn.sents.find((x) => x.sentNo === best + 1);
      if (nxt && estimateTokens(text) < 16) text = content.slice(s.start, nxt.end);
      text = clip(text, QUOTE_MAX_TOKENS);
      return [text, estimateTokens(text)];
    }
  }
  const spans = turn.sents;
  if (spans.length && leavesOutWords(content, spans)) {
    // pleasantries ("Oh wow!", "Thanks!") have no sentence vector: quote the substance only
    const text = clip(spans.map((x) => content.slice(x.start, x.end)).join(" "), QUOTE_MAX_TOKENS);
    return [text, estimateTokens(text)];
  }
  if (turn.tokens <= QUOTE_MAX_TOKENS) return [content, turn.tokens];
  const text = clip(content, QUOTE_MAX_TOKENS);
  return [text, estimateTokens(text)];
}

function quotes(s, req, hits, budget, memoryPaid, memoryOverhead) {
  if (!hits.length) return { chosen: [], dropped: [], memoryPaid };
  const groups = new Map();
  const dropped = [];
  const whoTokens = new Map();
  const days = new Set();
  for (const h of hits) {
    const turn = s.byNo.get(h.turn_no);
    if (!turn) continue;
    const key = h.note_id !== null ? h.note_id : `turn-${h.turn_no}`;
    let group = groups.get(key);
    if (!group && groups.size >= req.topK) {
      dropped.push({ turn_no: h.turn_no, note_id: h.note_id, reason: "top_k", fused: h.fused });
      continue;
    }
    const who = h.speaker || h.role;
    const [text, textTokens] = quoteText(turn, h.best_sentence);
    const ln = `${who}: ${text}`;
    if (!whoTokens.has(who)) whoTokens.set(who, estimateTokens(`${who}:`));
    let cost = whoTokens.get(who) + textTokens + 1; // the estimate is additive over these pieces
    if (!group) {
      const hdr = h.note_id !== null ? header(s.notes.find((n) => n.noteId === h.note_id))
        : { note_id: null, label: "not yet summarised", start_turn: h.turn_no, end_turn: h.turn_no, start_ts: h.ts, end_ts: h.ts };
      group = { ...hdr, quotes: [] };
    }
    const d = dateOf(h.ts);
    if (!days.has(d)) { // quotes are shown under one date line per day
      cost += estimateTokens(dayHeader(h.ts)) + 1;
    } else if (group.quotes.length >= QUOTES_PER_NOTE) {
      dropped.push({ turn_no: h.turn_no, note_id: h.note_id, reason: "quotes_per_note", fused: h.fused });
      continue;
    }
    const extra = memoryPaid ? 0 : memoryOverhead;
    if (!budget.take("notes", cost + extra)) {
      dropped.push({ turn_no: h.turn_no, note_id: h.note_id, reason: "budget", fused: h.fused });
      continue;
    }
    if (extra) {
      budget.split.notes -= extra;
      budget.split.overhead += extra;
      memoryPaid = true;
    }
    days.add(d);
    groups.set(key, group);
    group.quotes.push({ turn_no: h.turn_no, dense: h.dense, bm25: h.bm25, recency: h.recency, fused: h.fused,
      rank: h.rank, speaker: who, text, line: ln, ts: h.ts });
  }
  const chosen = [...groups.values()].sort((a, b) => a.start_turn - b.start_turn);
  for (const g of chosen) g.quotes.sort((a, b) => a.turn_no - b.turn_no);
  return { chosen, dropped, memoryPaid };
}

function overviewNotes(s, budget, memoryPaid, memoryOverhead) {
  const notes = s.notes.map(header);
  if (!notes.length) return { chosen: [], dropped: [], memoryPaid };
  const lines = notes.map((n) => `${noteHeader(n)} ${n.summary ? n.summary.split("\n")[0] : ""}`);
  const costs = lines.map((l) => estimateTokens(l) + 1);
  let extra = memoryPaid ? 0 : memoryOverhead;
  const room = budget.total - budget.used - extra;
  let keep = notes.map((_, i) => i);
  const sum = costs.reduce((a, b) => a + b, 0);
  if (sum > room) {
    keep = [];
    const step = Math.max(1, sum / Math.max(room, 1));
    for (let i = 0; Math.trunc(i) < notes.length; i += step) keep.push(Math.trunc(i));
  }
  const chosen = [];
  const dropped = [];
  notes.forEach((n, i) => {
    if (keep.includes(i) && budget.take("notes", costs[i] + extra)) {
      if (extra) {
        budget.split.notes -= extra;
        budget.split.overhead += extra;
        extra = 0;
        memoryPaid = true;
      }
      chosen.push({ ...n, quotes: [], overview_line: lines[i] });
    } else {
      dropped.push({ note_id: n.note_id, reason: "budget" });
    }
  });
  return { chosen, dropped, memoryPaid };
}

function renderMemory(pins, notes, overview) {
  if (!pins.length && !notes.length) return "";
  const out = [MEMORY_HEADER];
  if (pins.length) out.push(PIN_HEADER, ...pins);
  if (overview) {
    for (const n of notes) out.push(n.overview_line);
    return out.join("\n");
  }
  let d = null;
  for (const q of notes.flatMap((n) => n.quotes).sort((a, b) => a.turn_no - b.turn_no)) {
    if (dateOf(q.ts) !== d) {
      d = dateOf(q.ts);
      out.push(dayHeader(q.ts));
    }
    out.push(q.line);
  }
  return out.join("\n");
}
