"""Network adapters: REST (FastAPI), MCP (stdio) and the OpenAI-compatible proxy.

Each one parses input, calls one library function and formats the output. They need the
``server`` extra: ``pip install 'cce_duck[server]'``.
"""

from __future__ import annotations

__all__: list[str] = []
