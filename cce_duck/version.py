"""The package version, in a module of its own so the storage layer can name it without
importing the package root (and with it the engine)."""

from __future__ import annotations

__all__ = ["__version__"]

__version__ = "0.1.0"
