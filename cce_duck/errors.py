"""Exception types raised by cce_duck.

Every public entry point raises one of these (never a bare ``ValueError`` from deep inside), so
adapters can map them to stable error responses.
"""

from __future__ import annotations

__all__ = [
    "CCEError",
    "ConflictError",
    "EmbedderMismatchError",
    "EncryptionError",
    "FolderInUseError",
    "NotFoundError",
    "SchemaError",
    "ValidationError",
]


class CCEError(Exception):
    """Base class of every error this package raises on purpose."""


class ValidationError(CCEError, ValueError):
    """The input is malformed: wrong type, empty text, bad id, budget <= 0 and so on."""


class NotFoundError(CCEError, KeyError):
    """A session, note, pin or turn that does not exist."""

    def __str__(self) -> str:  # KeyError quotes its message; keep it readable.
        return str(self.args[0]) if self.args else "not found"


class ConflictError(CCEError):
    """The request contradicts the stored state (for example a closed session)."""


class EmbedderMismatchError(CCEError):
    """The data folder was built with another embedder (name or dimension)."""


class SchemaError(CCEError):
    """The database file is corrupt, not a cce_duck store, or from a newer schema."""


class FolderInUseError(CCEError):
    """Another process holds the data folder open for writing."""


class EncryptionError(CCEError):
    """A wrong or missing passphrase, a key given for a plain folder, or an unreadable marker."""
