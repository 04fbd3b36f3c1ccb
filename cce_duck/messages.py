"""Validated chat messages: roles, speakers, timestamps and session ids."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cce_duck import clock
from cce_duck.errors import ValidationError

__all__ = [
    "ROLES",
    "TRANSCRIPT_PREFIXES",
    "Message",
    "load_history",
    "message_id",
    "parse_messages",
    "parse_time",
    "parse_transcript",
    "validate_session_id",
    "validate_user_id",
]

ROLES = frozenset({"system", "user", "assistant", "tool"})
_SESSION_ID = re.compile(r"[A-Za-z0-9_.\-]{1,64}")
MAX_CONTENT_CHARS = 1_000_000
MAX_MESSAGE_ID_CHARS = 128


@dataclass(frozen=True, slots=True)
class Message:
    """One chat message. ``ts`` is naive UTC; ``speaker`` is an optional display name;
    ``message_id`` the client's id of the message (a retry with it stores nothing twice)."""

    role: str
    content: str
    ts: datetime
    speaker: str | None = None
    message_id: str | None = None


def _checked_id(value: object, what: str) -> str:
    if not isinstance(value, str) or not _SESSION_ID.fullmatch(value) or value in {".", ".."}:
        raise ValidationError(
            f"invalid {what} id {value!r}: use 1-64 characters of A-Z a-z 0-9 _ . - "
            "(not '.' or '..')"
        )
    return value


def validate_session_id(session_id: object) -> str:
    """Return ``session_id`` if it is 1-64 of ``[A-Za-z0-9_.-]`` and not ``.`` or ``..``."""
    return _checked_id(session_id, "session")


def validate_user_id(user_id: object) -> str:
    """Return ``user_id`` if it follows the rule of session ids (:func:`validate_session_id`)."""
    return _checked_id(user_id, "user")


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
    lacking = [k for k in ("role", "content") if k not in raw]
    if lacking:
        has = ", ".join(repr(str(k)) for k in raw) or "no keys"
        raise ValidationError(
            f"message {index} lacks {' and '.join(repr(k) for k in lacking)} (it has {has}); "
            "each message needs 'role' (user, assistant, system or tool) and 'content'")
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
    return Message(role, clean, ts, speaker or None, message_id(raw.get("id", raw.get("message_id")),
                                                                index))


def message_id(value: object, index: int = 0) -> str | None:
    """A client's message id: ``None`` or 1-128 printable characters."""
    if value is None:
        return None
    if (not isinstance(value, str) or not value or len(value) > MAX_MESSAGE_ID_CHARS
            or not value.isprintable() or value != value.encode("utf-8", "replace").decode()):
        raise ValidationError(f"message {index}: id must be a string of 1-{MAX_MESSAGE_ID_CHARS} "
                              "printable characters")
    return value


def parse_messages(raw: Iterable[Any], default_ts: datetime | None = None) -> list[Message]:
    """Validate every message before anything is stored (all or nothing)."""
    if isinstance(raw, str | bytes | Mapping) or not isinstance(raw, Iterable):
        raise ValidationError("messages must be a list of {role, content} objects")
    out = [_one(m, i, default_ts) for i, m in enumerate(raw)]
    seen: dict[str, Message] = {}
    for i, m in enumerate(out):
        if m.message_id is None:
            continue
        first = seen.setdefault(m.message_id, m)
        if (first.role, first.content) != (m.role, m.content):
            raise ValidationError(f"message {i}: id {m.message_id!r} is given to two different "
                                  "messages in one call")
    return out


#: Line prefixes a transcript may use (any letter case), and the role each one means.
TRANSCRIPT_PREFIXES = {"User": "user", "Human": "user", "Assistant": "assistant", "AI": "assistant",
                       "System": "system"}
_SPEAKER_LINE = re.compile(r"^(" + "|".join(TRANSCRIPT_PREFIXES) + r")\s*:\s?(.*)$", re.I)
_PREFIX_NAMES = ", ".join(f"'{p}:'" for p in TRANSCRIPT_PREFIXES)
_ROLE_OF = {p.lower(): role for p, role in TRANSCRIPT_PREFIXES.items()}


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
            raise ValidationError(f"a transcript's first line must start with one of {_PREFIX_NAMES} "
                                  f"(any case), not {line.strip()[:40]!r}")
    for msg in out:
        msg["content"] = msg["content"].strip()
    if not out:
        raise ValidationError(f"no lines starting with {_PREFIX_NAMES} found in the transcript")
    return out


def load_history(text: str) -> list[Any]:
    """A conversation file's messages: JSON (a list of messages, or ``{"messages": [...]}``) or a
    ``User: ...`` / ``Assistant: ...`` transcript.

    Text that starts with ``[`` or ``{`` is JSON: a syntax error is reported with its line and
    column. The messages themselves are validated by :func:`parse_messages`.
    """
    if text.lstrip().startswith(("[", "{")):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValidationError(f"invalid JSON at line {exc.lineno}, column {exc.colno}: "
                                  f"{exc.msg}") from None
        if isinstance(data, dict):
            if "messages" not in data:
                raise ValidationError("a JSON object needs a 'messages' list "
                                      f"(it has {', '.join(map(repr, data)) or 'no keys'})")
            data = data["messages"]
        if not isinstance(data, list):
            raise ValidationError("messages must be a list of {role, content} objects")
        return data
    return parse_transcript(text)
