// Topic segmentation and extractive summaries, ported from cce_duck/topics.py.
import { estimateTokens, splitSentences, termWords, terms } from "./text.js";

export function dot(a, b) {
  let s = 0;
  for (let i = 0; i < a.length; i += 1) s += a[i] * b[i];
  return s;
}

export function unit(v) {
  const n = Math.sqrt(dot(v, v));
  return n > 0 ? Array.from(v, (x) => x / n) : Array.from(v);
}

/**
 * Split consecutive turns into topics: a new one starts at a silence of `gapMinutes`, at
 * `maxTurns`, or when a turn (smoothed with its successor) is less similar than `threshold` to
 * the topic so far once it has `minTurns`. Returns index lists and whether the last is closed.
 */
export function segment(turns, vectors, { threshold, minTurns, maxTurns, gapMinutes }) {
  if (turns.length === 0) return { topics: [], lastClosed: true };
  const topics = [[0]];
  let total = Array.from(vectors[0]);
  for (let i = 1; i < turns.length; i += 1) {
    const cur = topics[topics.length - 1];
    const gap = (turns[i].ts - turns[i - 1].ts) / 60000;
    const look = i + 1 < turns.length
      ? Array.from(vectors[i], (x, j) => Math.fround(x + vectors[i + 1][j]))
      : Array.from(vectors[i]);
    const sim = dot(unit(look), unit(total));
    if (gap >= gapMinutes || cur.length >= maxTurns || (cur.length >= minTurns && sim < threshold)) {
      topics.push([i]);
      total = Array.from(vectors[i]);
    } else {
      cur.push(i);
      for (let j = 0; j < total.length; j += 1) total[j] += vectors[i][j];
    }
  }
  return { topics, lastClosed: topics[topics.length - 1].length >= maxTurns };
}

function who(t) {
  return t.speaker || t.role;
}

/** `text` cut to its longest word prefix that fits `maxTokens` with an ellipsis. */
export function clip(text, maxTokens) {
  if (estimateTokens(text) <= maxTokens) return text;
  const words = text.split(/\s+/u).filter(Boolean);
  let lo = 0;
  let hi = words.length;
  while (lo < hi) {
    const mid = Math.floor((lo + hi + 1) / 2);
    if (estimateTokens(words.slice(0, mid).join(" ") + " …") <= maxTokens) lo = mid;
    else hi = mid - 1;
  }
  return words.slice(0, lo).join(" ") + " …";
}

/** One line per message: who, and its most informative sentence (clipped). */
export function micro(turn, maxTokens = 32) {
  const sentences = splitSentences(turn.content);
  let best = null;
  let bestN = -1;
  for (const s of sentences) {
    const n = new Set(terms(s.text)).size;
    if (n > bestN) { best = s; bestN = n; }
  }
  return `${who(turn)}: ${clip(best ? best.text : turn.content, maxTokens)}`;
}

/** The topic's most central messages (closest to its centroid), in conversation order. */
export function mesoSummary(turns, vectors, maxTokens = 80) {
  const dim = vectors[0].length;
  const mean = new Array(dim).fill(0);
  for (const v of vectors) for (let j = 0; j < dim; j += 1) mean[j] += v[j];
  const centroid = unit(mean.map((x) => x / vectors.length));
  const order = vectors.map((v, i) => [dot(v, centroid), i]).sort((a, b) => b[0] - a[0] || a[1] - b[1]);
  const chosen = [];
  let used = 0;
  for (const [, i] of order.slice(0, Math.max(1, Math.min(3, turns.length)))) {
    const cost = estimateTokens(micro(turns[i])) + 1;
    if (chosen.length && used + cost > maxTokens) break;
    chosen.push(i);
    used += cost;
  }
  return chosen.sort((a, b) => a - b).map((i) => micro(turns[i])).join("\n");
}

/** The topic's most distinctive terms (tf in topic x idf in session), as a short label. */
export function label(turns, df, nDocs, nTerms = 3) {
  const tf = new Map();
  const words = new Map(); // term -> the words it stands for, to show the commonest
  for (const t of turns) {
    const pairs = termWords(t.content);
    for (const term of new Set(pairs.map(([term]) => term))) tf.set(term, (tf.get(term) ?? 0) + 1);
    for (const [term, word] of pairs) {
      if (!words.has(term)) words.set(term, new Map());
      const counts = words.get(term);
      counts.set(word, (counts.get(word) ?? 0) + 1);
    }
  }
  if (tf.size === 0) return "(no words)";
  const commonest = (term) => {
    let best = null;
    let n = 0;
    for (const [word, c] of words.get(term)) if (c > n) { best = word; n = c; }
    return best;
  };
  const score = (term, n) => n * Math.log(1 + nDocs / (1 + (df.get(term) ?? 0)));
  const scored = [...tf.entries()].sort((a, b) => {
    const d = score(b[0], b[1]) - score(a[0], a[1]);
    if (d !== 0) return d;
    return a[0] < b[0] ? -1 : a[0] > b[0] ? 1 : 0;
  });
  return scored.slice(0, nTerms).map(([t]) => commonest(t)).join(", ");
}
