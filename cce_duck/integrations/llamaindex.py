"""LlamaIndex memory backed by cce_duck: ``CCEChatMemory``.

``get(input)`` returns the context a model should see before answering ``input`` — one system
message with the matching older notes (verbatim quotes, pins), then the recent turns — under a
token cap, so it fits wherever LlamaIndex accepts a ``memory=`` (chat engines, agents).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import polars as pl

from cce_duck.engine import Engine
from cce_duck.errors import NotFoundError, ValidationError
from cce_duck.integrations.shared import engine_for
from cce_duck.messages import parse_messages

try:
    from llama_index.core.base.llms.types import ChatMessage, MessageRole
    from llama_index.core.bridge.pydantic import ConfigDict, Field, PrivateAttr
    from llama_index.core.memory.types import BaseMemory
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "cce_duck.integrations.llamaindex needs llama-index-core: "
        "pip install 'cce_duck[integrations]'"
    ) from exc

__all__ = ["CCEChatMemory", "from_llamaindex", "to_llamaindex"]

_ROLE_IN = {MessageRole.USER: "user", MessageRole.ASSISTANT: "assistant",
            MessageRole.SYSTEM: "system", MessageRole.TOOL: "tool",
            MessageRole.FUNCTION: "tool", MessageRole.DEVELOPER: "system",
            MessageRole.CHATBOT: "assistant", MessageRole.MODEL: "assistant"}
_ROLE_OUT = {"user": MessageRole.USER, "assistant": MessageRole.ASSISTANT,
             "system": MessageRole.SYSTEM, "tool": MessageRole.TOOL}


def from_llamaindex(message: ChatMessage) -> dict[str, Any]:
    """A LlamaIndex chat message as a cce_duck message dict."""
    role = _ROLE_IN.get(MessageRole(message.role))
    if role is None:
        raise ValidationError(f"cannot store a message with role {message.role!r} in cce_duck")
    text = message.content or ""
    calls = message.additional_kwargs.get("tool_calls")
    if not text.strip() and calls:
        text = f"[tool calls] {calls}"
    out: dict[str, Any] = {"role": role, "content": text}
    name = message.additional_kwargs.get("name")
    if isinstance(name, str) and name:
        out["name"] = name
    return out


def to_llamaindex(message: dict[str, Any]) -> ChatMessage:
    """A cce_duck message dict as a LlamaIndex chat message (``name`` in additional_kwargs)."""
    extra = {"name": message["name"]} if message.get("name") else {}
    return ChatMessage(role=_ROLE_OUT[message["role"]], content=message["content"],
                       additional_kwargs=extra)


class CCEChatMemory(BaseMemory):
    """Chat memory stored in a cce_duck data folder; ``get`` returns a token-capped context.

    Create it with :meth:`from_defaults`. ``get_all`` returns every stored message; ``set`` and
    ``reset`` delete what is stored.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    session_id: str = Field(description="cce_duck session id")
    max_tokens: int | None = Field(default=None, description="cap of get() (engine default if None)")
    _engine: Engine = PrivateAttr()

    @classmethod
    def class_name(cls) -> str:
        """Name used by LlamaIndex serialisation."""
        return "CCEChatMemory"

    @classmethod
    def from_defaults(cls, session_id: str = "default", data_dir: str | Path | None = None, *,
                      engine: Engine | None = None, embedder: str | None = None,
                      max_tokens: int | None = None, **kwargs: Any) -> CCEChatMemory:
        """Open (or share) the engine of ``data_dir`` and bind the memory to ``session_id``.

        Extra keyword arguments that LlamaIndex passes to every memory class (``llm``,
        ``chat_history``, ``token_limit``...) are accepted; ``chat_history`` is stored when the
        session is new, ``token_limit`` is used as ``max_tokens`` when that is not given.
        """
        eng = engine if engine is not None else engine_for(data_dir, embedder=embedder)
        sid = eng.session(session_id).id
        limit = max_tokens if max_tokens is not None else kwargs.get("token_limit")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0):
            raise ValidationError(f"max_tokens must be a positive integer, got {limit!r}")
        memory = cls(session_id=sid, max_tokens=limit)
        memory._engine = eng
        history = kwargs.get("chat_history")
        if history and not eng.history(sid):
            memory.put_messages(list(history))
        return memory

    @property
    def engine(self) -> Engine:
        """The engine holding this memory."""
        return self._engine

    def get(self, input: str | None = None, **kwargs: Any) -> list[ChatMessage]:
        """The context for ``input`` (default: the latest stored user message)."""
        query = input if input is not None else self._engine.latest_user_message(self.session_id)
        try:
            payload = self._engine.context(self.session_id, query or "", max_tokens=self.max_tokens)
        except NotFoundError:
            return []
        return [to_llamaindex(m) for m in payload.to_messages()]

    def get_all(self) -> list[ChatMessage]:
        """Every stored message of the session, oldest first."""
        return [to_llamaindex(m) for m in self._engine.history(self.session_id)]

    def put(self, message: ChatMessage) -> None:
        """Store one message."""
        self.put_messages([message])

    def put_messages(self, messages: list[ChatMessage]) -> None:
        """Store messages (all are checked first: one bad message stores none)."""
        self._engine.add_messages(self.session_id, [from_llamaindex(m) for m in messages])

    def set(self, messages: list[ChatMessage]) -> None:
        """Replace the stored history by ``messages``."""
        converted = [from_llamaindex(m) for m in messages]
        parse_messages(converted)  # validate everything before forgetting anything
        if [(m["role"], m["content"]) for m in converted] == [
                (m["role"], m["content"]) for m in self._engine.history(self.session_id)]:
            return
        self._engine.delete_session(self.session_id, missing_ok=True)
        if converted:
            self._engine.add_messages(self.session_id, converted)

    def reset(self) -> None:
        """Delete the session with everything stored about it (a later message starts it anew)."""
        self._engine.delete_session(self.session_id, missing_ok=True)

    # The engine is fast and owns one DuckDB connection: run the async variants in the caller's
    # thread rather than in worker threads.
    async def aget(self, input: str | None = None, **kwargs: Any) -> list[ChatMessage]:
        """See :meth:`get`."""
        return self.get(input, **kwargs)

    async def aget_all(self) -> list[ChatMessage]:
        """See :meth:`get_all`."""
        return self.get_all()

    async def aput(self, message: ChatMessage) -> None:
        """See :meth:`put`."""
        self.put(message)

    async def aput_messages(self, messages: list[ChatMessage]) -> None:
        """See :meth:`put_messages`."""
        self.put_messages(messages)

    async def aset(self, messages: list[ChatMessage]) -> None:
        """See :meth:`set`."""
        self.set(messages)

    async def areset(self) -> None:
        """See :meth:`reset`."""
        self.reset()

    def search(self, query: str, k: int = 10) -> pl.DataFrame:
        """Ranked stored turns for ``query`` with their scores."""
        return self._engine.search(self.session_id, query, k)
