-- cce_stats_v1
-- Purpose: size and tier occupancy of every session.
--   memory_tokens = summary tokens of its notes + tokens of its uncompressed turns;
--   compression_ratio = raw_tokens / memory_tokens, NULL while memory is not smaller than raw.
-- Parameters:
--   hot INTEGER := 6   size of the hot window (for the hot/pending split)
-- Returns: session_id, status, turns, raw_tokens, hot_turns, pending_turns, compressed_turns,
--   notes, note_tokens, memory_tokens, compression_ratio, raw_turns_stored, created_at, updated_at
CREATE OR REPLACE TEMP MACRO cce_stats_v1(hot := 6) AS TABLE
WITH t AS (
    SELECT t.session_id,
        count(*) AS turns,
        CAST(coalesce(sum(t.tokens), 0) AS BIGINT) AS raw_tokens,
        count(*) FILTER (WHERE t.note_id IS NULL AND t.turn_no >= s.next_turn - hot) AS hot_turns,
        count(*) FILTER (WHERE t.note_id IS NULL AND t.turn_no < s.next_turn - hot)
            AS pending_turns,
        count(*) FILTER (WHERE t.note_id IS NOT NULL) AS compressed_turns,
        CAST(coalesce(sum(t.tokens) FILTER (WHERE t.note_id IS NULL), 0) AS BIGINT) AS uncompressed_tokens,
        count(t.content) AS raw_turns_stored
    FROM main.turns AS t JOIN main.sessions AS s USING (session_id)
    GROUP BY t.session_id
),
n AS (
    SELECT session_id, count(*) AS notes, CAST(coalesce(sum(summary_tokens), 0) AS BIGINT) AS note_tokens
    FROM main.notes GROUP BY session_id
)
SELECT s.session_id, s.status,
    coalesce(t.turns, 0) AS turns,
    coalesce(t.raw_tokens, 0) AS raw_tokens,
    coalesce(t.hot_turns, 0) AS hot_turns,
    coalesce(t.pending_turns, 0) AS pending_turns,
    coalesce(t.compressed_turns, 0) AS compressed_turns,
    coalesce(n.notes, 0) AS notes,
    coalesce(n.note_tokens, 0) AS note_tokens,
    coalesce(n.note_tokens, 0) + coalesce(t.uncompressed_tokens, 0) AS memory_tokens,
    CASE WHEN coalesce(n.note_tokens, 0) + coalesce(t.uncompressed_tokens, 0)
              < coalesce(t.raw_tokens, 0)
         THEN round(t.raw_tokens / (coalesce(n.note_tokens, 0) + coalesce(t.uncompressed_tokens, 0)), 3)
    END AS compression_ratio,
    coalesce(t.raw_turns_stored, 0) AS raw_turns_stored,
    s.created_at, s.updated_at
FROM main.sessions AS s
LEFT JOIN t USING (session_id)
LEFT JOIN n USING (session_id)
ORDER BY s.session_id;
