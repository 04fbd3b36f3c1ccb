"""Exception types raised by cce_duck.

Every public entry point raises one of these (never a bare ``ValueError`` from deep inside), so
adapters can map them to stable error responses.
"""

from __future__ import annotations

__all__ = [
    "BudgetExceededError",
    "CCEError",
    "ConflictError",
    "EmbedderMismatchError",
    "EncryptionError",
    "FolderInUseError",
    "LLMError",
    "MissingExtraError",
    "NotFoundError",
    "SchemaError",
    "StorageError",
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


class StorageError(CCEError):
    """The data folder cannot be written or read right now (a full disk, an I/O error).

    The message names the folder and the cause. What was acknowledged before stays stored; the
    call that raised stored nothing. ``recoverable`` tells whether the process retries by itself
    once the cause is gone (``False``: it must be restarted).
    """

    def __init__(self, message: str, *, recoverable: bool = True) -> None:
        super().__init__(message)
        self.recoverable = recoverable


class FolderInUseError(CCEError):
    """Another process holds the data folder open for writing."""


class EncryptionError(CCEError):
    """A wrong or missing passphrase, a key given for a plain folder, or an unreadable marker."""


class MissingExtraError(CCEError, ImportError):
    """An optional dependency is not installed; the message names the extra that brings it."""


class LLMError(CCEError):
    """A model call failed (after any retries), or its reply was empty or malformed.

    ``retryable`` tells whether the failure was transient (timeout, 429, 5xx); ``status`` is the
    HTTP status when there was one; ``retry_after`` the server's ``Retry-After`` in seconds.
    """

    def __init__(self, message: str, *, retryable: bool = False, status: int | None = None,
                 retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retryable = retryable
        self.status = status
        self.retry_after = retry_after


class BudgetExceededError(CCEError):
    """The result cannot be made to fit the requested token budget."""
