"""The C allocator: giving freed memory back to the operating system.

CPython, DuckDB and onnxruntime free memory into the C allocator, which keeps it for reuse; the
process's resident size then stays at its high-water mark. After work that frees a lot at once
(loading a model, a large flush) glibc's ``malloc_trim`` hands the free pages back.

glibc also raises its mmap threshold as large blocks are freed (up to 32 MB), after which
DuckDB's 64 KB blocks, Arrow batches and NumPy arrays come from the shared heap, interleave
with long-lived objects and leave holes that no trim can return; and every thread that
allocates (DuckDB's workers, the index loader) may get a heap of its own. :func:`tune_allocator`
fixes the threshold at 64 KB, so such blocks are mapped on their own and unmapped when freed,
and allows two heaps. Measured with ``benchmarks/speed.py --child-memory hash`` (95,000
messages, then 12 cached session indexes; 2026-11-30): 108.1-114.1 MB added without it (three
runs), 97.1 and 100.5 with the threshold alone, 95.7 with both; ingestion no slower. The
price: a block of 64 KB or more is mapped, faulted in page by page and unmapped at every use,
so code run once per request keeps its larger scratch arrays (``cce_duck.index``: a fresh
float copy of a hashed question's columns cost a context 161 page faults and 0.48 ms of
system time on a server, 2026-12-03).

PyArrow allocates from its own pool (mimalloc), which keeps freed pages for reuse until asked
to return them: a user's index is read from DuckDB as Arrow tables of a hundred megabytes or
more, freed once the index is built, and the pool then held 90-110 MB of them in one run out
of four or five (resident memory added by a 100,000-message user's index: 329-350 MB in those
runs, 236-247 MB in the others; 237.5-240.9 MB in all seven after
:func:`release_arrow_memory`, 2026-12-02). Bulk loads call it once they are done (~1 ms).

The tuning is process-wide, so it is only on by default in the processes cce_duck owns (the
``cce`` command, the servers it starts, ``cce-mcp``: :func:`tune_owned_process`); a library
user opts in with ``Config(tune_allocator=True)`` or ``CCE_TUNE_ALLOCATOR=1``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from functools import cache
from typing import Any

import pyarrow as pa

from cce_duck.config import env_flag
from cce_duck.errors import ValidationError

__all__ = ["ARENAS", "ENV_VAR", "MMAP_THRESHOLD", "release_arrow_memory", "release_free_memory",
           "tune_allocator", "tune_owned_process"]

#: Turns the tuning on (``1``) for a library user, or off (``0``) for the processes cce_duck owns.
ENV_VAR = "CCE_TUNE_ALLOCATOR"

MMAP_THRESHOLD = 64 * 1024
ARENAS = 2
_M_TRIM_THRESHOLD = -1  # mallopt parameters (malloc.h)
_M_MMAP_THRESHOLD = -3
_M_ARENA_MAX = -8


@cache
def _libc_fn(name: str) -> Any:
    """A glibc function, or ``None`` where the C library has none (macOS, musl)."""
    lib = ctypes.util.find_library("c")
    if lib is None:
        return None
    try:
        return getattr(ctypes.CDLL(lib), name)
    except (OSError, AttributeError):
        return None


def _trim() -> Any:
    fn = _libc_fn("malloc_trim")
    if fn is not None:
        fn.argtypes = [ctypes.c_size_t]
        fn.restype = ctypes.c_int
    return fn


@cache
def tune_allocator() -> bool:
    """For the whole process, once: glibc maps blocks of :data:`MMAP_THRESHOLD` and more on
    their own (trimming past twice that) and keeps at most :data:`ARENAS` heaps. ``False`` where
    the C library cannot. An Engine calls it when ``Config.tune_allocator`` is on."""
    fn = _libc_fn("mallopt")
    if fn is None:
        return False
    fn.argtypes = [ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return all([fn(_M_MMAP_THRESHOLD, MMAP_THRESHOLD), fn(_M_TRIM_THRESHOLD, 2 * MMAP_THRESHOLD),
                fn(_M_ARENA_MAX, ARENAS)])


def tune_owned_process() -> bool:
    """Tune the allocator of a process cce_duck owns (called first by the ``cce`` and
    ``cce-mcp`` entry points) unless :data:`ENV_VAR` is ``0``; ``True`` if tuned."""
    try:
        wanted = env_flag(ENV_VAR)
    except ValidationError:
        wanted = None  # the Engine's configuration reports the bad value
    return tune_allocator() if wanted is not False else False


def release_free_memory() -> bool:
    """Return free heap pages to the system; ``False`` where the C library cannot."""
    fn = _trim()
    return bool(fn(0)) if fn is not None else False


def release_arrow_memory() -> None:
    """Return the pages PyArrow's memory pool keeps after large tables were freed."""
    pa.default_memory_pool().release_unused()
