// CCEClient against a real `cce serve rest` started here, with API keys; the server's choices
// are also checked against the lite engine (both use the `hash` embedder).
import assert from "node:assert/strict";
import fs from "node:fs";
import path from "node:path";
import { after, before, test } from "node:test";
import { fileURLToPath } from "node:url";

import { AuthError, CCEClient, NotFoundError, ValidationError, createEngine } from "../src/index.js";
import { startServer } from "./server.js";

const here = path.dirname(fileURLToPath(import.meta.url));
const fixture = JSON.parse(fs.readFileSync(path.join(here, "fixtures", "conversation.json"), "utf8"));
const messages = fixture.sessions.lighthouse;

let server;
let admin;
let user;

before(async () => {
  server = await startServer("rest", { CCE_API_KEYS: "admin-key=*;user-key=user-*" });
  admin = new CCEClient(server.url, { apiKey: "admin-key" });
  user = new CCEClient(server.url, { apiKey: "user-key" });
}, { timeout: 120_000 });

after(async () => {
  if (server) assert.equal(await server.stop(), 0, server.log());
});

test("keys: none, wrong, outside the key's sessions, admin-only routes", async () => {
  const anonymous = new CCEClient(server.url);
  assert.equal((await anonymous.health()).status, "ok");
  await assert.rejects(anonymous.sessions(), (e) => e instanceof AuthError && e.status === 401);
  await assert.rejects(new CCEClient(server.url, { apiKey: "nope" }).sessions(), (e) => e instanceof AuthError && e.status === 401);
  await assert.rejects(user.addMessage("team-x", "user", "hi"), (e) => e instanceof AuthError && e.status === 403);
  await assert.rejects(user.sql("SELECT 1"), (e) => e instanceof AuthError && e.status === 403);
  const r = await admin.sql("SELECT 42 AS answer");
  assert.deepEqual(r.rows, [[42]]);
});

test("messages, context with explain, stats: the server chooses what the lite engine chooses", async () => {
  const turns = await user.addMessages("user-1", messages);
  assert.deepEqual(turns, messages.map((_, i) => i));
  const lite = createEngine();
  lite.addMessages("user-1", messages);
  for (const q of fixture.questions.lighthouse) {
    const remote = await user.context("user-1", q, { maxTokens: 400, explain: true });
    const local = lite.context("user-1", q, { maxTokens: 400 });
    assert.ok(remote.tokens <= 400);
    assert.equal(remote.explain.budget.max_tokens, 400);
    assert.deepEqual(remote.notes.map((n) => [n.start_turn, n.end_turn]), local.notes.map((n) => [n.start_turn, n.end_turn]), q);
    assert.equal(remote.memory, local.memory, q);
    assert.deepEqual(remote.turns.map((t) => t.turn_no), local.turns.map((t) => t.turn_no), q);
  }
  const ctx = await user.context("user-1", "What freezer alert threshold did we settle on?", { maxTokens: 400 });
  assert.match(ctx.memory, /-16 °C/);
  const hits = await user.search("user-1", "freezer alert threshold", { k: 5 });
  assert.deepEqual(hits.map((h) => h.turn_no), lite.search("user-1", "freezer alert threshold", 5).map((h) => h.turn_no));
  assert.deepEqual(hits.map((h) => h.rank), [1, 2, 3, 4, 5]);
  assert.ok((await user.search("user-1", "freezer", { k: 50, lastTurns: 3 })).every((h) => h.turn_no >= messages.length - 3));
  await assert.rejects(user.search("user-1", "freezer", { k: 0 }), ValidationError);
  assert.equal(ctx.messages[0].role, "system");
  const stats = await user.stats("user-1");
  assert.equal(stats.turns, messages.length);
  assert.ok((await user.sessions()).some((s) => s.session_id === "user-1"));
  assert.ok(!(await user.sessions()).some((s) => !s.session_id.startsWith("user-")));
});

test("pins, forgetting with a plan, bad input", async () => {
  await user.addMessages("user-2", messages.slice(0, 20));
  const pinId = await user.pin("user-2", "Priya is allergic to peanuts.");
  assert.ok(Number.isInteger(pinId));
  assert.deepEqual((await user.pins("user-2")).map((p) => p.text), ["Priya is allergic to peanuts."]);
  let ctx = await user.context("user-2", "snacks", { maxTokens: 300 });
  assert.match(ctx.memory, /Pinned:\n- Priya is allergic to peanuts\./);
  await user.updatePin("user-2", pinId, "Priya: no peanuts.");
  ctx = await user.context("user-2", "snacks", { maxTokens: 300 });
  assert.match(ctx.memory, /- Priya: no peanuts\./);
  await user.unpin("user-2", pinId);
  assert.deepEqual(await user.pins("user-2"), []);
  await assert.rejects(user.unpin("user-2", pinId), NotFoundError);

  const plan = await user.forgetPlan("user-2", { turns: [0, 1] });
  assert.ok(plan.length > 0);
  assert.equal((await user.stats("user-2")).turns, 20);  // a plan removes nothing
  const deleted = await user.forget("user-2", { turns: [0, 1] });
  assert.ok(Object.values(deleted).some((n) => n > 0));
  assert.ok((await user.stats("user-2")).turns < 20);

  await assert.rejects(user.addMessages("user-2", [{ role: "user", content: "" }]), ValidationError);
  await assert.rejects(user.addMessages("user-2", [{ role: "robot", content: "hi" }]), ValidationError);
  await assert.rejects(user.context("user-nobody", "q"), NotFoundError);
  await assert.rejects(user.context("user-2", "q", { maxTokens: -1 }), ValidationError);
  assert.throws(() => user.stats("../etc"), ValidationError);
  await assert.rejects(user.forget("user-2", {}), ValidationError);
});

test("the explain form: budget parts, chosen notes with their best scores, dropped hits", async () => {
  await user.addMessages("user-3", messages);
  const q = "What freezer alert threshold did we settle on?";
  const p = await user.context("user-3", q, { maxTokens: 400, explain: true });
  const ex = p.explain;
  const b = ex.budget;
  const parts = b.pins + b.system_note + b.recent + b.pending + b.notes + b.overhead;
  assert.equal(b.planned, parts);
  assert.ok(b.planned <= 400 && b.used === p.tokens && b.free === 400 - p.tokens, JSON.stringify(b));
  assert.ok(b.system_note > 0 && b.notes > 0);
  assert.equal(ex.overview, false);
  assert.deepEqual(ex.verbatim_turns, p.turns.map((t) => t.turn_no));
  assert.deepEqual(ex.window, { since: null, until: null, last_turns: null });
  // chosen: one entry per note of the payload, with label, span and the best score of its quotes
  assert.equal(ex.chosen.length, p.notes.length);
  const hits = new Map(ex.hits.map((h) => [h.turn_no, h]));
  ex.chosen.forEach((c, i) => {
    assert.equal(c.label, p.notes[i].label);
    assert.deepEqual([c.start_turn, c.end_turn], [p.notes[i].start_turn, p.notes[i].end_turn]);
    assert.deepEqual(c.quotes.map((x) => x.turn_no), p.notes[i].quotes.map((x) => x.turn_no));
    for (const s of ["dense", "bm25", "recency", "fused"]) {
      assert.equal(c[s], Math.max(...c.quotes.map((x) => x[s])), `${c.label} ${s}`);
    }
    for (const x of c.quotes) assert.equal(x.fused, hits.get(x.turn_no).fused);
  });
  // the best hit is quoted; every hit not quoted is listed as dropped with a reason
  const quoted = new Set(ex.chosen.flatMap((c) => c.quotes.map((x) => x.turn_no)));
  assert.ok(quoted.has(ex.hits[0].turn_no));
  const dropped = new Map(ex.dropped.filter((d) => d.turn_no !== undefined).map((d) => [d.turn_no, d.reason]));
  for (const h of ex.hits) {
    if (!quoted.has(h.turn_no)) assert.ok(["budget", "top_k", "quotes_per_note", "cap"].includes(dropped.get(h.turn_no)), `${h.turn_no}`);
  }
  // without explain there is none
  assert.equal((await user.context("user-3", q, { maxTokens: 400 })).explain, null);
});

test("corrections, export, deleting a session, and what a key may do with them", async () => {
  await user.addMessages("user-4", messages);
  await admin.addMessages("team-4", messages.slice(0, 4));
  const [note] = (await user.exportSession("user-4")).notes;
  // a corrected turn rebuilds the note that covers it, so the note is corrected after it
  await user.editTurn("user-4", 1, "The night shift uses Android phones with the Lighthouse app.");
  await user.editNote("user-4", note.note_id, { label: "freezer rules" });
  const pinId = await user.pin("user-4", { turn: 0 });
  const doc = await user.exportSession("user-4");
  assert.equal(doc.embedder, "hash");
  assert.equal(doc.turns.length, messages.length);
  assert.equal(doc.turns[1].content, "The night shift uses Android phones with the Lighthouse app.");
  assert.equal(doc.turns[5].content, messages[5].content);
  assert.equal(doc.notes.find((n) => n.note_id === note.note_id).label, "freezer rules");
  assert.deepEqual(doc.pins.map((p) => p.pin_id), [pinId]);
  assert.match(doc.pins[0].text, /Lighthouse/);
  const ctx = await user.context("user-4", "What phones does the night shift carry?", { maxTokens: 300 });
  assert.match(ctx.memory, /Android phones with the Lighthouse app/);
  // the user key sees only its own sessions, and may not export or delete the team's
  await assert.rejects(user.exportSession("team-4"), (e) => e instanceof AuthError && e.status === 403);
  await assert.rejects(user.deleteSession("team-4"), (e) => e instanceof AuthError && e.status === 403);
  await assert.rejects(new CCEClient(server.url).deleteSession("user-4"), (e) => e instanceof AuthError && e.status === 401);
  assert.equal((await admin.exportSession("team-4")).turns.length, 4);
  // forgetting a note: the plan names it and its turns, nothing goes until the confirmed call
  const last = doc.notes[doc.notes.length - 1];
  const plan = await user.forgetPlan("user-4", { noteId: last.note_id });
  assert.ok(plan.some((r) => r.kind === "note" && r.note_id === last.note_id), JSON.stringify(plan));
  const planned = plan.filter((r) => r.kind === "turn").map((r) => r.turn_no).sort((x, y) => x - y);
  assert.deepEqual(planned, Array.from({ length: last.end_turn - last.start_turn + 1 }, (_, i) => last.start_turn + i));
  assert.equal((await user.exportSession("user-4")).notes.length, doc.notes.length);
  await user.forget("user-4", { noteId: last.note_id });
  const after = await user.exportSession("user-4");
  assert.ok(!after.notes.some((n) => n.note_id === last.note_id));
  assert.ok(!after.turns.some((t) => t.turn_no >= last.start_turn && t.turn_no <= last.end_turn));
  await assert.rejects(user.forget("user-4", { noteId: last.note_id }), NotFoundError);
  // deleting: everything goes, the rest stays, a second delete is a 404
  const deleted = await user.deleteSession("user-4");
  assert.ok(deleted.turns === after.turns.length && deleted.pins === 1, JSON.stringify(deleted));
  await assert.rejects(user.exportSession("user-4"), NotFoundError);
  await assert.rejects(user.deleteSession("user-4"), NotFoundError);
  assert.ok(!(await admin.sessions()).some((s) => s.session_id === "user-4"));
  assert.equal((await admin.stats("team-4")).turns, 4);
  await assert.rejects(user.editTurn("user-2", 10_000, "x"), NotFoundError);
  await assert.rejects(user.editNote("user-2", 1, {}), ValidationError);
});
