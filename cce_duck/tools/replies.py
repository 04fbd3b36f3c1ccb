"""Reading model replies: a JSON object out of chatty text, and numbers written many ways."""

from __future__ import annotations

import json
import re
from typing import Any

from cce_duck.errors import LLMError

__all__ = ["ReplyFormatError", "parse_json_object", "parse_number"]

_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.S | re.I)
_NUMBER = re.compile(
    r"(?<![\w.])[-−]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?\s*%?|(?<![\w.])[-−]?\.\d+\s*%?")


class ReplyFormatError(LLMError):
    """A model reply is not in the expected format (JSON object, number)."""


def parse_json_object(text: str) -> dict[str, Any]:
    """The first JSON object in ``text`` (code fences and surrounding prose are ignored)."""
    if not isinstance(text, str):
        raise ReplyFormatError("the reply is not text")
    candidates = [m.group(1) for m in _FENCE.finditer(text)] + [text]
    decoder = json.JSONDecoder()
    for cand in candidates:
        for i, ch in enumerate(cand):
            if ch != "{":
                continue
            try:
                obj, _ = decoder.raw_decode(cand, i)
            except ValueError:
                continue
            if isinstance(obj, dict):
                return obj
    raise ReplyFormatError(f"expected a JSON object in the reply, got: {text[:200]!r}")


def parse_number(text: str) -> float:
    """The first number in ``text``: ``"50%"`` is 0.5, ``"1,200"`` is 1200, ``"0"`` is 0."""
    if not isinstance(text, str):
        raise ReplyFormatError("the reply is not text")
    m = _NUMBER.search(text.replace("−", "-"))
    if m is None:
        raise ReplyFormatError(f"expected a number in the reply, got: {text[:200]!r}")
    raw = m.group(0).strip()
    percent = raw.endswith("%")
    value = float(raw.rstrip("%").strip().replace(",", ""))
    return value / 100.0 if percent else value
