"""Adapters to agent frameworks: ``cce_duck.integrations.langchain`` and
``cce_duck.integrations.llamaindex`` (install the ``integrations`` extra).

Both keep their messages in a :class:`cce_duck.Engine` and hand the framework the token-capped
context (memory block + recent turns) instead of the whole history.
"""

from __future__ import annotations

from cce_duck.integrations.shared import engine_for

__all__ = ["engine_for"]
