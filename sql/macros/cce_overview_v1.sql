-- cce_overview_v1
-- Purpose: the topics of a session in conversation order (answers "what did we talk about?").
-- Parameters:
--   sid VARCHAR   session id
-- Returns: note_id, start_turn, end_turn, start_ts, end_ts, label, summary, summary_tokens,
--   raw_tokens, level
CREATE OR REPLACE TEMP MACRO cce_overview_v1(sid) AS TABLE
SELECT note_id, start_turn, end_turn, start_ts, end_ts, label, summary, summary_tokens,
    raw_tokens, level
FROM main.notes
WHERE session_id = sid
ORDER BY start_turn;
