// Type definitions of cce-sdk.

export type Role = "system" | "user" | "assistant" | "tool";

export interface MessageInput {
  role: Role;
  content: string;
  /** ISO-8601 (no zone means UTC), a Date, or epoch seconds. Default: now. */
  timestamp?: string | Date | number;
  name?: string;
}

export interface EngineOptions {
  hotTurns?: number;
  liveBatchTurns?: number;
  maxTokens?: number;
  /** Most topic notes quoted per question (default 32). */
  topK?: number;
  /** Newest turns always sent verbatim with a fact question (default 2); older hot and pending
   * turns are quoted when relevant, and an overview question gets them all. */
  recentTurns?: number;
  topicThreshold?: number | null;
  minTopicTurns?: number;
  maxTopicTurns?: number;
  topicGapMinutes?: number;
  recencyWeight?: number;
  sentenceMinTokens?: number;
  rrfK?: number;
  flushEvery?: number;
  dim?: number;
  /** The embedder (default null: a HashEmbedder of `dim`); any object with the same members. */
  embedder?: Embedder | null;
}

/** What the lite engine needs of an embedder (HashEmbedder is one). */
export interface Embedder {
  readonly dim: number;
  readonly topicThreshold: number;
  embed(text: string): ArrayLike<number>;
  embedSpans(text: string, spans: [number, number][]): { whole: ArrayLike<number>; parts: ArrayLike<number>[] };
}

export const DEFAULTS: Readonly<Required<EngineOptions>>;

export interface VerbatimTurn {
  turn_no: number;
  role: Role;
  speaker: string | null;
  content: string;
  /** Epoch milliseconds. */
  ts: number;
  state: "hot" | "pending" | "compressed";
}

export interface Quote {
  turn_no: number;
  dense: number;
  bm25: number;
  recency: number;
  fused: number;
  rank: number;
  speaker: string;
  text: string;
  line: string;
}

export interface ChosenNote {
  note_id: number | null;
  label: string;
  summary?: string;
  start_turn: number;
  end_turn: number;
  start_ts: number;
  end_ts: number;
  quotes: Quote[];
  overview_line?: string;
}

export interface Hit {
  turn_no: number;
  note_id: number | null;
  role: Role;
  speaker: string | null;
  ts: number;
  dense: number;
  best_sentence: number | null;
  bm25: number;
  recency: number;
  asks: boolean;
  n_terms: number;
  fused: number;
  /** The conversation score (retrieve with `conversation: true`, and context hits). */
  score?: number;
  rank: number;
}

export interface Explain {
  budget: { max_tokens: number; used: number; pins: number; recent: number; pending: number; notes: number; overhead: number };
  overview: boolean;
  hits: Omit<Hit, "ts">[];
  chosen: { note_id: number | null; quotes: Pick<Quote, "turn_no" | "dense" | "bm25" | "recency" | "fused" | "rank">[] }[];
  dropped: { turn_no?: number; note_id: number | null; reason: string; fused?: number }[];
}

export interface ChatMessage {
  role: Role;
  content: string;
  name?: string;
}

export class ContextPayload {
  sessionId: string;
  query: string;
  maxTokens: number;
  memory: string;
  turns: VerbatimTurn[];
  notes: ChosenNote[];
  pins: string[];
  /** What sending the whole history as it is costs (measured as `tokens` is). */
  fullTokens: number;
  /** What the pins cost on their own; `tokens <= min(maxTokens, fullTokens + pinTokens)`. */
  pinTokens: number;
  /** The history (or its asked window) fitted: the context is its turns as they are. */
  verbatim: boolean;
  explain: Explain | null;
  readonly tokens: number;
  /** Net: `fullTokens + pinTokens - tokens` (never negative). */
  readonly tokensSaved: number;
  toMessages(): ChatMessage[];
  toString(): string;
  toJSON(): Record<string, unknown>;
}

export interface ContextOptions {
  maxTokens?: number;
  topK?: number;
  since?: string | Date | number | null;
  until?: string | Date | number | null;
  lastTurns?: number | null;
  explain?: boolean;
}

export interface TurnRow {
  turn_no: number;
  role: Role;
  speaker: string | null;
  content: string;
  ts: string;
  tokens: number;
  micro: string;
  note_id: number | null;
  state: "hot" | "pending" | "compressed";
}

export interface NoteRow {
  note_id: number;
  start_turn: number;
  end_turn: number;
  start_ts: string;
  end_ts: string;
  label: string;
  summary: string;
  raw_tokens: number;
  summary_tokens: number;
  retrieval_count: number;
}

export interface StatsRow {
  session_id: string;
  status: "open" | "closed";
  turns: number;
  notes: number;
  hot_turns: number;
  pending_turns: number;
  compressed_turns: number;
  raw_tokens: number;
  note_tokens: number;
  full_tokens: number;
}

export class LiteEngine {
  readonly config: Required<EngineOptions>;
  addMessage(sessionId: string, role: Role, content: string, options?: { timestamp?: string | Date | number; name?: string }): number;
  addMessages(sessionId: string, messages: MessageInput[]): number[];
  ingest(sessionId: string, messages: MessageInput[], options?: { compress?: boolean }): number[];
  flush(): void;
  closeSession(sessionId: string): string;
  pin(sessionId: string, text: string): number;
  unpin(sessionId: string, pinId: number): void;
  pins(sessionId: string): { pinId: number; text: string }[];
  retrieve(sessionId: string, query: string, options?: { k?: number; since?: string | null; until?: string | null;
    lastTurns?: number | null; beforeTurn?: number | null; recencyWeight?: number; rrfK?: number;
    /** The order a context is built from: replies added, conversation score (default false). */
    conversation?: boolean }): Hit[];
  search(sessionId: string, query: string, k?: number): (Hit & { content: string })[];
  context(sessionId: string, query: string, options?: ContextOptions): ContextPayload;
  turns(sessionId: string): TurnRow[];
  notes(sessionId: string): NoteRow[];
  overview(sessionId: string): NoteRow[];
  stats(sessionId?: string | null): StatsRow[];
  sessions(): Pick<StatsRow, "session_id" | "status" | "turns" | "notes">[];
}

/** A new in-memory lite engine. */
export function createEngine(options?: EngineOptions): LiteEngine;

export function isOverviewQuestion(query: string): boolean;
export function parseTranscript(text: string): { role: Role; content: string }[];
export function estimateTokens(text: string): number;
export function terms(text: string): string[];
export function queryTerms(query: string): [string, number][];
export function splitSentences(text: string): { start: number; end: number; text: string }[];
export function crc32(bytes: Uint8Array, start?: number, end?: number): number;

export class HashEmbedder {
  constructor(dim?: number);
  readonly name: "hash";
  readonly dim: number;
  readonly topicThreshold: number;
  embed(text: string): Float32Array;
  embedSpans(text: string, spans: [number, number][]): { whole: Float32Array; parts: Float32Array[] };
}

export class CCEError extends Error {}
export class ValidationError extends CCEError {}
export class NotFoundError extends CCEError {}
export class ConflictError extends CCEError {}

/** A missing or refused API key (HTTP 401 / 403). */
export class AuthError extends CCEError {}

/** Errors thrown by CCEClient carry the HTTP status, the server's error type and details. */
export interface HTTPErrorFields {
  status?: number;
  type?: string;
  details?: unknown;
}

export interface ClientOptions {
  apiKey?: string;
  fetch?: typeof fetch;
  timeoutMs?: number;
  headers?: Record<string, string>;
}

/** Scores of one retrieved turn in the server's explain form. */
export interface RemoteHit {
  turn_no: number;
  note_id: number | null;
  role: Role;
  speaker: string | null;
  dense: number;
  best_sentence: number | null;
  bm25: number;
  recency: number;
  fused: number;
  rank: number;
}

type Scores = Pick<RemoteHit, "dense" | "bm25" | "recency" | "fused">;

/** `context(..., { explain: true }).explain` of `cce serve rest`. */
export interface RemoteExplain {
  /** `planned` = pins + system_note + recent + pending + notes + overhead, never above max_tokens. */
  budget: { max_tokens: number; used: number; pins: number; system_note: number; recent: number; pending: number;
    notes: number; overhead: number; planned: number; free: number };
  overview: boolean;
  hits: RemoteHit[];
  /** The chosen notes in payload order, with label, span, best scores and their quotes. */
  chosen: ({ note_id: number | null; label: string; start_turn: number; end_turn: number;
    quotes: (Scores & { turn_no: number; rank: number })[] } & { [K in keyof Scores]: number | null })[];
  /** Retrieved but left out, and why. */
  dropped: { turn_no?: number; note_id: number | null; reason: "budget" | "top_k" | "quotes_per_note" | "cap" | string;
    fused?: number | null }[];
  window: { since: string | null; until: string | null; last_turns: number | null };
  pins: string[];
  verbatim_turns: number[];
}

/** Server context payload (JSON form of ContextPayload.to_dict(); times as ISO strings). */
export interface RemoteContext {
  session_id: string;
  query: string;
  max_tokens: number;
  memory: string;
  turns: (Omit<VerbatimTurn, "ts"> & { ts: string })[];
  notes: (Omit<ChosenNote, "start_ts" | "end_ts"> & { start_ts: string; end_ts: string })[];
  pins: string[];
  full_tokens: number;
  pin_tokens: number;
  verbatim: boolean;
  tokens: number;
  tokens_saved: number;
  messages: ChatMessage[];
  explain: RemoteExplain | null;
}

/** One session as `GET /v1/sessions` lists it. */
export interface RemoteSession {
  session_id: string;
  status: "open" | "closed";
  next_turn: number;
  created_at: string;
  updated_at: string;
  turns: number;
  notes: number;
}

/** `GET /v1/sessions/{id}/stats` (the `cce_stats` macro's row). */
export interface RemoteStats {
  session_id: string;
  status?: "open" | "closed";
  turns?: number;
  raw_tokens?: number;
  hot_turns?: number;
  pending_turns?: number;
  compressed_turns?: number;
  notes?: number;
  note_tokens?: number;
  memory_tokens?: number;
  compression_ratio?: number | null;
  pins?: number;
  contexts?: number;
  tokens_sent?: number;
  history_tokens?: number;
  tokens_saved?: number;
  [column: string]: unknown;
}

/** One row of a forget plan (the `cce_forget_plan` macro). */
export interface ForgetPlanRow {
  kind: string;
  note_id: number | null;
  turn_no: number | null;
  pin_id: number | null;
  rows: number;
  tokens: number | null;
  detail: string | null;
}

/** `GET /v1/sessions/{id}/export`: what `cce import` reads. */
export interface ExportDocument {
  format: string;
  version: number;
  embedder: string;
  dim: number;
  session: Record<string, unknown>;
  turns: Record<string, unknown>[];
  notes: Record<string, unknown>[];
  pins: Record<string, unknown>[];
  summary: string | null;
}

export class CCEClient {
  constructor(baseUrl?: string, options?: ClientOptions);
  readonly baseUrl: string;
  health(): Promise<{ status: string; version: string; embedder: string }>;
  sessions(): Promise<RemoteSession[]>;
  addMessages(sessionId: string, messages: MessageInput[]): Promise<number[]>;
  addMessage(sessionId: string, role: Role, content: string, options?: { timestamp?: string; name?: string }): Promise<number>;
  context(sessionId: string, query: string, options?: { maxTokens?: number; topK?: number; since?: string; until?: string;
    lastTurns?: number; explain?: boolean }): Promise<RemoteContext>;
  /** `POST /v1/sessions/{id}/search`: ranked turns with their scores and text (times as ISO strings). */
  search(sessionId: string, query: string, options?: { k?: number; since?: string; until?: string; lastTurns?: number }
  ): Promise<(Omit<Hit, "ts"> & { ts: string; content: string })[]>;
  stats(sessionId: string): Promise<RemoteStats>;
  summary(sessionId: string): Promise<string | null>;
  close(sessionId: string): Promise<string>;
  compress(messages: MessageInput[], query: string, options?: { maxTokens?: number }): Promise<RemoteContext>;
  pin(sessionId: string, textOrTurn: string | { turn: number }): Promise<number>;
  pins(sessionId: string): Promise<{ pin_id: number; text: string; turn: number | null; created_at: string;
    updated_at: string | null }[]>;
  updatePin(sessionId: string, pinId: number, text: string): Promise<void>;
  unpin(sessionId: string, pinId: number): Promise<void>;
  editNote(sessionId: string, noteId: number, changes: { label?: string; summary?: string }): Promise<void>;
  editTurn(sessionId: string, turn: number, text: string): Promise<void>;
  forgetPlan(sessionId: string, what: { noteId: number } | { turns: [number, number] }): Promise<ForgetPlanRow[]>;
  forget(sessionId: string, what: { noteId: number } | { turns: [number, number] }): Promise<Record<string, number>>;
  exportSession(sessionId: string): Promise<ExportDocument>;
  deleteSession(sessionId: string): Promise<Record<string, number>>;
  sql(statement: string): Promise<{ columns: string[]; types: string[]; rows: unknown[][] }>;
}
