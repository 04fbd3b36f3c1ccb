// CCEClient: the REST API of `cce serve rest` (sessions, messages, context with explain, stats,
// pins, corrections, forgetting, export, deleting a session) over fetch, with API keys. Node 18+
// and browsers.
import { AuthError, CCEError, ConflictError, NotFoundError, ValidationError } from "./errors.js";

const KINDS = { 400: ValidationError, 401: AuthError, 403: AuthError, 404: NotFoundError, 409: ConflictError,
  413: ValidationError, 422: ValidationError };

function sid(sessionId) {
  if (typeof sessionId !== "string" || !/^[A-Za-z0-9_.-]{1,64}$/.test(sessionId) || sessionId === "." || sessionId === "..") {
    throw new ValidationError(`invalid session id ${JSON.stringify(sessionId)}`);
  }
  return encodeURIComponent(sessionId);
}

function clean(obj) {
  return Object.fromEntries(Object.entries(obj).filter(([, v]) => v !== undefined && v !== null));
}

export class CCEClient {
  /**
   * @param {string} baseUrl  e.g. "http://127.0.0.1:9100"
   * @param {{apiKey?: string, fetch?: typeof fetch, timeoutMs?: number, headers?: Record<string,string>}} options
   */
  constructor(baseUrl = "http://127.0.0.1:9100", { apiKey, fetch: fetchFn, timeoutMs = 30_000, headers = {} } = {}) {
    this.baseUrl = String(baseUrl).replace(/\/+$/, "");
    this.apiKey = apiKey ?? null;
    this.timeoutMs = timeoutMs;
    this.headers = headers;
    this._fetch = fetchFn ?? globalThis.fetch?.bind(globalThis);
    if (!this._fetch) throw new CCEError("no fetch available: pass options.fetch");
  }

  async _request(method, path, body) {
    const headers = { accept: "application/json", ...this.headers };
    if (this.apiKey) headers.authorization = `Bearer ${this.apiKey}`;
    if (body !== undefined) headers["content-type"] = "application/json";
    const controller = typeof AbortController === "function" ? new AbortController() : null;
    const timer = controller ? setTimeout(() => controller.abort(), this.timeoutMs) : null;
    let res;
    try {
      res = await this._fetch(this.baseUrl + path, { method, headers, body: body === undefined ? undefined : JSON.stringify(body),
        signal: controller?.signal });
    } catch (err) {
      throw new CCEError(`cannot reach ${this.baseUrl}: ${err.message}`);
    } finally {
      if (timer) clearTimeout(timer);
    }
    const text = await res.text();
    let data = null;
    try { data = text ? JSON.parse(text) : null; } catch { data = null; }
    if (!res.ok) {
      const info = data?.error ?? {};
      const Kind = KINDS[res.status] ?? CCEError;
      const err = new Kind(info.message ?? `HTTP ${res.status} from ${method} ${path}`);
      err.status = res.status;
      err.type = info.type ?? "http_error";
      err.details = info.details ?? null;
      throw err;
    }
    return data;
  }

  /** Liveness, version and embedder (no key needed). */
  health() { return this._request("GET", "/health"); }

  /** Sessions the key may use, with turn and note counts. */
  async sessions() { return (await this._request("GET", "/v1/sessions")).sessions; }

  /** Append messages ({role, content, timestamp?, name?}); returns their turn numbers. */
  async addMessages(sessionId, messages) {
    return (await this._request("POST", `/v1/sessions/${sid(sessionId)}/messages`, { messages })).turns;
  }

  async addMessage(sessionId, role, content, { timestamp, name } = {}) {
    return (await this.addMessages(sessionId, [clean({ role, content, timestamp, name })]))[0];
  }

  /** The token-capped context for `query` (with `explain: true`, the scores and budget split). */
  context(sessionId, query, { maxTokens, topK, since, until, lastTurns, explain = false } = {}) {
    return this._request("POST", `/v1/sessions/${sid(sessionId)}/context`, clean({
      query, max_tokens: maxTokens, top_k: topK, since, until, last_turns: lastTurns, explain }));
  }

  /** The `k` best-ranked turns for `query` with their scores and text, best first. */
  async search(sessionId, query, { k, since, until, lastTurns } = {}) {
    return (await this._request("POST", `/v1/sessions/${sid(sessionId)}/search`, clean({
      query, k, since, until, last_turns: lastTurns }))).hits;
  }

  /** Sizes, tiers and compression of one session. */
  stats(sessionId) { return this._request("GET", `/v1/sessions/${sid(sessionId)}/stats`); }

  async summary(sessionId) { return (await this._request("GET", `/v1/sessions/${sid(sessionId)}/summary`)).summary; }

  async close(sessionId) { return (await this._request("POST", `/v1/sessions/${sid(sessionId)}/close`)).summary; }

  /** Stateless: compress `messages` and build the context for `query`; nothing is stored. */
  compress(messages, query, { maxTokens } = {}) {
    return this._request("POST", "/v1/compress", clean({ messages, query, max_tokens: maxTokens }));
  }

  /** Pin a text (or `{turn: n}`, a stored turn); returns the pin id. */
  async pin(sessionId, textOrTurn) {
    const body = typeof textOrTurn === "string" ? { text: textOrTurn } : { turn: textOrTurn?.turn };
    return (await this._request("POST", `/v1/sessions/${sid(sessionId)}/pins`, body)).pin_id;
  }

  async pins(sessionId) { return (await this._request("GET", `/v1/sessions/${sid(sessionId)}/pins`)).pins; }

  async updatePin(sessionId, pinId, text) {
    await this._request("PUT", `/v1/sessions/${sid(sessionId)}/pins/${Number(pinId)}`, { text });
  }

  async unpin(sessionId, pinId) {
    await this._request("DELETE", `/v1/sessions/${sid(sessionId)}/pins/${Number(pinId)}`);
  }

  async editNote(sessionId, noteId, { label, summary } = {}) {
    await this._request("PATCH", `/v1/sessions/${sid(sessionId)}/notes/${Number(noteId)}`, clean({ label, summary }));
  }

  async editTurn(sessionId, turn, text) {
    await this._request("PATCH", `/v1/sessions/${sid(sessionId)}/turns/${Number(turn)}`, { text });
  }

  /** What `forget` would remove (nothing is removed). Pass `{noteId}` or `{turns: [first, last]}`. */
  async forgetPlan(sessionId, what) {
    return (await this._request("POST", `/v1/sessions/${sid(sessionId)}/forget`, { ...forgetBody(what), dry_run: true })).plan;
  }

  /** Forget a note (with its turns) or a turn range for good; returns counts per kind. */
  async forget(sessionId, what) {
    return (await this._request("POST", `/v1/sessions/${sid(sessionId)}/forget`, forgetBody(what))).deleted;
  }

  /** The whole session as JSON (turns, notes, pins, summary; no vectors), as `cce export` writes it. */
  exportSession(sessionId) { return this._request("GET", `/v1/sessions/${sid(sessionId)}/export`); }

  /** Delete a session with everything stored about it; returns rows removed per table. */
  async deleteSession(sessionId) {
    return (await this._request("DELETE", `/v1/sessions/${sid(sessionId)}`)).deleted;
  }

  /** One read-only SQL statement (admin keys only): {columns, types, rows}. */
  sql(statement) { return this._request("POST", "/v1/admin/sql", { sql: statement }); }
}

function forgetBody(what = {}) {
  if (what.noteId !== undefined && what.turns === undefined) return { node_id: what.noteId };
  if (Array.isArray(what.turns) && what.turns.length === 2 && what.noteId === undefined) {
    return { start: what.turns[0], end: what.turns[1] };
  }
  throw new ValidationError("forget needs {noteId} or {turns: [first, last]}");
}
