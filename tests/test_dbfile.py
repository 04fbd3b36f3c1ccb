"""Database files: new ones are made with cce_duck's block size, older ones open as they are."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import duckdb
import numpy as np
import pytest

from cce_duck import CCEError, Engine
from cce_duck.dbfile import BLOCK_SIZE
from cce_duck.embedders.hash import HashEmbedder
from cce_duck.erasure import scrub
from cce_duck.store import DB_FILE
from cce_duck.text import split_sentences


def _database_size(path: Path, column: str) -> int:
    """A figure of ``pragma_database_size`` (block_size, free_blocks, ...) of a closed file."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        row = con.execute(f"SELECT {column} FROM pragma_database_size()").fetchone()
        assert row is not None
        return int(row[0])
    finally:
        con.close()


def _block_size(path: Path) -> int:
    return _database_size(path, "block_size")


def test_new_store_uses_small_blocks_and_rewrites_keep_them(
        data_dir: Path, conversation: list[dict[str, Any]]) -> None:
    assert BLOCK_SIZE == 64 * 1024 != 256 * 1024  # DuckDB's default
    with Engine(data_dir=data_dir, embedder="hash") as eng:
        eng.ingest("s", conversation)
        scrub(eng.store)  # the rewrite that forgetting does: a new file, same block size
        assert eng.sql("SELECT count(*) AS n FROM turns")["n"][0] == len(conversation)
    assert _block_size(data_dir / DB_FILE) == BLOCK_SIZE


def test_a_store_with_default_blocks_opens_and_keeps_them(
        tmp_path: Path, conversation: list[dict[str, Any]]) -> None:
    src, old = tmp_path / "src", tmp_path / "old"
    with Engine(data_dir=src, embedder="hash") as eng:
        eng.ingest("s", conversation)
        expected = eng.search("s", "budget", k=5)["turn_no"].to_list()
    old.mkdir()
    con = duckdb.connect(str(old / DB_FILE))  # DuckDB's own block size
    con.execute(f"ATTACH '{src / DB_FILE}' AS src (READ_ONLY)")
    con.execute(f"COPY FROM DATABASE src TO {(old / DB_FILE).stem}")
    con.close()
    for extra in src.iterdir():
        if extra.name != DB_FILE and extra.is_file():
            (old / extra.name).write_bytes(extra.read_bytes())
    assert _block_size(old / DB_FILE) == 256 * 1024
    with Engine(data_dir=old, embedder="hash") as eng:
        assert eng.search("s", "budget", k=5)["turn_no"].to_list() == expected
        eng.add_message("s", "user", "One more message about the budget.")
    assert _block_size(old / DB_FILE) == 256 * 1024


def test_hash_message_vector_is_the_same_with_sentences_left_out() -> None:
    emb = HashEmbedder()
    text = "Maria: Oh wow! The ferry leaves Piraeus at seven. The cabin faces the sea. Thanks!"
    body = len("Maria: ")
    spans = [(s.start + body, s.end + body) for s in split_sentences(text[body:])][1:3]
    whole, parts = emb.embed_spans(text, spans)
    assert parts.shape == (2, 384)
    np.testing.assert_allclose(whole[0], emb.embed([text])[0], atol=1e-6)
    np.testing.assert_allclose(parts, emb.embed([text[a:z] for a, z in spans]), atol=1e-6)


def _free_blocks(path: Path) -> int:
    return _database_size(path, "free_blocks")


def test_compact_drops_free_blocks_and_keeps_contents(
        data_dir: Path, conversation: list[dict[str, Any]]) -> None:
    for i in range(4):  # each close checkpoints: rewritten row groups leave their old blocks free
        with Engine(data_dir=data_dir, embedder="hash") as eng:
            eng.ingest(f"s{i}", conversation)
            eng.ingest("s0", [{"role": "user", "content": f"Round {i}: the budget moved again."}])
    path = data_dir / DB_FILE
    assert _free_blocks(path) > 0
    with Engine(data_dir=data_dir, embedder="hash") as eng:
        before = {sid: eng.search(sid, "budget", k=5).rows() for sid in ("s0", "s3")}
        turns = eng.sql("SELECT count(*) AS n FROM turns")["n"][0]
        sizes = eng.compact()
        assert sizes["bytes_after"] < sizes["bytes_before"]
        assert eng.sql("SELECT free_blocks FROM pragma_database_size()")["free_blocks"][0] == 0
        assert {sid: eng.search(sid, "budget", k=5).rows() for sid in ("s0", "s3")} == before
        eng.add_message("s1", "user", "Written after the rewrite.")
        assert eng.sql("SELECT count(*) AS n FROM turns")["n"][0] == turns + 1
    assert _block_size(path) == BLOCK_SIZE
    with Engine(data_dir=data_dir, embedder="hash", read_only=True) as ro, \
            pytest.raises(CCEError, match="read-only"):
        ro.compact()
    with Engine(data_dir=None, embedder="hash") as mem:
        assert mem.compact() == {"bytes_before": 0, "bytes_after": 0}
