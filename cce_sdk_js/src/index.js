// cce-sdk: the cce_duck JavaScript SDK. No runtime dependencies; Node 18+ and browsers.
export { createEngine, DEFAULTS, LiteEngine } from "./engine.js";
export { ContextPayload, isOverviewQuestion } from "./context.js";
export { AuthError, CCEError, ConflictError, NotFoundError, ValidationError } from "./errors.js";
export { CCEClient } from "./client.js";
export { HashEmbedder, crc32 } from "./hash.js";
export { parseTranscript } from "./messages.js";
export { estimateTokens, queryTerms, splitSentences, terms } from "./text.js";
