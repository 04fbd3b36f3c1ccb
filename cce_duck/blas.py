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
_blas_libs: list[Any] | None = None
_blas_saved: list[tuple[Any, int]] = []


@contextmanager
def one_blas_thread() -> Iterator[None]:
    """Run the block with one BLAS thread. A session's products are a few hundred thousand
    multiply-adds: waking BLAS worker threads for them costs more than the work, three times
    more on a busy machine. Nested and concurrent blocks share one limit; the process's
    setting is restored when the last one ends. The BLAS libraries are found once and then
    set directly (``ThreadpoolController.limit`` inspects every loaded library on each call:
    a twentieth of a context's cost)."""
    global _blas_depth, _blas_libs, _blas_saved
    with _blas_lock:
        if _blas_depth == 0:
            if _blas_libs is None:
                _blas_libs = list(ThreadpoolController().select(user_api="blas")
                                  .lib_controllers)
            saved = [(lib, lib.get_num_threads()) for lib in _blas_libs]
            _blas_saved = [(lib, n) for lib, n in saved if n != 1]
            for lib, _ in _blas_saved:
                lib.set_num_threads(1)
        _blas_depth += 1
    try:
        yield
    finally:
        with _blas_lock:
            _blas_depth -= 1
            if _blas_depth == 0:
                for lib, n in _blas_saved:
                    lib.set_num_threads(n)
                _blas_saved = []
