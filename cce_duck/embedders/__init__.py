"""Embedder registry: ``get_embedder("auto" | "onnx" | "multilingual" | "neural" | "hash" | name)``.

``auto`` prefers the English ``onnx`` default; the ``multilingual`` embedder is used only when asked for.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable

from cce_duck.embedders.base import CachedEmbedder, Embedder, Kind, Matrix
from cce_duck.embedders.hash import HashEmbedder
from cce_duck.embedders.multilingual import MultilingualEmbedder, multilingual_available
from cce_duck.embedders.onnx import OnnxEmbedder, onnx_files
from cce_duck.errors import ValidationError

__all__ = [
    "CachedEmbedder",
    "Embedder",
    "HashEmbedder",
    "Kind",
    "Matrix",
    "MultilingualEmbedder",
    "OnnxEmbedder",
    "available_embedders",
    "get_embedder",
    "register_embedder",
]

_REGISTRY: dict[str, Callable[[], Embedder]] = {}
_INSTANCES: dict[str, CachedEmbedder] = {}


def _neural() -> Embedder:
    from cce_duck.embedders.neural import NeuralEmbedder

    return NeuralEmbedder()


def register_embedder(name: str, factory: Callable[[], Embedder]) -> None:
    """Make ``factory`` available as ``embedder=name`` (replaces an earlier registration)."""
    _REGISTRY[name] = factory
    _INSTANCES.pop(name, None)


def available_embedders() -> list[str]:
    """Names whose requirements are installed, best first."""
    names = []
    if onnx_files() is not None:
        names.append("onnx")
    if importlib.util.find_spec("sentence_transformers") is not None:
        names.append("neural")
    if multilingual_available():
        names.append("multilingual")
    names.append("hash")
    names.extend(n for n in _REGISTRY if n not in names)
    return names


def get_embedder(name: str = "auto") -> CachedEmbedder:
    """A shared, cached embedder instance (models load once per process)."""
    if name == "auto":
        name = available_embedders()[0]
    if name in _INSTANCES:
        return _INSTANCES[name]
    if name in _REGISTRY:
        inner = _REGISTRY[name]()
    elif name == "hash":
        inner = HashEmbedder()
    elif name == "onnx":
        inner = OnnxEmbedder()
    elif name == "multilingual":
        inner = MultilingualEmbedder()
    elif name == "neural":
        inner = _neural()
    else:
        raise ValidationError(
            f"unknown embedder {name!r}; choose one of auto, {', '.join(available_embedders())}"
        )
    _INSTANCES[name] = CachedEmbedder(inner)
    return _INSTANCES[name]
