"""The engine's log lines in a server's output."""

from __future__ import annotations

import logging
import sys

__all__ = ["log_to_stderr"]


def log_to_stderr() -> None:
    """Show the engine's own log lines (``cce_duck.*``, INFO and up: a lake compacted by the
    process, a check that failed) on stderr beside uvicorn's, in its format. Once per
    process."""
    log = logging.getLogger("cce_duck")
    if any(getattr(h, "cce_server", False) for h in log.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(levelname)s:     %(name)s: %(message)s"))
    handler.cce_server = True  # type: ignore[attr-defined]
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    log.propagate = False  # (a server's root logger may have handlers of its own)
