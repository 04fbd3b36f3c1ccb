-- cce_turns_v1
-- Purpose: every stored turn of a session with its tier: 'hot' (among the last `hot` turns and
--   not compressed), 'pending' (left the hot window, waiting to be compressed) or 'compressed'
--   (covered by note_id).
-- Parameters:
--   sid VARCHAR        session id
--   hot INTEGER := 6   size of the hot window
-- Returns: turn_no, role, speaker, content, ts, tokens, micro, note_id, state
CREATE OR REPLACE TEMP MACRO cce_turns_v1(sid, hot := 6) AS TABLE
SELECT t.turn_no, t.role, t.speaker, t.content, t.ts, t.tokens, t.micro, t.note_id,
    CASE WHEN t.note_id IS NOT NULL THEN 'compressed'
         WHEN t.turn_no >= s.next_turn - hot THEN 'hot'
         ELSE 'pending' END AS state
FROM main.turns AS t JOIN main.sessions AS s USING (session_id)
WHERE t.session_id = sid
ORDER BY t.turn_no;
