-- cce_export_v1
-- Purpose: one session as portable rows, without vectors: its bookkeeping row, every turn,
--   every note, every pin and its cold-tier summary, each as a JSON object (the JSON export of
--   Engine.export_session is exactly these rows grouped by kind).
-- Parameters:
--   sid VARCHAR   session id
-- Returns: kind ('session', 'turn', 'note', 'pin', 'summary'), key (turn, note or pin number;
--   NULL for session and summary), data JSON
CREATE OR REPLACE TEMP MACRO cce_export_v1(sid) AS TABLE
SELECT kind, key, data FROM (
    SELECT 0 AS k, 'session' AS kind, CAST(NULL AS BIGINT) AS key,
        to_json(struct_pack(session_id := session_id, status := status, next_turn := next_turn,
                            created_at := created_at, updated_at := updated_at)) AS data
    FROM main.sessions WHERE session_id = sid
    UNION ALL
    SELECT 1, 'turn', turn_no,
        to_json(struct_pack(turn_no := turn_no, role := role, speaker := speaker,
                            content := content, ts := ts, tokens := tokens, micro := micro,
                            note_id := note_id))
    FROM main.turns WHERE session_id = sid
    UNION ALL
    SELECT 2, 'note', note_id,
        to_json(struct_pack(note_id := note_id, start_turn := start_turn, end_turn := end_turn,
                            start_ts := start_ts, end_ts := end_ts, label := label,
                            summary := summary, raw_tokens := raw_tokens,
                            summary_tokens := summary_tokens, level := level,
                            retrieval_count := retrieval_count, created_at := created_at))
    FROM main.notes WHERE session_id = sid
    UNION ALL
    SELECT 3, 'pin', pin_id,
        to_json(struct_pack(pin_id := pin_id, text := text, turn_no := turn_no,
                            created_at := created_at, updated_at := updated_at))
    FROM main.pins WHERE session_id = sid
    UNION ALL
    SELECT 4, 'summary', NULL,
        to_json(struct_pack(summary := summary, tokens := tokens, created_at := created_at))
    FROM main.session_summaries WHERE session_id = sid
)
ORDER BY k, key;
