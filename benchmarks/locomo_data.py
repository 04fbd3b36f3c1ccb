"""Load the LoCoMo benchmark file as per-conversation message lists with real timestamps.

    >>> from benchmarks.locomo_data import load
    >>> convs = load("/work/shared/data/locomo_dev.json")
    >>> convs[0].messages[0]["role"], convs[0].messages[0]["dia_id"]
    ('user', 'D1:1')

Every turn becomes one message dict ``{"role", "content", "timestamp", "name", "dia_id"}``:
``speaker_a`` speaks as ``user``, ``speaker_b`` as ``assistant``, ``name`` is the speaker.
A LoCoMo session gives its start as ``session_N_date_time`` ("1:56 pm on 8 May, 2023"); the
turns of a session get that time plus 30 seconds per turn, so timestamps keep the turn order.
Sessions are taken in their numeric order. A turn that shares an image keeps its caption in
the text (``[shares an image: ...]``), as LoCoMo's own baselines do; pass
``image_captions=False`` to drop it.

``Engine.ingest`` ignores the extra ``dia_id`` key, so ``conv.messages`` can be passed as is;
:func:`engine_messages` strips it for callers that want only the engine's keys.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

__all__ = ["TURN_STEP", "Conversation", "engine_messages", "load", "parse_date_time"]

TURN_STEP = timedelta(seconds=30)
_SESSION = re.compile(r"session_(\d+)")


@dataclass(frozen=True)
class Conversation:
    """One LoCoMo conversation: its speakers, its turns as messages and its questions."""

    sample_id: str
    speaker_a: str
    speaker_b: str
    messages: list[dict[str, Any]] = field(default_factory=list)
    qa: list[dict[str, Any]] = field(default_factory=list)


def parse_date_time(text: str) -> datetime:
    """``"1:56 pm on 8 May, 2023"`` -> ``datetime(2023, 5, 8, 13, 56)``."""
    clean = " ".join(text.replace(",", " ").split()).upper()
    for fmt in ("%I:%M %p ON %d %B %Y", "%I:%M %p ON %d %b %Y"):
        try:
            return datetime.strptime(clean, fmt)
        except ValueError:
            continue
    raise ValueError(f"unrecognised LoCoMo date/time {text!r}")


def _content(turn: dict[str, Any], image_captions: bool) -> str:
    text = str(turn.get("text") or "").strip()
    caption = turn.get("blip_caption")
    if image_captions and caption:
        text = f"{text} [shares an image: {caption}]".strip()
    return text


def _conversation(item: dict[str, Any], image_captions: bool) -> Conversation:
    conv = item["conversation"]
    a, b = conv["speaker_a"], conv["speaker_b"]
    numbers = sorted(int(m.group(1)) for k in conv if (m := _SESSION.fullmatch(k)))
    messages: list[dict[str, Any]] = []
    for n in numbers:
        turns = conv[f"session_{n}"] or []
        if not turns:
            continue
        start = parse_date_time(conv[f"session_{n}_date_time"])
        for i, turn in enumerate(turns):
            content = _content(turn, image_captions)
            if not content:
                continue
            speaker = turn["speaker"]
            messages.append({
                "role": "user" if speaker == a else "assistant",
                "content": content,
                "timestamp": start + i * TURN_STEP,
                "name": speaker,
                "dia_id": turn.get("dia_id"),
                "session": n,
            })
    return Conversation(
        sample_id=str(item.get("sample_id", "")), speaker_a=a, speaker_b=b,
        messages=messages, qa=list(item.get("qa", [])),
    )


def load(path: str | Path, *, image_captions: bool = True) -> list[Conversation]:
    """Every conversation of a LoCoMo JSON file, in file order."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    return [_conversation(item, image_captions) for item in data]


def engine_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The message dicts without ``dia_id`` (the keys ``Engine.ingest`` takes)."""
    keys = ("role", "content", "timestamp", "name")
    return [{k: m[k] for k in keys} for m in messages]
