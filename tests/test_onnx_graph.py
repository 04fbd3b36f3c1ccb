"""The onnx embedder's rewritten model: the word table stays int8, the vectors do not change."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from tokenizers import Tokenizer

from cce_duck.embedders.onnx import lookup_after_gather, onnx_files

FILES = onnx_files()  # the model packages are core dependencies: never skipped

TEXTS = [
    "Hey Mel! How are you doing? I went hiking last weekend with my family.",
    "I painted a sunrise over the lake yesterday; it took me three hours.",
    "DuckDB 1.5.5 stores TINYINT[384] vectors — ¿qué tal? 日本語も。",
]


def _run(model: str | bytes, tok: Tokenizer) -> np.ndarray:
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    sess = ort.InferenceSession(model, sess_options=opts, providers=["CPUExecutionProvider"])
    out = []
    for text in TEXTS:
        ids = np.array([tok.encode(text).ids], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": np.ones_like(ids),
                 "token_type_ids": np.zeros_like(ids)}
        out.append(sess.run(None, feeds)[0][0])
    return np.concatenate(out)


def test_rewritten_model_gives_the_same_token_states() -> None:
    assert FILES is not None
    model_path, tok_path = FILES
    tok = Tokenizer.from_file(str(tok_path))
    before = _run(str(model_path), tok)
    after = _run(lookup_after_gather(model_path), tok)
    assert before.shape == after.shape
    assert np.array_equal(before, after)


def test_rewritten_model_looks_up_int8_rows() -> None:
    assert FILES is not None
    graph = onnx.load_from_string(lookup_after_gather(FILES[0])).graph
    table = "inner.embeddings.word_embeddings.weight"
    gathers = [n for n in graph.node if n.op_type == "Gather" and n.input[0].startswith(table)]
    assert sorted(n.input[0] for n in gathers) == [table + "_q", table + "_scale"]
    # the float table is no longer produced anywhere in the graph
    assert not any(table in n.output or table + "_f" in n.output for n in graph.node)
