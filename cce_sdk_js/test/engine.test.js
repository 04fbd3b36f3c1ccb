// Unit tests of the lite engine: the token cap, input validation, pins, overview, transcripts.
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { test } from "node:test";
import { fileURLToPath } from "node:url";

import {
  ConflictError, NotFoundError, ValidationError, crc32, createEngine, estimateTokens, parseTranscript,
  queryTerms, splitSentences, terms,
} from "../src/index.js";

const here = path.dirname(fileURLToPath(import.meta.url));
const fixture = JSON.parse(fs.readFileSync(path.join(here, "fixtures", "conversation.json"), "utf8"));
const lighthouse = fixture.sessions.lighthouse;

test("text primitives", () => {
  assert.equal(crc32(new TextEncoder().encode("123456789")), 0xcbf43926);
  assert.deepEqual(terms("The bugs' classes and queries of Marta's grills"), ["bug", "class", "queri", "marta", "grill"]);
  assert.deepEqual(queryTerms("What did Marta say about B2-117?"), [["marta", 2], ["b2", 2], ["117", 2]]);
  const s = splitSentences("First one. Second (really)! Third?\nFourth");
  assert.deepEqual(s.map((x) => x.text), ["First one.", "Second (really)!", "Third?", "Fourth"]);
  for (const x of s) assert.equal("First one. Second (really)! Third?\nFourth".slice(x.start, x.end), x.text);
  assert.equal(estimateTokens(""), 0);
  assert.equal(estimateTokens("The freezer alerts at -16 °C."), 9);
});

test("the context never exceeds the cap", () => {
  const eng = createEngine();
  eng.ingest("s", fixture.sessions.long);
  eng.pin("s", "Priya is allergic to peanuts.");
  for (const budget of [1, 5, 20, 37, 64, 100, 180, 333, 500, 999, 2500]) {
    for (const q of ["freezer threshold", "What did we talk about?", "", "budget of the ACME project"]) {
      const p = eng.context("s", q, { maxTokens: budget, explain: true });
      assert.ok(p.tokens <= budget, `${p.tokens} > ${budget} for ${JSON.stringify(q)}`);
      assert.ok(p.tokens <= p.fullTokens + p.pinTokens, "never more than the history and the pins");
      assert.equal(p.explain.budget.max_tokens, budget);
    }
  }
  const big = eng.context("s", "What is the freezer alert threshold?", { maxTokens: 2500 });
  assert.ok(big.memory.startsWith("Memory of earlier conversation"));
  assert.ok(big.memory.includes("Pinned:\n- Priya is allergic to peanuts."));
  assert.ok(big.tokens < big.fullTokens);
  assert.equal(big.tokensSaved, big.fullTokens + big.pinTokens - big.tokens);
  const msgs = big.toMessages();
  assert.equal(msgs[0].role, "system");
  assert.equal(msgs.length, 1 + big.turns.length);
  assert.equal(JSON.parse(JSON.stringify(big)).tokens, big.tokens);
});

test("a history that fits is sent as it is, after the pins", () => {
  const eng = createEngine();
  eng.addMessage("s", "user", "We picked DuckDB for storage.");
  eng.pin("s", "Answer briefly.");
  const p = eng.context("s", "storage?", { maxTokens: 500 });
  assert.ok(p.verbatim);
  assert.equal(p.memory, "Pinned:\n- Answer briefly.");
  assert.equal(p.toString(), "Pinned:\n- Answer briefly.\nuser: We picked DuckDB for storage.");
  assert.equal(p.tokens, p.fullTokens + p.pinTokens);
  assert.equal(p.tokensSaved, 0);
  const small = eng.context("s", "storage?", { maxTokens: p.tokens - 1 });
  assert.ok(!small.verbatim && small.tokens < p.tokens);
});

test("bad input is refused and stores nothing", () => {
  const eng = createEngine();
  eng.addMessages("s", lighthouse.slice(0, 4));
  const before = JSON.stringify(eng.turns("s"));
  assert.throws(() => eng.addMessages("s", [{ role: "user", content: "ok" }, { role: "user", content: "  " }]), ValidationError);
  assert.throws(() => eng.addMessages("s", [{ role: "robot", content: "hi" }]), ValidationError);
  assert.throws(() => eng.addMessages("s", "not a list"), ValidationError);
  assert.throws(() => eng.addMessage("s", "user", "hi", { timestamp: "yesterday" }), ValidationError);
  assert.throws(() => eng.addMessage("../x", "user", "hi"), ValidationError);
  assert.throws(() => eng.context("s", "q", { maxTokens: 0 }), ValidationError);
  assert.throws(() => eng.context("s", "q", { since: "2026-03-01", until: "2026-01-01" }), ValidationError);
  assert.throws(() => eng.search("s", " "), ValidationError);
  assert.throws(() => createEngine({ hotTurn: 3 }), ValidationError);
  assert.equal(JSON.stringify(eng.turns("s")), before);
  assert.throws(() => eng.context("nobody", "q"), NotFoundError);
  assert.throws(() => eng.unpin("s", 42), NotFoundError);
});

test("live tiers: hot, pending, compressed; closed sessions refuse writes", () => {
  const eng = createEngine();
  lighthouse.slice(0, 20).forEach((m) => eng.addMessage("live", m.role, m.content, { timestamp: m.timestamp }));
  const states = eng.turns("live").map((t) => t.state);
  assert.equal(states.filter((s) => s === "hot").length, 6);
  assert.ok(states.includes("compressed"));
  const [stats] = eng.stats("live");
  assert.equal(stats.turns, 20);
  assert.equal(stats.hot_turns + stats.pending_turns + stats.compressed_turns, 20);
  const summary = eng.closeSession("live");
  assert.ok(summary.startsWith("- "));
  assert.ok(eng.turns("live").every((t) => t.state === "compressed"));
  assert.throws(() => eng.addMessage("live", "user", "more"), ConflictError);
});

test("ingest is idempotent and overview questions list topics in order", () => {
  const eng = createEngine();
  eng.ingest("s", lighthouse);
  const again = eng.ingest("s", lighthouse);
  assert.deepEqual(again, []);
  assert.equal(eng.turns("s").length, lighthouse.length);
  const p = eng.context("s", "What did we talk about?", { explain: true });
  assert.equal(p.explain.overview, true);
  const starts = p.notes.map((n) => n.start_turn);
  assert.deepEqual(starts, [...starts].sort((a, b) => a - b));
  assert.equal(p.notes.length, eng.notes("s").length);
});

test("transcripts", () => {
  const msgs = parseTranscript("User: hi there\nAssistant: hello\nmore text\nUser: bye");
  assert.deepEqual(msgs, [{ role: "user", content: "hi there" }, { role: "assistant", content: "hello\nmore text" },
    { role: "user", content: "bye" }]);
  assert.throws(() => parseTranscript("no speakers here"), ValidationError);
});
