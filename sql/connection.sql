-- Statements that open, seal and convert data folders. Each block: "-- name: <name>", a
-- description, the SQL. {placeholders} are filled by cce_duck.sqlfiles.statement with quoted
-- SQL literals or identifiers (DuckDB takes no parameters in these statements).

-- name: temp_directory
-- Where temporary (spill) files go: beside the database file.
SET temp_directory = {path};

-- name: temp_file_encryption
-- Encrypt temporary files with the database's key.
SET temp_file_encryption = true;

-- name: load_extension
-- Load an extension file by its path (signature checks stay on).
LOAD {path};

-- name: attach_scratch
-- A throw-away in-memory catalog, so the default one can be replaced by the data file.
ATTACH ':memory:' AS cce_boot;

-- name: use
-- Make a catalog the default one.
USE {name};

-- name: detach
-- Detach a catalog.
DETACH {name};

-- name: attach_encrypted
-- Attach an encrypted database file (read-write).
ATTACH {path} AS {name} (ENCRYPTION_KEY {key});

-- name: attach_encrypted_read_only
-- Attach an encrypted database file read-only.
ATTACH {path} AS {name} (ENCRYPTION_KEY {key}, READ_ONLY);

-- name: attach_plain
-- Attach a plain database file (read-write).
ATTACH {path} AS {name};

-- name: copy_database
-- Copy every schema object and row of one catalog into another (empty) one.
COPY FROM DATABASE {source} TO {target};

-- name: mark_encrypted
-- Record in a converted catalog whether it is encrypted ('true' / 'false').
UPDATE {name}.main.cce_meta SET value = {value} WHERE key = 'encrypted';

-- name: has_meta
-- Whether a catalog holds a cce_duck store.
SELECT count(*) FROM duckdb_tables()
WHERE database_name = {value} AND schema_name = 'main' AND table_name = 'cce_meta';

-- name: checkpoint
-- Write a catalog's WAL into its file.
CHECKPOINT {name};

-- name: sandbox_no_autoload
-- The sandbox: no extension is loaded because a function or file asked for it.
SET autoload_known_extensions = false;

-- name: sandbox_no_autoinstall
-- The sandbox: no extension is ever downloaded.
SET autoinstall_known_extensions = false;

-- name: sandbox_no_community
-- The sandbox: no community extension either.
SET allow_community_extensions = false;

-- name: sandbox_no_spill
-- The sandbox of an in-memory store: no temporary (spill) files at all.
SET temp_directory = '';

-- name: sandbox_allowed_directory
-- The sandbox: the one folder file access may reach once external access is off (path ends in /).
SET allowed_directories = [{path}];

-- name: sandbox_no_external_access
-- The sandbox: no file outside the allowed folder, no URL, no extension loading. Final.
SET enable_external_access = false;

-- name: sandbox_lock_configuration
-- The sandbox: no setting may change any more. Final.
SET lock_configuration = true;

-- name: sandbox_parse_tree
-- DuckDB's parse tree of a SELECT statement, as JSON (the read-only check walks it).
SELECT json_serialize_sql($1);

-- name: sandbox_begin_read_only
-- A transaction in which DuckDB refuses every write (the read-only SQL runs in it).
BEGIN TRANSACTION READ ONLY;

-- name: sandbox_rollback
-- End the read-only transaction, whatever happened in it.
ROLLBACK;

-- name: attach_lake
-- Attach a DuckLake (its catalog: 'ducklake:postgres:…' or 'ducklake:<file>.ducklake') with
-- its data path; data inlining off, so no row is ever stored in the catalog database.
ATTACH {catalog} AS {name} (DATA_PATH {path}, DATA_INLINING_ROW_LIMIT 0);

-- name: attach_lake_encrypted
-- Attach a DuckLake whose new Parquet files are encrypted (DuckLake's own keys, one per file,
-- kept in the catalog).
ATTACH {catalog} AS {name} (DATA_PATH {path}, DATA_INLINING_ROW_LIMIT 0, ENCRYPTED);

-- name: attach_lake_read_only
-- Attach a DuckLake read-only.
ATTACH {catalog} AS {name} (DATA_PATH {path}, READ_ONLY);

-- name: lake_inlining
-- The catalog's recorded data inlining row limit (NULL when never set).
SELECT max(value) FROM {name}.options() WHERE option_name = 'data_inlining_row_limit'
    AND scope = 'GLOBAL';

-- name: lake_no_inlining
-- Record in the lake's catalog that no insert is inlined into it (every process, any client).
CALL {name}.set_option('data_inlining_row_limit', 0);

-- name: lake_sequences
-- The lake's stand-in for sequences (DuckLake has none): the next value of each counter.
CREATE TABLE IF NOT EXISTS main._cce_sequences (name VARCHAR NOT NULL, value BIGINT NOT NULL);

-- name: lake_merge
-- Merge a table's small data files that follow one another into larger ones (live writing
-- leaves one or more files per commit); the files merged away become old files.
CALL ducklake_merge_adjacent_files({name});

-- name: lake_merge_table
-- lake_merge for one table ({table}): a compaction merges one table per commit, so that the
-- writes of other processes wait for one table's merge at a time, not for all of them.
CALL ducklake_merge_adjacent_files({name}, {table});

-- name: lake_rewrite_table
-- lake_rewrite for one table ({table}).
CALL ducklake_rewrite_data_files({name}, {table}, delete_threshold => 0.0);

-- name: lake_tables
-- The tables of the lake's current snapshot that hold data files, most files first. {meta}
-- is the lake's metadata catalog.
SELECT t.table_name
FROM {meta}.ducklake_table AS t
JOIN {meta}.ducklake_data_file AS f ON f.table_id = t.table_id AND f.end_snapshot IS NULL
WHERE t.end_snapshot IS NULL
GROUP BY t.table_name
ORDER BY count(*) DESC, t.table_name;

-- name: lake_files
-- The data files the lake's current snapshot reads, and their bytes. {meta} is the lake's
-- metadata catalog.
SELECT count(*), coalesce(sum(file_size_bytes), 0)::BIGINT
FROM {meta}.ducklake_data_file WHERE end_snapshot IS NULL;

-- name: lake_rewrite
-- Rewrite every data file that has deleted rows, so the deleted rows leave it.
CALL ducklake_rewrite_data_files({name}, delete_threshold => 0.0);

-- name: lake_expire
-- Expire every snapshot but the current one (the files only they use become old files).
SELECT count(*) FROM ducklake_expire_snapshots({name}, older_than => now());

-- name: lake_expire_before
-- Expire the snapshots older than {seconds} seconds but the current one (a compaction by a
-- process itself: the processes serving the lake have read their stamps by then).
SELECT count(*) FROM ducklake_expire_snapshots(
    {name}, older_than => now() - to_seconds(CAST({seconds} AS DOUBLE)));

-- name: lake_cleanup
-- Delete every data file no snapshot uses any more.
SELECT count(*) FROM ducklake_cleanup_old_files({name}, cleanup_all => true);

-- name: lake_orphans
-- Delete every file of the data path that the catalog does not know: a process killed while it
-- wrote or deleted files leaves such files (an erased message may be in one). Run holding the
-- commit lock: no other process's write transaction has files in flight then.
SELECT count(*) FROM ducklake_delete_orphaned_files({name}, cleanup_all => true);

-- name: lake_text_stats
-- A lake's table-wide min and max of each text column, recomputed from the files that remain
-- (DuckLake widens them on insert and never narrows them on delete, so an erased message could
-- stay there as a bound). {meta} is the lake's metadata catalog.
UPDATE {meta}.ducklake_table_column_stats AS t
SET min_value = s.lo, max_value = s.hi
FROM (
    SELECT c.table_id, c.column_id, min(f.min_value) AS lo, max(f.max_value) AS hi
    FROM {meta}.ducklake_column AS c
    LEFT JOIN {meta}.ducklake_data_file AS d
        ON d.table_id = c.table_id AND d.end_snapshot IS NULL
    LEFT JOIN {meta}.ducklake_file_column_stats AS f
        ON f.data_file_id = d.data_file_id AND f.column_id = c.column_id
    WHERE c.end_snapshot IS NULL AND lower(c.column_type) = 'varchar'
    GROUP BY ALL
) AS s
WHERE t.table_id = s.table_id AND t.column_id = s.column_id
  AND (t.min_value IS DISTINCT FROM s.lo OR t.max_value IS DISTINCT FROM s.hi);

-- name: advance_sequence
-- Move a new sequence on by ? values (a store copied into a new file continues its ids).
SELECT count(nextval({name})) FROM range(?);
