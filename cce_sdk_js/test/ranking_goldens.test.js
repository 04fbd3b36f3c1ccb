// The ranking goldens (tests/goldens/ranking.json), written from the cce_retrieve SQL macro by
// benchmarks/ranking_goldens.py: the lite engine reproduces every case without running Python.
// `hash` cases are ingested with the lite engine's own hashing embedder; `onnx` cases replay the
// stored int8 vectors and query vectors the golden file records.
import assert from "node:assert/strict";
import crypto from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import { createEngine } from "../src/index.js";
import { SPEC } from "../src/ranking.js";

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, "..", "..");
const goldens = JSON.parse(fs.readFileSync(path.join(repo, "tests", "goldens", "ranking.json"), "utf8"));
const specPath = path.join(here, "..", "src", "ranking_v1.json");

const bytes = (b64) => Buffer.from(b64, "base64");
const int8 = (b64) => { const b = bytes(b64); return new Int8Array(b.buffer, b.byteOffset, b.length); };
const float32 = (b64) => { const b = Buffer.from(bytes(b64)); return new Float32Array(b.buffer, b.byteOffset, b.length / 4); };
const dequantize = (q) => Float32Array.from(q, (x) => x / SPEC.vector_scale);

/** An embedder that hands back a case's recorded vectors: passages in turn order, queries by text. */
function replay(vectors) {
  const sentences = new Map();
  for (const [turn, , v] of vectors.sentences) {
    if (!sentences.has(turn)) sentences.set(turn, []);
    sentences.get(turn).push(dequantize(int8(v)));
  }
  const queue = vectors.messages.map(([turn, v]) => ({ whole: dequantize(int8(v)), parts: sentences.get(turn) ?? [] }));
  const queries = new Map(Object.entries(vectors.queries).map(([q, v]) => [q, float32(v)]));
  let next = 0;
  return {
    dim: queue.length ? queue[0].whole.length : 384,
    topicThreshold: 0.3,
    embed(text) {
      if (queries.has(text)) return queries.get(text);
      const item = queue[next++];
      assert.equal(item.parts.length, 0, "a turn with sentence vectors is embedded with its spans");
      return item.whole;
    },
    embedSpans(text, spans) {
      const item = queue[next++];
      assert.equal(item.parts.length, spans.length, "the same sentences get vectors");
      return { whole: item.whole, parts: item.parts };
    },
  };
}

test("the goldens were written from this ranking specification", () => {
  const sha = crypto.createHash("sha256").update(fs.readFileSync(specPath)).digest("hex");
  assert.equal(goldens.spec_sha256, sha,
    `${goldens.spec_file} changed since the goldens were written: run python benchmarks/ranking_goldens.py`);
});

for (const c of goldens.cases) {
  test(`the lite engine reproduces the ${c.name} goldens (${c.embedder})`, () => {
    const eng = createEngine(c.vectors ? { embedder: replay(c.vectors) } : {});
    eng.ingest(c.name, c.messages);
    let compared = 0;
    for (const q of c.queries) {
      const hits = eng.retrieve(c.name, q.query, {
        k: q.k, since: q.since ?? null, until: q.until ?? null, lastTurns: q.last_turns ?? null,
        beforeTurn: q.before_turn ?? null, conversation: q.conversation ?? true,
      });
      assert.deepEqual(hits.map((h) => h.turn_no), q.expect, `${c.name}/${c.embedder}: ${JSON.stringify({ ...q, expect: undefined })}`);
      compared += 1;
    }
    assert.ok(compared > 0);
  });
}
