"""Validated chat messages: roles, speakers, timestamps and session ids."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cce_duck import clock
from cce_duck.errors import ValidationError

__all__ = [
    "ROLES",
    "Message",
    "parse_messages",
    "parse_time",
    "parse_transcript",
    "validate_session_id",
]

ROLES = frozenset({"system", "user", "assistant", "tool"})
_SESSION_ID = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
MAX_CONTENT_CHARS = 1_000_000


@dataclass(frozen=True, slots=True)
class Message:
    """One chat message. ``ts`` is naive UTC; ``speaker`` is an optional display name."""

    role: str
    content: str
    ts: datetime
    speaker: str | None = None


def validate_session_id(session_id: object) -> str:
    """Return ``session_id`` if it is 1-64 of ``[A-Za-z0-9_.-]`` and not ``.`` or ``..``."""
    if not isinstance(session_id, str) or not _SESSION_ID.fullmatch(session_id) or session_id in {
        ".", ".."
    }:
        raise ValidationError(
            f"invalid session id {session_id!r}: use 1-64 characters of A-Z a-z 0-9 _ . - "
            "(not '.' or '..')"
        )
    return session_id


def parse_time(value: object, what: str = "timestamp") -> datetime:
    """A naive-UTC datetime from a datetime, an ISO-8601 string or epoch seconds."""
    if isinstance(value, datetime):
        dt = value
    elif isinstance(value, bool):
        raise ValidationError(f"{what} must be an ISO-8601 string, got {value!r}")
    elif isinstance(value, int | float):
        try:
            dt = datetime.fromtimestamp(float(value), UTC)
        except (OverflowError, OSError, ValueError):
            raise ValidationError(f"{what} {value!r} is out of range") from None
    elif isinstance(value, str):
        try:
            dt = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise ValidationError(f"{what} {value!r} is not an ISO-8601 date/time") from None
    else:
        raise ValidationError(f"{what} must be an ISO-8601 string, got {type(value).__name__}")
    if dt.tzinfo is not None:
        dt = dt.astimezone(UTC).replace(tzinfo=None)
    return dt


def _one(raw: object, index: int, default_ts: datetime | None) -> Message:
    if isinstance(raw, Message):
        return raw
    if not isinstance(raw, Mapping):
        raise ValidationError(f"message {index} must be an object with role and content")
    role, content = raw.get("role"), raw.get("content")
    if not isinstance(role, str) or role not in ROLES:
        raise ValidationError(
            f"message {index}: unknown role {role!r}; use one of {', '.join(sorted(ROLES))}"
        )
    if not isinstance(content, str):
        raise ValidationError(f"message {index}: content must be a string")
    if not content.strip():
        raise ValidationError(f"message {index}: content is empty")
    if len(content) > MAX_CONTENT_CHARS:
        raise ValidationError(f"message {index}: content longer than {MAX_CONTENT_CHARS} chars")
    speaker = raw.get("name", raw.get("speaker"))
    if speaker is not None and (not isinstance(speaker, str) or len(speaker) > 128):
        raise ValidationError(f"message {index}: name must be a string of at most 128 chars")
    ts_raw = raw.get("timestamp", raw.get("ts"))
    ts = parse_time(ts_raw, f"message {index} timestamp") if ts_raw is not None else (
        default_ts or clock.now()
    )
    clean = content.encode("utf-8", "replace").decode("utf-8")
    return Message(role, clean, ts, speaker or None)


def parse_messages(raw: Iterable[Any], default_ts: datetime | None = None) -> list[Message]:
    """Validate every message before anything is stored (all or nothing)."""
    if isinstance(raw, str | bytes | Mapping) or not isinstance(raw, Iterable):
        raise ValidationError("messages must be a list of {role, content} objects")
    out = [_one(m, i, default_ts) for i, m in enumerate(raw)]
    return out


_SPEAKER_LINE = re.compile(r"^(User|Assistant|System|Human|AI)\s*:\s?(.*)$", re.I)
_ROLE_OF = {"user": "user", "human": "user", "assistant": "assistant", "ai": "assistant",
            "system": "system"}


def parse_transcript(text: str) -> list[dict[str, Any]]:
    """``User: ...`` / ``Assistant: ...`` text into message dicts (continuation lines join)."""
    out: list[dict[str, Any]] = []
    for line in text.splitlines():
        m = _SPEAKER_LINE.match(line)
        if m:
            out.append({"role": _ROLE_OF[m.group(1).lower()], "content": m.group(2)})
        elif out:
            out[-1]["content"] += "\n" + line
        elif line.strip():
            raise ValidationError("transcript must start with 'User:' or 'Assistant:'")
    for msg in out:
        msg["content"] = msg["content"].strip()
    if not out:
        raise ValidationError("no 'User:' / 'Assistant:' lines found in the transcript")
    return out
