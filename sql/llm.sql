-- Named queries of the LLM cache and the playbook. Each block: "-- name: <name>", a description, the SQL.

-- name: cache_get
-- One cached reply with its age in seconds.
SELECT response, prompt_tokens, completion_tokens, created_at
FROM main.llm_cache WHERE key = $key;

-- name: cache_put
-- Store (or refresh) one reply.
INSERT OR REPLACE INTO main.llm_cache (key, model, response, prompt_tokens, completion_tokens, created_at)
VALUES ($key, $model, $response, $prompt_tokens, $completion_tokens, $now);

-- name: cache_delete
-- Drop one entry (expired or corrupt).
DELETE FROM main.llm_cache WHERE key = $key;

-- name: cache_expire
-- Drop every entry created before a time.
DELETE FROM main.llm_cache WHERE created_at < $cutoff;

-- name: cache_trim
-- Keep only the newest entries.
DELETE FROM main.llm_cache WHERE key IN (
    SELECT key FROM main.llm_cache ORDER BY created_at DESC, key OFFSET $keep
);

-- name: cache_count
-- Number of cached replies.
SELECT count(*) FROM main.llm_cache;

-- name: bullets_of
-- Every bullet of a playbook, in id order (vectors included).
SELECT bullet_id, section, content, helpful, harmful, created_at, updated_at, vector
FROM main.playbook_bullets WHERE playbook = $playbook ORDER BY bullet_id;

-- name: bullets_delete_playbook
-- Remove every bullet of a playbook (before writing its new state).
DELETE FROM main.playbook_bullets WHERE playbook = $playbook;

-- name: bullets_insert
-- Write a playbook's bullets from a registered batch.
INSERT INTO main.playbook_bullets BY NAME SELECT * FROM _b_bullets;

-- name: bullet_next_id
-- The next id of the global bullet counter.
SELECT nextval('bullet_ids');

-- name: bullet_last_id
-- The last id the global bullet counter handed out (NULL before the first).
SELECT last_value FROM duckdb_sequences() WHERE sequence_name = 'bullet_ids';
