// Speed of the lite engine: `node bench.mjs [conversation.json]` (default: the test fixture).
// Adds every session's messages one at a time, then times context() for each message text.
import fs from "node:fs";
import { createEngine } from "./src/index.js";

const file = process.argv[2] ?? new URL("./test/fixtures/conversation.json", import.meta.url);
const sessions = JSON.parse(fs.readFileSync(file, "utf8")).sessions;
const eng = createEngine();
let n = 0;
const t0 = performance.now();
for (const [sid, messages] of Object.entries(sessions)) {
  for (const m of messages) { eng.addMessage(sid, m.role, m.content, { timestamp: m.timestamp }); n += 1; }
}
eng.flush();
const ingest = (performance.now() - t0) / 1000;
const times = [];
for (const [sid, messages] of Object.entries(sessions)) {
  for (const m of messages.slice(0, 50)) {
    const t = performance.now();
    eng.context(sid, m.content, { maxTokens: 1000 });
    times.push(performance.now() - t);
  }
}
times.sort((a, b) => a - b);
console.log(JSON.stringify({ messages: n, sessions: Object.keys(sessions).length, ingest_msg_per_s: Math.round(n / ingest),
  context_p50_ms: +times[Math.floor(times.length / 2)].toFixed(2), context_p95_ms: +times[Math.floor(times.length * 0.95)].toFixed(2),
  queries: times.length }));
