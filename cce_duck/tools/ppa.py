"""PPA: partition long messages into leaves, summarise each leaf, aggregate, fit the budget.

Every message longer than its share of the budget is cut into leaves on paragraph, then sentence,
then word boundaries (character offsets kept). Each leaf is summarised in isolation (calls run
concurrently and go through the model client's cache); the summaries of a message are merged
level by level, each merge call sized to the model's window, until the message fits its part of
the budget. The result fits ``budget_tokens`` or :class:`BudgetExceededError` is raised
(``truncate=True`` cuts summaries at word boundaries instead). Nothing calls the model when the
messages already fit.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any

from cce_duck.errors import BudgetExceededError, ValidationError
from cce_duck.llm.client import LLM, Completion, validate_messages
from cce_duck.llm.tokens import MESSAGE_OVERHEAD, REPLY_PRIMER, TokenCounter
from cce_duck.text import split_sentences
from cce_duck.tools.prompts import prompt

__all__ = ["Leaf", "PPAResult", "partition", "ppa_compress", "truncate_to_tokens"]

MIN_SUMMARY_TOKENS = 12
_PARAGRAPH = re.compile(r"\n\s*\n")
_WORD = re.compile(r"\S+")
_PROMPT_MARGIN = 96  # tokens of instructions around the text of one call, with slack


@dataclass
class Leaf:
    """A slice ``[start, end)`` of message ``message_index`` and its summary."""

    message_index: int
    leaf_index: int
    start: int
    end: int
    tokens: int
    summary: str = ""
    summary_tokens: int = 0
    cached: bool = False

    @property
    def leaf_id(self) -> str:
        """Stable id, e.g. ``m003-l002``."""
        return f"m{self.message_index:03d}-l{self.leaf_index:03d}"


@dataclass
class PPAResult:
    """Compressed messages and how they were made."""

    messages: list[dict[str, str]]
    budget_tokens: int
    tokens_before: int
    tokens_after: int
    leaves: list[Leaf] = field(default_factory=list)
    summaries: dict[int, str] = field(default_factory=dict)
    levels: dict[int, int] = field(default_factory=dict)
    originals: dict[int, str] = field(default_factory=dict)
    calls: int = 0
    cache_hits: int = 0
    truncated: bool = False

    def provenance(self) -> dict[str, Any]:
        """Everything but the messages, as plain data."""
        return {
            "budget_tokens": self.budget_tokens, "tokens_before": self.tokens_before,
            "tokens_after": self.tokens_after, "calls": self.calls,
            "cache_hits": self.cache_hits, "truncated": self.truncated,
            "compressed_messages": sorted(self.summaries),
            "levels": {str(k): v for k, v in self.levels.items()},
            "leaves": [{**asdict(lf), "leaf_id": lf.leaf_id} for lf in self.leaves],
        }


def _spans(text: str, start: int, end: int, limit: int, counter: TokenCounter
           ) -> list[tuple[int, int, int]]:
    """Units of ``text[start:end]`` of at most ``limit`` tokens: paragraphs, else sentences,
    else runs of words. Returns ``(start, end, tokens)``."""
    n = counter.count(text[start:end])
    if n <= limit:
        return [(start, end, n)]
    piece = text[start:end]
    parts: list[tuple[int, int]] = []
    pos = 0
    for m in _PARAGRAPH.finditer(piece):
        parts.append((pos, m.start()))
        pos = m.end()
    parts.append((pos, len(piece)))
    parts = [_trim(piece, a, b) for a, b in parts if piece[a:b].strip()]
    if len(parts) <= 1:
        parts = [(s.start, s.end) for s in split_sentences(piece)]
    if len(parts) <= 1:
        out: list[tuple[int, int, int]] = []
        words = [(m.start(), m.end()) for m in _WORD.finditer(piece)]
        i = 0
        while i < len(words):
            j, a = i, words[i][0]
            while j + 1 < len(words) and counter.count(piece[a:words[j + 1][1]]) <= limit:
                j += 1
            b = words[j][1]
            out.append((start + a, start + b, counter.count(piece[a:b])))
            i = j + 1
        return out
    result: list[tuple[int, int, int]] = []
    for a, b in parts:
        result.extend(_spans(text, start + a, start + b, limit, counter))
    return result


def _trim(text: str, a: int, b: int) -> tuple[int, int]:
    while a < b and text[a].isspace():
        a += 1
    while b > a and text[b - 1].isspace():
        b -= 1
    return a, b


def partition(text: str, leaf_tokens: int, counter: TokenCounter) -> list[tuple[int, int, int]]:
    """Leaves ``(start, end, tokens)`` of ``text``, each at most ``leaf_tokens`` (a single word
    longer than that is its own leaf), packed greedily on paragraph/sentence/word boundaries."""
    units = _spans(text, 0, len(text), leaf_tokens, counter)
    leaves: list[tuple[int, int, int]] = []
    for a, b, n in units:
        if leaves:
            la, _, ln = leaves[-1]
            if ln + n <= leaf_tokens:
                merged = counter.count(text[la:b])
                if merged <= leaf_tokens:
                    leaves[-1] = (la, b, merged)
                    continue
        leaves.append((a, b, n))
    return leaves


def truncate_to_tokens(text: str, tokens: int, counter: TokenCounter) -> str:
    """The longest prefix of ``text`` ending at a word boundary with at most ``tokens`` tokens."""
    if counter.count(text) <= tokens:
        return text
    ends = [m.end() for m in _WORD.finditer(text)]
    lo, hi = 0, len(ends)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if counter.count(text[: ends[mid - 1]]) <= tokens:
            lo = mid
        else:
            hi = mid - 1
    return text[: ends[lo - 1]] if lo else ""


def _allocate(sizes: list[int], available: int) -> dict[int, int]:
    """Target tokens for each message that must shrink (the others stay as they are)."""
    n = len(sizes)
    big = {i for i, s in enumerate(sizes) if s > available / n}
    while True:
        room = available - sum(s for i, s in enumerate(sizes) if i not in big)
        if room >= MIN_SUMMARY_TOKENS * len(big) or len(big) == n:
            break
        big = set(range(n))
    if room < MIN_SUMMARY_TOKENS * len(big):
        raise BudgetExceededError(
            f"a budget of {available} content tokens cannot hold {len(big)} summaries of "
            f"{MIN_SUMMARY_TOKENS} tokens")
    total_big = sum(sizes[i] for i in big)
    return {i: max(MIN_SUMMARY_TOKENS, math.floor(room * sizes[i] / total_big)) for i in big}


class _Run:
    def __init__(self, llm: LLM, workers: int) -> None:
        self.llm = llm
        self.workers = workers
        self.calls = 0
        self.hits = 0

    def many(self, jobs: list[tuple[str, str, int]]) -> list[Completion]:
        """Run ``(prompt name, text, target tokens)`` jobs concurrently, in order."""
        def one(job: tuple[str, str, int]) -> Completion:
            name, text, target = job
            p = prompt(name)
            return self.llm.chat(p.messages(text=text, words=max(5, int(target * 0.7))),
                                 prompt_version=p.key, max_tokens=max(8, target))
        with ThreadPoolExecutor(max_workers=self.workers) as pool:
            out = list(pool.map(one, jobs))
        for c in out:
            self.hits += c.cached
            self.calls += not c.cached
        return out


def ppa_compress(messages: Sequence[Mapping[str, Any]], budget_tokens: int, llm: LLM, *,
                 leaf_tokens: int | None = None, truncate: bool = False, max_workers: int = 4,
                 max_levels: int = 6) -> PPAResult:
    """Compress ``messages`` to at most ``budget_tokens`` (counted with ``llm``'s counter)."""
    msgs = validate_messages(messages)
    if isinstance(budget_tokens, bool) or not isinstance(budget_tokens, int) or budget_tokens <= 0:
        raise ValidationError(f"budget_tokens must be a positive integer, got {budget_tokens!r}")
    if not isinstance(llm, LLM):
        raise ValidationError("llm must be a cce_duck.llm.LLM")
    if isinstance(max_workers, bool) or not isinstance(max_workers, int) or max_workers < 1:
        raise ValidationError("max_workers must be a positive integer")
    counter = llm.counter
    before = llm.count_messages(msgs)
    if before <= budget_tokens:
        return PPAResult([dict(m) for m in msgs], budget_tokens, before, before)
    reply_cap = min(llm.max_tokens, llm.context_window // 4)
    input_cap = llm.context_window - reply_cap - _PROMPT_MARGIN
    if leaf_tokens is None:
        leaf_tokens = min(1024, input_cap)
    if isinstance(leaf_tokens, bool) or not isinstance(leaf_tokens, int) or not (
        MIN_SUMMARY_TOKENS < leaf_tokens <= input_cap
    ):
        raise ValidationError(
            f"leaf_tokens must be an integer in ({MIN_SUMMARY_TOKENS}, {input_cap}] for a "
            f"{llm.context_window}-token window")
    available = budget_tokens - REPLY_PRIMER - MESSAGE_OVERHEAD * len(msgs)
    if available <= 0:
        raise BudgetExceededError(
            f"a budget of {budget_tokens} tokens does not cover the per-message overhead of "
            f"{len(msgs)} messages")
    sizes = [counter.count(m["content"]) for m in msgs]
    targets = _allocate(sizes, available)
    res = PPAResult([dict(m) for m in msgs], budget_tokens, before, before)
    run = _Run(llm, max_workers)
    for i in sorted(targets):
        text = msgs[i]["content"]
        res.originals[i] = text
        for j, (a, b, n) in enumerate(partition(text, leaf_tokens, counter)):
            res.leaves.append(Leaf(i, j, a, b, n))
    jobs = []
    for lf in res.leaves:
        share = targets[lf.message_index] * lf.tokens / max(1, sizes[lf.message_index])
        jobs.append(("ppa_leaf", msgs[lf.message_index]["content"][lf.start:lf.end],
                     min(reply_cap, max(MIN_SUMMARY_TOKENS, math.ceil(share)))))
    for lf, done in zip(res.leaves, run.many(jobs), strict=True):
        lf.summary = done.text.strip()
        lf.summary_tokens = counter.count(lf.summary)
        lf.cached = done.cached
    for i, target in targets.items():
        pieces = [lf.summary for lf in res.leaves if lf.message_index == i]
        pieces, level = _aggregate(run, pieces, target, input_cap, reply_cap, counter, max_levels)
        res.summaries[i] = "\n".join(pieces)
        res.levels[i] = level
        res.messages[i]["content"] = res.summaries[i]
    res.calls, res.cache_hits = run.calls, run.hits
    res.tokens_after = llm.count_messages(res.messages)
    if res.tokens_after > budget_tokens:
        if not truncate:
            raise BudgetExceededError(
                f"the summaries take {res.tokens_after} tokens, over the budget of "
                f"{budget_tokens}; pass truncate=True to cut them")
        _truncate(res, targets, counter, budget_tokens, llm)
    return res


def _aggregate(run: _Run, pieces: list[str], target: int, input_cap: int, reply_cap: int,
               counter: TokenCounter, max_levels: int) -> tuple[list[str], int]:
    """Merge summaries level by level until they fit ``target`` (or stop shrinking)."""
    level = 0
    total = counter.count("\n".join(pieces))
    while total > target and level < max_levels:
        groups: list[list[str]] = [[]]
        for p in pieces:
            if groups[-1] and counter.count("\n\n".join([*groups[-1], p])) > input_cap:
                groups.append([])
            groups[-1].append(p)
        jobs = []
        for g in groups:
            g_tokens = counter.count("\n\n".join(g))
            share = target * g_tokens / max(1, total) if len(groups) > 1 else target
            jobs.append(("ppa_merge", "\n\n".join(f"<summary>\n{x}\n</summary>" for x in g),
                         min(reply_cap, max(MIN_SUMMARY_TOKENS, math.floor(share)))))
        merged = [c.text.strip() for c in run.many(jobs)]
        level += 1
        new_total = counter.count("\n".join(merged))
        if new_total >= total:
            break
        pieces, total = merged, new_total
    return pieces, level


def _truncate(res: PPAResult, targets: dict[int, int], counter: TokenCounter, budget: int,
              llm: LLM) -> None:
    for i in sorted(targets, key=lambda k: -counter.count(res.messages[k]["content"])):
        over = llm.count_messages(res.messages) - budget
        if over <= 0:
            break
        content = res.messages[i]["content"]
        keep = max(0, counter.count(content) - over)
        res.messages[i]["content"] = truncate_to_tokens(content, keep, counter)
        res.summaries[i] = res.messages[i]["content"]
    res.truncated = True
    res.tokens_after = llm.count_messages(res.messages)
    if res.tokens_after > budget:
        raise BudgetExceededError(
            f"even truncated, the messages take {res.tokens_after} tokens (budget {budget})")
