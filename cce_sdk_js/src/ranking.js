// The ranking of a session's stored turns, as cce_duck/ranking.py defines it: every constant
// comes from the one specification file, sql/ranking_v1.json (src/ranking_v1.json links to it;
// `npm pack` ships a copy). Golden files written from the cce_retrieve macro prove the lite
// engine ranks as the Python engine and the SQL macro do (test/ranking_goldens.test.js).
import SPEC from "./ranking_v1.json" with { type: "json" };

export { SPEC };

/** The term frequency stored for a term seen `count` times in a turn (the cap's one place). */
export function storedTf(count) {
  return Math.min(count, SPEC.tf_cap);
}

/** Similarity of a stored int8 vector to the query: sum(int8 * query) / vector_scale. */
export function similarity(q8, query) {
  let s = 0;
  for (let i = 0; i < q8.length; i += 1) s += q8[i] * query[i];
  return s / SPEC.vector_scale;
}

/** Dense score of a turn (the best of its message and sentence vectors) and its best sentence. */
export function denseScore(turn, query) {
  const md = similarity(turn.q8, query);
  let sd = null;
  let best = null;
  for (const x of turn.sents) {
    const d = similarity(x.q8, query);
    if (sd === null || d > sd) { sd = d; best = x.sentNo; }
  }
  return { dense: Math.max(md, sd ?? md), bestSentence: best };
}

/** BM25 of every turn: `postings` holds, per question term in order, [weight, Map(turn -> tf)]. */
export function bm25Scores(turns, postings) {
  const n = turns.length;
  const out = new Map(turns.map((t) => [t, 0]));
  if (!n) return out;
  const avgdl = Math.max(turns.reduce((a, t) => a + t.nTerms, 0) / n, SPEC.bm25_min_avgdl);
  const k1 = SPEC.bm25_k1;
  const b = SPEC.bm25_b;
  for (const [weight, tfs] of postings) {
    const df = tfs.size;
    if (!df) continue;
    const idf = Math.log(1 + (n - df + 0.5) / (df + 0.5));
    for (const [t, tf] of tfs) {
      const norm = k1 * ((1 - b) + b * t.nTerms / avgdl);
      out.set(t, out.get(t) + weight * idf * tf * (k1 + 1) / (tf + norm));
    }
  }
  return out;
}

/** The speakers a question names: all the terms of the name are among the question's. */
export function namedSpeakers(queryTermList, speakerTerms) {
  const asked = new Set(queryTermList);
  const out = new Set();
  for (const [sp, ts] of speakerTerms) if (ts.length && ts.every((t) => asked.has(t))) out.add(sp);
  return out;
}

const later = (a, b) => b.turn_no - a.turn_no;

/**
 * Rank candidates (objects with turn_no, dense, bm25, recency, asks, speaker, n_terms, in turn
 * order): fused by reciprocal rank, the best `k`; with `conversation`, the replies to the
 * questions among them added and the list ordered by conversation score. Returns the hits with
 * `fused`, `score` (conversation only) and `rank`.
 */
export function rank(cands, { k, recencyWeight = SPEC.recency_weight, rrfK = SPEC.rrf_k, conversation = false,
  named = new Set() }) {
  const byDense = [...cands].sort((a, b) => (b.dense + recencyWeight * b.recency) - (a.dense + recencyWeight * a.recency)
    || later(a, b));
  const rDense = new Map(byDense.map((h, i) => [h, i + 1]));
  const byBm = [...cands].sort((a, b) => b.bm25 - a.bm25 || later(a, b));
  const rBm = new Map(byBm.map((h, i) => [h, i + 1]));
  const fused = cands.map((h) => ({ ...h, fused: 1 / (rrfK + rDense.get(h)) + (h.bm25 > 0 ? 1 / (rrfK + rBm.get(h)) : 0) }));
  const position = new Map(fused.map((h, i) => [h, i]));
  let top = [...fused].sort((a, b) => b.fused - a.fused || later(a, b)).slice(0, k);
  if (!conversation) return top.map((h, i) => ({ ...h, rank: i + 1 }));
  const taken = new Set(top);
  const replies = new Set();
  for (const h of top) {
    const nxt = fused[position.get(h) + 1];
    if (h.asks && nxt && nxt.turn_no === h.turn_no + 1 && !taken.has(nxt)) replies.add(nxt);
  }
  top = top.concat([...replies].sort((a, b) => a.turn_no - b.turn_no));
  const listed = new Map(top.map((h) => [h.turn_no, h]));
  for (const h of top) {
    let score = h.fused;
    const prev = listed.get(h.turn_no - 1);
    if (prev !== undefined && prev.asks) score = score + SPEC.reply_share * prev.fused;
    if (named.size === 1 && !named.has(h.speaker)) score = score * SPEC.other_speaker;
    h.score = score * (h.n_terms / (h.n_terms + SPEC.terms_half_weight));
  }
  return top.sort((a, b) => b.score - a.score || later(a, b)).map((h, i) => ({ ...h, rank: i + 1 }));
}
