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
