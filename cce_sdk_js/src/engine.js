// The offline "lite" engine: the cce_duck pipeline (segmenting, hashing embedder, topic notes,
// BM25 + similarity retrieval, token-capped context) in memory, in one JavaScript module.
// It follows cce_duck's write path (writer.py) and retrieval macro (cce_retrieve) so that, on the
// same conversation, it keeps the same topics and chooses the same notes as the Python engine
// with the `hash` embedder.
import { buildContext } from "./context.js";
import { ConflictError, NotFoundError, ValidationError } from "./errors.js";
import { HashEmbedder, dequantize, quantize } from "./hash.js";
import { parseMessages, parseTime, validateSessionId } from "./messages.js";
import { SPEC, bm25Scores, denseScore, namedSpeakers, rank, storedTf } from "./ranking.js";
import { label, mesoSummary, micro, segment } from "./topics.js";
import { estimateTokens, isFiller, queryTerms, splitSentences, terms } from "./text.js";

export const DEFAULTS = Object.freeze({
  hotTurns: 6,
  liveBatchTurns: 8,
  maxTokens: 1000,
  topK: 32,
  recentTurns: 2,
  topicThreshold: null, // null: the embedder's (0.05 for hash)
  minTopicTurns: 2,
  maxTopicTurns: 12,
  topicGapMinutes: 240,
  recencyWeight: SPEC.recency_weight,
  sentenceMinTokens: 24,
  rrfK: SPEC.rrf_k,
  flushEvery: 256,
  dim: 384,
  embedder: null, // null: the hashing embedder of `dim`; else an object like HashEmbedder
});

function positiveInt(name, v) {
  if (!Number.isInteger(v) || v <= 0) throw new ValidationError(`${name} must be a positive integer, got ${v}`);
  return v;
}

function contentHash(role, content) {
  // FNV-1a over role \0 content: only used to skip messages already stored by ingest().
  let h = 0x811c9dc5;
  const s = `${role}\u0000${content}`;
  for (let i = 0; i < s.length; i += 1) { h ^= s.charCodeAt(i); h = Math.imul(h, 0x01000193) >>> 0; }
  return h;
}

const ASKS = /[?？؟]/u; // a turn with a question mark: the next turn is likely its answer

class LiteEngine {
  constructor(options = {}) {
    const unknown = Object.keys(options).filter((k) => !(k in DEFAULTS));
    if (unknown.length) throw new ValidationError(`unknown option(s): ${unknown.join(", ")}`);
    this.config = { ...DEFAULTS, ...options };
    for (const k of ["hotTurns", "liveBatchTurns", "maxTokens", "topK", "recentTurns", "minTopicTurns", "maxTopicTurns",
      "sentenceMinTokens", "rrfK", "flushEvery", "dim"]) positiveInt(k, this.config[k]);
    if (this.config.minTopicTurns > this.config.maxTopicTurns) {
      throw new ValidationError("minTopicTurns must not exceed maxTopicTurns");
    }
    this.embedder = this.config.embedder ?? new HashEmbedder(this.config.dim);
    this._sessions = new Map();
    this._buffer = [];
    this._nextNoteId = 1;
    this._nextPinId = 1;
  }

  // -- sessions ------------------------------------------------------------------------------

  _session(sid, create = false) {
    let s = this._sessions.get(sid);
    if (!s && create) {
      s = { id: sid, nextTurn: 0, status: "open", turns: [], byNo: new Map(), notes: [], pins: [],
        df: new Map(), createdAt: Date.now() };
      this._sessions.set(sid, s);
    }
    return s;
  }

  _existing(sid) {
    validateSessionId(sid);
    this.flush();
    const s = this._sessions.get(sid);
    if (!s || (s.turns.length === 0 && s.nextTurn === 0 && s.pins.length === 0)) {
      throw new NotFoundError(`unknown session ${JSON.stringify(sid)}`);
    }
    return s;
  }

  // -- writing -------------------------------------------------------------------------------

  /** Append one message; returns its turn number. */
  addMessage(sessionId, role, content, { timestamp, name } = {}) {
    const msg = { role, content };
    if (timestamp !== undefined) msg.timestamp = timestamp;
    if (name !== undefined) msg.name = name;
    return this.addMessages(sessionId, [msg])[0];
  }

  /** Append messages (all validated first: a bad one stores none); returns their turn numbers. */
  addMessages(sessionId, messages) {
    const sid = validateSessionId(sessionId);
    const parsed = parseMessages(messages);
    if (!parsed.length) return [];
    return this._add(sid, parsed);
  }

  _add(sid, parsed) {
    const s = this._session(sid, true);
    if (s.status === "closed") throw new ConflictError(`session ${JSON.stringify(sid)} is closed; open a new session`);
    const start = s.nextTurn;
    const numbers = parsed.map((_, i) => start + i);
    parsed.forEach((m, i) => this._buffer.push([sid, start + i, m]));
    s.nextTurn = start + parsed.length;
    if (this._buffer.length >= this.config.flushEvery) this.flush();
    return numbers;
  }

  /** Store a whole history at once; idempotent (a repeated prefix is skipped). */
  ingest(sessionId, messages, { compress = true } = {}) {
    const sid = validateSessionId(sessionId);
    const parsed = parseMessages(messages);
    this.flush();
    const s = this._session(sid, false);
    let skip = 0;
    if (s) {
      for (const t of s.turns) {
        const m = parsed[skip];
        if (!m || t.role !== m.role || t.hash !== contentHash(m.role, m.content)) break;
        skip += 1;
      }
    }
    const fresh = parsed.slice(skip);
    const out = [];
    const batch = Math.max(this.config.liveBatchTurns, 256);
    for (let i = 0; i < fresh.length; i += batch) out.push(...this._add(sid, fresh.slice(i, i + batch)));
    this.flush(compress && fresh.length ? new Set([sid]) : null);
    return out;
  }

  /** Store buffered messages and compress what left the hot window (reads do this themselves). */
  flush(finish = null, { hotToo = false } = {}) {
    if (!this._buffer.length && !finish) return;
    const items = this._buffer;
    this._buffer = [];
    const touched = new Set();
    for (const [sid, n, m] of items) {
      this._insert(this._session(sid, true), n, m);
      touched.add(sid);
    }
    const all = [...new Set([...touched, ...(finish ?? [])])].sort();
    for (const sid of all) {
      const fin = finish ? finish.has(sid) : false;
      this._compress(this._session(sid, true), fin, hotToo && fin);
    }
  }

  _insert(s, n, m) {
    // who said it is part of what a turn is about ("what did Maria decide?")
    const words = [...terms(m.content), ...(m.speaker ? terms(m.speaker) : [])];
    const tf = new Map();
    for (const w of words) tf.set(w, (tf.get(w) ?? 0) + 1);
    for (const [w, c] of tf) tf.set(w, storedTf(c));
    const tokens = estimateTokens(m.content);
    const sentences = splitSentences(m.content);
    // A long message's sentences get vectors of their own, pleasantries excepted.
    const kept = sentences.length > 1 && tokens >= this.config.sentenceMinTokens
      ? sentences.map((x, no) => ({ no, x })).filter(({ x }) => !isFiller(x.text)) : [];
    const spans = kept.map(({ x }) => [x.start, x.end]);
    let q8;
    let sents = [];
    // Embedded as "Speaker: text" (sentence spans shifted to match), like the BM25 terms.
    const prefix = m.speaker ? `${m.speaker}: ` : "";
    if (spans.length) {
      const { whole, parts } = this.embedder.embedSpans(prefix + m.content,
        spans.map(([a, b]) => [a + prefix.length, b + prefix.length]));
      q8 = quantize(whole);
      sents = spans.map(([a, b], j) => ({ sentNo: kept[j].no, start: a, end: b, q8: quantize(parts[j]) }));
    } else {
      q8 = quantize(this.embedder.embed(prefix + m.content));
    }
    const vec = dequantize(q8); // stored int8 vectors, read back as float32 for topics
    const turn = {
      turnNo: n, role: m.role, speaker: m.speaker, content: m.content, ts: m.ts, tokens,
      nTerms: words.length, tf, hash: contentHash(m.role, m.content),
      micro: micro({ role: m.role, speaker: m.speaker, content: m.content }), noteId: null, vec, q8, sents,
    };
    s.turns.push(turn);
    s.byNo.set(n, turn);
    for (const term of tf.keys()) s.df.set(term, (s.df.get(term) ?? 0) + 1);
  }

  _compress(s, finish, hotToo) {
    const cfg = this.config;
    const before = s.nextTurn - (hotToo ? 0 : cfg.hotTurns);
    const pending = s.turns.filter((t) => t.noteId === null && t.turnNo < before);
    if (!pending.length || (!finish && pending.length < cfg.liveBatchTurns)) return;
    const threshold = cfg.topicThreshold ?? this.embedder.topicThreshold;
    let { topics, lastClosed } = segment(pending, pending.map((t) => t.vec), {
      threshold, minTurns: cfg.minTopicTurns, maxTurns: cfg.maxTopicTurns, gapMinutes: cfg.topicGapMinutes,
    });
    if (!finish && !lastClosed) {
      topics = topics.slice(0, -1);
      if (!topics.length) return;
    }
    for (const idx of topics) {
      const part = idx.map((i) => pending[i]);
      const summary = mesoSummary(part, part.map((t) => t.vec));
      const note = {
        noteId: this._nextNoteId++, startTurn: part[0].turnNo, endTurn: part[part.length - 1].turnNo,
        startTs: part[0].ts, endTs: part[part.length - 1].ts, label: label(part, s.df, s.turns.length),
        summary, rawTokens: part.reduce((a, t) => a + t.tokens, 0), summaryTokens: estimateTokens(summary),
        retrievalCount: 0,
      };
      s.notes.push(note);
      for (const t of part) t.noteId = note.noteId;
    }
    s.notes.sort((a, b) => a.startTurn - b.startTurn);
  }

  /** Compress everything, write the session's one-paragraph summary and close it. */
  closeSession(sessionId) {
    const s = this._existing(sessionId);
    this.flush(new Set([s.id]), { hotToo: true });
    const lines = [];
    let used = 0;
    for (const n of s.notes) {
      const line = `- ${n.label}: ${n.summary.split("\n", 1)[0]}`;
      const cost = estimateTokens(line) + 1;
      if (used + cost > 240) { lines.push(`- … and ${s.notes.length - lines.length} more topics`); break; }
      lines.push(line);
      used += cost;
    }
    s.summary = lines.join("\n");
    s.status = "closed";
    return s.summary;
  }

  // -- pins ----------------------------------------------------------------------------------

  /** Keep `text` in every context of the session; returns the pin id. */
  pin(sessionId, text) {
    const sid = validateSessionId(sessionId);
    if (typeof text !== "string" || !text.trim()) throw new ValidationError("pin text must be a non-empty string");
    const s = this._session(sid, true);
    const id = this._nextPinId++;
    s.pins.push({ pinId: id, text });
    return id;
  }

  unpin(sessionId, pinId) {
    const s = this._existing(sessionId);
    const i = s.pins.findIndex((p) => p.pinId === pinId);
    if (i < 0) throw new NotFoundError(`unknown pin ${pinId}`);
    s.pins.splice(i, 1);
  }

  pins(sessionId) {
    return this._existing(sessionId).pins.map((p) => ({ ...p }));
  }

  // -- reading -------------------------------------------------------------------------------

  /** Ranked stored turns for `query` with their scores (cce_duck/ranking.py, the cce_retrieve
   * macro): the fused ranking, or with `conversation` the order a context is built from. */
  retrieve(sessionId, query, { k = 40, since = null, until = null, lastTurns = null, beforeTurn = null,
    recencyWeight = this.config.recencyWeight, rrfK = this.config.rrfK, conversation = false } = {}) {
    const s = this._existing(sessionId);
    const qv = this.embedder.embed(query);
    const qt = queryTerms(query);
    const sinceMs = since === null ? null : parseTime(since, "since");
    const untilMs = until === null ? null : parseTime(until, "until");
    const cand = s.turns.filter((t) => (sinceMs === null || t.ts >= sinceMs) && (untilMs === null || t.ts <= untilMs)
      && (lastTurns === null || t.turnNo >= s.nextTurn - lastTurns) && (beforeTurn === null || t.turnNo < beforeTurn));
    const postings = qt.map(([term, weight]) => [weight, new Map(s.turns.filter((t) => t.tf.has(term))
      .map((t) => [t, t.tf.get(term)]))]);
    const bm25 = bm25Scores(s.turns, postings);
    const scored = cand.map((t) => {
      const { dense, bestSentence } = denseScore(t, qv);
      return { turn_no: t.turnNo, note_id: t.noteId, role: t.role, speaker: t.speaker, ts: t.ts,
        dense, best_sentence: bestSentence, bm25: bm25.get(t),
        recency: (t.turnNo + 1) / Math.max(s.nextTurn, 1), asks: ASKS.test(t.content ?? ""),
        n_terms: t.nTerms };
    });
    const named = conversation ? namedSpeakers(qt.map(([t]) => t), this._speakerTerms(s)) : new Set();
    return rank(scored, { k, recencyWeight, rrfK, conversation, named });
  }

  _speakerTerms(s) {
    return new Map([...new Set(s.turns.map((t) => t.speaker))].filter(Boolean).map((sp) => [sp, terms(sp)]));
  }

  /** Ranked turns with their text (like Engine.search). */
  search(sessionId, query, k = 10) {
    if (typeof query !== "string" || !query.trim()) throw new ValidationError("query must be a non-empty string");
    positiveInt("k", k);
    const s = this._existing(sessionId);
    return this.retrieve(sessionId, query, { k }).map((h) => ({ ...h, content: s.byNo.get(h.turn_no).content }));
  }

  /** The token-capped context a model should receive before answering `query`. */
  context(sessionId, query, { maxTokens, topK, since = null, until = null, lastTurns = null, explain = false } = {}) {
    const s = this._existing(sessionId);
    if (typeof query !== "string") throw new ValidationError("query must be a string");
    const req = {
      sessionId: s.id, query, maxTokens: positiveInt("maxTokens", maxTokens ?? this.config.maxTokens),
      topK: positiveInt("topK", topK ?? this.config.topK),
      since: since === null ? null : parseTime(since, "since"),
      until: until === null ? null : parseTime(until, "until"),
      lastTurns: lastTurns === null ? null : positiveInt("lastTurns", lastTurns),
    };
    if (req.since !== null && req.until !== null && req.since > req.until) throw new ValidationError("since is after until");
    return buildContext(this, s, req, explain);
  }

  /** Every turn with its tier: hot, pending or compressed. */
  turns(sessionId) {
    const s = this._existing(sessionId);
    return s.turns.map((t) => ({
      turn_no: t.turnNo, role: t.role, speaker: t.speaker, content: t.content, ts: new Date(t.ts).toISOString(),
      tokens: t.tokens, micro: t.micro, note_id: t.noteId, state: this._state(s, t),
    }));
  }

  _state(s, t) {
    if (t.noteId !== null) return "compressed";
    return t.turnNo >= s.nextTurn - this.config.hotTurns ? "hot" : "pending";
  }

  /** A session's notes (warm tier), in conversation order. */
  notes(sessionId) {
    return this._existing(sessionId).notes.map((n) => ({
      note_id: n.noteId, start_turn: n.startTurn, end_turn: n.endTurn, start_ts: new Date(n.startTs).toISOString(),
      end_ts: new Date(n.endTs).toISOString(), label: n.label, summary: n.summary, raw_tokens: n.rawTokens,
      summary_tokens: n.summaryTokens, retrieval_count: n.retrievalCount,
    }));
  }

  overview(sessionId) {
    return this.notes(sessionId);
  }

  /** Sizes and tier occupancy per session. */
  stats(sessionId = null) {
    this.flush();
    const ids = sessionId === null ? [...this._sessions.keys()].sort() : [this._existing(sessionId).id];
    return ids.map((sid) => {
      const s = this._sessions.get(sid);
      const count = { hot: 0, pending: 0, compressed: 0 };
      for (const t of s.turns) count[this._state(s, t)] += 1;
      const raw = s.turns.reduce((a, t) => a + t.tokens, 0);
      const notesTokens = s.notes.reduce((a, n) => a + n.summaryTokens, 0);
      return { session_id: sid, status: s.status, turns: s.turns.length, notes: s.notes.length,
        hot_turns: count.hot, pending_turns: count.pending, compressed_turns: count.compressed,
        raw_tokens: raw, note_tokens: notesTokens, full_tokens: raw + 4 * s.turns.length };
    });
  }

  sessions() {
    return this.stats().map(({ session_id, status, turns, notes }) => ({ session_id, status, turns, notes }));
  }
}

/** A new in-memory lite engine (see DEFAULTS for the options). */
export function createEngine(options = {}) {
  return new LiteEngine(options);
}

export { LiteEngine };
