-- Reads of the in-process retrieval index for many sessions at once (a user's): the queries of
-- the session index (``index_*`` in queries.sql) for the sessions of ``$sids`` (a VARCHAR
-- list), each row with its ``session_id``, unordered. One scan per table instead of one per
-- session and table.

-- name: many_states
-- Turn counter and last change of each session of $sids (they key the retrieval index).
SELECT session_id, next_turn, updated_at FROM main.sessions
WHERE session_id IN (SELECT unnest($sids::VARCHAR[]));

-- name: many_turns
-- Turns with their text.
SELECT session_id, turn_no, ts, n_terms, tokens, role, speaker, note_id, content, micro
FROM main.turns WHERE session_id IN (SELECT unnest($sids::VARCHAR[]));

-- name: many_message_vectors
-- Message vectors.
SELECT session_id, turn_no, vector FROM main.message_vectors
WHERE session_id IN (SELECT unnest($sids::VARCHAR[]));

-- name: many_sentences
-- Sentence vectors and offsets.
SELECT session_id, turn_no, sent_no, start_char, end_char, vector FROM main.sentence_vectors
WHERE session_id IN (SELECT unnest($sids::VARCHAR[]));

-- name: many_postings
-- BM25 postings.
SELECT session_id, term, turn_no, tf FROM main.postings
WHERE session_id IN (SELECT unnest($sids::VARCHAR[]));

-- name: many_notes
-- Note headers.
SELECT session_id, note_id, label, start_turn, end_turn, start_ts, end_ts FROM main.notes
WHERE session_id IN (SELECT unnest($sids::VARCHAR[]));

-- name: many_pins
-- Pins of each session and of its user (kept under '@user:' || user_id), oldest first.
SELECT s.session_id, p.pin_id, p.text
FROM main.sessions AS s
JOIN main.pins AS p ON p.session_id = s.session_id OR p.session_id = '@user:' || s.user_id
WHERE s.session_id IN (SELECT unnest($sids::VARCHAR[]))
ORDER BY s.session_id, p.pin_id;
