"""A synchronous handle on a real MCP stdio server (``cce serve mcp`` in a subprocess), for tests
that call tools from ordinary functions (property tests): the official client runs in one task of
an event loop on its own thread, and calls are handed to it."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import sys
import threading
from pathlib import Path
from types import TracebackType
from typing import Any

from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.types import CallToolResult

TIMEOUT = 60


class McpClient:
    """``with McpClient(data_dir, errlog) as c: c.call("cce_list_sessions", {})``."""

    def __init__(self, data_dir: Path, errlog: Path) -> None:
        self.params = StdioServerParameters(
            command=sys.executable, args=["-m", "cce_duck.cli", "serve", "mcp"],
            env={**os.environ, "CCE_DATA_DIR": str(data_dir), "CCE_EMBEDDER": "hash"})
        self.errlog = errlog
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.queue: asyncio.Queue[tuple[str, dict[str, Any] | None,
                                        concurrent.futures.Future[Any]] | None] | None = None
        self.done: concurrent.futures.Future[None] | None = None

    def __enter__(self) -> McpClient:
        self.thread.start()
        ready: concurrent.futures.Future[None] = concurrent.futures.Future()
        self.done = asyncio.run_coroutine_threadsafe(self._serve(ready), self.loop)
        ready.result(TIMEOUT)
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        if self.queue is not None:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, None)
        try:
            if self.done is not None:
                self.done.result(TIMEOUT)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(TIMEOUT)
            self.loop.close()

    async def _serve(self, ready: concurrent.futures.Future[None]) -> None:
        self.queue = asyncio.Queue()
        try:
            with self.errlog.open("w") as err:
                async with stdio_client(self.params, errlog=err) as (read, write), \
                        ClientSession(read, write) as session:
                    await session.initialize()
                    ready.set_result(None)
                    while (item := await self.queue.get()) is not None:
                        name, args, fut = item
                        try:
                            if args is None and name == "tools/list":
                                fut.set_result(await session.list_tools())
                            else:
                                fut.set_result(await session.call_tool(name, args))
                        except Exception as exc:  # handed to the caller
                            fut.set_exception(exc)
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            raise

    def _submit(self, name: str, args: dict[str, Any] | None) -> Any:
        assert self.queue is not None
        fut: concurrent.futures.Future[Any] = concurrent.futures.Future()
        self.loop.call_soon_threadsafe(self.queue.put_nowait, (name, args, fut))
        return fut.result(TIMEOUT)

    def raw(self, name: str, arguments: dict[str, Any]) -> CallToolResult:
        """The tool result as the protocol returns it."""
        result: CallToolResult = self._submit(name, arguments)
        return result

    def call(self, name: str, arguments: dict[str, Any]) -> tuple[bool, Any]:
        """``(is_error, structured result or error text)``."""
        res = self.raw(name, arguments)
        text = "".join(getattr(c, "text", "") for c in res.content)
        if res.is_error:
            return True, text
        return False, res.structured_content or json.loads(text)

    def list_tools(self) -> Any:
        """The ``tools/list`` result."""
        return self._submit("tools/list", None)
