-- cce_user_overview_v1
-- Purpose: what a user talked about: their sessions in time order (of the first turn), each
--   with its cold-tier summary (written when the session is closed) and its topics in
--   conversation order (answers "what did we talk about last week?" across sessions).
-- Parameters:
--   uid VARCHAR             user id
--   since VARCHAR := NULL   ISO-8601 time; only sessions with a turn at or after it, and the
--                           topics that end at or after it
--   until VARCHAR := NULL   ISO-8601 time; only sessions with a turn at or before it, and the
--                           topics that start at or before it
-- Returns: session_id, status, first_ts, last_ts, turns, turns_in_window, summary (NULL while
--   the session is open), whole (every turn of the session is inside the window), topics
--   (LIST of STRUCT(label, summary, start_ts, end_ts), in conversation order), unsummarised
--   (how many of the turns in the window no topic holds yet: the open session's latest) and
--   opening (the first of them said by the user, its text)
CREATE OR REPLACE TEMP MACRO cce_user_overview_v1(uid, since := NULL, until := NULL) AS TABLE
WITH per_session AS (
    SELECT s.session_id, s.status, s.created_at, min(t.ts) AS first_ts, max(t.ts) AS last_ts,
        count(*) AS turns,
        count(*) FILTER (WHERE (since IS NULL OR t.ts >= CAST(since AS TIMESTAMP))
                           AND (until IS NULL OR t.ts <= CAST(until AS TIMESTAMP)))
            AS turns_in_window,
        count(*) FILTER (WHERE t.note_id IS NULL
                           AND (since IS NULL OR t.ts >= CAST(since AS TIMESTAMP))
                           AND (until IS NULL OR t.ts <= CAST(until AS TIMESTAMP)))
            AS unsummarised,
        arg_min(t.content, t.turn_no) FILTER (WHERE t.note_id IS NULL AND t.role = 'user'
                           AND (since IS NULL OR t.ts >= CAST(since AS TIMESTAMP))
                           AND (until IS NULL OR t.ts <= CAST(until AS TIMESTAMP)))
            AS opening
    FROM main.sessions AS s
    JOIN main.turns AS t ON t.session_id = s.session_id
    WHERE s.user_id = uid
    GROUP BY s.session_id, s.status, s.created_at
),
topics AS (
    SELECT n.session_id,
        list(struct_pack(label := n.label, summary := n.summary, start_ts := n.start_ts,
                         end_ts := n.end_ts) ORDER BY n.start_turn) AS topics
    FROM main.notes AS n
    WHERE n.session_id IN (SELECT session_id FROM per_session)
      AND (since IS NULL OR n.end_ts >= CAST(since AS TIMESTAMP))
      AND (until IS NULL OR n.start_ts <= CAST(until AS TIMESTAMP))
    GROUP BY n.session_id
)
SELECT p.session_id, p.status, p.first_ts, p.last_ts, p.turns, p.turns_in_window,
    m.summary, p.turns_in_window = p.turns AS whole, coalesce(tp.topics, []) AS topics,
    p.unsummarised, p.opening
FROM per_session AS p
LEFT JOIN main.session_summaries AS m ON m.session_id = p.session_id
LEFT JOIN topics AS tp ON tp.session_id = p.session_id
WHERE p.turns_in_window > 0
ORDER BY p.first_ts, p.created_at, p.session_id;
