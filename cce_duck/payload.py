"""What a model receives: the built context, in message, string and dict forms."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from datetime import datetime
from typing import Any

from cce_duck.text import estimate_tokens

__all__ = ["MESSAGE_OVERHEAD", "ContextPayload", "VerbatimTurn", "messages_tokens"]

#: Tokens a chat API spends around each message (role, separators).
MESSAGE_OVERHEAD = 4


def messages_tokens(messages: list[dict[str, Any]]) -> int:
    """Token estimate of a message list, counted the way the context cap is enforced."""
    return sum(estimate_tokens(str(m.get("content") or "")) + MESSAGE_OVERHEAD for m in messages)


@dataclass
class VerbatimTurn:
    """A turn sent as it was written (``state``: hot, pending, or compressed when the whole
    history is sent)."""

    turn_no: int
    role: str
    speaker: str | None
    content: str
    ts: datetime
    state: str

    def line(self) -> str:
        """``who: text`` for the string form."""
        return f"{self.speaker or self.role}: {self.content}"


@dataclass
class ContextPayload:
    """A token-capped context: a memory block (pins, notes, quotes) then verbatim turns.

    ``full_tokens`` is what sending the whole history as it is would cost and ``pin_tokens``
    what the pins cost on their own, both measured as :attr:`tokens` is; a context never costs
    more than ``min(max_tokens, full_tokens + pin_tokens)``. ``verbatim``: the history (or its
    asked window) fitted, so the context is its turns as they are, after the pins.
    """

    session_id: str
    query: str
    max_tokens: int
    memory: str
    turns: list[VerbatimTurn]
    notes: list[dict[str, Any]] = field(default_factory=list)
    pins: list[str] = field(default_factory=list)
    full_tokens: int = 0
    pin_tokens: int = 0
    verbatim: bool = False
    explain: dict[str, Any] | None = None
    #: Why the context may miss what other processes wrote lately (a lake whose catalog could
    #: not be reached: it was built from what this process had cached), else ``None``.
    stale: str | None = None

    def to_messages(self) -> list[dict[str, Any]]:
        """OpenAI-style messages: one system message with the memory, then the turns."""
        out: list[dict[str, Any]] = []
        if self.memory:
            out.append({"role": "system", "content": self.memory})
        for t in self.turns:
            msg: dict[str, Any] = {"role": t.role, "content": t.content}
            if t.speaker:
                msg["name"] = t.speaker
            out.append(msg)
        return out

    def to_string(self) -> str:
        """The whole context as one text: the memory block, then the turns with who said them
        (under a ``Recent conversation (day):`` line unless the context is the history as it
        is)."""
        parts = [self.memory] if self.memory else []
        if self.turns:
            lines = "\n".join(t.line() for t in self.turns)
            day = self.turns[0].ts.strftime("%Y-%m-%d")
            parts.append(lines if self.verbatim else f"Recent conversation ({day}):\n{lines}")
        return "\n".join(parts)

    @property
    def tokens(self) -> int:
        """Size of the context: the larger of its message form and its string form (kept until
        the memory text or the turns change)."""
        key = (self.memory, tuple((t.role, t.speaker, t.content, t.ts) for t in self.turns))
        cached = self.__dict__.get("_tokens")
        if cached is not None and cached[0] == key:
            return int(cached[1])
        n = max(messages_tokens(self.to_messages()), estimate_tokens(self.to_string()))
        self.__dict__["_tokens"] = (key, n)
        return n

    @property
    def history_tokens(self) -> int:
        """What the call would have cost without memory: the whole history and the pins."""
        return self.full_tokens + self.pin_tokens

    @property
    def tokens_saved(self) -> int:
        """Net saving of this call: :attr:`history_tokens` minus the tokens sent (the context
        never costs more, so this is never negative; it is 0 when the history is sent)."""
        return self.history_tokens - self.tokens

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict (times as ISO strings)."""
        return {k: _jsonable(v) for k, v in self.document().items()}

    def document(self) -> dict[str, Any]:
        """:meth:`to_dict` with its times left as ``datetime`` values, for an encoder that
        writes them as ISO 8601 itself (orjson: the same text as ``isoformat``), without a walk
        through every note and quote to convert them first."""
        d: dict[str, Any] = {f.name: getattr(self, f.name) for f in fields(self)}
        d["turns"] = [{"turn_no": t.turn_no, "role": t.role, "speaker": t.speaker,
                       "content": t.content, "ts": t.ts, "state": t.state}
                      for t in self.turns]
        d["messages"] = self.to_messages()
        d["tokens"] = self.tokens
        d["tokens_saved"] = self.tokens_saved
        return d


def _jsonable(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {k: _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return value
