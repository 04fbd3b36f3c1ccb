-- Named queries used by the library. Each block: "-- name: <name>", a description, the SQL.

-- name: session_row
-- One session's bookkeeping row.
SELECT session_id, status, next_turn, created_at, updated_at, user_id
FROM main.sessions WHERE session_id = $sid;

-- name: upsert_sessions
-- Create sessions or move their turn counter forward (it never goes back); a session's user,
-- once set, is kept.
INSERT INTO main.sessions (session_id, created_at, updated_at, status, next_turn, user_id)
SELECT session_id, created_at, updated_at, 'open', next_turn, user_id FROM _b_sessions
ON CONFLICT (session_id) DO UPDATE SET
    next_turn = greatest(sessions.next_turn, excluded.next_turn),
    user_id = coalesce(sessions.user_id, excluded.user_id),
    updated_at = excluded.updated_at;

-- name: insert_turns
-- Append a batch of turns.
INSERT INTO main.turns BY NAME SELECT * FROM _b_turns;

-- name: insert_message_vectors
-- Append a batch of message vectors.
INSERT INTO main.message_vectors BY NAME SELECT * FROM _b_mvec;

-- name: insert_sentence_vectors
-- Append a batch of sentence vectors.
INSERT INTO main.sentence_vectors BY NAME SELECT * FROM _b_svec;

-- name: insert_postings
-- Append a batch of BM25 postings.
INSERT INTO main.postings BY NAME SELECT * FROM _b_post;

-- name: insert_notes
-- Append a batch of notes.
INSERT INTO main.notes BY NAME SELECT * FROM _b_notes;

-- name: assign_notes
-- Mark turns as compressed into their note (raw text kept).
UPDATE main.turns SET note_id = m.note_id
FROM _b_map AS m
WHERE turns.session_id = m.session_id AND turns.turn_no = m.turn_no;

-- name: assign_notes_drop_raw
-- Mark turns as compressed into their note and drop their raw text (keep_raw_turns off).
UPDATE main.turns SET note_id = m.note_id, content = NULL
FROM _b_map AS m
WHERE turns.session_id = m.session_id AND turns.turn_no = m.turn_no;

-- name: pending_turns
-- Uncompressed turns of a session older than a turn number, with their message vectors.
SELECT t.turn_no, t.role, t.speaker, coalesce(t.content, t.micro) AS content, t.ts, t.tokens,
    m.vector
FROM main.turns AS t JOIN main.message_vectors AS m USING (session_id, turn_no)
WHERE t.session_id = $sid AND t.note_id IS NULL AND t.turn_no < $before
ORDER BY t.turn_no;

-- name: sessions_df
-- Document frequency of every term of each session in $sids (one scan for them all: on a lake
-- a commit of derived rows labels the notes of many sessions at once).
SELECT session_id, term, count(*) AS df FROM main.postings
WHERE session_id IN (SELECT unnest($sids::VARCHAR[]))
GROUP BY session_id, term;

-- name: sessions_docs
-- Number of turns (BM25 documents) of each session in $sids that has any.
SELECT session_id, count(*) AS n FROM main.turns
WHERE session_id IN (SELECT unnest($sids::VARCHAR[]))
GROUP BY session_id;

-- name: next_note_ids
-- Reserve note ids.
SELECT nextval('note_ids') AS id FROM range($n);

-- name: session_history
-- Every stored turn of a session as a message, oldest first (a turn whose raw text was dropped
-- after compression gives its one-line summary).
SELECT role, coalesce(content, micro) AS content, speaker AS name, turn_no
FROM main.turns WHERE session_id = $sid ORDER BY turn_no;

-- name: latest_user_message
-- Text of a session's latest user message (its summary line when the raw text was dropped).
SELECT coalesce(content, micro) FROM main.turns
WHERE session_id = $sid AND role = 'user' ORDER BY turn_no DESC LIMIT 1;

-- name: turn_hashes
-- Role and content hash of every turn of a session, in order (for idempotent re-ingestion).
SELECT turn_no, role, content_hash FROM main.turns WHERE session_id = $sid ORDER BY turn_no;

-- name: turns_by_message_id
-- Turns of a session that carry one of the client message ids $ids (for idempotent retries).
SELECT message_id, turn_no, role, content_hash FROM main.turns
WHERE session_id = $sid AND message_id IN (SELECT unnest($ids::VARCHAR[]));

-- name: close_session
-- Mark a session closed.
UPDATE main.sessions SET status = 'closed', updated_at = $now WHERE session_id = $sid;

-- name: upsert_summary
-- Store (or replace) the cold-tier summary of a session.
INSERT OR REPLACE INTO main.session_summaries VALUES ($sid, $summary, $tokens, $now);

-- name: note_labels
-- Labels and summaries of a session's notes in order.
SELECT label, summary FROM main.notes WHERE session_id = $sid ORDER BY start_turn;

-- name: sessions
-- Every session with its size.
SELECT s.session_id, s.user_id, s.status, s.next_turn, s.created_at, s.updated_at,
    (SELECT count(*) FROM main.turns AS t WHERE t.session_id = s.session_id) AS turns,
    (SELECT count(*) FROM main.notes AS n WHERE n.session_id = s.session_id) AS notes
FROM main.sessions AS s ORDER BY s.session_id;

-- name: notes
-- A session's notes without vectors.
SELECT note_id, start_turn, end_turn, start_ts, end_ts, label, summary, raw_tokens,
    summary_tokens, level, retrieval_count
FROM main.notes WHERE session_id = $sid ORDER BY start_turn;

-- name: summary
-- The cold-tier summary of a session.
SELECT summary, tokens, created_at FROM main.session_summaries WHERE session_id = $sid;

-- name: pin_texts
-- Pins of a session and of its user (kept under the user's pin owner, '@user:' || user_id),
-- oldest first.
SELECT pin_id, text FROM main.pins
WHERE session_id = $sid
   OR session_id = (SELECT '@user:' || user_id FROM main.sessions WHERE session_id = $sid)
ORDER BY pin_id;

-- name: full_tokens
-- Tokens of a session's whole history (plus the per-message overhead).
SELECT coalesce(sum(tokens), 0) + 4 * count(*) FROM main.turns WHERE session_id = $sid;

-- Memory management (pins, corrections, forgetting, export/import, warm-tier cap, stats).

-- name: pin_list
-- Pins of a session, oldest first (the turn a pin was taken from, if any).
SELECT pin_id, text, turn_no AS turn, created_at, updated_at
FROM main.pins WHERE session_id = $sid ORDER BY pin_id;

-- name: pin_row
-- One pin of a session.
SELECT pin_id, text, turn_no FROM main.pins WHERE session_id = $sid AND pin_id = $pin_id;

-- name: insert_pin
-- Add a pin; returns its id.
INSERT INTO main.pins (pin_id, session_id, text, turn_no, created_at, updated_at)
VALUES (nextval('pin_ids'), $sid, $text, $turn_no, $now, $now) RETURNING pin_id;

-- name: update_pin
-- Replace a pin's text (a pin taken from a turn no longer follows that turn).
UPDATE main.pins SET text = $text, turn_no = NULL, updated_at = $now
WHERE session_id = $sid AND pin_id = $pin_id;

-- name: delete_pin
-- Remove a pin.
DELETE FROM main.pins WHERE session_id = $sid AND pin_id = $pin_id;

-- name: turn_row
-- One stored turn of a session.
SELECT turn_no, role, speaker, content, ts, tokens, micro, note_id
FROM main.turns WHERE session_id = $sid AND turn_no = $turn;

-- name: note_row
-- One note of a session (without its vector).
SELECT note_id, start_turn, end_turn, label, summary, level, retrieval_count
FROM main.notes WHERE session_id = $sid AND note_id = $nid;

-- name: edit_note
-- Replace a note's label and summary.
UPDATE main.notes SET label = $label, summary = $summary, summary_tokens = $summary_tokens
WHERE session_id = $sid AND note_id = $nid;

-- name: set_note_summaries
-- Swap in model summaries from a registered batch _b_summ (session_id, note_id, old, summary,
-- summary_tokens), only where a note still has the summary it was written with.
UPDATE main.notes SET summary = b.summary, summary_tokens = b.summary_tokens
FROM _b_summ AS b
WHERE notes.session_id = b.session_id AND notes.note_id = b.note_id AND notes.summary = b.old;

-- name: update_turn_text
-- Replace a turn's text and everything derived from it in the turns table.
UPDATE main.turns SET content = $content, tokens = $tokens, n_terms = $n_terms,
    content_hash = $content_hash, micro = $micro
WHERE session_id = $sid AND turn_no = $turn;

-- name: delete_turn_derived
-- Drop the vectors and BM25 postings of some turns ($turns: comma-separated numbers).
DELETE FROM main.message_vectors WHERE session_id = $sid
    AND list_contains(CAST(string_split($turns, ',') AS INTEGER[]), turn_no);
DELETE FROM main.sentence_vectors WHERE session_id = $sid
    AND list_contains(CAST(string_split($turns, ',') AS INTEGER[]), turn_no);
DELETE FROM main.postings WHERE session_id = $sid
    AND list_contains(CAST(string_split($turns, ',') AS INTEGER[]), turn_no);

-- name: sync_turn_pins
-- Pins taken from a turn follow the turn's corrected text.
UPDATE main.pins SET text = $text, updated_at = $now WHERE session_id = $sid AND turn_no = $turn;

-- name: note_turns
-- The turns of a note range with their text (or micro line) and message vectors.
SELECT t.turn_no, t.role, t.speaker, coalesce(t.content, t.micro) AS content, t.ts, t.tokens,
    m.vector
FROM main.turns AS t JOIN main.message_vectors AS m USING (session_id, turn_no)
WHERE t.session_id = $sid AND t.turn_no BETWEEN $first AND $last
  AND ($nids IS NULL OR list_contains(CAST(string_split($nids, ',') AS BIGINT[]), t.note_id))
ORDER BY t.turn_no;

-- name: rewrite_note
-- Replace what some notes say from a registered batch _b_notes (after a turn's text changed).
UPDATE main.notes SET start_turn = b.start_turn, end_turn = b.end_turn, start_ts = b.start_ts,
    end_ts = b.end_ts, label = b.label, summary = b.summary, raw_tokens = b.raw_tokens,
    summary_tokens = b.summary_tokens, level = b.level, retrieval_count = b.retrieval_count,
    vector = b.vector
FROM _b_notes AS b
WHERE notes.session_id = b.session_id AND notes.note_id = b.note_id;

-- name: forget_rows
-- Delete what a forget plan lists ($notes, $turns: comma-separated ids; pins of those turns).
DELETE FROM main.notes WHERE session_id = $sid
    AND list_contains(CAST(string_split($notes, ',') AS BIGINT[]), note_id);
DELETE FROM main.turns WHERE session_id = $sid
    AND list_contains(CAST(string_split($turns, ',') AS INTEGER[]), turn_no);
DELETE FROM main.message_vectors WHERE session_id = $sid
    AND list_contains(CAST(string_split($turns, ',') AS INTEGER[]), turn_no);
DELETE FROM main.sentence_vectors WHERE session_id = $sid
    AND list_contains(CAST(string_split($turns, ',') AS INTEGER[]), turn_no);
DELETE FROM main.postings WHERE session_id = $sid
    AND list_contains(CAST(string_split($turns, ',') AS INTEGER[]), turn_no);
DELETE FROM main.pins WHERE session_id = $sid
    AND list_contains(CAST(string_split($turns, ',') AS INTEGER[]), turn_no);

-- name: erase_llm_cache
-- Empty the cache of model replies (part of every erasure: a cached reply is tied to no session
-- and may quote what is erased; the notes keep their summaries, later calls ask the model again).
DELETE FROM main.llm_cache;

-- name: refresh_summary
-- Rewrite an existing cold-tier summary (after its notes changed); no-op for open sessions.
UPDATE main.session_summaries SET summary = $summary, tokens = $tokens
WHERE session_id = $sid;

-- name: export_turns
-- A session's turns with every stored column (Parquet export).
SELECT * FROM main.turns WHERE session_id = $sid ORDER BY turn_no;

-- name: export_notes
-- A session's notes with their vectors (Parquet export).
SELECT * FROM main.notes WHERE session_id = $sid ORDER BY start_turn;

-- name: export_message_vectors
-- A session's message vectors (Parquet export).
SELECT * FROM main.message_vectors WHERE session_id = $sid ORDER BY turn_no;

-- name: export_sentence_vectors
-- A session's sentence vectors (Parquet export).
SELECT * FROM main.sentence_vectors WHERE session_id = $sid ORDER BY turn_no, sent_no;

-- name: export_postings
-- A session's BM25 postings (Parquet export).
SELECT * FROM main.postings WHERE session_id = $sid ORDER BY term, turn_no;

-- name: export_pins
-- A session's pins (Parquet export).
SELECT * FROM main.pins WHERE session_id = $sid ORDER BY pin_id;

-- name: export_sessions
-- A session's bookkeeping row (Parquet export).
SELECT * FROM main.sessions WHERE session_id = $sid;

-- name: export_session_summaries
-- A session's cold-tier summary (Parquet export).
SELECT * FROM main.session_summaries WHERE session_id = $sid;

-- name: import_sessions
-- Insert imported session rows from a registered batch _b_import.
INSERT INTO main.sessions BY NAME SELECT * FROM _b_import;

-- name: import_pins
-- Insert imported pins (new ids) from a registered batch _b_import.
INSERT INTO main.pins BY NAME
SELECT * EXCLUDE (pin_id), nextval('pin_ids') AS pin_id FROM (SELECT * FROM _b_import ORDER BY pin_id);

-- name: import_session_summaries
-- Insert an imported cold-tier summary from a registered batch _b_import.
INSERT INTO main.session_summaries BY NAME SELECT * FROM _b_import;

-- name: insert_context_calls
-- Record built contexts (sizes only) from a registered batch _b_calls.
INSERT INTO main.context_calls BY NAME SELECT * FROM _b_calls;

-- name: warm_notes
-- A session's notes in conversation order, with what the warm-tier cap weighs.
SELECT note_id, start_turn, end_turn, level, retrieval_count
FROM main.notes WHERE session_id = $sid ORDER BY start_turn;

-- name: merge_note_turns
-- Move the turns of note $from into note $into (a warm-tier merge), then drop the empty note.
UPDATE main.turns SET note_id = $into WHERE session_id = $sid AND note_id = $from;
DELETE FROM main.notes WHERE session_id = $sid AND note_id = $from;

-- name: touch_session
-- Mark a session changed (pins, corrections, forgetting, merges): caches keyed on updated_at
-- reload it.
UPDATE main.sessions SET updated_at = greatest($now, updated_at + INTERVAL 1 MICROSECOND)
WHERE session_id = $sid;

-- name: session_tables
-- Tables of the store that hold rows of sessions (they have a session_id column).
SELECT table_name FROM duckdb_columns()
WHERE database_name = current_database() AND schema_name = 'main' AND column_name = 'session_id'
ORDER BY table_name;

-- name: index_turns
-- A session's turns with their text, for the in-process retrieval index (unordered).
SELECT turn_no, ts, n_terms, tokens, role, speaker, note_id, content, micro
FROM main.turns WHERE session_id = $sid;

-- name: index_message_vectors
-- A session's message vectors, for the in-process retrieval index (unordered).
SELECT turn_no, vector FROM main.message_vectors WHERE session_id = $sid;

-- name: index_sentences
-- A session's sentence vectors and offsets, for the in-process retrieval index (unordered).
SELECT turn_no, sent_no, start_char, end_char, vector
FROM main.sentence_vectors WHERE session_id = $sid;

-- name: index_postings
-- A session's BM25 postings, for the in-process retrieval index.
SELECT term, turn_no, tf FROM main.postings WHERE session_id = $sid;

-- name: index_notes
-- A session's note headers, for the in-process retrieval index.
SELECT note_id, label, start_turn, end_turn, start_ts, end_ts
FROM main.notes WHERE session_id = $sid;

-- name: session_state
-- A session's turn counter and last change (they key the in-process retrieval index).
SELECT next_turn, updated_at FROM main.sessions WHERE session_id = $sid;

-- name: bump_retrieval_batch
-- Add counts of notes put into contexts (from the registered table _b_bump: session_id,
-- note_id, n).
UPDATE main.notes SET retrieval_count = retrieval_count + b.n
FROM _b_bump AS b
WHERE notes.session_id = b.session_id AND notes.note_id = b.note_id;

-- name: user_sessions
-- A user's sessions in time order (of their first turn; sessions without turns last).
SELECT s.session_id
FROM main.sessions AS s
LEFT JOIN (SELECT session_id, min(ts) AS first_ts FROM main.turns
           WHERE session_id IN (SELECT session_id FROM main.sessions WHERE user_id = $uid)
           GROUP BY session_id) AS t USING (session_id)
WHERE s.user_id = $uid
ORDER BY t.first_ts NULLS LAST, s.created_at, s.session_id;

-- name: users
-- Every user with the number of their sessions and turns and the time of their first and last turn.
SELECT s.user_id, count(*) AS sessions, sum(coalesce(t.turns, 0))::BIGINT AS turns,
    min(t.first_ts) AS first_ts, max(t.last_ts) AS last_ts
FROM main.sessions AS s
LEFT JOIN (SELECT session_id, count(*) AS turns, min(ts) AS first_ts, max(ts) AS last_ts
           FROM main.turns GROUP BY session_id) AS t USING (session_id)
WHERE s.user_id IS NOT NULL
GROUP BY s.user_id ORDER BY s.user_id;
