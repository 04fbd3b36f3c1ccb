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

-- name: commit_unlock
-- Give the commit lock back.
SELECT pg_advisory_unlock(hashtextextended(%(key)s, 0)) AS released;
