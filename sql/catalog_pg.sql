-- Statements run on a lake's PostgreSQL catalog database directly (with psycopg), beside the
-- DuckLake extension's own connection: session write leases and the change feed.

-- name: lease_try
-- Take the write lease of one session if no other process holds it (true when taken). A
-- session-level advisory lock: PostgreSQL releases it when the connection ends, so the lease
-- of a process that dies is free as soon as its connection is gone.
SELECT pg_try_advisory_lock(hashtextextended(%(key)s, 0)) AS taken;

-- name: lease_release
-- Give a lease back (false when this connection did not hold it).
SELECT pg_advisory_unlock(hashtextextended(%(key)s, 0)) AS released;

-- name: lease_release_many
-- Give several leases back in one round trip.
SELECT pg_advisory_unlock(hashtextextended(k, 0)) AS released FROM unnest(%(keys)s::text[]) AS k;

-- name: lease_holders
-- How many of the given leases some connection holds right now (any process).
SELECT count(*) AS held FROM pg_locks
WHERE locktype = 'advisory' AND granted
  AND ((classid::bigint << 32) | objid::bigint) = ANY (
      SELECT hashtextextended(k, 0) FROM unnest(%(keys)s::text[]) AS k);

-- name: ping
-- One round trip: the connection (and with it every lease it holds) is alive.
SELECT 1 AS alive;

-- name: feed_head
-- The newest snapshot of the lake.
SELECT coalesce(max(snapshot_id), -1) AS head FROM {schema}.ducklake_snapshot;

-- name: feed_since
-- Every snapshot committed after the given one, with who committed it and what it says it
-- changed (cce_duck's own commits carry a JSON list of sessions in commit_extra_info).
SELECT c.snapshot_id, c.author, c.commit_message, c.commit_extra_info, c.changes_made
FROM {schema}.ducklake_snapshot_changes AS c
WHERE c.snapshot_id > %(after)s
ORDER BY c.snapshot_id;

-- name: backend_pid
-- The server process serving this connection.
SELECT pg_backend_pid() AS pid;

-- name: terminate_backend
-- End another connection of the same role (what a lost catalog looks like to its owner).
SELECT pg_terminate_backend(%(pid)s) AS ended;

-- name: commit_lock
-- Wait for the lake's commit lock (one write transaction of the lake at a time; the
-- connection's lock_timeout bounds the wait).
SELECT pg_advisory_lock(hashtextextended(%(key)s, 0)) IS NULL AS locked;

-- name: writers_in_flight
-- Other client connections of the catalog database inside a transaction that wrote something
-- (a transaction id assigned), or running a statement that writes and has not written yet
-- (DuckLake sends a commit's inserts as one batch: until its first row is in, the connection
-- is active without a transaction id): a commit of a process killed while it held the commit
-- lock can still be finishing there after its lock connection, and the lock, are gone.
SELECT count(*) AS n FROM pg_stat_activity
WHERE datname = current_database() AND backend_type = 'client backend'
  AND pid <> pg_backend_pid()
  AND (backend_xid IS NOT NULL
       OR (state = 'active'
           AND query ~* '^\s*(INSERT|UPDATE|DELETE|CREATE|DROP|ALTER|COPY\s+\S+\s+FROM)'));

-- name: commit_unlock
-- Give the commit lock back.
SELECT pg_advisory_unlock(hashtextextended(%(key)s, 0)) AS released;

-- name: fence_installed
-- Whether the turn fence (below) is installed in this catalog, in its present form (the one
-- that also keeps the sessions with underived turns).
SELECT count(*) = 1 AND to_regclass('{schema}.cce_duck_underived') IS NOT NULL AS installed
FROM pg_trigger WHERE tgname = 'cce_duck_turn_fence'
    AND tgrelid = '{schema}.ducklake_snapshot_changes'::regclass;

-- name: fence_install
-- The turn fence: every cce_duck commit that stores turn rows says which turn numbers it gives
-- (commit_extra_info "turns": {session: [first, last]}); a trigger on the catalog's table of
-- snapshot changes, inside DuckLake's own commit transaction, refuses a commit whose first
-- number is below the session's next one, so no turn number is ever stored twice, whatever
-- the timing (a process killed while its commit is being written can have that commit land
-- after another process took the session's lease: the later of the two commits fails, and is
-- never acknowledged). One row per session.
--
-- The same trigger keeps the sessions that hold turns without derived rows (cce_duck_underived):
-- a commit that gives turns adds their sessions; a commit of derived rows removes those it left
-- with none (commit_extra_info "complete": [session, ...]). A process that opens the lake for
-- writing completes what that table names (another process stopped between its two commits)
-- instead of reading all of turns and message_vectors. Created with the row '*' (no session
-- id has that form): the table does not know yet the turns stored before it, and the first
-- process that reads it looks at the whole lake once (underived_seed).
-- Installed once, under a transaction lock.
BEGIN;
SELECT pg_advisory_xact_lock(hashtextextended('cce_duck:fence', 0));
CREATE TABLE IF NOT EXISTS {schema}.cce_duck_turns (
    session_id TEXT PRIMARY KEY,
    next_turn INTEGER NOT NULL
);
DO $seed$
BEGIN
    IF to_regclass('{schema}.cce_duck_underived') IS NULL THEN
        CREATE TABLE {schema}.cce_duck_underived (session_id TEXT PRIMARY KEY);
        INSERT INTO {schema}.cce_duck_underived VALUES ('*');
    END IF;
END
$seed$;
CREATE OR REPLACE FUNCTION {schema}.cce_duck_turn_fence() RETURNS trigger
LANGUAGE plpgsql AS $fence$
DECLARE
    s record;
    first_turn integer;
    moved integer;
BEGIN
    IF NEW.commit_message IS DISTINCT FROM 'cce_duck' OR NEW.commit_extra_info IS NULL
       OR (NEW.commit_extra_info NOT LIKE '%"turns"%'
           AND NEW.commit_extra_info NOT LIKE '%"complete"%') THEN
        RETURN NEW;
    END IF;
    INSERT INTO {schema}.cce_duck_underived (session_id)
    SELECT key FROM jsonb_each(coalesce(NEW.commit_extra_info::jsonb -> 'turns', '{}'))
    ON CONFLICT DO NOTHING;
    DELETE FROM {schema}.cce_duck_underived WHERE session_id IN (
        SELECT jsonb_array_elements_text(coalesce(NEW.commit_extra_info::jsonb -> 'complete',
                                                  '[]')));
    FOR s IN SELECT key, value FROM jsonb_each(coalesce(NEW.commit_extra_info::jsonb -> 'turns',
                                                        '{}')) LOOP
        first_turn := (s.value ->> 0)::integer;
        INSERT INTO {schema}.cce_duck_turns AS f (session_id, next_turn)
        VALUES (s.key, (s.value ->> 1)::integer + 1)
        ON CONFLICT (session_id) DO UPDATE SET next_turn = EXCLUDED.next_turn
        WHERE f.next_turn <= first_turn;
        GET DIAGNOSTICS moved = ROW_COUNT;
        IF moved = 0 THEN
            RAISE EXCEPTION 'cce_duck: turn % of session % was already given by another commit',
                first_turn, s.key;
        END IF;
    END LOOP;
    RETURN NEW;
END
$fence$;
CREATE OR REPLACE TRIGGER cce_duck_turn_fence BEFORE INSERT ON {schema}.ducklake_snapshot_changes
FOR EACH ROW EXECUTE FUNCTION {schema}.cce_duck_turn_fence();
COMMIT;

-- name: fence_forget
-- Sessions deleted: a later message to the same id starts a new session at turn 0 (and the
-- session's id leaves the table of sessions with underived turns).
WITH underived AS (
    DELETE FROM {schema}.cce_duck_underived WHERE session_id = ANY(%(sids)s::text[])
)
DELETE FROM {schema}.cce_duck_turns WHERE session_id = ANY(%(sids)s::text[]) RETURNING session_id;

-- name: underived_list
-- The sessions that may hold turns without derived rows ('*': not known yet, see fence_install).
SELECT session_id FROM {schema}.cce_duck_underived ORDER BY session_id;

-- name: underived_seed
-- The sessions a look at the whole lake found with underived turns, in place of '*' (one
-- statement: both or neither).
WITH found AS (
    INSERT INTO {schema}.cce_duck_underived (session_id)
    SELECT unnest(%(sids)s::text[]) ON CONFLICT DO NOTHING
)
DELETE FROM {schema}.cce_duck_underived WHERE session_id = '*' RETURNING session_id;
