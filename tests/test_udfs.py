"""The Python UDFs, called from SQL on an engine's connection: one row, many rows, NULLs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from cce_duck import Engine, udfs
from cce_duck.text import estimate_tokens, query_terms, terms

DIM = 384
TEXTS = [
    "We picked DuckDB for storage.",
    "The budget for ACME is 40 000 euros.",
    "東京タワーに行きました",
    "{\"a\": [1, 2, 3]}",
    "Bob's databases were migrated on Friday; the queries got faster.",
]


def _many(n: int) -> list[str | None]:
    return [None if i % 7 == 3 else f"{TEXTS[i % len(TEXTS)]} row {i}" for i in range(n)]


def test_every_udf_is_registered(engine: Engine) -> None:
    names = {r[0] for r in engine.store.con.execute(
        "SELECT function_name FROM duckdb_functions() WHERE function_name LIKE 'cce_%'"
    ).fetchall()}
    assert set(udfs.UDF_NAMES) <= names


@pytest.mark.parametrize("fn", udfs.UDF_NAMES)
def test_udf_null_in_null_out(engine: Engine, fn: str) -> None:
    assert engine.store.con.execute(f"SELECT {fn}(NULL)").fetchone() == (None,)
    assert engine.store.con.execute(
        f"SELECT {fn}(CAST(NULL AS VARCHAR)) IS NULL FROM range(3)").fetchall() == [(True,)] * 3


@pytest.mark.parametrize("fn", ["cce_embed", "cce_embed_query"])
def test_embed_one_row(engine: Engine, fn: str) -> None:
    con = engine.store.con
    assert con.execute(f"SELECT typeof({fn}('hello'))").fetchone() == (f"FLOAT[{DIM}]",)
    for text in TEXTS:
        (vec,) = con.execute(f"SELECT {fn}(?)", [text]).fetchone()
        v = np.asarray(vec, dtype=np.float32)
        assert v.shape == (DIM,)
        assert np.linalg.norm(v) == pytest.approx(1.0, abs=1e-5)
        kind = "query" if fn == "cce_embed_query" else "passage"
        expected = engine.store.embedder.embed([text], kind)[0]
        np.testing.assert_allclose(v, expected, atol=1e-6)


@pytest.mark.parametrize("fn", ["cce_embed", "cce_embed_query"])
def test_embed_many_rows_with_nulls(engine: Engine, fn: str) -> None:
    values = _many(5000)  # more than one DuckDB vector (2048 rows)
    con = engine.store.con
    rows = con.execute(
        f"SELECT i, {fn}(s) FROM (SELECT i, s FROM unnest(?) WITH ORDINALITY AS t(s, i)) "
        "ORDER BY i", [values]).fetchall()
    assert len(rows) == len(values)
    kind = "query" if fn == "cce_embed_query" else "passage"
    for (_, vec), text in zip(rows, values, strict=True):
        if text is None:
            assert vec is None
            continue
        v = np.asarray(vec, dtype=np.float32)
        assert v.shape == (DIM,)
        assert np.linalg.norm(v) == pytest.approx(1.0, abs=1e-5)
    # spot-check values against the embedder
    for i in (0, 1, 2, 4, 2046, 2048, 4999):
        text = values[i]
        assert text is not None
        np.testing.assert_allclose(
            np.asarray(rows[i][1]), engine.store.embedder.embed([text], kind)[0], atol=1e-6)


def test_embed_all_nulls_in_a_batch(engine: Engine) -> None:
    rows = engine.store.con.execute(
        "SELECT cce_embed(CASE WHEN i < 0 THEN 'x' END) FROM range(3000) t(i)").fetchall()
    assert rows == [(None,)] * 3000


def test_similar_text_scores_higher(engine: Engine) -> None:
    con = engine.store.con
    (same, other) = con.execute(
        "SELECT list_dot_product(cce_embed_query('DuckDB storage'), "
        "cce_embed('We picked DuckDB for storage.')), "
        "list_dot_product(cce_embed_query('DuckDB storage'), cce_embed('Lunch was pasta.'))"
    ).fetchone()
    assert same > other


def test_terms_udf_matches_python(engine: Engine) -> None:
    values = _many(5000)
    rows = engine.store.con.execute(
        "SELECT cce_terms(s) FROM unnest(?) WITH ORDINALITY AS t(s, i) ORDER BY i",
        [values]).fetchall()
    assert [r[0] for r in rows] == [None if v is None else terms(v) for v in values]
    assert engine.store.con.execute("SELECT cce_terms('the and of')").fetchone() == ([],)


def test_query_terms_udf_matches_python(engine: Engine) -> None:
    values = _many(3000)
    rows = engine.store.con.execute(
        "SELECT cce_query_terms(s) FROM unnest(?) WITH ORDINALITY AS t(s, i) ORDER BY i",
        [values]).fetchall()
    expected = [None if v is None else [{"term": a, "weight": w} for a, w in query_terms(v)]
                for v in values]
    assert [r[0] for r in rows] == expected
    (typ,) = engine.store.con.execute("SELECT typeof(cce_query_terms('x'))").fetchone()
    assert typ == "STRUCT(term VARCHAR, weight DOUBLE)[]"


def test_tokens_udf_matches_python(engine: Engine) -> None:
    values = _many(5000)
    rows = engine.store.con.execute(
        "SELECT cce_tokens(s) FROM unnest(?) WITH ORDINALITY AS t(s, i) ORDER BY i",
        [values]).fetchall()
    assert [r[0] for r in rows] == [None if v is None else estimate_tokens(v) for v in values]
    assert engine.store.con.execute("SELECT cce_tokens('')").fetchone() == (0,)
    assert engine.store.con.execute("SELECT typeof(cce_tokens('x'))").fetchone() == ("INTEGER",)


def test_udfs_and_macros_on_a_cursor(engine: Engine) -> None:
    engine.add_message("s", "user", "We picked DuckDB for storage.")
    engine.flush()
    cur = engine.store.cursor()
    try:
        assert cur.execute("SELECT cce_tokens('hello world')").fetchone() == (2,)
        assert cur.execute("SELECT count(*) FROM cce_recent('s')").fetchone() == (1,)
    finally:
        cur.close()


def test_udfs_and_macros_on_a_read_only_store(data_dir: Path) -> None:
    with Engine(data_dir=data_dir, embedder="hash") as eng:
        eng.add_message("s", "user", "We picked DuckDB for storage.")
    with Engine(data_dir=data_dir, embedder="hash", read_only=True) as ro:
        con = ro.store.con
        assert con.execute("SELECT len(cce_embed('x')), cce_terms('Bugs')").fetchone() == (
            DIM, ["bug"])
        hits = ro.search("s", "DuckDB storage")
        assert hits["turn_no"].to_list() == [0]
