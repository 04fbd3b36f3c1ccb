"""sentence-transformers models (optional extra ``cce_duck[neural]``, pulls PyTorch)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from cce_duck.embedders.base import Kind, Matrix
from cce_duck.errors import CCEError

__all__ = ["NeuralEmbedder"]


class NeuralEmbedder:
    """A sentence-transformers model that is already on disk (no hub download is attempted)."""

    topic_threshold = 0.25

    def __init__(self, model: str | None = None) -> None:
        try:
            from sentence_transformers import SentenceTransformer
        except ImportError as exc:
            raise CCEError(
                "the neural embedder needs sentence-transformers: pip install 'cce_duck[neural]'"
            ) from exc
        model = model or os.environ.get("CCE_NEURAL_MODEL", "sentence-transformers/all-MiniLM-L6-v2")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        try:
            self._model: Any = SentenceTransformer(model, device="cpu")
        except Exception as exc:
            raise CCEError(f"cannot load sentence-transformers model {model!r} offline: {exc}") from exc
        self.name = "neural:" + model.rsplit("/", 1)[-1]
        self.dim = int(self._model.get_sentence_embedding_dimension())

    def embed(self, texts: list[str], kind: Kind = "passage") -> Matrix:
        """Embed with the model's own batching, normalised."""
        vecs = self._model.encode(texts, normalize_embeddings=True, convert_to_numpy=True)
        return np.asarray(vecs, dtype=np.float32)
