// The `hash` embedder of cce_duck (cce_duck/embedders/hash.py): signed feature hashing of words
// (weight 1) and of the byte trigrams of `#word#` (weight 0.5) with crc32, L2-normalised.
// Same text, same vector as the Python engine's `hash` embedder (up to float rounding).
import { outsideSpans, tokens } from "./text.js";

const TABLE = (() => {
  const t = new Uint32Array(256);
  for (let i = 0; i < 256; i += 1) {
    let c = i;
    for (let k = 0; k < 8; k += 1) c = c & 1 ? 0xedb88320 ^ (c >>> 1) : c >>> 1;
    t[i] = c >>> 0;
  }
  return t;
})();

const encoder = new TextEncoder();

/** crc32 (IEEE) of bytes. */
export function crc32(bytes, start = 0, end = bytes.length) {
  let c = 0xffffffff;
  for (let i = start; i < end; i += 1) c = TABLE[(c ^ bytes[i]) & 0xff] ^ (c >>> 8);
  return (c ^ 0xffffffff) >>> 0;
}

/** Add the hashed features of `text` to `acc` (a Float64Array). */
function addFeatures(acc, text) {
  const dim = acc.length;
  for (const word of tokens(text)) {
    const w = encoder.encode(word);
    const h = crc32(w);
    acc[h % dim] += (h >>> 16) & 1 ? 1 : -1;
    const padded = encoder.encode(`#${word}#`);
    for (let i = 0; i + 3 <= padded.length; i += 1) {
      const g = crc32(padded, i, i + 3);
      acc[g % dim] += (g >>> 16) & 1 ? 0.5 : -0.5;
    }
  }
}

function toFloat32(acc) {
  const out = new Float32Array(acc.length);
  for (let i = 0; i < acc.length; i += 1) out[i] = acc[i];
  return out;
}

/** `v` scaled to unit length as float32 (zero stays zero). */
export function normalise(v) {
  let s = 0;
  for (let i = 0; i < v.length; i += 1) s += v[i] * v[i];
  const n = Math.fround(Math.sqrt(s));
  const out = new Float32Array(v.length);
  for (let i = 0; i < v.length; i += 1) out[i] = n > 0 ? v[i] / n : v[i];
  return out;
}

export class HashEmbedder {
  constructor(dim = 384) {
    this.name = "hash";
    this.dim = dim;
    this.topicThreshold = 0.05;
  }

  /** Unit vector of one text. */
  embed(text) {
    const acc = new Float64Array(this.dim);
    addFeatures(acc, text);
    return normalise(toFloat32(acc));
  }

  /** The message vector and one vector per character span (the message is their sum). */
  embedSpans(text, spans) {
    const parts = spans.map(([a, b]) => {
      const acc = new Float64Array(this.dim);
      addFeatures(acc, text.slice(a, b));
      return toFloat32(acc);
    });
    // the message vector: the sentences' sum plus the words outside them (hashing is additive)
    const whole = new Float32Array(this.dim);
    for (const p of parts) for (let i = 0; i < this.dim; i += 1) whole[i] += p[i];
    const acc = new Float64Array(this.dim);
    addFeatures(acc, outsideSpans(text, spans).join(" "));
    for (let i = 0; i < this.dim; i += 1) whole[i] += acc[i];
    return { whole: normalise(whole), parts: parts.map(normalise) };
  }
}

/** Unit vectors stored as int8 (x127, round half to even), read back as float32 / 127. */
export function quantize(v) {
  const q = new Int8Array(v.length);
  for (let i = 0; i < v.length; i += 1) {
    const x = Math.fround(v[i] * 127);
    let r = Math.round(x);
    if (Math.abs(x % 1) === 0.5 && r % 2 !== 0) r -= 1;  // rint: ties to even
    q[i] = Math.max(-127, Math.min(127, r));
  }
  return q;
}

export function dequantize(q) {
  const out = new Float32Array(q.length);
  for (let i = 0; i < q.length; i += 1) out[i] = q[i] / 127;
  return out;
}
