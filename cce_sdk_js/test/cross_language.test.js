// Cross-language test: the lite engine and the Python engine (`hash` embedder), run live on the
// same fixture file, keep the same topics and choose the same notes, quotes and recent turns.
// The Python side is tests/js_reference.py, run with CCE_PYTHON (default: the repository's
// .venv/bin/python, else python3); it must be able to import cce_duck.
import assert from "node:assert/strict";
import { execFileSync } from "node:child_process";
import fs from "node:fs";
import path from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import { createEngine } from "../src/index.js";
import { snowballEnglish } from "../src/snowball.js";

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, "..", "..");
const fixturePath = path.join(here, "fixtures", "conversation.json");
const fixture = JSON.parse(fs.readFileSync(fixturePath, "utf8"));

function python() {
  if (process.env.CCE_PYTHON) return process.env.CCE_PYTHON;
  const venv = path.join(repo, ".venv", "bin", "python");
  return fs.existsSync(venv) ? venv : "python3";
}

function ctx(p) {
  return {
    notes: p.notes.map((n) => [n.start_turn, n.end_turn]),
    quotes: p.notes.map((n) => n.quotes.map((q) => q.turn_no)),
    turns: p.turns.map((t) => t.turn_no),
    tokens: p.tokens,
    memory: p.memory,
  };
}

const notes = (eng, sid) => eng.notes(sid).map((n) => [n.start_turn, n.end_turn, n.label, n.summary]);

function scenario() {
  const out = { ingest: {}, live: {} };
  for (const [sid, messages] of Object.entries(fixture.sessions)) {
    const questions = fixture.questions[sid];
    let eng = createEngine();
    eng.ingest(sid, messages);
    const run = { notes: notes(eng, sid), contexts: [], search: [] };
    for (const q of questions) {
      for (const budget of fixture.budgets) run.contexts.push(ctx(eng.context(sid, q, { maxTokens: budget })));
      run.search.push(eng.search(sid, q, 10).map((h) => h.turn_no));
    }
    out.ingest[sid] = run;
    eng = createEngine();
    const live = { contexts: [] };
    const every = fixture.live_every;
    messages.forEach((m, i) => {
      eng.addMessage(sid, m.role, m.content, { timestamp: m.timestamp });
      if ((i + 1) % every === 0) {
        live.contexts.push(ctx(eng.context(sid, questions[Math.floor(i / every) % questions.length], { maxTokens: 600 })));
      }
    });
    live.notes = notes(eng, sid);
    out.live[sid] = live;
  }
  return out;
}

test("the lite engine agrees with the Python engine on the shared fixture", { timeout: 300_000 }, () => {
  let reference;
  try {
    reference = JSON.parse(execFileSync(python(), [path.join(repo, "tests", "js_reference.py"), fixturePath],
      { encoding: "utf8", maxBuffer: 64 * 1024 * 1024, env: { ...process.env, CCE_EMBEDDER: "hash" } }));
  } catch (err) {
    throw new Error(`the Python reference run failed (set CCE_PYTHON to a Python with cce_duck installed): ${err.message}`);
  }
  const mine = scenario();
  let compared = 0;
  for (const mode of ["ingest", "live"]) {
    for (const sid of Object.keys(fixture.sessions)) {
      const a = mine[mode][sid];
      const b = reference[mode][sid];
      assert.ok(b.notes.length > 0, `${mode}/${sid}: the Python engine made notes`);
      assert.deepEqual(a.notes, b.notes, `${mode}/${sid}: same topic notes (spans, labels, summaries)`);
      assert.equal(a.contexts.length, b.contexts.length);
      a.contexts.forEach((c, i) => {
        const r = b.contexts[i];
        assert.deepEqual(c.notes, r.notes, `${mode}/${sid} context ${i}: same notes chosen`);
        assert.deepEqual(c.quotes, r.quotes, `${mode}/${sid} context ${i}: same quotes`);
        assert.deepEqual(c.turns, r.turns, `${mode}/${sid} context ${i}: same recent turns`);
        assert.equal(c.memory, r.memory, `${mode}/${sid} context ${i}: same memory text`);
        assert.equal(c.tokens, r.tokens, `${mode}/${sid} context ${i}: same token count`);
        compared += 1;
      });
      if (mode === "ingest") assert.deepEqual(a.search, b.search, `${sid}: same search ranking`);
    }
  }
  assert.ok(compared >= 70, `compared ${compared} contexts`);
});

test("the Snowball English port stems a large word list exactly like PyStemmer", () => {
  const table = JSON.parse(execFileSync(python(), [path.join(repo, "tests", "js_reference.py"), "--stems"],
    { encoding: "utf8", maxBuffer: 256 * 1024 * 1024 }));
  const words = Object.keys(table);
  assert.ok(words.length >= 50000, `only ${words.length} words`);
  const wrong = words.filter((w) => snowballEnglish(w) !== table[w]);
  assert.deepEqual(wrong.slice(0, 20).map((w) => [w, table[w], snowballEnglish(w)]), []);
  // the table exercises the rules, not only words that stay unchanged
  assert.ok(words.filter((w) => table[w] !== w).length > words.length / 3);
});
