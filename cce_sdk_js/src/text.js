// Text primitives, ported from cce_duck/text.py: sentences with offsets, BM25 terms, question
// terms and token estimates. Offsets are JavaScript string indices (UTF-16 code units).

import { SPEC } from "./ranking.js";
import { snowballEnglish } from "./snowball.js";

export const STOPWORDS = new Set([
  "a", "about", "above", "after", "again", "against", "all", "also", "am", "an", "and", "any",
  "are", "aren", "as", "at", "be", "because", "been", "before", "being", "below", "between",
  "both", "but", "by", "can", "cannot", "could", "couldn", "did", "didn", "do", "does",
  "doesn", "doing", "don", "down", "during", "each", "few", "for", "from", "further", "had",
  "hadn", "has", "hasn", "have", "haven", "having", "he", "her", "here", "hers", "herself",
  "him", "himself", "his", "how", "i", "if", "in", "into", "is", "isn", "it", "its", "itself",
  "just", "let", "me", "more", "most", "mustn", "my", "myself", "no", "nor", "not", "now",
  "of", "off", "on", "once", "only", "or", "other", "ought", "our", "ours", "ourselves",
  "out", "over", "own", "same", "shan", "she", "should", "shouldn", "so", "some", "such",
  "than", "that", "the", "their", "theirs", "them", "themselves", "then", "there", "these",
  "they", "this", "those", "through", "to", "too", "under", "until", "up", "very", "was",
  "wasn", "we", "were", "weren", "what", "when", "where", "which", "while", "who", "whom",
  "why", "will", "with", "won", "would", "wouldn", "you", "your", "yours", "yourself",
  "yourselves", "ll", "re", "ve", "im", "ive", "id", "youre", "thats", "dont", "doesnt",
  "didnt", "isnt", "wasnt", "cant", "wont", "yes", "yeah", "oh", "ok", "okay", "hey", "hi",
  "hello", "thanks", "thank", "really", "got", "get", "gets", "getting", "like", "just",
  "also", "well", "much", "many", "one", "would",
]);

const QUESTION_WORDS = new Set([
  "tell", "know", "remember", "said", "say", "says", "mentioned", "mention", "talk", "talked",
  "discuss", "discussed", "kind", "thing", "things", "something", "anything", "ever",
  "likely", "might", "may", "think",
]);

const CJK = "\\u3040-\\u30ff\\u3400-\\u4dbf\\u4e00-\\u9fff\\uf900-\\ufaff\\uac00-\\ud7af";
const W = `(?:(?![${CJK}])[\\p{L}\\p{N}])`;
const CJK_RUN = new RegExp(`^[${CJK}]+$`, "u");
const WORD = new RegExp(`${W}+(?:['’]${W}+)*|[${CJK}]+`, "gu");
const SENTENCE_END = new RegExp(`(?<=[.!?…])["')\\]]*\\s+|(?<=[。！？])|\\n+`, "gu");
const TOKEN_PIECE = new RegExp(
  `[${CJK}]|[A-Za-z]+|\\p{Nd}+|(?:(?![\\p{Nd}A-Za-z${CJK}])[\\p{L}\\p{N}])+|\\n|[ \\t]{2,}|[^\\p{L}\\p{N}_\\s]`,
  "gu",
);
const ASCII = /^[\x00-\x7f]*$/;
const DIGIT = /\p{Nd}/u;
const UPPER = /\p{Lu}/u;

const cpLength = (s) => { let n = 0; for (const _ of s) n += 1; return n; };

/** A sentence of a message with its offsets (`text === message.slice(start, end)`). */
export function splitSentences(text) {
  const out = [];
  let pos = 0;
  for (const m of text.matchAll(SENTENCE_END)) {
    const g = m[0];
    const isSpace = g.length > 0 && g.trim() === "";
    appendSentence(out, text, pos, isSpace ? m.index : m.index + g.length);
    pos = m.index + g.length;
  }
  appendSentence(out, text, pos, text.length);
  return out;
}

function appendSentence(out, text, start, end) {
  while (start < end && /\s/u.test(text[start])) start += 1;
  while (end > start && /\s/u.test(text[end - 1])) end -= 1;
  if (end > start) out.push({ start, end, text: text.slice(start, end) });
}

function normalise(text) {
  return text.normalize("NFKC").toLowerCase().replace(/ß/g, "ss").replace(/ς/g, "σ")
    .replace(/’/g, "'");
}

function stem(word) {
  if (word.endsWith("'s")) word = word.slice(0, -2);
  else if (word.includes("'")) word = word.replace(/'/g, "");
  return ASCII.test(word) ? snowballEnglish(word) : word;
}

/** Lower-cased words; runs of CJK characters become overlapping character bigrams. */
export function tokens(text) {
  const out = [];
  for (const m of normalise(text).matchAll(WORD)) {
    const w = m[0];
    if (CJK_RUN.test(w)) {
      const chars = [...w];
      if (chars.length === 1) out.push(w);
      else for (let i = 0; i < chars.length - 1; i += 1) out.push(chars[i] + chars[i + 1]);
    } else {
      out.push(w);
    }
  }
  return out;
}

/** BM25 terms of a text: normalised words without stop words, Snowball-stemmed (English). */
export function terms(text) {
  const out = [];
  for (const w of tokens(text)) {
    if (STOPWORDS.has(w) || (cpLength(w) < 2 && ASCII.test(w) && !/^\d+$/.test(w))) continue;
    out.push(stem(w));
  }
  return out;
}

/** `[term, word]` pairs: each BM25 term of `text` with the word it was stemmed from. */
export function termWords(text) {
  const out = [];
  for (const w of tokens(text)) {
    if (STOPWORDS.has(w) || (cpLength(w) < 2 && ASCII.test(w) && !/^\d+$/.test(w))) continue;
    out.push([stem(w), w]);
  }
  return out;
}

/** Distinct normalised words of 3+ characters that are not stop words (CJK: bigrams). */
export function contentWords(text) {
  return new Set(tokens(text).filter((w) => !STOPWORDS.has(w) && (cpLength(w) >= 3 || CJK_RUN.test(w))));
}

const FILLER_MAX_WORDS = 1; // a sentence with at most this many content words is a pleasantry

/** A pleasantry ("Oh wow!", "Thanks!", "See you."): at most one content word. Such sentences
 * get no vector of their own and are left out of quotes. */
export function isFiller(sentence) {
  return contentWords(sentence).size <= FILLER_MAX_WORDS;
}

/** The pieces of `text` before, between and after the (ordered) `[start, end]` spans. */
export function outsideSpans(text, spans) {
  const ends = [0, ...spans.map(([, b]) => b)];
  const starts = [...spans.map(([a]) => a), text.length];
  return ends.map((e, i) => text.slice(e, starts[i]));
}

/** Distinct search terms of a question with weights (names, numbers, codes weigh 2: the
 * ranking specification's distinctive_term_weight). */
export function queryTerms(query) {
  const seen = new Map();
  for (const m of query.normalize("NFKC").matchAll(WORD)) {
    const raw = m[0];
    const chars = [...raw];
    const distinctive = chars.some((c) => DIGIT.test(c))
      || (UPPER.test(chars[0]) && m.index > 0)
      || chars.filter((c) => UPPER.test(c)).length > 1;
    for (const [t, word] of termWords(raw)) {
      if (QUESTION_WORDS.has(word) || QUESTION_WORDS.has(t)) continue;
      seen.set(t, Math.max(seen.get(t) ?? 0, distinctive ? SPEC.distinctive_term_weight : SPEC.plain_term_weight));
    }
  }
  return [...seen.entries()];
}

/** Estimate how many tokens a BPE model spends on `text` (about 1.3 per English word). */
export function estimateTokens(text) {
  if (!text) return 0;
  let n = 0;
  for (const m of text.matchAll(TOKEN_PIECE)) {
    const piece = m[0];
    const c = piece[0];
    if (/[A-Za-z]/.test(c)) n += piece.length <= 8 ? 1 : Math.ceil(piece.length / 5);
    else if (DIGIT.test(c)) n += Math.ceil(cpLength(piece) / 3);
    else if (c === "\n" || c === " " || c === "\t") n += 1;
    else if (cpLength(piece) > 1 && !ASCII.test(c)) n += Math.ceil(cpLength(piece) / 3);
    else n += 1;
  }
  return n;
}
