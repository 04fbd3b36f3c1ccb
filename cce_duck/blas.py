"""BLAS threads for the retrieval products: one, around the small ones."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from threadpoolctl import ThreadpoolController

__all__ = ["one_blas_thread"]

_blas_lock = threading.Lock()
_blas_depth = 0
_blas_limit: Any = None
_blas: ThreadpoolController | None = None


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """Run the block with one BLAS thread. A session's products are a few hundred thousand
    multiply-adds: waking BLAS worker threads for them costs more than the work, three times
    more on a busy machine. Nested and concurrent blocks share one limit; the process's
    setting is restored when the last one ends."""
    global _blas, _blas_depth, _blas_limit
    with _blas_lock:
        if _blas_depth == 0:
            if _blas is None:
                _blas = ThreadpoolController()
            _blas_limit = _blas.limit(limits=1, user_api="blas")
        _blas_depth += 1
    try:
        yield
    finally:
        with _blas_lock:
            _blas_depth -= 1
            if _blas_depth == 0 and _blas_limit is not None:
                _blas_limit.restore_original_limits()
                _blas_limit = None
