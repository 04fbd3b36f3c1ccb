"""MCP server over stdio (``cce serve mcp`` or ``cce-mcp``), built on the official ``mcp`` SDK.

Each tool validates its arguments (unknown fields and bad values are a tool error, not a crash),
calls one library function and returns JSON-ready data.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import ConfigDict, Field

from cce_duck import __version__, pipeline
from cce_duck.adhoc import read_only_query
from cce_duck.config import Config
from cce_duck.engine import Engine
from cce_duck.errors import CCEError
from cce_duck.server.models import MessageIn
from cce_duck.server.serial import Serialized

__all__ = ["build_server", "run_stdio"]

T = TypeVar("T")

SessionId = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$",
                                 description="Session id: 1-64 of A-Z a-z 0-9 _ . -")]
Text = Annotated[str, Field(min_length=1, max_length=1_000_000)]
Time = Annotated[str | None, Field(None, max_length=64, description="ISO-8601 date/time")]
Role = Literal["system", "user", "assistant", "tool"]
Budget = Annotated[int | None, Field(None, gt=0, le=1_000_000, description="Token cap")]

INSTRUCTIONS = (
    "Long-term memory for this conversation. Store each turn with cce_ingest_turn (or a whole "
    "history with cce_ingest_history); before answering, call cce_retrieve_context with the "
    "user's question to get the relevant notes and recent turns under a token cap."
)


class _Engine(Serialized):
    """The server's engine (tool calls run one at a time); library errors become tool errors."""

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            return super().call(fn, *args, **kwargs)
        except CCEError as exc:
            raise ToolError(f"{type(exc).__name__}: {exc}") from None


def _strict(server: MCPServer[Any]) -> None:
    """Make every tool refuse unknown arguments (the SDK ignores them by default)."""
    for tool in server._tool_manager.list_tools():
        base = tool.fn_metadata.arg_model
        config = ConfigDict(**{**base.model_config, "extra": "forbid"})
        tool.fn_metadata.arg_model = type(base.__name__, (base,), {"model_config": config})
        tool.parameters["additionalProperties"] = False


def build_server(engine: Engine) -> MCPServer[Any]:
    """The MCP server with every tool bound to ``engine``."""
    server: MCPServer[Any] = MCPServer("cce_duck", version=__version__, instructions=INSTRUCTIONS)
    eng = _Engine(engine)
    e = engine

    @server.tool()
    def cce_ingest_turn(session_id: SessionId, role: Role, content: Text, timestamp: Time = None,
                        name: Annotated[str | None, Field(None, max_length=128)] = None
                        ) -> dict[str, Any]:
        """Store one message (role: user, assistant, system or tool); returns its turn number."""
        turn = eng.call(e.add_message, session_id, role, content, timestamp, name)
        return {"session_id": session_id, "turn": turn}

    @server.tool()
    def cce_ingest_history(session_id: SessionId,
                           messages: Annotated[list[MessageIn], Field(min_length=1, max_length=10_000)]
                           ) -> dict[str, Any]:
        """Store a whole history at once (idempotent: messages already stored are skipped)."""
        msgs = [m.model_dump(exclude_none=True) for m in messages]
        turns = eng.call(e.ingest, session_id, msgs)
        return {"session_id": session_id, "stored_turns": turns}

    @server.tool()
    def cce_retrieve_context(session_id: SessionId, query: Text, max_tokens: Budget = None,
                             top_k: Annotated[int | None, Field(None, gt=0, le=1000)] = None,
                             since: Time = None, until: Time = None,
                             last_turns: Annotated[int | None, Field(None, gt=0)] = None,
                             explain: bool = False) -> dict[str, Any]:
        """The token-capped context for the question about to be answered: notes, quotes, recent turns."""
        payload = eng.call(e.context, session_id, query, max_tokens=max_tokens, top_k=top_k,
                           since=since, until=until, last_turns=last_turns, explain=explain)
        out = {"context": payload.to_string(), "tokens": payload.tokens,
               "full_tokens": payload.full_tokens, "pin_tokens": payload.pin_tokens,
               "tokens_saved": payload.tokens_saved, "notes": payload.to_dict()["notes"]}
        if explain:
            out["explain"] = payload.to_dict()["explain"]
        return out

    @server.tool()
    def cce_summarize_session(session_id: SessionId) -> dict[str, Any]:
        """The session's topics in order, and its summary once it is closed."""
        return eng.call(e.outline, session_id)

    @server.tool()
    def cce_session_stats(session_id: SessionId) -> dict[str, Any]:
        """Sizes, tiers and compression of one session."""
        rows: list[dict[str, Any]] = eng.call(e.stats, session_id).to_dicts()
        return _jsonable(rows[0]) if rows else {"session_id": session_id}

    @server.tool()
    def cce_close_session(session_id: SessionId) -> dict[str, Any]:
        """Compress what is pending, write the session summary and close the session."""
        return {"session_id": session_id, "summary": eng.call(e.close_session, session_id)}

    @server.tool()
    def cce_list_sessions() -> dict[str, Any]:
        """Every session with its turn and note counts."""
        return {"sessions": _jsonable(eng.call(e.sessions).to_dicts())}

    @server.tool()
    def cce_stateless_compress(messages: Annotated[list[MessageIn], Field(min_length=1,
                                                                          max_length=10_000)],
                               query: Text, max_tokens: Budget = None) -> dict[str, Any]:
        """Compress a history for one question without storing anything."""
        msgs = [m.model_dump(exclude_none=True) for m in messages]
        payload = eng.call(pipeline.compress, msgs, query, max_tokens)
        return {"context": payload.to_string(), "tokens": payload.tokens,
                "full_tokens": payload.full_tokens, "messages": payload.to_messages()}

    @server.tool()
    def cce_sql(sql: Annotated[str, Field(min_length=1, max_length=100_000)]) -> dict[str, Any]:
        """One read-only SQL statement over the memory (macros such as cce_retrieve work)."""
        df = eng.call(read_only_query, e, sql)
        return {"columns": df.columns, "rows": _jsonable([list(r) for r in df.rows()])}

    _manage_tools(server, eng, e)
    _strict(server)
    return server


def _manage_tools(server: MCPServer[Any], eng: _Engine, e: Engine) -> None:
    """Pins, forgetting and export."""

    @server.tool()
    def cce_pin_memory(session_id: SessionId,
                       text: Annotated[str | None, Field(None, min_length=1, max_length=100_000)] = None,
                       turn: Annotated[int | None, Field(None, ge=0)] = None) -> dict[str, Any]:
        """Pin a text (or a stored turn by number): it is kept first in every context of the session."""
        return {"session_id": session_id, "pin_id": eng.call(e.pin, session_id, text, turn=turn)}

    @server.tool()
    def cce_forget_memory(session_id: SessionId,
                          note_id: Annotated[int | None, Field(None, ge=0)] = None,
                          start: Annotated[int | None, Field(None, ge=0)] = None,
                          end: Annotated[int | None, Field(None, ge=0)] = None,
                          confirm: bool = False) -> dict[str, Any]:
        """Forget a note (note_id) or a turn range (start..end, inclusive) for good.

        Without confirm=true nothing is removed: the tool fails and lists what would be.
        """
        turns = None if start is None and end is None else (start, end)
        deleted = eng.call(e.forget, session_id, note_id=note_id, turns=turns, dry_run=not confirm)
        if not confirm:
            what = ", ".join(f"{n} {k}" for k, n in deleted.items() if n and k != "vectors") or "nothing"
            raise ToolError(f"nothing forgotten: call again with confirm=true to remove {what}")
        return {"session_id": session_id, "deleted": deleted}

    @server.tool()
    def cce_export_session(session_id: SessionId,
                           path: Annotated[str | None, Field(
                               None, min_length=1, max_length=4096,
                               description="Write here instead: a name inside the export folder "
                                           "the user set (CCE_EXPORT_DIR)")] = None,
                           format: Literal["json", "parquet"] = "json") -> dict[str, Any]:
        """Export a session: returned as JSON (turns, notes, pins, summary), or written to path
        inside the user's export folder (json file, or a folder of Parquet files with vectors)."""
        if path is None:
            if format != "json":
                raise ToolError("format parquet needs a path")
            doc = eng.call(e.export_document, session_id)
            return {k: _jsonable(v) for k, v in doc.items()}
        out = eng.call(e.export_session, session_id, path, format=format, confined=True)
        return {"session_id": session_id, "path": str(out), "format": format}


def _jsonable(value: Any) -> Any:
    from cce_duck.payload import _jsonable as conv

    return conv(value)


def run_stdio(config: Config) -> None:
    """Serve over stdin/stdout until the client closes the pipe."""
    with Engine(config) as engine:
        build_server(engine).run("stdio")
