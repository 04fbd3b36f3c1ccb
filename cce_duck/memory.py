"""Giving freed memory back to the operating system.

CPython, DuckDB and onnxruntime free memory into the C allocator, which keeps it for reuse; the
process's resident size then stays at its high-water mark. After work that frees a lot at once
(loading a model, a large flush) glibc's ``malloc_trim`` hands the free pages back.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache
from typing import Any

__all__ = ["release_free_memory"]


@cache
def _trim() -> Any:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        fn = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):  # not glibc (macOS, musl): nothing to do
        return None
    fn.argtypes = [ctypes.c_size_t]
    fn.restype = ctypes.c_int
    return fn


def release_free_memory() -> bool:
    """Return free heap pages to the system; ``False`` where the C library cannot."""
    fn = _trim()
    return bool(fn(0)) if fn is not None else False
