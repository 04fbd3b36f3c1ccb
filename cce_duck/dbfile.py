"""How cce_duck opens DuckDB: every connection creates its new database files with small blocks.

DuckDB writes each table's data, and each primary-key index, into blocks of its own, so a store
of a dozen small tables pays about a dozen partly empty blocks whatever its size. With DuckDB's
default 256 KB blocks that fixed cost was a third of a 2,772-message LoCoMo store. 64 KB blocks
measured (hash embedder, 2026-11-30): 2.46 -> 1.54 MB per 1,000 messages for that store, and
2.24 -> 1.55 MB at 20,000 messages in 20 sessions. The size only applies to files a connection
creates (new data folders, rewrites, encryption conversions); existing files keep the block size
recorded in them and open as before.
"""

from __future__ import annotations

import duckdb

__all__ = ["BLOCK_SIZE", "connect"]

BLOCK_SIZE = 64 * 1024


def connect(path: str = ":memory:", *, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """``duckdb.connect`` with cce_duck's block size for the files it creates."""
    return duckdb.connect(path, read_only=read_only,
                          config={"default_block_size": str(BLOCK_SIZE)})
