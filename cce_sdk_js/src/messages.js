// Validated chat messages and session ids (cce_duck/messages.py).
import { ValidationError } from "./errors.js";

export const ROLES = new Set(["system", "user", "assistant", "tool"]);
const SESSION_ID = /^[A-Za-z0-9_.-]{1,64}$/;
export const MAX_CONTENT_CHARS = 1_000_000;

export function validateSessionId(sid) {
  if (typeof sid !== "string" || !SESSION_ID.test(sid) || sid === "." || sid === "..") {
    throw new ValidationError(
      `invalid session id ${JSON.stringify(sid)}: use 1-64 characters of A-Z a-z 0-9 _ . - (not '.' or '..')`);
  }
  return sid;
}

/** Milliseconds since the epoch from a Date, an ISO-8601 string (no zone means UTC) or epoch seconds. */
export function parseTime(value, what = "timestamp") {
  let ms;
  if (value instanceof Date) ms = value.getTime();
  else if (typeof value === "number") ms = value * 1000;
  else if (typeof value === "string") {
    const s = value.trim();
    const zoned = /([zZ]|[+-]\d\d:?\d\d)$/.test(s) || !/T|\d:\d/.test(s) ? s : `${s}Z`;
    ms = Date.parse(/^\d{4}-\d\d-\d\d$/.test(zoned) ? `${zoned}T00:00:00Z` : zoned);
  } else {
    throw new ValidationError(`${what} must be an ISO-8601 string, got ${typeof value}`);
  }
  if (!Number.isFinite(ms)) throw new ValidationError(`${what} ${JSON.stringify(value)} is not an ISO-8601 date/time`);
  return ms;
}

export function parseMessages(raw, defaultTs = null) {
  if (!Array.isArray(raw)) throw new ValidationError("messages must be a list of {role, content} objects");
  return raw.map((m, i) => {
    if (m === null || typeof m !== "object") throw new ValidationError(`message ${i} must be an object with role and content`);
    if (typeof m.role !== "string" || !ROLES.has(m.role)) {
      throw new ValidationError(`message ${i}: unknown role ${JSON.stringify(m.role)}; use one of assistant, system, tool, user`);
    }
    if (typeof m.content !== "string") throw new ValidationError(`message ${i}: content must be a string`);
    if (!m.content.trim()) throw new ValidationError(`message ${i}: content is empty`);
    if (m.content.length > MAX_CONTENT_CHARS) throw new ValidationError(`message ${i}: content longer than ${MAX_CONTENT_CHARS} chars`);
    const speaker = m.name ?? m.speaker ?? null;
    if (speaker !== null && (typeof speaker !== "string" || speaker.length > 128)) {
      throw new ValidationError(`message ${i}: name must be a string of at most 128 chars`);
    }
    const tsRaw = m.timestamp ?? m.ts ?? null;
    const ts = tsRaw !== null ? parseTime(tsRaw, `message ${i} timestamp`) : (defaultTs ?? Date.now());
    return { role: m.role, content: m.content, ts, speaker: speaker || null };
  });
}

const SPEAKER_LINE = /^(User|Assistant|System|Human|AI)\s*:\s?(.*)$/i;
const ROLE_OF = { user: "user", human: "user", assistant: "assistant", ai: "assistant", system: "system" };

/** `User: ...` / `Assistant: ...` text into message objects (continuation lines join). */
export function parseTranscript(text) {
  const out = [];
  for (const line of text.split(/\r?\n/)) {
    const m = SPEAKER_LINE.exec(line);
    if (m) out.push({ role: ROLE_OF[m[1].toLowerCase()], content: m[2] });
    else if (out.length) out[out.length - 1].content += `\n${line}`;
    else if (line.trim()) throw new ValidationError("transcript must start with 'User:' or 'Assistant:'");
  }
  for (const msg of out) msg.content = msg.content.trim();
  if (!out.length) throw new ValidationError("no 'User:' / 'Assistant:' lines found in the transcript");
  return out;
}
