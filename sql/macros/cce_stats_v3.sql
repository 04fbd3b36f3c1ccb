-- cce_stats_v3
-- Purpose: size, tier occupancy and token savings of every session. The formulas agree:
--   raw_tokens = hot_tokens + pending_tokens + compressed_tokens (every stored turn's estimate);
--   memory_tokens = note_tokens + hot_tokens + pending_tokens (what the memory holds for them);
--   compression_ratio = raw_tokens / memory_tokens, NULL while memory is not smaller than raw;
--   tokens_sent = sum of the sizes of every built context (context_calls);
--   history_tokens = sum, over those calls, of what sending the whole history as it is (and the
--     pins) cost at that call (each call's payload.history_tokens);
--   tokens_saved = history_tokens - tokens_sent: the net saving (v2 summed max(0, history - sent)
--     per call, so a call that sent more than the history counted as no loss).
-- Parameters:
--   hot INTEGER := 6   size of the hot window (for the hot/pending split)
-- Returns: session_id, status, turns, raw_tokens, hot_turns, pending_turns, compressed_turns,
--   notes, note_tokens, memory_tokens, compression_ratio, raw_turns_stored, created_at,
--   updated_at, hot_tokens, pending_tokens, compressed_tokens, max_level, pins, pin_tokens,
--   cold_summary_tokens, contexts, tokens_sent, history_tokens, tokens_saved
CREATE OR REPLACE TEMP MACRO cce_stats_v3(hot := 6) AS TABLE
WITH t AS (
    SELECT t.session_id,
        count(*) AS turns,
        CAST(coalesce(sum(t.tokens), 0) AS BIGINT) AS raw_tokens,
        count(*) FILTER (WHERE t.note_id IS NULL AND t.turn_no >= s.next_turn - hot) AS hot_turns,
        count(*) FILTER (WHERE t.note_id IS NULL AND t.turn_no < s.next_turn - hot)
            AS pending_turns,
        count(*) FILTER (WHERE t.note_id IS NOT NULL) AS compressed_turns,
        CAST(coalesce(sum(t.tokens) FILTER (WHERE t.note_id IS NULL
            AND t.turn_no >= s.next_turn - hot), 0) AS BIGINT) AS hot_tokens,
        CAST(coalesce(sum(t.tokens) FILTER (WHERE t.note_id IS NULL
            AND t.turn_no < s.next_turn - hot), 0) AS BIGINT) AS pending_tokens,
        CAST(coalesce(sum(t.tokens) FILTER (WHERE t.note_id IS NOT NULL), 0) AS BIGINT)
            AS compressed_tokens,
        count(t.content) AS raw_turns_stored
    FROM main.turns AS t JOIN main.sessions AS s USING (session_id)
    GROUP BY t.session_id
),
n AS (
    SELECT session_id, count(*) AS notes,
        CAST(coalesce(sum(summary_tokens), 0) AS BIGINT) AS note_tokens,
        max(level) AS max_level
    FROM main.notes GROUP BY session_id
),
p AS (
    SELECT session_id, count(*) AS pins, CAST(sum(cce_tokens(text)) AS BIGINT) AS pin_tokens
    FROM main.pins GROUP BY session_id
),
c AS (
    SELECT session_id, count(*) AS contexts,
        CAST(sum(tokens_sent) AS BIGINT) AS tokens_sent,
        CAST(sum(history_tokens) AS BIGINT) AS history_tokens,
        CAST(sum(history_tokens - tokens_sent) AS BIGINT) AS tokens_saved
    FROM main.context_calls GROUP BY session_id
),
base AS (
    SELECT s.session_id, s.status, s.created_at, s.updated_at,
        coalesce(t.turns, 0) AS turns,
        coalesce(t.raw_tokens, 0) AS raw_tokens,
        coalesce(t.hot_turns, 0) AS hot_turns,
        coalesce(t.pending_turns, 0) AS pending_turns,
        coalesce(t.compressed_turns, 0) AS compressed_turns,
        coalesce(t.hot_tokens, 0) AS hot_tokens,
        coalesce(t.pending_tokens, 0) AS pending_tokens,
        coalesce(t.compressed_tokens, 0) AS compressed_tokens,
        coalesce(n.notes, 0) AS notes,
        coalesce(n.note_tokens, 0) AS note_tokens,
        n.max_level,
        coalesce(t.raw_turns_stored, 0) AS raw_turns_stored,
        coalesce(p.pins, 0) AS pins,
        coalesce(p.pin_tokens, 0) AS pin_tokens,
        ss.tokens AS cold_summary_tokens,
        coalesce(c.contexts, 0) AS contexts,
        coalesce(c.tokens_sent, 0) AS tokens_sent,
        coalesce(c.history_tokens, 0) AS history_tokens,
        coalesce(c.tokens_saved, 0) AS tokens_saved
    FROM main.sessions AS s
    LEFT JOIN t USING (session_id)
    LEFT JOIN n USING (session_id)
    LEFT JOIN p USING (session_id)
    LEFT JOIN c USING (session_id)
    LEFT JOIN main.session_summaries AS ss USING (session_id)
)
SELECT session_id, status, turns, raw_tokens, hot_turns, pending_turns, compressed_turns,
    notes, note_tokens,
    note_tokens + hot_tokens + pending_tokens AS memory_tokens,
    CASE WHEN note_tokens + hot_tokens + pending_tokens < raw_tokens
         THEN round(raw_tokens / (note_tokens + hot_tokens + pending_tokens), 3)
    END AS compression_ratio,
    raw_turns_stored, created_at, updated_at,
    hot_tokens, pending_tokens, compressed_tokens, max_level, pins, pin_tokens,
    cold_summary_tokens, contexts, tokens_sent, history_tokens, tokens_saved
FROM base
ORDER BY session_id;
