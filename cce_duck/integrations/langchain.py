"""LangChain chat history backed by cce_duck: ``CCEChatMessageHistory``.

``messages`` is not the whole transcript: it is the context a model should see — one system
message with the older notes that match the latest user message (verbatim quotes, pins), then the
recent turns — under a token cap. Use it with ``RunnableWithMessageHistory`` or read and write it
from a LangGraph node.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import polars as pl

from cce_duck.engine import Engine
from cce_duck.errors import NotFoundError, ValidationError
from cce_duck.integrations.shared import engine_for

try:
    from langchain_core.chat_history import BaseChatMessageHistory
    from langchain_core.messages import (
        AIMessage,
        BaseMessage,
        ChatMessage,
        HumanMessage,
        SystemMessage,
        ToolMessage,
    )
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "cce_duck.integrations.langchain needs langchain-core: pip install 'cce_duck[integrations]'"
    ) from exc

__all__ = ["CCEChatMessageHistory", "from_langchain", "to_langchain"]


def _text(message: BaseMessage) -> str:
    content = message.content
    if isinstance(content, str):
        text = content
    else:  # a list of content blocks: keep the text ones
        parts = [b if isinstance(b, str) else str(b.get("text", "")) for b in content
                 if isinstance(b, str) or (isinstance(b, dict) and b.get("type") == "text")]
        text = "\n".join(p for p in parts if p)
    calls = getattr(message, "tool_calls", None)
    if not text.strip() and calls:
        text = "\n".join(f"[tool call] {c['name']}({json.dumps(c.get('args', {}), sort_keys=True)})"
                         for c in calls)
    return text


def from_langchain(message: BaseMessage) -> dict[str, Any]:
    """A LangChain message as a cce_duck message dict (role, content, optional name)."""
    if isinstance(message, HumanMessage):
        role = "user"
    elif isinstance(message, AIMessage):
        role = "assistant"
    elif isinstance(message, SystemMessage):
        role = "system"
    elif isinstance(message, ToolMessage):
        role = "tool"
    elif isinstance(message, ChatMessage) and message.role in {"user", "assistant", "system", "tool"}:
        role = message.role
    else:
        raise ValidationError(f"cannot store a {type(message).__name__} message "
                              f"(type {message.type!r}) in cce_duck")
    out: dict[str, Any] = {"role": role, "content": _text(message)}
    if message.name:
        out["name"] = message.name
    return out


def to_langchain(message: dict[str, Any]) -> BaseMessage:
    """A cce_duck message dict (``role``, ``content``, optional ``name``) as a LangChain message."""
    role, content, name = message["role"], message["content"], message.get("name")
    if role == "user":
        return HumanMessage(content=content, name=name)
    if role == "assistant":
        return AIMessage(content=content, name=name)
    if role == "system":
        return SystemMessage(content=content, name=name)
    return ChatMessage(role=role, content=content, name=name)


class CCEChatMessageHistory(BaseChatMessageHistory):
    """A chat history stored in a cce_duck data folder, read back as a token-capped context.

    Args:
        session_id: The cce_duck session (1-64 of ``A-Z a-z 0-9 _ . -``).
        data_dir: Data folder (default ``CCE_DATA_DIR`` or ``.cce_data``); engines are shared per
            folder within a process. Ignored when ``engine`` is given.
        engine: An open :class:`cce_duck.Engine` to use instead.
        embedder: Embedder name when the folder is opened here (``auto`` by default).
        max_tokens: Cap of :attr:`messages` (default: the engine's ``context_max_tokens``).
    """

    def __init__(self, session_id: str, *, data_dir: str | Path | None = None,
                 engine: Engine | None = None, embedder: str | None = None,
                 max_tokens: int | None = None) -> None:
        self.engine = engine if engine is not None else engine_for(data_dir, embedder=embedder)
        self.session_id = self.engine.session(session_id).id  # validates the id
        if max_tokens is not None and (isinstance(max_tokens, bool) or not isinstance(max_tokens, int)
                                       or max_tokens <= 0):
            raise ValidationError(f"max_tokens must be a positive integer, got {max_tokens!r}")
        self.max_tokens = max_tokens

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        """The context for the latest user message: memory block, then the recent turns."""
        return self.messages_for(self.engine.latest_user_message(self.session_id) or "")

    def messages_for(self, query: str) -> list[BaseMessage]:
        """The context a model should see before answering ``query`` (empty for a new session)."""
        try:
            payload = self.engine.context(self.session_id, query, max_tokens=self.max_tokens)
        except NotFoundError:
            return []
        return [to_langchain(m) for m in payload.to_messages()]

    def all_messages(self) -> list[BaseMessage]:
        """Every stored message of the session, oldest first (not capped)."""
        return [to_langchain(m) for m in self.engine.history(self.session_id)]

    def search(self, query: str, k: int = 10) -> pl.DataFrame:
        """Ranked stored turns for ``query`` with their scores (see :meth:`cce_duck.Engine.search`)."""
        return self.engine.search(self.session_id, query, k)

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        """Store messages (all are checked first: one bad message stores none)."""
        converted = [from_langchain(m) for m in messages]
        self.engine.add_messages(self.session_id, converted)

    def clear(self) -> None:
        """Delete the session with everything stored about it (a later message starts it anew)."""
        self.engine.delete_session(self.session_id, missing_ok=True)
