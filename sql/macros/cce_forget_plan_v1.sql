-- cce_forget_plan_v1
-- Purpose: what a forget request removes, without removing anything. A note is forgotten with
--   every turn it covers; a turn range forgets every note overlapping it (with all of their
--   turns) and every turn in the range (recent and pending ones too). Each forgotten turn takes
--   its message vector, sentence vectors, BM25 postings and the pins taken from it.
-- Parameters:
--   sid VARCHAR                  session id
--   nid BIGINT := NULL           a note id to forget
--   first_turn INTEGER := NULL   first turn of a range to forget (with last_turn)
--   last_turn INTEGER := NULL    last turn of the range (inclusive)
-- Returns: kind ('note', 'turn', 'message_vector', 'sentence_vector', 'posting', 'pin'),
--   note_id, turn_no, pin_id, rows (table rows removed), tokens, detail (label, role or text)
CREATE OR REPLACE TEMP MACRO cce_forget_plan_v1(sid, nid := NULL, first_turn := NULL,
    last_turn := NULL) AS TABLE
WITH n AS (
    SELECT note_id, start_turn, end_turn, label, raw_tokens
    FROM main.notes
    WHERE session_id = sid
      AND (note_id = nid
           OR (first_turn IS NOT NULL AND start_turn <= last_turn AND end_turn >= first_turn))
),
t AS (
    SELECT turn_no, note_id, role, tokens
    FROM main.turns
    WHERE session_id = sid
      AND (note_id IN (SELECT note_id FROM n)
           OR (first_turn IS NOT NULL AND turn_no BETWEEN first_turn AND last_turn))
),
mv AS (
    SELECT m.turn_no, count(*) AS rows FROM main.message_vectors AS m
    WHERE m.session_id = sid AND m.turn_no IN (SELECT turn_no FROM t) GROUP BY m.turn_no
),
sv AS (
    SELECT s.turn_no, count(*) AS rows FROM main.sentence_vectors AS s
    WHERE s.session_id = sid AND s.turn_no IN (SELECT turn_no FROM t) GROUP BY s.turn_no
),
po AS (
    SELECT p.turn_no, count(*) AS rows FROM main.postings AS p
    WHERE p.session_id = sid AND p.turn_no IN (SELECT turn_no FROM t) GROUP BY p.turn_no
),
pi AS (
    SELECT p.pin_id, p.turn_no, p.text FROM main.pins AS p
    WHERE p.session_id = sid AND p.turn_no IN (SELECT turn_no FROM t)
),
plan AS (
    SELECT 'note' AS kind, 0 AS k, note_id, CAST(NULL AS INTEGER) AS turn_no,
        CAST(NULL AS BIGINT) AS pin_id, CAST(1 AS BIGINT) AS rows,
        CAST(raw_tokens AS BIGINT) AS tokens, label AS detail
    FROM n
    UNION ALL
    SELECT 'turn', 1, note_id, turn_no, NULL, 1, tokens, role FROM t
    UNION ALL
    SELECT 'message_vector', 2, t.note_id, mv.turn_no, NULL, mv.rows, NULL, NULL
    FROM mv JOIN t USING (turn_no)
    UNION ALL
    SELECT 'sentence_vector', 3, t.note_id, sv.turn_no, NULL, sv.rows, NULL, NULL
    FROM sv JOIN t USING (turn_no)
    UNION ALL
    SELECT 'posting', 4, t.note_id, po.turn_no, NULL, po.rows, NULL, NULL
    FROM po JOIN t USING (turn_no)
    UNION ALL
    SELECT 'pin', 5, t.note_id, pi.turn_no, pi.pin_id, 1, NULL, pi.text
    FROM pi JOIN t USING (turn_no)
)
SELECT kind, note_id, turn_no, pin_id, rows, tokens, detail
FROM plan
ORDER BY k, note_id NULLS LAST, turn_no NULLS FIRST, pin_id;
