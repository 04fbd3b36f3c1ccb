-- Statements that open and convert encrypted data folders. Each block: "-- name: <name>", a
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
