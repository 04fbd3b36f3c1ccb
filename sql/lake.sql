-- Named queries of a lake store where DuckLake needs another form than sql/queries.sql: it has
-- no primary keys (no ON CONFLICT, no INSERT OR REPLACE), no sequences (counters are rows of
-- _cce_sequences, moved in the transaction that takes the ids) and no RETURNING. Each block:
-- "-- name: <name>" (the name of the query it replaces), a description, the SQL; a block of
-- several statements runs them in order, each with the parameters it uses.

-- name: session_next_turn
-- One past a session's last stored turn. On a lake a message is acknowledged once its turn row
-- is committed, and the session's counter row moves with the derived rows, in a later commit
-- (cce_duck.backlog): a writer numbers after both.
SELECT coalesce(max(turn_no) + 1, 0) FROM main.turns WHERE session_id = $sid;

-- name: advance_sessions
-- Move the turn counters of existing sessions forward to _b_sessions.next_turn (never back),
-- with their updated_at: the commit of derived rows, after the acknowledgement commit that
-- created the session (a session deleted meanwhile is not created again).
MERGE INTO main.sessions AS s USING _b_sessions AS b ON s.session_id = b.session_id
WHEN MATCHED THEN UPDATE SET
    next_turn = greatest(s.next_turn, b.next_turn),
    updated_at = greatest(s.updated_at, b.updated_at);

-- name: advance_session
-- Move one session's turn counter forward (before its last turns are forgotten on a lake,
-- where the counter row may lag the turn rows: numbers never go back).
UPDATE main.sessions SET next_turn = $next WHERE session_id = $sid AND next_turn < $next;

-- name: insert_turn_lists
-- Append turns given as one list per column (a lake's acknowledgement commit: binding lists
-- costs less there than registering an Arrow table, which is a catalog lookup in the
-- transaction).
INSERT INTO main.turns (session_id, turn_no, role, speaker, content, ts, tokens, n_terms,
    content_hash, micro, note_id, message_id)
SELECT unnest($session_id::VARCHAR[]), unnest($turn_no::INTEGER[]), unnest($role::VARCHAR[]),
    unnest($speaker::VARCHAR[]), unnest($content::VARCHAR[]), unnest($ts::TIMESTAMP[]),
    unnest($tokens::INTEGER[]), unnest($n_terms::INTEGER[]), unnest($content_hash::UBIGINT[]),
    unnest($micro::VARCHAR[]), unnest($note_id::BIGINT[]), unnest($message_id::VARCHAR[]);

-- name: insert_sessions
-- Create sessions from _b_sessions (an acknowledgement commit creates the sessions it starts;
-- the later commit of derived rows moves their counters with upsert_sessions).
INSERT INTO main.sessions (session_id, created_at, updated_at, status, next_turn, user_id)
SELECT session_id, created_at, updated_at, 'open', next_turn, user_id FROM _b_sessions;

-- name: uncompressed_turns
-- The uncompressed turns of the sessions in $sids, oldest first, with their message vector
-- (NULL: its derived rows are not committed yet). Read inside the commit of derived rows,
-- under the lake's commit lock: it says which acknowledged turns still need their rows and
-- which pending turns a note may compress.
SELECT t.session_id, t.turn_no, t.role, t.speaker, t.content, t.micro, t.ts, t.tokens,
    t.content_hash, t.message_id, m.vector
FROM main.turns AS t
LEFT JOIN (SELECT session_id, turn_no, vector FROM main.message_vectors
           WHERE session_id IN (SELECT unnest($sids::VARCHAR[]))) AS m
    USING (session_id, turn_no)
WHERE t.session_id IN (SELECT unnest($sids::VARCHAR[])) AND t.note_id IS NULL
ORDER BY t.session_id, t.turn_no;

-- name: underived_sessions
-- Sessions that hold turns without derived rows (a process stopped between a lake's two
-- commits, or another one has not made its second commit yet); read once by every process
-- that opens the lake for writing, which then completes them.
SELECT DISTINCT t.session_id FROM main.turns AS t
WHERE t.note_id IS NULL AND NOT EXISTS (
    SELECT 1 FROM main.message_vectors AS m
    WHERE m.session_id = t.session_id AND m.turn_no = t.turn_no)
ORDER BY t.session_id;

-- name: session_message_ids
-- Every client message id of a session's stored turns with its turn, role and content hash
-- (a lake writer keeps them in memory: idempotent retries without a read per message).
SELECT message_id, turn_no, role, content_hash FROM main.turns
WHERE session_id = $sid AND message_id IS NOT NULL;

-- name: sessions_docs
-- Number of the turns of each session in $sids that have their derived rows (BM25 documents):
-- on a lake the last acknowledged turns may not have them yet.
SELECT session_id, count(*) AS n FROM main.message_vectors
WHERE session_id IN (SELECT unnest($sids::VARCHAR[]))
GROUP BY session_id;

-- name: next_note_ids
-- Reserve note ids.
UPDATE main._cce_sequences SET value = value + $n WHERE name = 'note_ids';
SELECT value - $n + range AS id FROM main._cce_sequences, range($n)
WHERE name = 'note_ids' ORDER BY id;

-- name: upsert_summary
-- Store (or replace) the cold-tier summary of a session.
DELETE FROM main.session_summaries WHERE session_id = $sid;
INSERT INTO main.session_summaries VALUES ($sid, $summary, $tokens, $now);

-- name: insert_pin
-- Add a pin; returns its id.
UPDATE main._cce_sequences SET value = value + 1 WHERE name = 'pin_ids';
INSERT INTO main.pins (pin_id, session_id, text, turn_no, created_at, updated_at)
SELECT value - 1, $sid, $text, $turn_no, $now, $now FROM main._cce_sequences WHERE name = 'pin_ids';
SELECT value - 1 AS pin_id FROM main._cce_sequences WHERE name = 'pin_ids';

-- name: import_pins
-- Insert imported pins (new ids) from a registered batch _b_import.
INSERT INTO main.pins BY NAME
SELECT * EXCLUDE (pin_id, k), (SELECT value FROM main._cce_sequences WHERE name = 'pin_ids') + k
    AS pin_id
FROM (SELECT *, row_number() OVER (ORDER BY pin_id) - 1 AS k FROM _b_import);
UPDATE main._cce_sequences SET value = value + (SELECT count(*) FROM _b_import)
WHERE name = 'pin_ids';

-- name: item_ids
-- `$n` fresh ids for new store items (sql/store_items.sql), from their _cce_sequences row.
UPDATE main._cce_sequences SET value = value + $n WHERE name = 'store_item_ids';
SELECT value - $n + r.i AS item_id
FROM main._cce_sequences, range($n) AS r(i) WHERE name = 'store_item_ids' ORDER BY r.i;

-- name: stamp_commit
-- Sign the running transaction's snapshot: author (the process), message and the sessions it
-- wrote as JSON, read by the other processes (cce_duck.changefeed).
CALL ducklake_set_commit_message(current_database(), $author, $message, extra_info => $extra);

-- name: cache_put
-- Store (or refresh) one reply (sql/llm.sql).
MERGE INTO main.llm_cache AS c
USING (SELECT $key AS key, $model AS model, $response AS response,
              $prompt_tokens AS prompt_tokens, $completion_tokens AS completion_tokens,
              $now AS created_at) AS n
ON c.key = n.key
WHEN MATCHED THEN UPDATE SET model = n.model, response = n.response,
    prompt_tokens = n.prompt_tokens, completion_tokens = n.completion_tokens,
    created_at = n.created_at
WHEN NOT MATCHED THEN INSERT (key, model, response, prompt_tokens, completion_tokens, created_at)
    VALUES (n.key, n.model, n.response, n.prompt_tokens, n.completion_tokens, n.created_at);

-- name: bullet_next_id
-- The next id of the global bullet counter (sql/llm.sql).
UPDATE main._cce_sequences SET value = value + 1 WHERE name = 'bullet_ids';
SELECT value - 1 FROM main._cce_sequences WHERE name = 'bullet_ids';

-- name: bullet_last_id
-- The last id the global bullet counter handed out (NULL before the first; sql/llm.sql).
SELECT nullif(value - 1, 0) FROM main._cce_sequences WHERE name = 'bullet_ids';

-- name: erasure_mark
-- Record, in the transaction that deletes an erasure's rows, that the purge of the data files
-- is owed (cce_duck.erasure: a lake's intent; a random key, never an id or a text).
INSERT INTO main.cce_meta VALUES ($key, $at);

-- name: erasure_pending
-- The erasures whose rows are deleted and whose purge may not have run yet, with the time each
-- was recorded.
SELECT key, value FROM main.cce_meta WHERE starts_with(key, $prefix) ORDER BY key;

-- name: erasure_unmark
-- The purge ran after these erasures' deletions: their records go.
DELETE FROM main.cce_meta WHERE list_contains($keys::VARCHAR[], key);
