-- cce_recent_v1
-- Purpose: the last `n` turns of a session, oldest first.
-- Parameters:
--   sid VARCHAR       session id
--   n INTEGER := 6    how many turns
-- Returns: turn_no, role, speaker, content, ts, tokens, note_id
CREATE OR REPLACE TEMP MACRO cce_recent_v1(sid, n := 6) AS TABLE
SELECT turn_no, role, speaker, content, ts, tokens, note_id
FROM (
    SELECT * FROM main.turns WHERE session_id = sid ORDER BY turn_no DESC LIMIT n
)
ORDER BY turn_no;
