"""Request bodies of the REST API (unknown fields and wrong types are refused with 422)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

__all__ = [
    "ChatMessageIn",
    "CompressIn",
    "ContextIn",
    "ForgetIn",
    "MessageIn",
    "MessagesIn",
    "NotePatch",
    "PinIn",
    "PinUpdate",
    "SearchIn",
    "SqlIn",
    "TurnPatch",
    "UserContextIn",
    "UserPinIn",
]

MAX_TEXT = 1_000_000
MAX_MESSAGES = 10_000


class _Strict(BaseModel):
    """Unknown fields and wrong types are refused (``"max_tokens": "100"`` or ``1.0`` is not an
    integer, ``"explain": "true"`` or ``1`` not a boolean): 422 ``invalid_request``."""

    model_config = ConfigDict(extra="forbid", strict=True)


class ChatMessageIn(_Strict):
    """One chat message."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str = Field(min_length=1, max_length=MAX_TEXT)
    timestamp: str | None = Field(None, max_length=64, description="ISO-8601 time (default: now)")
    name: str | None = Field(None, max_length=128, description="Speaker's display name")


class MessageIn(ChatMessageIn):
    """One chat message."""

    id: str | None = Field(None, max_length=128, description="Client id: a retry stores it once")


class MessagesIn(_Strict):
    """Messages to append to a session."""

    messages: list[MessageIn] = Field(min_length=1, max_length=MAX_MESSAGES)
    user_id: str | None = Field(None, max_length=64, description="The user the session belongs "
                                "to: bound at its first write, never changed (409 otherwise)")


class ContextIn(_Strict):
    """A context request: the question about to be asked, and limits."""

    query: str = Field(min_length=1, max_length=MAX_TEXT)
    max_tokens: int | None = Field(None, gt=0, le=1_000_000)
    top_k: int | None = Field(None, gt=0, le=1000)
    since: str | None = Field(None, max_length=64, description="ISO-8601 start of the time window")
    until: str | None = Field(None, max_length=64, description="ISO-8601 end of the time window")
    last_turns: int | None = Field(None, gt=0, le=10_000_000)
    explain: bool = False


class UserContextIn(_Strict):
    """A context request across a user's sessions, optionally answered in one of them."""

    query: str = Field(min_length=1, max_length=MAX_TEXT)
    session_id: str | None = Field(None, max_length=64, description="The session being answered "
                                   "in: its pins and recent turns come first, verbatim")
    max_tokens: int | None = Field(None, gt=0, le=1_000_000)
    top_k: int | None = Field(None, gt=0, le=1000)
    since: str | None = Field(None, max_length=64, description="ISO-8601 start of the time window")
    until: str | None = Field(None, max_length=64, description="ISO-8601 end of the time window")
    explain: bool = False


class SearchIn(_Strict):
    """A search: the best-ranked turns for a query, inside an optional time/turn window."""

    query: str = Field(min_length=1, max_length=MAX_TEXT)
    k: int = Field(10, gt=0, le=1000, description="How many turns")
    since: str | None = Field(None, max_length=64, description="ISO-8601 start of the time window")
    until: str | None = Field(None, max_length=64, description="ISO-8601 end of the time window")
    last_turns: int | None = Field(None, gt=0, le=10_000_000)


class CompressIn(_Strict):
    """A stateless compression: nothing is stored."""

    messages: list[ChatMessageIn] = Field(min_length=1, max_length=MAX_MESSAGES)
    query: str = Field(min_length=1, max_length=MAX_TEXT)
    max_tokens: int | None = Field(None, gt=0, le=1_000_000)


class ForgetIn(_Strict):
    """``{"node_id": N}`` or ``{"start": A, "end": B}`` (turn numbers, inclusive)."""

    node_id: int | None = Field(None, ge=0)
    start: int | None = Field(None, ge=0)
    end: int | None = Field(None, ge=0)
    dry_run: bool = Field(False, description="Only return what would be removed")

    @model_validator(mode="after")
    def _one_form(self) -> ForgetIn:
        by_note = self.node_id is not None
        by_range = self.start is not None or self.end is not None
        if by_note == by_range or (by_range and (self.start is None or self.end is None)):
            raise ValueError("send either node_id, or start and end")
        return self


class UserPinIn(_Strict):
    """A text kept in every context of every session of a user."""

    text: str = Field(min_length=1, max_length=MAX_TEXT)


class PinIn(_Strict):
    """Pin a text, or a stored turn by number."""

    text: str | None = Field(None, min_length=1, max_length=MAX_TEXT)
    turn: int | None = Field(None, ge=0)

    @model_validator(mode="after")
    def _one_form(self) -> PinIn:
        if (self.text is None) == (self.turn is None):
            raise ValueError("send either text or turn")
        return self


class PinUpdate(_Strict):
    """New text of a pin."""

    text: str = Field(min_length=1, max_length=MAX_TEXT)


class NotePatch(_Strict):
    """Corrections of a note (at least one field)."""

    label: str | None = Field(None, min_length=1, max_length=MAX_TEXT)
    summary: str | None = Field(None, min_length=1, max_length=MAX_TEXT)

    @model_validator(mode="after")
    def _something(self) -> NotePatch:
        if self.label is None and self.summary is None:
            raise ValueError("send label and/or summary")
        return self


class TurnPatch(_Strict):
    """The corrected text of a stored turn."""

    text: str = Field(min_length=1, max_length=MAX_TEXT)


class SqlIn(_Strict):
    """One read-only SQL statement (admin keys only)."""

    sql: str = Field(min_length=1, max_length=100_000)
