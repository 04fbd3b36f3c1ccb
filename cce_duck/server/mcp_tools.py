"""MCP server over stdio (``cce serve mcp`` or ``cce-mcp``), built on the official ``mcp`` SDK.

Each tool validates its arguments (unknown fields and bad values are a tool error, not a crash),
calls one library function and returns JSON-ready data. What a model reads is kept short: tool
descriptions of one line, input schemas without generated titles, annotations telling clients
which tools only read; ``cce_retrieve_context`` answers with the context text itself, scores
(rounded) only with ``explain``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Annotated, Any, Literal, TypeVar

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent, ToolAnnotations
from pydantic import ConfigDict, Field

from cce_duck import __version__, pipeline
from cce_duck.adhoc import read_only_query
from cce_duck.config import Config
from cce_duck.engine import Engine
from cce_duck.errors import CCEError
from cce_duck.server import mcp_users
from cce_duck.server.models import ChatMessageIn, MessageIn
from cce_duck.server.serial import Serialized

__all__ = ["build_server", "run_stdio"]

T = TypeVar("T")

SessionId = Annotated[str, Field(max_length=64, pattern=r"^[A-Za-z0-9_.\-]+$")]  # 1+ chars
Text = Annotated[str, Field(min_length=1, max_length=1_000_000)]
Time = Annotated[str | None, Field(None, max_length=64, description="ISO-8601 date/time")]
UserId = Annotated[str | None, Field(None, max_length=64)]  # checked as session ids are
Role = Literal["system", "user", "assistant", "tool"]
Budget = Annotated[int | None, Field(None, gt=0, le=1_000_000, description="Token cap")]
Turns = Annotated[int | None, Field(None, gt=0, description="Only the last N turns")]

INSTRUCTIONS = (
    "Long-term memory for this conversation. Store each turn with cce_ingest_turn (or a whole "
    "history with cce_ingest_history); before answering, call cce_retrieve_context with the "
    "user's question: it returns what to read, under a token cap and never more than the "
    "history. cce_search lists the best-matching turns with their scores."
)

#: Tool annotations (hints for clients: nothing here reaches outside the memory).
READ = ToolAnnotations(read_only_hint=True, destructive_hint=False, idempotent_hint=True,
                       open_world_hint=False)
ADD = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False,
                      open_world_hint=False)
STORE = ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=True,
                        open_world_hint=False)
ERASE = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True,
                        open_world_hint=False)


class _Engine(Serialized):
    """The server's engine (writes one at a time, reads beside them); library errors become
    tool errors."""

    def call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            return super().call(fn, *args, **kwargs)
        except CCEError as exc:
            raise ToolError(f"{type(exc).__name__}: {exc}") from None

    def read(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        try:
            return super().read(fn, *args, **kwargs)
        except CCEError as exc:
            raise ToolError(f"{type(exc).__name__}: {exc}") from None


def _strict(server: MCPServer[Any]) -> None:
    """Make every tool refuse unknown arguments (the SDK ignores them by default), and list its
    schemas compactly."""
    for tool in server._tool_manager.list_tools():
        base = tool.fn_metadata.arg_model
        config = ConfigDict(**{**base.model_config, "extra": "forbid"})
        tool.fn_metadata.arg_model = type(base.__name__, (base,), {"model_config": config})
        tool.parameters = _compact(tool.parameters)
        tool.parameters["additionalProperties"] = False
        if tool.output_schema is not None:
            tool.output_schema = _compact(tool.output_schema)


def _compact(schema: dict[str, Any]) -> dict[str, Any]:
    """A JSON schema without pydantic's generated titles; an optional argument (default null) is
    listed as its type alone (it may still be sent as null)."""
    out: dict[str, Any] = {k: v for k, v in schema.items() if k != "title"}
    props = out.get("properties")
    if isinstance(props, dict):
        compacted = {}
        for name, prop in props.items():
            prop = {k: v for k, v in prop.items() if k != "title"}
            kinds = prop.get("anyOf")
            if prop.get("default", 0) is None and isinstance(kinds, list) and len(kinds) == 2 \
                    and {"type": "null"} in kinds:
                rest = prop.pop("anyOf")
                prop.pop("default")
                prop = {**next(k for k in rest if k != {"type": "null"}), **prop}
            compacted[name] = _compact(prop) if "properties" in prop else prop
        out["properties"] = compacted
    if isinstance(out.get("$defs"), dict):
        out["$defs"] = {k: _compact(v) for k, v in out["$defs"].items()}
    if isinstance(out.get("items"), dict):
        out["items"] = _compact(out["items"])
    return out


def _rounded(value: Any, digits: int = 4) -> Any:
    """JSON-ready ``value`` with floats rounded (scores read by a model need no 16 digits)."""
    if isinstance(value, float):
        return round(value, digits)
    if isinstance(value, dict):
        return {k: _rounded(v, digits) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v, digits) for v in value]
    return value


def build_server(engine: Engine) -> MCPServer[Any]:
    """The MCP server with every tool bound to ``engine``."""
    server: MCPServer[Any] = MCPServer("cce_duck", version=__version__, instructions=INSTRUCTIONS)
    eng = _Engine(engine)
    e = engine

    @server.tool(annotations=ADD)
    def cce_ingest_turn(session_id: SessionId, role: Role, content: Text, timestamp: Time = None,
                        name: Annotated[str | None, Field(None, max_length=128)] = None,
                        id: Annotated[str | None, Field(None, max_length=128)] = None,
                        user_id: UserId = None) -> dict[str, Any]:
        """Store one message; returns its turn number."""
        turn = eng.call(e.add_message, session_id, role, content, timestamp, name, message_id=id,
                        user_id=user_id)
        return {"session_id": session_id, "turn": turn}

    @server.tool(annotations=STORE)
    def cce_ingest_history(session_id: SessionId,
                           messages: Annotated[list[MessageIn], Field(min_length=1, max_length=10_000)],
                           user_id: UserId = None) -> dict[str, Any]:
        """Store a whole history (messages already stored are skipped)."""
        msgs = [m.model_dump(exclude_none=True) for m in messages]
        turns = eng.call(e.ingest, session_id, msgs, user_id=user_id)
        return {"session_id": session_id, "stored_turns": turns}

    @server.tool(annotations=READ)
    def cce_retrieve_context(session_id: SessionId, query: Text, max_tokens: Budget = None,
                             top_k: Annotated[int | None, Field(None, gt=0, le=1000)] = None,
                             since: Time = None, until: Time = None, last_turns: Turns = None,
                             explain: Annotated[bool, Field(description="Add notes, scores and "
                                                            "the budget split")] = False,
                             user_id: UserId = None) -> CallToolResult:
        """The context to read before answering the question (the text; JSON with explain)."""
        if user_id is None:
            payload = eng.read(e.context, session_id, query, max_tokens=max_tokens, top_k=top_k,
                               since=since, until=until, last_turns=last_turns, explain=explain)
        elif last_turns is not None:
            raise ToolError("last_turns applies to one session: leave it out with user_id")
        else:  # across the user's sessions, answered in session_id
            payload = eng.read(e.user_context, user_id, query, session_id=session_id,
                               max_tokens=max_tokens, top_k=top_k, since=since, until=until,
                               explain=explain)
        out: dict[str, Any] = {"context": payload.to_string(), "tokens": payload.tokens,
                               "full_tokens": payload.full_tokens,
                               "pin_tokens": payload.pin_tokens,
                               "tokens_saved": payload.tokens_saved, "verbatim": payload.verbatim}
        if not explain:
            return CallToolResult(content=[TextContent(type="text", text=out["context"])],
                                  structured_content=out)
        d = payload.to_dict()
        out = _rounded({**out, "notes": d["notes"], "explain": d["explain"]})
        return CallToolResult(content=[TextContent(type="text", text=json.dumps(out))],
                              structured_content=out)

    @server.tool(annotations=READ)
    def cce_search(session_id: SessionId, query: Text,
                   k: Annotated[int, Field(gt=0, le=1000, description="How many turns")] = 10,
                   since: Time = None, until: Time = None, last_turns: Turns = None
                   ) -> dict[str, Any]:
        """The turns that best match a query, best first, with their scores and text."""
        hits = eng.read(e.search, session_id, query, k, since=since, until=until,
                        last_turns=last_turns)
        return {"session_id": session_id, "hits": _rounded(_jsonable(hits.to_dicts()))}

    @server.tool(annotations=READ)
    def cce_summarize_session(session_id: SessionId) -> dict[str, Any]:
        """The session's topics in order, and its summary once closed."""
        return eng.call(e.outline, session_id)

    @server.tool(annotations=READ)
    def cce_session_stats(session_id: SessionId) -> dict[str, Any]:
        """Sizes, tiers and compression of one session."""
        rows: list[dict[str, Any]] = eng.read(e.stats, session_id).to_dicts()
        return _jsonable(rows[0]) if rows else {"session_id": session_id}

    @server.tool(annotations=STORE)
    def cce_close_session(session_id: SessionId) -> dict[str, Any]:
        """Compress what is pending, summarise and close the session."""
        return {"session_id": session_id, "summary": eng.call(e.close_session, session_id)}

    @server.tool(annotations=READ)
    def cce_list_sessions(user_id: UserId = None) -> dict[str, Any]:
        """Every session (or a user's, in time order) with its turn and note counts."""
        return {"sessions": _jsonable(eng.read(e.sessions, user_id).to_dicts())}

    @server.tool(annotations=READ)
    def cce_stateless_compress(messages: Annotated[list[ChatMessageIn], Field(min_length=1,
                                                                          max_length=10_000)],
                               query: Text, max_tokens: Budget = None) -> dict[str, Any]:
        """Compress a history for one question; nothing is stored."""
        msgs = [m.model_dump(exclude_none=True) for m in messages]
        payload = eng.call(pipeline.compress, msgs, query, max_tokens)
        return {"context": payload.to_string(), "tokens": payload.tokens,
                "full_tokens": payload.full_tokens, "messages": payload.to_messages()}

    @server.tool(annotations=READ)
    def cce_sql(sql: Annotated[str, Field(min_length=1, max_length=100_000)]) -> dict[str, Any]:
        """One read-only SQL statement (SELECT or EXPLAIN), sandboxed to the memory's tables."""
        df = eng.read(read_only_query, e, sql)
        return {"columns": df.columns, "rows": _jsonable([list(r) for r in df.rows()])}

    _manage_tools(server, eng, e)
    mcp_users.register(server, eng, e)
    _strict(server)
    return server


def _manage_tools(server: MCPServer[Any], eng: _Engine, e: Engine) -> None:
    """Pins, forgetting and export."""

    @server.tool(annotations=ADD)
    def cce_pin_memory(session_id: SessionId,
                       text: Annotated[str | None, Field(None, min_length=1, max_length=100_000)] = None,
                       turn: Annotated[int | None, Field(None, ge=0)] = None) -> dict[str, Any]:
        """Pin a text (or a stored turn): kept first in every context of the session."""
        return {"session_id": session_id, "pin_id": eng.call(e.pin, session_id, text, turn=turn)}

    @server.tool(annotations=ERASE)
    def cce_forget_memory(session_id: SessionId,
                          note_id: Annotated[int | None, Field(None, ge=0)] = None,
                          start: Annotated[int | None, Field(None, ge=0)] = None,
                          end: Annotated[int | None, Field(None, ge=0)] = None,
                          confirm: bool = False) -> dict[str, Any]:
        """Forget a note or turns start..end for good (without confirm: only say what)."""
        turns = None if start is None and end is None else (start, end)
        deleted = eng.call(e.forget, session_id, note_id=note_id, turns=turns, dry_run=not confirm)
        if not confirm:
            what = ", ".join(f"{n} {k}" for k, n in deleted.items() if n and k != "vectors") or "nothing"
            raise ToolError(f"nothing forgotten: call again with confirm=true to remove {what}")
        return {"session_id": session_id, "deleted": deleted}

    @server.tool(annotations=ToolAnnotations(read_only_hint=False, destructive_hint=True,
                                             idempotent_hint=True, open_world_hint=False))
    def cce_export_session(session_id: SessionId,
                           path: Annotated[str | None, Field(
                               None, min_length=1, max_length=4096,
                               description="Write here instead: a name inside the export folder "
                                           "the user set (CCE_EXPORT_DIR)")] = None,
                           format: Literal["json", "parquet"] = "json") -> dict[str, Any]:
        """Export a session as JSON, or write it to path in the export folder (json, Parquet)."""
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
