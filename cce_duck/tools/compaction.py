"""U-shaped chat compaction: keep the head and the recent turns, summarise the middle.

When a chat reaches ``trigger_tokens``, the head (leading system messages and the first user
turn) and the most recent turns (up to ``keep_recent_tokens``) stay verbatim; the messages in
between are replaced by one assistant message holding a structured summary (goal, decisions,
facts, open items). System messages are never dropped or summarised (one found in the middle is
kept, before the summary); an assistant message with tool calls is never separated from its tool
results; the kept tail starts with a user turn, so user/assistant turns still alternate.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cce_duck.errors import ValidationError
from cce_duck.llm.client import LLM
from cce_duck.llm.tokens import MESSAGE_OVERHEAD, REPLY_PRIMER
from cce_duck.tools.ppa import truncate_to_tokens
from cce_duck.tools.prompts import prompt
from cce_duck.tools.replies import ReplyFormatError, parse_json_object

__all__ = ["CompactionResult", "compact_messages", "render_summary"]

_ROLES = frozenset({"system", "user", "assistant", "tool"})
_KEYS = ("decisions", "facts", "open_items")
SUMMARY_HEADER = "[Summary of earlier conversation]"
_LIST = {"type": "array", "items": {"type": "string", "maxLength": 80}, "maxItems": 3}
#: Sent with the request (``LLM(json_schemas=True)``) so a grammar-constrained server returns
#: exactly these keys, short enough to finish.
SCHEMA = {"type": "object", "properties": {
    "goal": {"type": "string", "maxLength": 120}, "decisions": _LIST, "facts": _LIST,
    "open_items": _LIST}, "required": ["goal", "decisions", "facts", "open_items"]}


@dataclass
class CompactionResult:
    """The compacted chat and what happened."""

    messages: list[dict[str, Any]]
    compacted: bool
    tokens_before: int
    tokens_after: int
    exact_tokens: bool
    summarised: int = 0
    head: int = 0
    tail: int = 0
    summary: dict[str, Any] = field(default_factory=dict)
    calls: int = 0
    cache_hits: int = 0


def _validate(messages: object) -> list[dict[str, Any]]:
    if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
        raise ValidationError("messages must be a non-empty list of message dicts")
    out = []
    open_calls: set[str] = set()
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ValidationError(f"message {i} is not a mapping")
        role, content = m.get("role"), m.get("content")
        if role not in _ROLES:
            raise ValidationError(f"message {i} has an invalid role {role!r}")
        calls = m.get("tool_calls")
        if content is None and not (role == "assistant" and calls):
            raise ValidationError(f"message {i} has no content")
        if content is not None and not isinstance(content, str):
            raise ValidationError(f"message {i}: content must be a string")
        if calls is not None:
            if role != "assistant" or not isinstance(calls, list):
                raise ValidationError(f"message {i}: only assistant messages carry a tool_calls list")
            for c in calls:
                if not isinstance(c, Mapping) or not isinstance(c.get("id"), str):
                    raise ValidationError(f"message {i}: every tool call needs an 'id'")
                open_calls.add(c["id"])
        if role == "tool":
            cid = m.get("tool_call_id")
            if not isinstance(cid, str) or cid not in open_calls:
                raise ValidationError(f"message {i}: a tool result must answer an earlier tool call")
        out.append(dict(m))
    return out


def _text(m: Mapping[str, Any]) -> str:
    parts = [m.get("content") or ""]
    if m.get("tool_calls"):
        parts.append(json.dumps(m["tool_calls"], ensure_ascii=False, sort_keys=True))
    return "\n".join(p for p in parts if p)


def _count(llm: LLM, msgs: Sequence[Mapping[str, Any]]) -> int:
    return REPLY_PRIMER + sum(MESSAGE_OVERHEAD + llm.count(_text(m)) for m in msgs)


def render_summary(summary: Mapping[str, Any], n_messages: int) -> str:
    """The summary message text (Markdown sections)."""
    lines = [f"{SUMMARY_HEADER} ({n_messages} messages)", f"Goal: {summary.get('goal') or '-'}"]
    for key, title in (("decisions", "Decisions"), ("facts", "Facts"),
                       ("open_items", "Open items")):
        items = summary.get(key) or []
        lines.append(f"{title}:" + ("" if items else " -"))
        lines.extend(f"- {x}" for x in items)
    return "\n".join(lines)


def _coerce(obj: dict[str, Any]) -> dict[str, Any]:
    goal = obj.get("goal")
    out: dict[str, Any] = {"goal": " ".join(str(goal).split()) if goal else ""}
    for key in _KEYS:
        raw = obj.get(key, obj.get(key.replace("_", " "), []))
        if isinstance(raw, str):
            raw = [raw]
        if not isinstance(raw, list):
            raise ReplyFormatError(f"summary field {key!r} is not a list")
        out[key] = [" ".join(str(x).split()) for x in raw if str(x).strip()]
    return out


def compact_messages(messages: Sequence[Mapping[str, Any]], llm: LLM, *, trigger_tokens: int,
                     keep_recent_tokens: int | None = None, summary_tokens: int | None = None,
                     ) -> CompactionResult:
    """Compact ``messages`` once they reach ``trigger_tokens`` (see the module doc)."""
    msgs = _validate(messages)
    for name, value in (("trigger_tokens", trigger_tokens),
                        ("keep_recent_tokens", keep_recent_tokens),
                        ("summary_tokens", summary_tokens)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise ValidationError(f"{name} must be a positive integer")
    if not isinstance(llm, LLM):
        raise ValidationError("llm must be a cce_duck.llm.LLM")
    keep_recent = keep_recent_tokens or max(1, trigger_tokens // 3)
    summary_cap = summary_tokens or max(32, trigger_tokens // 4)
    before = _count(llm, msgs)
    res = CompactionResult([dict(m) for m in msgs], False, before, before, llm.counter.exact)
    if before < trigger_tokens:
        return res
    head_end = 0
    while head_end < len(msgs) and msgs[head_end]["role"] == "system":
        head_end += 1
    first_user = next((i for i in range(head_end, len(msgs)) if msgs[i]["role"] == "user"), None)
    if first_user is not None:
        head_end = first_user + 1
    # the tail: recent turns within keep_recent tokens, then back to a user turn
    start, used = len(msgs), 0
    while start > head_end:
        cost = MESSAGE_OVERHEAD + llm.count(_text(msgs[start - 1]))
        if used + cost > keep_recent and start < len(msgs):
            break
        used += cost
        start -= 1
    tail0 = start
    while head_end < start < len(msgs) and msgs[start]["role"] != "user":
        start -= 1
    merge_into_head = start < len(msgs) and msgs[start]["role"] != "user"
    if merge_into_head:
        # No user turn to open the tail (a long tool-using run): the tail opens with the
        # assistant turn that made the calls, and the summary joins the head's user turn.
        start = tail0
        while head_end < start < len(msgs) and msgs[start]["role"] == "tool":
            start -= 1
    middle = [m for m in msgs[head_end:start] if m["role"] != "system"]
    kept_system = [m for m in msgs[head_end:start] if m["role"] == "system"]
    if not middle:
        return res
    summary = _summarise(llm, middle, summary_cap, res)
    text = render_summary(summary, len(middle))
    if llm.count(text) > summary_cap:
        text = truncate_to_tokens(text, summary_cap, llm.counter)
    head = [dict(m) for m in msgs[:head_end]]
    if not merge_into_head:
        res.messages = [*head, *kept_system, {"role": "assistant", "content": text},
                        *msgs[start:]]
    elif head and head[-1]["role"] == "user":
        head[-1]["content"] = f"{head[-1]['content']}\n\n{text}"
        res.messages = [*head, *kept_system, *msgs[start:]]
    else:
        res.messages = [*head, *kept_system, {"role": "user", "content": text}, *msgs[start:]]
    res.compacted, res.summarised, res.summary = True, len(middle), summary
    res.head, res.tail = head_end, len(msgs) - start
    res.tokens_after = _count(llm, res.messages)
    return res


def _summarise(llm: LLM, middle: list[dict[str, Any]], cap: int, res: CompactionResult
               ) -> dict[str, Any]:
    p = prompt("compact_summary")
    reply_cap = min(llm.max_tokens, llm.context_window // 4, max(64, cap * 2))
    input_cap = llm.context_window - reply_cap - 160
    lines = [f"{m['role']}: {_text(m)}" for m in middle]
    chunks: list[list[str]] = [[]]
    for line in lines:
        if llm.count(line) > input_cap:
            line = truncate_to_tokens(line, input_cap, llm.counter)
        if chunks[-1] and llm.count("\n".join([*chunks[-1], line])) > input_cap:
            chunks.append([])
        chunks[-1].append(line)
    merged: dict[str, Any] = {"goal": "", "decisions": [], "facts": [], "open_items": []}
    for chunk in chunks:
        c = llm.chat(p.messages(text="\n".join(chunk), words=max(10, int(cap * 0.7))),
                     prompt_version=p.key, max_tokens=reply_cap, json_object=True,
                     json_schema=SCHEMA if llm.json_schemas else None)
        res.calls += not c.cached
        res.cache_hits += c.cached
        part = _coerce(parse_json_object(c.text))
        merged["goal"] = merged["goal"] or part["goal"]
        for key in _KEYS:
            merged[key] += [x for x in part[key] if x not in merged[key]]
    return merged
