"""cce_duck: an embedded memory engine for AI assistants on DuckDB.

Long conversations become compact, searchable notes; before each model call the engine hands the
model only the context it needs, under a hard token cap.
"""

from __future__ import annotations

from cce_duck.config import Config
from cce_duck.embedders import Embedder, available_embedders, get_embedder, register_embedder
from cce_duck.engine import Engine, Session
from cce_duck.errors import (
    CCEError,
    ConflictError,
    EmbedderMismatchError,
    EncryptionError,
    FolderInUseError,
    NotFoundError,
    SchemaError,
    StorageError,
    ValidationError,
)
from cce_duck.payload import ContextPayload
from cce_duck.pipeline import compress, compression_stats, full_pipeline
from cce_duck.text import estimate_tokens
from cce_duck.version import __version__

__all__ = [
    "CCEError",
    "Config",
    "ConflictError",
    "ContextPayload",
    "Embedder",
    "EmbedderMismatchError",
    "EncryptionError",
    "Engine",
    "FolderInUseError",
    "NotFoundError",
    "SchemaError",
    "Session",
    "StorageError",
    "ValidationError",
    "__version__",
    "available_embedders",
    "compress",
    "compression_stats",
    "estimate_tokens",
    "full_pipeline",
    "get_embedder",
    "register_embedder",
]
