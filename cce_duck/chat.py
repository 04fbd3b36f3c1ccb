"""Chat trimming for OpenAI-style requests: keep short chats, replace long histories by memory.

Used by the OpenAI-compatible proxy: :func:`prepare_chat` stores the conversation (idempotently)
and decides what the model receives; :func:`record_reply` stores the model's answer.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cce_duck.engine import Engine
from cce_duck.errors import ValidationError
from cce_duck.messages import validate_session_id
from cce_duck.payload import messages_tokens

__all__ = ["ChatPlan", "chat_session_id", "is_plain_chat", "prepare_chat", "record_reply"]

_SAFE_ID = re.compile(r"[A-Za-z0-9_.\-]{1,64}")


@dataclass
class ChatPlan:
    """What to send upstream, and whether the exchange is remembered."""

    session_id: str
    messages: list[dict[str, Any]]
    trimmed: bool
    remembered: bool
    tokens_in: int
    tokens_out: int


def _hash(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()[:16]


def chat_session_id(messages: Sequence[Any], *, header: str | None = None,
                    user: object = None) -> str:
    """The session of a chat: the header, else the ``user`` field, else a hash of the first message.

    A ``user`` that is not a valid session id (an e-mail address, say) is hashed into one.
    """
    if header:
        return validate_session_id(header)
    if isinstance(user, str) and user:
        return user if _SAFE_ID.fullmatch(user) and user not in {".", ".."} else f"user-{_hash(user)}"
    firsts = [m for m in messages if isinstance(m, Mapping) and m.get("role") != "system"]
    first = firsts[0] if firsts else (messages[0] if messages else None)
    if not isinstance(first, Mapping):
        raise ValidationError("messages must be a non-empty list of objects")
    return f"chat-{_hash(str(first.get('role')) + chr(0) + str(first.get('content')))}"


def is_plain_chat(messages: Sequence[Any]) -> bool:
    """True when every message is plain text from system, user or assistant (no tools, images)."""
    for m in messages:
        if not isinstance(m, Mapping) or m.get("role") not in {"system", "user", "assistant"}:
            return False
        if not isinstance(m.get("content"), str) or m.get("tool_calls") or m.get("function_call"):
            return False
    return bool(messages)


def prepare_chat(engine: Engine, session_id: str, messages: Sequence[Any], *,
                 max_tokens: int | None = None, user_id: str | None = None) -> ChatPlan:
    """Store the chat in ``session_id`` and return the messages to send to the model.

    Chats with tool calls, tool messages or non-text content are passed on unchanged and not
    stored. Plain chats are stored (idempotently: a history already stored is skipped; system
    messages are not stored). A chat within ``max_tokens`` (default: the engine's context cap)
    passes unchanged; a longer one becomes its system messages, then the memory block with the
    relevant notes, then the recent turns, ending with the new user message, all within
    ``max_tokens`` (when the system messages and the question alone do not fit, only they are
    sent). ``user_id`` binds the session to its user (see :meth:`Engine.add_messages`), and the
    memory then comes from all of the user's sessions (:meth:`Engine.user_context`).
    """
    if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
        raise ValidationError("messages must be a non-empty list")
    original = [dict(m) if isinstance(m, Mapping) else m for m in messages]
    size = messages_tokens([m for m in original if isinstance(m, dict)])
    if not is_plain_chat(original):
        return ChatPlan(session_id, original, False, False, size, size)
    budget = engine.config.context_max_tokens if max_tokens is None else max_tokens
    if isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0:
        raise ValidationError("max_tokens must be a positive integer")
    system = [m for m in original if m["role"] == "system"]
    convo = [{"role": m["role"], "content": m["content"], **({"name": m["name"]} if m.get("name")
                                                             else {})}
             for m in original if m["role"] != "system"]
    if convo:
        engine.ingest(session_id, convo, user_id=user_id)
    if size <= budget or not convo or convo[-1]["role"] != "user":
        return ChatPlan(session_id, original, False, bool(convo), size, size)
    question = {"role": "user", "content": convo[-1]["content"]}
    # the question is sent last in any case: the memory gets what the budget leaves beside it
    room = budget - messages_tokens([*system, question])
    sent = list(system)
    if room > 0 and user_id is not None:  # the memory of every session of the user
        sent += engine.user_context(user_id, question["content"], session_id=session_id,
                                    max_tokens=room).to_messages()
    elif room > 0:
        sent += engine.context(session_id, question["content"], max_tokens=room).to_messages()
    last = sent[-1] if sent else {}
    if last.get("role") != "user" or last.get("content") != question["content"]:
        sent.append(question)
    return ChatPlan(session_id, sent, True, True, size, messages_tokens(sent))


def record_reply(engine: Engine, session_id: str, content: object) -> None:
    """Store the model's answer (nothing for an empty or non-text answer)."""
    if isinstance(content, str) and content.strip():
        engine.add_message(session_id, "assistant", content)
