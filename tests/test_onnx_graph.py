"""The onnx embedder's rewritten model: the word table and the weights stay int8; a lookup
after the gather changes nothing, int8 products change the vectors only slightly."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from tokenizers import Tokenizer

from cce_duck.embedders.onnx import OnnxEmbedder, onnx_files, prepared_model

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
    after = _run(prepared_model(model_path, integer=False), tok)
    assert before.shape == after.shape
    assert np.array_equal(before, after)


def test_rewritten_model_looks_up_int8_rows() -> None:
    assert FILES is not None
    graph = onnx.load_from_string(prepared_model(FILES[0], integer=False)).graph
    table = "inner.embeddings.word_embeddings.weight"
    gathers = [n for n in graph.node if n.op_type == "Gather" and n.input[0].startswith(table)]
    assert sorted(n.input[0] for n in gathers) == [table + "_q", table + "_scale"]
    # the float table is no longer produced anywhere in the graph
    assert not any(table in n.output or table + "_f" in n.output for n in graph.node)


def test_integer_products_keep_every_weight_int8() -> None:
    assert FILES is not None
    graph = onnx.load_from_string(prepared_model(FILES[0])).graph
    ops = [n.op_type for n in graph.node]
    # 6 layers x (query, key, value, attention output, two feed-forward products)
    assert ops.count("DynamicQuantizeMatMul") == 36
    weights = {n.input[1] for n in graph.node if n.op_type == "DynamicQuantizeMatMul"}
    init = {i.name: i for i in graph.initializer}
    assert all(init[w].data_type == onnx.TensorProto.INT8 for w in weights)
    # no float32 copy of those weights is made anywhere in the graph
    casts = {n.input[0] for n in graph.node if n.op_type == "Cast"}
    assert not weights & casts


def test_integer_products_stay_close_to_the_float_products() -> None:
    exact, fast = OnnxEmbedder(exact=True), OnnxEmbedder(exact=False)
    texts = [*TEXTS, "Caroline went to the LGBTQ support group on 7 May 2023.",
             "What did Melanie paint?", "ok"]
    a, b = exact.embed(texts), fast.embed(texts)
    cos = (a * b).sum(axis=1)
    assert cos.min() > 0.97, cos
    assert not np.array_equal(a, b)  # they are really different computations
    # neighbours stay neighbours: each text is still closest to itself across the two
    assert (np.argmax(a @ b.T, axis=1) == np.arange(len(texts))).all()


_ARENA_CHILD = """
import sys
from cce_duck.allocator import release_free_memory, tune_allocator
from cce_duck.embedders import onnx as O
tune_allocator()
O.SHRINK_AFTER_TOKENS = int(sys.argv[1])
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
e = O.OnnxEmbedder()
short = [f"a short message number {i} about the garden" for i in range(20)]
e.embed(short)
release_free_memory()
before = rss()
long = " ".join(f"word{i} of a long message that fills the model's window" for i in range(60))
e.embed([long, long + " again", long + " once more"])
e.embed(short)
v1 = e.embed([long])
release_free_memory()
print(rss() - before, float(v1[0][0]))
"""


@pytest.mark.processes
def test_a_long_input_gives_its_working_memory_back() -> None:
    """onnxruntime keeps the largest run's buffers for reuse: a 256-token message once held
    ~40 MB for the life of the process. Inputs past ``SHRINK_AFTER_TOKENS`` give them back
    (measured in a child process, against the same run without, which shows the growth the
    measurement must be able to see); the vectors are the same."""
    import subprocess
    import sys

    def added(after_tokens: int) -> tuple[float, float]:
        out = subprocess.run([sys.executable, "-c", _ARENA_CHILD, str(after_tokens)],
                             capture_output=True, text=True, check=True, timeout=300)
        mb, first = out.stdout.split()
        return float(mb), float(first)

    kept, v_kept = added(10**9)
    given, v_given = added(96)
    assert kept > 25, kept  # without: the arena holds the long runs' buffers
    assert given < 15, given
    assert v_kept == v_given
