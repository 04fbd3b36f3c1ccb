"""MCP tools at user scope: a user pin, the user's export.

Registered on the server of :mod:`cce_duck.server.mcp_tools`, which also takes ``user_id`` on
the ingest tools, on ``cce_list_sessions`` (the user's sessions in time order) and on
``cce_retrieve_context`` (the context across the user's sessions; an overview question lists
them with their summaries and topics). Each tool calls one library function; the tool list is
what a model reads first, so user scope adds two tools, not one per library method.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal, Protocol, TypeVar

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations
from pydantic import Field

from cce_duck.engine import Engine
from cce_duck.payload import _jsonable

__all__ = ["register"]

T = TypeVar("T")

UserId = Annotated[str, Field(min_length=1, max_length=64)]  # checked as session ids are

ADD = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False,
                      open_world_hint=False)
WRITE_FILE = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True,
                             open_world_hint=False)  # a file may be overwritten


class Caller(Protocol):
    """The server's engine, called one tool at a time (library errors become tool errors)."""

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T: ...


def register(server: MCPServer[Any], eng: Caller, e: Engine) -> None:
    """Add the user tools to ``server``."""

    @server.tool(annotations=ADD)
    def cce_pin_user(user_id: UserId, text: Annotated[str, Field(min_length=1,
                                                                 max_length=100_000)]
                     ) -> dict[str, Any]:
        """Pin a text in every context of every session of a user."""
        return {"user_id": user_id, "pin_id": eng.call(e.pin_user, user_id, text)}

    @server.tool(annotations=WRITE_FILE)
    def cce_export_user(user_id: UserId,
                        path: Annotated[str | None, Field(
                            None, min_length=1, max_length=4096,
                            description="Write here, inside CCE_EXPORT_DIR")] = None,
                        format: Literal["json", "parquet"] = "json") -> dict[str, Any]:
        """Every session of a user as JSON, or written to path (json, parquet)."""
        if path is None:
            if format != "json":
                raise ToolError("format parquet needs a path")
            return {k: _jsonable(v) for k, v in eng.call(e.user_document, user_id).items()}
        out = eng.call(e.export_user, user_id, path, format=format, confined=True)
        return {"user_id": user_id, "path": str(out), "format": format}
