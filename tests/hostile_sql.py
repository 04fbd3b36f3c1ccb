"""Hostile statements for the read-only SQL sandbox, and the files they aim at.

``{out}`` is a folder outside the data folder holding secrets (so is ``{data}-evil``, a sibling
whose name starts like the data folder's), ``{other}`` another data folder, ``{data}`` the data
folder under attack. Every statement must be refused on every read-only
route, leave memory exactly as it was, and neither read nor create a file outside ``{data}``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["HOSTILE", "LEAK_TARGETS", "READS", "SECRET", "plant_secrets"]

#: Written into every file outside the data folder; no answer may ever contain it.
SECRET = "SECRET-7f3a9c-OUTSIDE"

#: Files the statements try to create; none may exist afterwards.
LEAK_TARGETS = ("leak1.csv", "leak2.csv", "leak3.parquet", "leak4.json", "dump", "fresh.duckdb",
                "log.txt")

HOSTILE: list[str] = [
    # EXPLAIN ANALYZE runs what it explains
    "EXPLAIN ANALYZE UPDATE turns SET content = 'PWNED' WHERE turn_no = 1",
    "EXPLAIN ANALYZE DELETE FROM turns",
    "EXPLAIN ANALYZE CREATE TABLE pwned (a INTEGER)",
    "EXPLAIN ANALYZE SET threads = 1",
    "EXPLAIN ANALYZE LOAD json",
    "EXPLAIN ANALYZE INSTALL json",
    "EXPLAIN ANALYZE COPY (SELECT content FROM turns) TO '{out}/leak1.csv'",
    "EXPLAIN (ANALYZE, FORMAT json) DELETE FROM notes",
    "/* hidden */ explain   analyse\n  INSERT INTO pins SELECT * FROM pins",
    "EXPLAIN COPY turns TO '{out}/leak2.csv'",
    # host files
    "SELECT content FROM read_text('/etc/hostname')",
    "SELECT * FROM read_blob('{other}/memory.duckdb')",
    "SELECT * FROM glob('/root/*')",
    "SELECT * FROM glob('{out}/*')",
    "SELECT * FROM read_text('{out}/secret.txt')",
    "SELECT * FROM read_text(['{out}/secret.txt', '{data}/memory.duckdb'])",
    "SELECT * FROM read_csv('{out}/secret.csv')",
    "SELECT * FROM read_csv_auto('/etc/passwd')",
    "SELECT * FROM read_parquet('{out}/secret.parquet')",
    "SELECT * FROM parquet_metadata('{out}/secret.parquet')",
    "SELECT * FROM read_json('{out}/secret.json')",
    "SELECT * FROM read_json_objects('{out}/secret.json')",
    "SELECT * FROM sniff_csv('{out}/secret.csv')",
    "SELECT * FROM '{out}/secret.csv'",
    "SELECT * FROM read_text('{data}/../outside/secret.txt')",
    "SELECT * FROM read_text('{data}-evil/secret.txt')",  # a sibling sharing the prefix
    "SELECT * FROM read_text('/proc/self/environ')",  # the server's keys and passphrase
    "SELECT * FROM glob('/root/.ssh/*')",
    "SELECT * FROM read_duckdb('{other}/memory.duckdb', table_name = 'turns')",
    "SELECT * FROM duckdb_secrets()",
    # URLs (httpfs is loaded for encryption)
    "SELECT * FROM read_csv('https://example.com/data.csv')",
    "SELECT * FROM read_parquet('s3://bucket/data.parquet')",
    "SELECT content FROM read_text('http://127.0.0.1:9/x')",
    # writing files
    "COPY turns TO '{out}/leak2.csv'",
    "COPY (SELECT * FROM turns) TO '{out}/leak3.parquet' (FORMAT parquet)",
    "COPY (SELECT * FROM turns) TO '{data}/leak4.json'",
    "EXPORT DATABASE '{out}/dump'",
    "ATTACH '{other}/memory.duckdb' AS other",
    "ATTACH '{out}/fresh.duckdb' AS fresh",
    "ATTACH ':memory:' AS scratch",
    "DETACH memory",
    "USE system",
    # settings, extensions, engine state
    "SET enable_external_access = true",
    "SET allowed_directories = ['/']",
    "RESET lock_configuration",
    "PRAGMA threads = 1",
    "PRAGMA enable_profiling",
    "PRAGMA force_checkpoint",
    "LOAD httpfs",
    "INSTALL httpfs",
    "LOAD '{out}/evil.duckdb_extension'",
    "CALL checkpoint()",
    "CALL enable_logging(storage = 'file', storage_path = '{out}/log.txt')",
    "SELECT * FROM checkpoint()",
    "SELECT (SELECT count(*) FROM force_checkpoint()) AS n",
    "SELECT * FROM enable_logging()",
    "SELECT setseed(0.5)",
    "SELECT write_log('x')",
    "CHECKPOINT",
    "VACUUM",
    "BEGIN TRANSACTION",
    "PREPARE p AS SELECT 1",
    # wrappers that run SQL from text
    "SELECT * FROM query('SELECT content FROM read_text(''/etc/hostname'')')",
    "SELECT * FROM query('UPDATE turns SET content = ''PWNED''')",
    "SELECT * FROM query_table('turns')",
    "SELECT * FROM json_execute_serialized_sql(json_serialize_sql('SELECT 1'))",
    # CTEs and subqueries hiding a write
    "WITH w AS (DELETE FROM turns RETURNING *) SELECT * FROM w",
    "WITH ids AS (SELECT nextval('note_ids') AS n) SELECT * FROM ids",
    "SELECT * FROM turns WHERE turn_no IN (SELECT nextval('note_ids'))",
    "SELECT [x FOR x IN [1] IF nextval('note_ids') > 0]",
    "SELECT ('note_ids').nextval()",  # method-call syntax
    "SELECT * FROM system.main.checkpoint()",  # qualified
    "FROM \"CHECKPOINT\"()",  # quoted, upper case
    # plain writes
    "UPDATE turns SET content = 'PWNED'",
    "DELETE FROM turns",
    "INSERT INTO pins (pin_id, session_id, text) VALUES (99, 's1', 'PWNED')",
    "CREATE TABLE pwned AS SELECT 1",
    "CREATE TEMP TABLE pwned AS SELECT 1",
    "CREATE OR REPLACE TEMP MACRO cce_retrieve(a, b) AS TABLE SELECT 1",
    "DROP TABLE turns",
    "ALTER TABLE turns ADD COLUMN x INTEGER",
    "PIVOT turns ON role USING count(*)",
    # several statements
    "SELECT 1; DELETE FROM turns",
    "SELECT 1; SELECT 2",
]

#: Ordinary read queries that must keep working (``{sid}`` is the loaded session).
READS: list[str] = [
    "SELECT count(*) AS n FROM turns",
    "SELECT turn_no, fused FROM cce_retrieve('{sid}', 'How much is a piano lesson?', k := 3)",
    "SELECT * FROM cce_overview('{sid}')",
    "SELECT session_id, turns FROM cce_stats()",
    "WITH t AS (SELECT role FROM turns) SELECT role, count(*) AS n FROM t GROUP BY role",
    "EXPLAIN ANALYZE SELECT count(*) FROM notes",
    "DESCRIBE turns",
    "PRAGMA table_info('turns')",
]


def plant_secrets(out: Path) -> None:
    """Files outside the data folder that each hold :data:`SECRET`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "secret.txt").write_text(SECRET + "\n", encoding="utf-8")
    (out / "secret.csv").write_text(f"name,value\nkey,{SECRET}\n", encoding="utf-8")
    (out / "secret.json").write_text(json.dumps({"key": SECRET}), encoding="utf-8")
    pq.write_table(pa.table({"key": [SECRET]}), out / "secret.parquet")
    (out / "evil.duckdb_extension").write_bytes(SECRET.encode() * 8)
